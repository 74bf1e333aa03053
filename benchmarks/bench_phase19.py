"""Phase-19 wall-time benchmark (a script, not a test): writes the numbers in docs/benchmarks.md.

    python benchmarks/bench_phase19.py [--repeats 3] [--json out.json]

1. The pair: `spikecheck train` of 19-control and 19-break-no-clip as two parallel 1-thread
   processes, wall time from launch to both exiting (what `make demo` does before compare).
2. Harness overhead: the engine's time per training step (forward, backward, clip, AdamW,
   recording; evaluation excluded and reported separately) against a bare loop on the same
   model, batches, optimizer and clip (torch.nn.utils.clip_grad_norm_) with no recording, their
   steps alternating in one process (``--no-pair`` measures this alone).
3. ``--itemise``: the same ratio with each per-step measurement of the harness patched out in
   turn (model statistics, post-clip norm, Σv, pre-clip per-tensor norms), then all four: what
   each costs in place. ``--batch-size``/``--steps`` measure the ratio at another batch size.
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
from contextlib import ExitStack
from unittest import mock
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_recorder import UserLoop  # noqa: E402  (the bare loop: the same model, batches, optimizer, clip)


def pair_wall_time(out: Path) -> float:
    exe = [sys.executable, "-m", "pytest_spikecheck.cli", "train", "--quiet", "--threads", "1"]
    start = time.perf_counter()
    procs = [
        subprocess.Popen([*exe, str(ROOT / "experiments" / name), "--out", str(out / name)], stdout=subprocess.DEVNULL)
        for name in ("19-control", "19-break-no-clip")
    ]
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


def _without(measurements: tuple[str, ...]) -> ExitStack:
    """Patches that take the named per-step measurements out of the harness (a benchmark's
    switch, never a setting: without them the records are incomplete)."""
    import torch

    from pytest_spikecheck.clipping import clip_grads_
    from pytest_spikecheck.models.gpt import GPT
    from pytest_spikecheck.training.sharding import SingleProcess

    def clip_without_pre_clip_norms(self, max_norm, *, backend, mode):
        self._pre_clip_norms = torch.zeros(len(self._grads()))
        return clip_grads_(self.params, max_norm, backend=backend, mode=mode)

    patches = {
        "model statistics": lambda: mock.patch.object(GPT, "record_stats", property(lambda m: False, lambda m, on: None)),
        "post-clip norm": lambda: mock.patch.object(
            SingleProcess, "grad_norm", lambda self: torch.zeros((), dtype=torch.float64)
        ),
        "sum of v": lambda: mock.patch.object(SingleProcess, "adam_v_sum", lambda self, optimizer: 1.0),
        "pre-clip per-tensor norms": lambda: mock.patch.object(SingleProcess, "clip", clip_without_pre_clip_norms),
    }
    stack = ExitStack()
    for name in measurements:
        stack.enter_context(patches[name]())
    return stack


ITEMS = ("model statistics", "post-clip norm", "sum of v", "pre-clip per-tensor norms")


def itemise(scenario, repeats: int) -> dict[str, dict[str, object]]:
    """The harness/bare ratio (median, and each run's) with each measurement taken out in turn,
    then all of them."""
    out: dict[str, dict[str, object]] = {}
    for label, names in [("harness", ()), *((f"without {n}", (n,)) for n in ITEMS), ("without all four", ITEMS)]:
        with _without(names):
            ratios = [h / b for h, b, _ in (harness_and_bare_step_seconds(scenario) for _ in range(repeats))]
        out[label] = {"median": statistics.median(ratios), "runs": ratios}
        print(f"{label:40s} {statistics.median(ratios):.3f}x  [{min(ratios):.3f}-{max(ratios):.3f}]", flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--no-pair", action="store_true", help="measure the harness overhead only")
    parser.add_argument("--itemise", action="store_true", help="what each per-step measurement costs (no pair)")
    parser.add_argument("--batch-size", type=int, default=None, help="another batch size than Phase-19's 8")
    parser.add_argument("--steps", type=int, default=None, help="fewer steps (the burst is dropped if past the end)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    from pytest_spikecheck import Scenario, train

    scenario = Scenario.from_yaml(ROOT / "experiments" / "19-control")
    if args.batch_size is not None:
        scenario = scenario.replace(sampler__batch_size=args.batch_size)
    if args.steps is not None:
        past_the_end = any(getattr(b, "at_step", 0) > args.steps for b in scenario.breaks)
        scenario = scenario.replace(steps=args.steps, **({"breaks": ()} if past_the_end else {}))
    train(scenario.replace(steps=20, breaks=()))  # warm the tokenizer cache and torch's kernels (no burst: 20 steps)
    if args.itemise:
        result = {
            "date": time.strftime("%Y-%m-%d"),
            "torch": __import__("torch").__version__,
            "batch_size": scenario.resolved().sampler.batch_size,
            "steps": scenario.steps,
            "harness_over_bare": itemise(scenario, args.repeats),
        }
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))
        return 0

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
        print(
            f"pair wall time (2 parallel 1-thread processes): median {statistics.median(pairs):.2f} s "
            f"[{min(pairs):.2f}–{max(pairs):.2f}] over {len(pairs)}"
        )
    print(
        f"harness {statistics.median(result['harness_ms_per_step']):.2f} ms/step vs bare loop "
        f"{statistics.median(result['bare_ms_per_step']):.2f} ms/step, steps alternating in one process: "
        f"median ratio {result['harness_over_bare']:.3f}x over {args.repeats} runs "
        f"[{min(ratios):.3f}–{max(ratios):.3f}]"
    )
    print(f"outside the training steps (data, model set-up, evaluations): {statistics.median(outside):.2f} s per run")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
