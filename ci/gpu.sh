#!/usr/bin/env bash
# The checks to run on a machine with an NVIDIA GPU, from the checkout's root: bash ci/gpu.sh
#
# Each step writes its log under $OUT (default: gpu-logs/) and has its own time limit, so one
# step that fails or hangs leaves the others' results. docs/hardware.md records what they gave.
#   env.txt            the machine: GPU, driver, torch, NCCL, `hwdist env --issue`
#   tests_hardware.txt HWDIST_RUN_HARDWARE=1 pytest -m hardware (check bodies on the GPU, a group
#                      torch made without a backend, a CUDA child forked after detection)
#   check.txt          hwdist check -n 1 --backend nccl
#   bench_gpu.txt      benchmarks.bench_gpu --quick (pass-through, object collectives, collect_results)
#   tests_dist.txt     pytest -m dist on NCCL at one rank (HWDIST_GPU_DIST=0 skips it)
set -u
out=${OUT:-gpu-logs}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
unset PYTORCH_NVML_BASED_CUDA_CHECK  # detection and the fork test must see torch's default

step() {  # step NAME SECONDS COMMAND...: run with a limit, log to $out/NAME.txt, print the status
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    timeout -k 10 "$limit" "$@" >"$out/$name.txt" 2>&1
    local rc=$?
    echo "$name: exit $rc in $((SECONDS - t0)) s" | tee -a "$out/summary.txt"
    tail -n 3 "$out/$name.txt"
}

{
    nvidia-smi
    python -c "import sys, torch; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
    nproc
    python -m hwdist env --issue
} >"$out/env.txt" 2>&1
HWDIST_RUN_HARDWARE=1 step tests_hardware 200 python -m pytest tests -m hardware -q -rs -p no:cacheprovider
step check 90 python -m hwdist check -n 1 --backend nccl
step bench_gpu 150 python -m benchmarks.bench_gpu --quick --json "$out/bench_gpu.json"
if [ "${HWDIST_GPU_DIST:-1}" != 0 ]; then
    workers=()
    python -c "import xdist" 2>/dev/null && workers=(-n 12)
    HWDIST_TEST_BACKENDS=nccl HWDIST_TEST_WORLD_SIZES=1 \
        step tests_dist 150 python -m pytest tests -m dist -q -p no:cacheprovider "${workers[@]}"
fi
