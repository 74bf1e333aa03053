"""Sweep executors against ``train()`` alone (a script, not a test): writes the numbers in
docs/benchmarks.md ("Sweeps").

    python benchmarks/bench_sweep.py [--points 8] [--steps 150] [--model nano] [--repeats 3] [--json docs/bench_sweep.json]

Each round trains the same N points (Phase-19 on the ``--model`` shape, seeds 0..N-1) five ways, one
after the other, the order rotated from round to round so that a shared machine's load hits
them alike:

* ``train()`` alone, one point after the other in this (warm) process: the reference;
* the local executor with 1 job (the points trained in this process through the engine);
* the local executor with 2 jobs (two spawned 1-thread workers);
* the ray executor on a local Ray started for the sweep (``address=None``), 1 CPU, then 2 CPUs.

No outputs and no run store (``out=None``): what is timed is the executor. For each way:
wall time from the call to its return, start-up, per-point overhead and throughput:

* per-point overhead against ``train()`` alone = (wall − reference wall / jobs) / N: what the
  executor adds per point, start-up included, against the ideal of ``jobs`` points at a time
  (it carries the run-to-run noise of the training itself, ±15 % on a shared machine);
* of it, beyond the executor's own runs = (wall − Σ its runs' own ``train()`` seconds / jobs) / N:
  the same without that noise (a fresh worker's first steps count as training here);
* start-up = the time to the first point back minus that point's own ``train()`` time (the
  pool's spawn and the workers' imports, or Ray's start and its workers');
* throughput = N / wall, in points per minute.

The load average before and after each round is recorded beside its numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class _FirstPoint:
    """A quiet progress that notes when the first point came back."""

    def __init__(self) -> None:
        from pytest_spikecheck.progress import Progress, ProgressTask

        first = self
        self.at: float | None = None

        class Task(ProgressTask):
            def update(self, n=1, *, outcome=None, **shown):
                if first.at is None:
                    first.at = time.perf_counter()
                super().update(n, outcome=outcome, **shown)

        class Quiet(Progress):
            def task(self, name, total=None, unit="step"):
                return Task(self, name, total, unit)

        self.progress = Quiet(mode="quiet")


def _reference(scenarios) -> dict:
    from pytest_spikecheck import train

    started = time.perf_counter()
    seconds = [train(s).meta["seconds"] for s in scenarios]
    return {"wall": time.perf_counter() - started, "train_seconds": seconds}


def _executor(plan, executor: str, jobs: int) -> dict:
    from pytest_spikecheck.sweep import sweep

    first = _FirstPoint()
    started = time.perf_counter()
    result = sweep(plan, executor=executor, jobs=jobs, progress=first.progress)
    wall = time.perf_counter() - started
    if result.failed:
        raise SystemExit(f"{executor}: {result.failed[0]['error']}")
    first_seconds = min(r["seconds"] for r in result.rows)  # the earliest back is one of the cheapest
    return {"wall": wall, "startup": first.at - started - first_seconds, "train_seconds": [r["seconds"] for r in result.rows]}


def table(data: dict) -> list[str]:
    """The markdown table of a run of this script (also from its --json: ``--table FILE``)."""
    n, rounds = data["points"], data["rounds"]

    def cell(values, spec):
        return f"{statistics.median(values):{spec}} [{min(values):{spec}}–{max(values):{spec}}]"

    lines = [
        f"{n} points of {data['steps']} steps ({data['model']} Phase-19), {len(rounds)} rounds; median [min–max]",
        "",
        "| executor | wall (s) | start-up (s) | per-point overhead vs train() alone (s) | of it, beyond the executor's "
        "own runs (s) | throughput (points/min) |",
        "|---|---|---|---|---|---|",
    ]
    for label, executor, jobs in WAYS:
        ways = [r["ways"][label] for r in rounds]
        walls = [w["wall"] for w in ways]
        refs = [r["ways"]["train() alone"]["wall"] for r in rounds]
        against = [(w - ref / jobs) / n for w, ref in zip(walls, refs)]
        # what the executor adds beyond the runs it trained (their own train() time, in the workers)
        beyond = [(w["wall"] - sum(w["train_seconds"]) / jobs) / n for w in ways]
        rates = [60 * n / w for w in walls]
        startup = cell([w["startup"] for w in ways], ".1f") if executor else "—"
        lines.append(
            f"| {label} | {cell(walls, '.1f')} | {startup} | {cell(against, '.2f') if executor else '—'} | "
            f"{cell(beyond, '.2f') if executor else '—'} | {cell(rates, '.1f')} |"
        )
    loads = ", ".join(f"{r['load_before'][0]:.1f}→{r['load_after'][0]:.1f}" for r in rounds)
    lines += ["", f"load average (1 min) before→after each round: {loads}; {data.get('machine', '?')}, {data['cpus']} CPUs"]
    return lines


WAYS = (
    ("train() alone", None, 1),
    ("local, 1 job", "local", 1),
    ("local, 2 jobs", "local", 2),
    ("ray, 1 CPU", "ray", 1),
    ("ray, 2 CPUs", "ray", 2),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=8)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--model", default="nano", help="a model preset (nano, micro, mini, small)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None, help="write the measurements here")
    parser.add_argument("--table", default=None, metavar="JSON", help="print the table of an earlier --json, train nothing")
    args = parser.parse_args()
    if args.table:
        print("\n".join(table(json.loads(Path(args.table).read_text()))))
        return 0
    from pytest_spikecheck import Scenario
    from pytest_spikecheck.models.config import model_preset
    from pytest_spikecheck.sweep import Sweep

    base = Scenario.preset("phase-19").replace(steps=args.steps, model=model_preset(args.model))
    plan = Sweep(base, grid={"seed": list(range(args.points))}, name="bench")
    scenarios = [p.scenario for p in plan.expand()]
    _reference(scenarios[:1])  # warm this process (torch's first steps) before anything is timed
    rounds = []
    for i in range(args.repeats):
        load_before = os.getloadavg()
        order = WAYS[i % len(WAYS) :] + WAYS[: i % len(WAYS)]
        measured = {}
        for label, executor, jobs in order:
            measured[label] = _reference(scenarios) if executor is None else _executor(plan, executor, jobs)
            print(f"round {i + 1}: {label}: {measured[label]['wall']:.1f} s", file=sys.stderr, flush=True)
        rounds.append({"load_before": load_before, "load_after": os.getloadavg(), "ways": measured})
    data = {
        "date": time.strftime("%Y-%m-%d"),
        "points": args.points,
        "steps": args.steps,
        "model": args.model,
        "rounds": rounds,
        "cpus": os.cpu_count(),
        "machine": platform.processor() or platform.machine(),
    }
    lines = table(data)
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
