#!/usr/bin/env bash
# The GPU check: run once on a CUDA machine (an H200) with no network access.
#
#   scripts/gpu_check.sh OUTDIR
#
# Installs this checkout (no network, no dependencies: torch, cupy, pytest, pytest-benchmark
# and hypothesis must already be installed), runs the GPU tests (cupy backend vs torch vs
# float64, determinism, streams, the conformance kit), the clip benchmarks, and writes into
# OUTDIR:
#   gpu_check.log      everything printed, with a status line per step and a summary
#   gpu_tests.xml      JUnit report of the GPU tests
#   bench_gpu.json     pytest-benchmark results
#   bench_gpu.md       the benchmark table (benchmarks/clip_table.py)
#   summary.txt        one line per step: ok / FAILED (exit code) / skipped, and seconds
#
# Every step runs even when an earlier one failed, so later results still get written; the
# script exits 1 if any step failed. Expected time: ~3 minutes; the step timeouts add up to 7.
# Environment: PYTHON (default python3).

set -uo pipefail  # no -e: a failing step is recorded and the next one still runs

if [[ $# -ne 1 ]]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi
mkdir -p "$1"
OUTDIR=$(cd "$1" && pwd)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
LOG="$OUTDIR/gpu_check.log"
SUMMARY="$OUTDIR/summary.txt"
: >"$LOG"
: >"$SUMMARY"
exec > >(tee -a "$LOG") 2>&1
TEE_PID=$!
cd "$REPO"

# Caches in a scratch directory: HOME may be read-only, and a fresh cache proves a cold start.
SCRATCH=$(mktemp -d)
export CUPY_CACHE_DIR="$SCRATCH/cupy"
export XDG_CACHE_HOME="$SCRATCH/cache"
export PYTHONDONTWRITEBYTECODE=1

FAILED=0
SKIPPED=77  # a step that exits with this was skipped on purpose (automake's convention)

# step NAME TIMEOUT_SECONDS COMMAND...: run, time and record one step. COMMAND may be a function
# of this script (they are exported, so `timeout` can run them in a child bash).
step() {
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS status
    echo
    echo "=== [$(date -u +%H:%M:%S)] $name (timeout ${limit}s): $*"
    if declare -F "$1" >/dev/null; then
        timeout --kill-after=10 "$limit" bash -c '"$@"' "$1" "$@"
    else
        timeout --kill-after=10 "$limit" "$@"
    fi
    status=$?
    local took=$((SECONDS - start))
    if [[ $status -eq 0 ]]; then
        echo "=== $name: ok (${took}s)"
        printf '%-18s ok (%ss)\n' "$name" "$took" >>"$SUMMARY"
    elif [[ $status -eq $SKIPPED ]]; then
        echo "=== $name: skipped"
        printf '%-18s skipped\n' "$name" >>"$SUMMARY"
    else
        [[ $status -eq 124 ]] && echo "=== $name: TIMED OUT after ${limit}s"
        echo "=== $name: FAILED (exit $status, ${took}s)"
        printf '%-18s FAILED (exit %s, %ss)\n' "$name" "$status" "$took" >>"$SUMMARY"
        FAILED=1
    fi
}

install_package() {
    # PEP 660 editable install from this checkout, offline. Fall back to the flags some images
    # need: --break-system-packages (PEP 668 "externally managed" Pythons).
    "$PYTHON" -m pip install --no-deps --no-build-isolation --no-index -e . ||
        "$PYTHON" -m pip install --no-deps --no-build-isolation --no-index --break-system-packages -e . || return 1
    "$PYTHON" -c "import pytest_spikecheck.kernels, pytest_spikecheck.clipping.cupy_backend; print('installed', pytest_spikecheck.__file__)"
}

show_environment() {
    nvidia-smi -L
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv || true
    "$PYTHON" - <<'PY'
import sys
import cupy
import torch
from pytest_spikecheck.clipping import available_backends, resolve_backend
from pytest_spikecheck.clipping._registry import unavailable_reason
print("python", sys.version.split()[0], "| torch", torch.__version__, "cuda", torch.version.cuda,
      "| cupy", cupy.__version__, "| nvrtc", cupy.cuda.nvrtc.getVersion())
print("device:", torch.cuda.get_device_name() if torch.cuda.is_available() else "none")
print("backends:", available_backends(), "| auto ->", resolve_backend("auto"))
print("cupy unavailable reason:", unavailable_reason("cupy"))
PY
}

run_gpu_tests() {
    # test_cupy_gpu.py (all marked gpu): the cupy backend against torch and float64 at
    # ANDREA-120M and tiny shapes, 16-bit dtypes, determinism across runs and grids, torch's
    # stream, no host sync, launch count, the pointer-table cache, the non-finite flag and the
    # conformance kit on cupy. Also, as they are quick: NVRTC compiling clip.cu with this
    # machine's NVRTC, and the torch backend against this machine's torch.
    "$PYTHON" -m pytest tests/test_cupy_gpu.py tests/test_kernels_compile.py tests/test_clipping.py \
        -p no:cacheprovider -q -rs --durations=10 --junitxml "$OUTDIR/gpu_tests.xml"
}

run_marked_gpu_tests() {
    # Anything else in the suite marked gpu (other modules' GPU tests), without failing the
    # whole run on a module that cannot be collected here.
    # Exit 5 (nothing selected) is fine: there may be no other GPU tests.
    "$PYTHON" -m pytest tests -m gpu --ignore tests/test_cupy_gpu.py -p no:cacheprovider -q -rs \
        --continue-on-collection-errors
    local status=$?
    [[ $status -eq 5 ]] && return 0
    return $status
}

run_benchmarks() {
    "$PYTHON" -m pytest benchmarks/bench_clip.py -p no:cacheprovider -q \
        --benchmark-json "$OUTDIR/bench_gpu.json" --benchmark-max-time=0.5 --benchmark-min-rounds=20 \
        --benchmark-columns=min,median,max,rounds --benchmark-sort=fullname
}

# ---------------------------------------------------------------------------------------------
# Seed A's Phase-19 pair trained on the GPU with the cupy clipping backend (the engine does not
# know which backend runs), compared and diagnosed like `make demo` does on CPU. Outputs in
# "$OUTDIR/phase-19-gpu/". The two runs' train_seconds are the GPU step-time figures.
train_phase19_on_gpu() {
    local out="$OUTDIR/phase-19-gpu" name
    for name in 19-control 19-break-no-clip; do
        "$PYTHON" -m pytest_spikecheck.cli train "experiments/$name" --backend cupy --device cuda \
            --out "$out/$name" --quiet || return 1
        "$PYTHON" -c "import json,sys; m=json.load(open(sys.argv[1])); print(sys.argv[2], 'backend', m['backend'], 'device', m['device'], 'train_seconds', round(m['train_seconds'], 3), 'seconds', round(m['seconds'], 3))" "$out/$name/run.json" "$name" || return 1
    done
    "$PYTHON" -m pytest_spikecheck.cli compare "$out/19-control" "$out/19-break-no-clip" --out "$out/compare" || return 1
    "$PYTHON" -m pytest_spikecheck.cli diagnose "$out/19-break-no-clip"
}
# ---------------------------------------------------------------------------------------------

export -f install_package show_environment run_gpu_tests run_marked_gpu_tests run_benchmarks train_phase19_on_gpu
export PYTHON OUTDIR REPO SKIPPED

echo "gpu_check: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), repo $REPO, output $OUTDIR"

step install          60 install_package
step environment      30 show_environment
step gpu-tests       150 run_gpu_tests
step other-gpu-tests  60 run_marked_gpu_tests
step phase-19-gpu     90 train_phase19_on_gpu
step benchmarks      120 run_benchmarks
step benchmark-table  20 "$PYTHON" benchmarks/clip_table.py "$OUTDIR/bench_gpu.json" --output "$OUTDIR/bench_gpu.md"

echo
echo "=== summary ($SECONDS s in all)"
cat "$SUMMARY"
rm -rf "$SCRATCH"
exec >&- 2>&-  # let tee see the end of its input, and wait until the log is complete
wait "$TEE_PID" 2>/dev/null
exit "$FAILED"
