"""What the measurement scripts share: each one's grid is a sweep file in experiments/sweeps/,
trained through the sweep engine (pytest_spikecheck.sweep: local or Ray, kept in the run store,
resumed), and the script measures what its docs table needs from the runs. Import it from a
script in scripts/."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SWEEPS = ROOT / "experiments" / "sweeps"


def seed_range(text: str) -> list[int]:
    """``"0-9"`` -> 0..9; ``"1,5,7"`` -> those seeds."""
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",")]


def add_sweep_arguments(parser: argparse.ArgumentParser, seeds: bool = True) -> None:
    """The engine's options, as ``spikecheck sweep`` spells them, and ``--seeds`` (replacing a
    sweep file's seed axis) for the scripts whose grid is a file."""
    if seeds:
        parser.add_argument("--seeds", default=None, help="replace the sweep file's seed axis, e.g. 0-2 or 0,5")
    parser.add_argument("--executor", default="local", choices=("local", "ray"))
    parser.add_argument("--address", default=None, help="with --executor ray: auto or ray://HOST:10001")
    parser.add_argument("--jobs", type=int, default=2, help="points at a time (default 2)")
    parser.add_argument(
        "--runs",
        default=str(ROOT / "out" / "sweeps"),
        metavar="DIR",
        help="where each sweep file gets its folder DIR/<file stem>/ (runs/, run store, sweep.md). "
        "Default: out/sweeps, as `spikecheck sweep`, so either resumes the other",
    )
    parser.add_argument("--fresh", action="store_true", help="ignore the run store: train every point again")


def run_sweep(name: str, args: argparse.Namespace, recipes: list[str] | None = None) -> Any:
    """Train ``experiments/sweeps/<name>.yaml`` (its seeds replaced by ``--seeds``, only the
    ``recipes`` named when given) and return the
    :class:`~pytest_spikecheck.sweep.SweepResult`; a failed point stops the script (its numbers
    would be missing from the table)."""
    from pytest_spikecheck.sweep import load_sweep, sweep

    plan = load_sweep(SWEEPS / f"{name}.yaml")
    if args.seeds:  # replaced through the Sweep's own checks (a file whose points name seeds refuses it)
        plan = dataclasses.replace(plan, grid={**plan.grid, "seed": seed_range(args.seeds)})
    if recipes is not None:
        plan = dataclasses.replace(plan, recipes={recipe: plan.recipes[recipe] for recipe in recipes})
    out = Path(args.runs) / name
    result = sweep(plan, executor=args.executor, address=args.address, jobs=args.jobs, out=out, fresh=args.fresh)
    if result.failed:
        raise SystemExit(f"{len(result.failed)} points failed, first {result.failed[0]['point']}: {result.failed[0]['error']}")
    return result
