"""What the framework-free recorder costs a user's loop (a script, not a test): the numbers in
docs/benchmarks.md ("Recording your own loop").

    OMP_NUM_THREADS=1 python benchmarks/bench_recorder.py [--repeats 9] [--json out.json]

The Phase-19 control (micro GPT, batch 8, AdamW, clip 1.0, 500 steps, no burst) trained by a
bare loop, and by the same loop with ``pytest_spikecheck.record`` around its clip and at the
end of each step (logits and targets handed over, batch indices, catalog). No step is an event
(no burst; the spike trigger set out of reach), so this is the cost outside event steps: two
norm passes over the gradients (pre- and post-clip), Σv of Adam, the batch indices and one row.
The bare and the recorded loop train side by side in one process, one torch thread, their
steps alternating (a shared machine's load then slows both alike); the ratio of medians over
the repeats is the number. ``--parts`` also times each recorder call in place (one more
paired run, ``perf_counter`` around ``before_clip``, ``after_clip``, the optimizer step hook that
measures the post-clip norm, ``step`` and the Σv read).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class UserLoop:
    """One user loop (model, optimizer, batches), recorded or not, stepped one step at a time."""

    def __init__(self, scenario, *, recorded: bool) -> None:
        import torch

        from pytest_spikecheck import SampleCatalog, record
        from pytest_spikecheck.data.dataset import build_dataset
        from pytest_spikecheck.data.samplers import plan_batches
        from pytest_spikecheck.training.build import build_model
        from pytest_spikecheck.training.optimizers import build_optimizer

        r = self.r = scenario.resolved()
        data = build_dataset(r)
        self.plan = plan_batches(
            r.sampler, steps=r.steps, seed=r.seed, n_corpus=data.n_corpus, burst_members=data.burst_members, is_rare=data.is_rare
        )
        torch.manual_seed(r.seed)
        self.model = build_model(r, data.tokenizer.vocab_size)
        self.opt = build_optimizer(self.model, r)
        self.inputs, self.targets = torch.from_numpy(data.train.inputs), torch.from_numpy(data.train.targets)
        self.rec = None
        if recorded:
            catalog = SampleCatalog.from_tokens(
                list(data.train.targets),
                vocab_size=data.tokenizer.vocab_size,
                ids=[s.id for s in data.pool],
                token_str=data.tokenizer.token,
            )
            self.rec = record(self.model, self.opt, max_norm=r.max_norm, catalog=catalog, spike_ratio=math.inf)

    def step(self, step: int) -> float:
        import torch

        from pytest_spikecheck.training.schedule import lr_at

        r, opt, rec = self.r, self.opt, self.rec
        start = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, base_lr=r.optimizer.lr, total_steps=r.steps, spec=r.schedule)
        idx = torch.tensor(self.plan[step - 1])
        x, y = self.inputs[idx], self.targets[idx]
        logits, loss = self.model(x, y)
        loss.backward()
        if rec is None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), r.max_norm)
            opt.step()
        else:
            with rec.clipping():
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), r.max_norm)
            opt.step()
            rec.step(loss=loss, batch=self.plan[step - 1], logits=logits, targets=y)
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - start


def paired_run(scenario) -> tuple[float, float]:
    """Seconds per step of the bare and the recorded loop, trained side by side in one process,
    their steps alternating (so a busy neighbour slows both alike)."""
    import torch

    torch.set_num_threads(1)
    bare, recorded = UserLoop(scenario, recorded=False), UserLoop(scenario, recorded=True)
    t_bare = t_rec = 0.0
    for step in range(1, scenario.steps + 1):
        if step % 2:
            t_bare += bare.step(step)
            t_rec += recorded.step(step)
        else:
            t_rec += recorded.step(step)
            t_bare += bare.step(step)
    if recorded.rec.events:
        raise SystemExit("an event step was recorded: this benchmark measures steps outside events")
    return t_bare / scenario.steps, t_rec / scenario.steps


def parts_in_place(scenario) -> dict[str, float]:
    """Milliseconds per step spent in each recorder call, timed inside one paired run."""
    from contextlib import ExitStack
    from unittest import mock

    from pytest_spikecheck.integrations.recorder import Recorder
    from pytest_spikecheck.training.sharding import SingleProcess

    spent: dict[str, float] = {}

    def timed(function, label):
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - start

        return call

    with ExitStack() as patches:
        # The post-clip norm is measured when the optimizer's step returns (its step post-hook).
        for cls, name, label in [
            (Recorder, "before_clip", "before_clip"),
            (Recorder, "after_clip", "after_clip"),
            (Recorder, "_after_optimizer_step", "post-clip (optimizer step hook)"),
            (Recorder, "step", "step"),
            (SingleProcess, "adam_v_sum", "step: sum of v"),
        ]:
            patches.enter_context(mock.patch.object(cls, name, timed(getattr(cls, name), label)))
        paired_run(scenario)
    return {label: 1e3 * seconds / scenario.steps for label, seconds in spent.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--parts", action="store_true", help="also time each recorder call in place")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    from pytest_spikecheck import Scenario

    scenario = Scenario.from_yaml(ROOT / "experiments" / "19-control")
    paired_run(scenario.replace(steps=20, breaks=()))  # warm caches and kernels (no burst: it is past step 20)
    bare, recorded = [], []
    for _ in range(args.repeats):
        b, r = paired_run(scenario)
        bare.append(b)
        recorded.append(r)
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "torch": __import__("torch").__version__,
        "bare_ms_per_step": [1e3 * b for b in bare],
        "recorded_ms_per_step": [1e3 * r for r in recorded],
        "recorded_over_bare": statistics.median(recorded) / statistics.median(bare),
        "recorded_over_bare_min": min(recorded) / min(bare),
    }
    if args.parts:
        result["ms_per_step_in_place"] = parts_in_place(scenario)
        print("in place, ms per step: " + ", ".join(f"{k} {v:.3f}" for k, v in result["ms_per_step_in_place"].items()))
    print(
        f"recorded loop {statistics.median(result['recorded_ms_per_step']):.2f} ms/step vs bare loop "
        f"{statistics.median(result['bare_ms_per_step']):.2f} ms/step (medians over {args.repeats} paired runs, steps alternating): "
        f"{result['recorded_over_bare']:.3f}x; fastest run of each: {min(result['recorded_ms_per_step']):.2f} vs "
        f"{min(result['bare_ms_per_step']):.2f} ms/step, {result['recorded_over_bare_min']:.3f}x"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
