#!/usr/bin/env bash
# The version matrix: one virtual environment per (Python, torch) combination hwdist claims, each
# running the unit and dist suites (without the docs and lint tests, which do not depend on torch)
# and `hwdist check -n 2`, then one summary table. Exit 1 if any combination fails.
#
#   bash ci/versions.sh [CACHE_DIR]          # venvs and uv's cache under CACHE_DIR
#                                            # (default: ~/.cache/hwdist-versions; kept, so a
#                                            # second run reuses the venvs)
#   HWDIST_VERSIONS="3.9:2.1.2 3.13:2.15.0" bash ci/versions.sh /tmp/x    # some combinations
#
# Needs: uv (`pip install uv`; it is installed with the first python3 if missing) and the Python
# interpreters (pyenv's, `pyenv root`, or python3.X on PATH; uv does not download interpreters
# here). PyPI's Linux torch wheels are CUDA builds and pull their nvidia-* packages even on a CPU
# machine (4.5-7 GB a venv). torch < 2.3 needs numpy < 2 (its numpy bridge is built against
# numpy 1). uv reads the find-links pip is configured with (a local wheel, e.g. the CPU wheel of
# 2.13.0, is preferred over PyPI's). Per-combination limit: HWDIST_VERSIONS_TIMEOUT seconds
# (default 2400) for the suites, the same for the check. HWDIST_VERSIONS_INSTALL_ONLY=1: build the
# venvs and stop.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
CACHE=${1:-${HWDIST_VERSIONS_CACHE:-$HOME/.cache/hwdist-versions}}
mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd)
export UV_CACHE_DIR=${UV_CACHE_DIR:-$CACHE/uv-cache}
LIMIT=${HWDIST_VERSIONS_TIMEOUT:-2400}
# HWDIST_VERSIONS_MARK: a pytest -m expression for the suites (CI: 'not slow', the fast lane).
MARK=${HWDIST_VERSIONS_MARK:-}
# python:torch; the first is the floor (pyproject.toml), 2.8.0 is the newest torch for Python 3.9.
COMBOS=${HWDIST_VERSIONS:-"3.9:2.1.2 3.10:2.4.1 3.9:2.8.0 3.11:2.13.0 3.13:2.15.0"}

if ! command -v uv >/dev/null; then
    python3 -m pip install -q uv || { echo "versions: uv is missing and could not be installed"; exit 2; }
fi
UV=$(command -v uv)

# The find-links pip uses here (environment or pip config), for uv too.
FIND_LINKS=()
for dir in ${PIP_FIND_LINKS:-} $(python3 -m pip config get global.find-links 2>/dev/null || true); do
    [ -d "$dir" ] && FIND_LINKS+=(--find-links "$dir")
done

interpreter() {  # X.Y -> path of a python X.Y, or nothing
    local root cand
    root=$(pyenv root 2>/dev/null || true)
    for cand in ${root:+$root/versions/$1.*/bin/python$1} "$(command -v "python$1" 2>/dev/null)"; do
        [ -x "$cand" ] && { echo "$cand"; return; }
    done
}

declare -a ROWS
fail=0
for combo in $COMBOS; do
    py=${combo%%:*}; tv=${combo##*:}
    name="py$py-torch$tv"
    venv="$CACHE/$name"
    log="$CACHE/$name.log"
    start=$SECONDS
    echo "=== Python $py + torch $tv (venv $venv, log $log)"
    row() { ROWS+=("$(printf '%-7s %-8s %-52s %-24s %5s' "$py" "$tv" "$1" "$2" "$(awk "BEGIN{printf \"%.1f\", ($SECONDS-$start)/60}")")"); }
    pybin=$(interpreter "$py")
    if [ -z "$pybin" ]; then
        row "SKIP: no python$py (pyenv install $py)" "-"; fail=1; continue
    fi
    deps=("torch==$tv" "pytest>=7" "pytest-timeout>=2.1" "hypothesis>=6")
    case $tv in 2.1.*|2.2.*) deps+=("numpy<2");; *) deps+=("numpy");; esac
    if ! { [ -x "$venv/bin/python" ] || "$UV" venv -q -p "$pybin" "$venv"; } >"$log" 2>&1 \
        || ! "$UV" pip install -q -p "$venv/bin/python" "${FIND_LINKS[@]}" "${deps[@]}" >>"$log" 2>&1; then
        tail -5 "$log"
        row "INSTALL FAILED (see $log)" "-"; fail=1; continue
    fi
    got=$("$venv/bin/python" -c 'import sys, torch; print(f"{sys.version_info[0]}.{sys.version_info[1]} {torch.__version__}")' 2>&1)
    echo "    installed: Python/torch $got"
    if [ -n "${HWDIST_VERSIONS_INSTALL_ONLY:-}" ]; then row "installed ($got)" "-"; continue; fi
    # hwdist from this checkout (not installed into the venv).
    export PYTHONPATH="$REPO"
    timeout "$LIMIT" "$venv/bin/python" -m pytest -q -p no:cacheprovider tests -m "(unit or dist)${MARK:+ and ($MARK)}" \
        --ignore=tests/project/test_docs.py --ignore=tests/project/test_lint.py >>"$log" 2>&1
    trc=$?
    summary=$(grep -E '^(=+ )?[0-9]+ (passed|failed|skipped|error)' "$log" | tail -1 | sed -E 's/=+//g; s/ in [0-9.]+s.*//; s/^ +//')
    [ $trc -eq 124 ] && summary="TIMEOUT after ${LIMIT}s; $summary"
    [ -z "$summary" ] && summary="no summary (exit $trc)"
    clog="$CACHE/$name.check.log"
    timeout "$LIMIT" "$venv/bin/python" -m hwdist check -n 2 >"$clog" 2>&1
    crc=$?
    check=$(tail -1 "$clog" | sed -E 's/ in [0-9.]+ s$//')
    [ $crc -eq 124 ] && check="TIMEOUT"
    unset PYTHONPATH
    if [ $trc -ne 0 ] || [ $crc -ne 0 ]; then
        fail=1
        [ $trc -ne 0 ] && grep -E '^(FAILED|ERROR) ' "$log" | head -20
        [ $crc -ne 0 ] && grep -E ' FAIL ' "$clog" | head -20
        summary="FAIL: $summary"
    fi
    row "$summary" "$check"
    echo "    $summary | check: $check"
done

echo
echo "=== hwdist version matrix ($(uname -m), $(nproc) CPUs; logs in $CACHE)"
printf '%-7s %-8s %-52s %-24s %5s\n' Python torch "unit + dist suites" "hwdist check -n 2" min
printf '%s\n' "${ROWS[@]}"
exit $fail
