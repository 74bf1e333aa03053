"""Phase-19 wall-time benchmark (a script, not a test): writes the numbers in docs/benchmarks.md.

    python benchmarks/bench_phase19.py [--repeats 3] [--json out.json]

1. The pair: `spikecheck train` of 19-control and 19-break-no-clip as two parallel 1-thread
   processes, wall time from launch to both exiting (what `make demo` does before compare).
2. Harness overhead: the engine's time per training step (forward, backward, clip, AdamW,
   recording; evaluation excluded and reported separately) against a bare loop on the same
   model, batches, optimizer and clip (torch.nn.utils.clip_grad_norm_) with no recording.
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


def bare_loop_step_seconds(scenario) -> float:
    """The same training with nothing recorded: the floor the harness is compared against."""
    import torch

    from pytest_spikecheck.data.dataset import build_dataset
    from pytest_spikecheck.data.samplers import plan_batches
    from pytest_spikecheck.training.build import build_model, build_optimizer
    from pytest_spikecheck.training.schedule import lr_at

    torch.set_num_threads(1)
    r = scenario.resolved()
    data = build_dataset(r)
    plan = plan_batches(r.sampler, steps=r.steps, seed=r.seed, n_corpus=data.n_corpus,
                        burst_members=data.burst_members, is_rare=data.is_rare)
    torch.manual_seed(r.seed)
    model = build_model(r, data.tokenizer.vocab_size)
    opt = build_optimizer(model, r)
    inputs, targets = torch.from_numpy(data.train.inputs), torch.from_numpy(data.train.targets)
    start = time.perf_counter()
    for step in range(1, r.steps + 1):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, base_lr=r.optimizer.lr, total_steps=r.steps, spec=r.schedule)
        idx = torch.tensor(plan[step - 1])
        _, loss = model(inputs[idx], targets[idx])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), r.max_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return (time.perf_counter() - start) / r.steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    from pytest_spikecheck import Scenario, train

    scenario = Scenario.from_yaml(ROOT / "experiments" / "19-control")
    train(scenario.replace(steps=20, breaks=()))  # warm the tokenizer cache and torch's kernels (no burst: 20 steps)

    pairs, harness, bare, evals = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            pairs.append(pair_wall_time(Path(tmp)))
    for _ in range(args.repeats):
        run = train(scenario, threads=1)
        harness.append(run.meta["train_seconds"] / len(run))
        n_evals = int((~__import__("numpy").isnan(run["eval_loss"])).sum())
        evals.append((run.meta["seconds"] - run.meta["train_seconds"], n_evals))
        bare.append(bare_loop_step_seconds(scenario))
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "torch": __import__("torch").__version__,
        "pair_wall_seconds": pairs,
        "harness_ms_per_step": [1e3 * h for h in harness],
        "bare_ms_per_step": [1e3 * b for b in bare],
        "harness_over_bare": statistics.median(harness) / statistics.median(bare),
        "harness_over_bare_min": min(harness) / min(bare),
        "eval_and_setup_seconds_per_run": [e for e, _ in evals],
        "evals_per_run": evals[0][1],
    }
    print(f"pair wall time (2 parallel 1-thread processes): median {statistics.median(pairs):.2f} s "
          f"[{min(pairs):.2f}–{max(pairs):.2f}] over {len(pairs)}")
    print(f"harness {statistics.median(result['harness_ms_per_step']):.2f} ms/step vs bare loop "
          f"{statistics.median(result['bare_ms_per_step']):.2f} ms/step (medians over {args.repeats} interleaved runs): "
          f"{result['harness_over_bare']:.3f}x; fastest run of each: {min(result['harness_ms_per_step']):.2f} vs "
          f"{min(result['bare_ms_per_step']):.2f} ms/step, {result['harness_over_bare_min']:.3f}x")
    print(f"outside the training steps (data, model set-up, {result['evals_per_run']} evals of 96 sentences): "
          f"{statistics.median(result['eval_and_setup_seconds_per_run']):.2f} s per run")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
