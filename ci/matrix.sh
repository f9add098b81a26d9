#!/usr/bin/env bash
# The distributed suite across world sizes and backends, for developers (not run by .ci/run,
# whose pytest run already covers world sizes 1,2,3 x gloo,emu and runs the MPI entries
# through tests/drivers/test_mpi.py).
#
#   bash ci/matrix.sh                 # tests -m dist
#   bash ci/matrix.sh tests/collectives/test_tensor.py -x
#
# Entries: each of gloo and emu at world sizes 1, 2, 3 (spawned ranks), then, when mpi4py and
# mpiexec are installed, backend mpi under `mpiexec -n 2` and `mpiexec -n 3`
# (hwdist.testing.mpi_suite; every MPI process is one rank). Each entry is bounded in time.
set -uo pipefail
cd "$(dirname "$0")/.."
ARGS=("$@")
[ ${#ARGS[@]} -eq 0 ] && ARGS=(tests -m dist)
LIMIT=${HWDIST_MATRIX_TIMEOUT:-900}
export HWDIST_MATRIX=1
LOGS=${HWDIST_MATRIX_LOGS:-$(mktemp -d -t hwdist-matrix.XXXXXX)}
mkdir -p "$LOGS"
declare -a RESULTS
fail=0

entry() {  # name, command...
    local name=$1; shift
    echo "=== $name"
    local start=$SECONDS log="$LOGS/${name//[^A-Za-z0-9=]/_}.log" rc
    timeout "$LIMIT" "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    if [ "$rc" -eq 0 ]; then
        RESULTS+=("PASS  $name ($((SECONDS - start))s)")
    else
        RESULTS+=("FAIL  $name ($((SECONDS - start))s, exit $rc; log: $log)")
        fail=1
    fi
}

for backend in gloo emu; do
    for ws in 1 2 3; do
        entry "$backend ws=$ws" env HWDIST_TEST_BACKENDS=$backend HWDIST_TEST_WORLD_SIZES=$ws \
            python3 -m pytest -q -p no:cacheprovider "${ARGS[@]}"
    done
done

if python3 -c "import mpi4py" 2>/dev/null && command -v mpiexec >/dev/null; then
    for n in 2 3; do
        entry "mpi mpiexec -n $n" env MPIEXEC_TIMEOUT="$LIMIT" HWDIST_MPI_SUITE_BACKEND=mpi \
            mpiexec -n "$n" python3 -m hwdist.testing.mpi_suite "${ARGS[@]}" -q
    done
else
    RESULTS+=("SKIP  mpi (mpi4py or mpiexec missing: pip install mpi4py mpich)")
fi

echo; echo "=== matrix (logs in $LOGS)"
printf '%s\n' "${RESULTS[@]}"
exit $fail
