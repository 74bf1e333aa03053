"""Phase-19 wall-time benchmark (a script, not a test): writes the numbers in docs/benchmarks.md.

    python benchmarks/bench_phase19.py [--repeats 3] [--json out.json]

1. The pair: `spikecheck train` of 19-control and 19-break-no-clip as two parallel 1-thread
   processes, wall time from launch to both exiting (what `make demo` does before compare).
2. Harness overhead: the engine's time per training step (forward, backward, clip, AdamW,
   recording; evaluation excluded and reported separately) against a bare loop on the same
   model, batches, optimizer and clip (torch.nn.utils.clip_grad_norm_) with no recording, their
   steps alternating in one process (``--no-pair`` measures this alone).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_recorder import UserLoop  # noqa: E402  (the bare loop: the same model, batches, optimizer, clip)


def pair_wall_time(out: Path) -> float:
    exe = [sys.executable, "-m", "pytest_spikecheck.cli", "train", "--quiet", "--threads", "1"]
    start = time.perf_counter()
    procs = [subprocess.Popen([*exe, str(ROOT / "experiments" / name), "--out", str(out / name)],
                              stdout=subprocess.DEVNULL)
             for name in ("19-control", "19-break-no-clip")]
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"training failed: exit codes {codes}")
    return time.perf_counter() - start


def harness_and_bare_step_seconds(scenario) -> tuple[float, float, float]:
    """Seconds per step of the harness (``train``'s training steps, evaluation excluded) and of
    the bare loop, trained side by side in one process and one torch thread: after each harness
    step, a callback runs the bare loop's step of the same number. A shared machine's load and
    the caches' state then hit both alike (whole runs one after the other differ by +-20 % here).
    Also returns the run's seconds outside its training steps (data, model set-up, evaluations)."""
    from pytest_spikecheck import train

    bare = UserLoop(scenario, recorded=False)
    bare_seconds: list[float] = []
    run = train(scenario, threads=1, callbacks=[lambda ctx: bare_seconds.append(bare.step(ctx.step))])
    outside_steps = run.meta["seconds"] - run.meta["train_seconds"] - sum(bare_seconds)  # data, model, evals
    return run.meta["train_seconds"] / len(run), sum(bare_seconds) / len(bare_seconds), outside_steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--no-pair", action="store_true", help="measure the harness overhead only")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    from pytest_spikecheck import Scenario, train

    scenario = Scenario.from_yaml(ROOT / "experiments" / "19-control")
    train(scenario.replace(steps=20, breaks=()))  # warm the tokenizer cache and torch's kernels (no burst: 20 steps)

    pairs, harness, bare, outside = [], [], [], []
    if not args.no_pair:
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(args.repeats):
                pairs.append(pair_wall_time(Path(tmp)))
    for _ in range(args.repeats):
        h, b, o = harness_and_bare_step_seconds(scenario)
        harness.append(h)
        bare.append(b)
        outside.append(o)
    ratios = [h / b for h, b in zip(harness, bare)]
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "torch": __import__("torch").__version__,
        "pair_wall_seconds": pairs,
        "harness_ms_per_step": [1e3 * h for h in harness],
        "bare_ms_per_step": [1e3 * b for b in bare],
        "harness_over_bare_per_run": ratios,
        "harness_over_bare": statistics.median(ratios),
        "outside_training_steps_seconds_per_run": outside,
    }
    if pairs:
        print(f"pair wall time (2 parallel 1-thread processes): median {statistics.median(pairs):.2f} s "
              f"[{min(pairs):.2f}–{max(pairs):.2f}] over {len(pairs)}")
    print(f"harness {statistics.median(result['harness_ms_per_step']):.2f} ms/step vs bare loop "
          f"{statistics.median(result['bare_ms_per_step']):.2f} ms/step, steps alternating in one process: "
          f"median ratio {result['harness_over_bare']:.3f}x over {args.repeats} runs "
          f"[{min(ratios):.3f}–{max(ratios):.3f}]")
    print(f"outside the training steps (data, model set-up, evaluations): "
          f"{statistics.median(outside):.2f} s per run")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
