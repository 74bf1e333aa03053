#!/usr/bin/env bash
# The GPU check: run once on a CUDA machine (an H200) with no network access.
#
#   scripts/gpu_check.sh OUTDIR
#
# Installs this checkout (no network, no dependencies: torch, cupy, pytest, pytest-benchmark
# and hypothesis must already be installed), runs the GPU tests (cupy backend vs torch vs
# float64, determinism, streams, the fallback), the conformance kit on the device, trains the
# Phase-19 pair on the GPU with the torch and the cupy backend, runs the clip benchmarks (tiny,
# ANDREA-12M, ANDREA-120M, GPT-2 124M; fp32 and bf16) and writes six files into OUTDIR (no
# sub-folders):
#   gpu_check.log      everything printed, with a status line per step and a summary
#   summary.txt        one line per step: ok / FAILED (exit code) / skipped, and seconds
#   gpu_tests.xml      JUnit report of the GPU tests
#   phase19_gpu.json   the four Phase-19 runs (backend, step time, spike) and cupy vs torch
#   bench_gpu.json     pytest-benchmark results
#   bench_gpu.md       the benchmark table in docs/benchmarks.md's shape (benchmarks/clip_table.py)
#
# Every step runs even when an earlier one failed, so later results still get written; the
# script exits 1 if any step failed, and 3 (after saying so) where there is no CUDA device.
# Expected time on an H200: ~4 minutes; the step timeouts add up to 7.6 minutes.
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

# Caches and run folders in a scratch directory: HOME may be read-only, a fresh cache proves a
# cold start, and only the six files above go to OUTDIR.
SCRATCH=$(mktemp -d)
export CUPY_CACHE_DIR="$SCRATCH/cupy"
export XDG_CACHE_HOME="$SCRATCH/cache"
export PYTHONDONTWRITEBYTECODE=1

FAILED=0
NO_DEVICE=3
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
if unavailable_reason("cupy") is None:
    from pytest_spikecheck.clipping.cupy_backend import describe_device
    print("cuda:0 is", describe_device(0))
PY
}

# No CUDA device (a CPU machine, a dry run): say so and stop before installing anything.
cuda_device_or_exit() {
    local reason
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        reason="nvidia-smi not found"
    elif ! nvidia-smi -L >/dev/null 2>&1; then
        reason="nvidia-smi lists no GPU"
    elif ! reason=$("$PYTHON" -c 'import torch; print("" if torch.cuda.is_available() else f"torch {torch.__version__} sees no CUDA device")' 2>&1); then
        reason="torch does not import: ${reason##*$'\n'}"
    fi
    if [[ -n $reason ]]; then
        echo "gpu_check: no CUDA device ($reason): nothing to check; run this on a GPU machine."
        printf '%-18s no CUDA device (%s)\n' "preflight" "$reason" >>"$SUMMARY"
        return 1
    fi
}

run_gpu_tests() {
    # test_cupy_gpu.py: the cupy backend against torch and float64 at ANDREA-120M and tiny
    # shapes, 16-bit dtypes, determinism across runs and grids, torch's stream, no host sync,
    # launch count, the pointer-table cache, the non-finite flag, the fallback, and the
    # conformance kit on cupy. Also, as they are quick: NVRTC compiling clip.cu for every
    # architecture with this machine's NVRTC, and the torch backend against this machine's torch.
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

run_conformance() {
    # The conformance kit on the device, more examples than the GPU tests: the cupy backend
    # (every dtype, exact elements, no flush to zero) and, as a control, the torch backend.
    "$PYTHON" - <<'PY'
from pytest_spikecheck.clipping.conformance import Tolerances, check_backend, check_case, every_value_case
from pytest_spikecheck.clipping import get_backend

exact = Tolerances(norm_rtol=2e-6, element_ulps=0, allow_flush_to_zero=False)
report = check_backend("cupy", max_examples=300, tolerances=exact)
print("cupy:", report)
for dtype in ("float16", "bfloat16"):
    check_case(get_backend("cupy").clip_, every_value_case(dtype), device="cuda", tolerances=exact)
    print(f"cupy: every {dtype} value converts and rounds exactly")
report = check_backend("torch", dtypes=("float32", "bfloat16"), device="cuda", max_examples=100, tolerances=exact)
print("torch on cuda:", report)
PY
}

run_benchmarks() {
    # The emulator is CPU-only and is benchmarked in docs/benchmarks.md's CPU table.
    "$PYTHON" -m pytest benchmarks/bench_clip.py -p no:cacheprovider -q -k "not emulator" \
        --benchmark-json "$OUTDIR/bench_gpu.json" --benchmark-max-time=0.25 --benchmark-min-rounds=10 \
        --benchmark-columns=min,median,max,rounds --benchmark-sort=fullname
}

# ---------------------------------------------------------------------------------------------
# Seed A's Phase-19 pair trained on the GPU with each clipping backend (torch and cupy; the
# engine does not know which runs). Run folders stay in the scratch directory; phase19_gpu.json
# gets, per run, the backend and device it used, its step time and spike, and per experiment
# how far the cupy run is from the torch run (norms, clip decisions).
train_phase19_on_gpu() {
    local runs="$SCRATCH/phase-19-gpu" name backend
    for backend in torch cupy; do
        for name in 19-control 19-break-no-clip; do
            "$PYTHON" -m pytest_spikecheck.cli train "experiments/$name" --backend "$backend" --device cuda \
                --out "$runs/$backend/$name" --quiet || return 1
        done
    done
    "$PYTHON" - "$runs" "$OUTDIR/phase19_gpu.json" <<'PY' || return 1
import json, math, sys
from pathlib import Path

runs, out = Path(sys.argv[1]), Path(sys.argv[2])
result = {"runs": {}, "cupy_vs_torch": {}}
columns = {}
for backend in ("torch", "cupy"):
    for name in ("19-control", "19-break-no-clip"):
        folder = runs / backend / name
        meta = json.loads((folder / "run.json").read_text())
        rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
        pre = [r["grad_norm_pre"] for r in rows]
        finite = [x for x in pre if x is not None and math.isfinite(x)]
        peak = max(range(len(finite)), key=finite.__getitem__)
        columns[backend, name] = rows
        result["runs"][f"{backend}/{name}"] = {
            "backend": meta.get("backend"), "device": meta.get("device"), "steps": len(rows),
            "train_seconds": meta.get("train_seconds"), "seconds": meta.get("seconds"),
            "ms_per_step": 1e3 * meta["train_seconds"] / len(rows) if meta.get("train_seconds") else None,
            "peak_grad_norm_pre": finite[peak], "peak_step": rows[peak]["step"], "final_loss": rows[-1]["loss"],
        }
for name in ("19-control", "19-break-no-clip"):
    a, b = columns["torch", name], columns["cupy", name]
    n = min(len(a), len(b))
    def worst(key):
        rel = [abs(x[key] - y[key]) / abs(x[key]) for x, y in zip(a[:n], b[:n])
               if x[key] not in (None, 0) and y[key] is not None and math.isfinite(x[key]) and math.isfinite(y[key])]
        return max(rel) if rel else None
    result["cupy_vs_torch"][name] = {
        "steps_compared": n,
        "max_rel_grad_norm_pre": worst("grad_norm_pre"), "max_rel_grad_norm_post": worst("grad_norm_post"),
        "max_rel_clip_factor": worst("clip_factor"), "max_rel_loss": worst("loss"),
        "clip_decisions_identical": all((x["clip_factor"] < 1) == (y["clip_factor"] < 1) for x, y in zip(a[:n], b[:n])),
    }
out.write_text(json.dumps(result, indent=1) + "\n")
print(json.dumps(result, indent=1))
bad = [f"{backend}/{name}" for (backend, name) in columns if result["runs"][f"{backend}/{name}"]["backend"] != backend]
if bad:
    sys.exit(f"runs that did not use the backend they asked for: {bad}")
PY
    "$PYTHON" -m pytest_spikecheck.cli compare "$runs/cupy/19-control" "$runs/cupy/19-break-no-clip" \
        --out "$runs/compare" || return 1
    "$PYTHON" -m pytest_spikecheck.cli diagnose "$runs/cupy/19-break-no-clip"
}
# ---------------------------------------------------------------------------------------------

export -f install_package show_environment run_gpu_tests run_marked_gpu_tests run_conformance run_benchmarks \
    train_phase19_on_gpu
export PYTHON OUTDIR REPO SKIPPED SCRATCH

echo "gpu_check: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), repo $REPO, output $OUTDIR"

if ! cuda_device_or_exit; then
    rm -rf "$SCRATCH"
    exec >&- 2>&-
    wait "$TEE_PID" 2>/dev/null
    exit "$NO_DEVICE"
fi

step install          40 install_package
step environment      15 show_environment
step gpu-tests       100 run_gpu_tests
step other-gpu-tests  20 run_marked_gpu_tests
step conformance      40 run_conformance
step phase-19-gpu    130 train_phase19_on_gpu
step benchmarks      100 run_benchmarks
step benchmark-table  10 "$PYTHON" benchmarks/clip_table.py "$OUTDIR/bench_gpu.json" --output "$OUTDIR/bench_gpu.md"
echo
echo "=== summary ($SECONDS s in all)"
cat "$SUMMARY"
rm -rf "$SCRATCH"
exec >&- 2>&-  # let tee see the end of its input, and wait until the log is complete
wait "$TEE_PID" 2>/dev/null
exit "$FAILED"
