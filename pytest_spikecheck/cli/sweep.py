"""``spikecheck sweep SWEEP.yaml``: a sweep file trained through the sweep engine
(:mod:`pytest_spikecheck.sweep`), locally or on Ray, resumed from its run store.

Exit 0: every point trained or came from the store; 1: a point failed (the others still ran,
the outputs are written); 2: the sweep file or an option is wrong (one line, before anything
trains); 130: interrupted (the finished points are kept and written).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pytest_spikecheck.errors import ConfigError

#: Exit status when a point failed (the others trained and the outputs are written).
EXIT_FAILED_POINTS = 1
EXIT_INTERRUPTED = 130


def default_out(sweep_file: Path) -> Path:
    """Where ``sweep`` writes when no ``--out`` is given: ``out/sweeps/<file stem>``."""
    return Path("out") / "sweeps" / sweep_file.stem


def cmd_sweep(args: argparse.Namespace) -> int:
    from pytest_spikecheck.sweep import SweepInterrupted, load_sweep, make_executor, sweep

    plan = load_sweep(args.sweep)  # every point checked, nothing trained yet
    if args.address is not None and args.executor != "ray":
        raise ConfigError("--address joins a Ray cluster: use it with --executor ray")
    executor = make_executor(args.executor, jobs=args.jobs, address=args.address)  # no Ray: one line, here
    out = Path(args.out) if args.out else default_out(Path(args.sweep))
    try:
        result = sweep(plan, executor=executor, out=out, fresh=args.fresh)
    except SweepInterrupted as stopped:
        print(f"spikecheck: interrupted: kept {stopped.result.counts_text()} → {out}", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(result.summary_table())
    lrs = result.lr_sensitivity_table()
    if lrs:
        print("\nLR sensitivity (nats), median [min–max] over seeds:\n" + lrs)
    for row in result.failed:
        print(f"failed: {row['point']}: {row['error']}", file=sys.stderr)
    print(
        f"\n{len(result.rows)} points ({result.counts_text()}) in {result.wall_seconds:.0f} s, {result.executor} "
        f"→ {out}/sweep.md, sweep.csv, sweep.json, runs/"
    )
    return EXIT_FAILED_POINTS if result.failed else 0


def add_parser(sub: Any, positive_int: Any) -> None:
    p = sub.add_parser(
        "sweep",
        help="train a sweep file's grid (locally or on Ray), resumed from its run store",
        description="Expand SWEEP.yaml (a base scenario, a grid of dotted field paths, explicit "
        "points, recipes of breaks), check every point, train the points the run store "
        "does not hold yet, and write DIR/runs/<point>/, sweep.csv, sweep.json, sweep.md "
        "and the panels. Exit 0: all points ran; 1: a point failed (the others ran); "
        "2: a bad sweep file or option; 130: interrupted (finished points kept).",
    )
    p.add_argument("sweep", metavar="SWEEP.yaml", help="the sweep file (see README, 'Sweeps')")
    p.add_argument(
        "--executor",
        default="local",
        choices=["local", "ray"],
        help="local: spawned 1-thread worker processes; ray: a Ray task per point. Default: %(default)s",
    )
    p.add_argument(
        "--address",
        default=None,
        metavar="ADDR",
        help="with --executor ray: 'auto' (the cluster this machine is in) or ray://HOST:10001. Default: start a local Ray",
    )
    p.add_argument(
        "--jobs",
        type=positive_int,
        default=None,
        metavar="N",
        help="points at a time. Default: local, the number of CPUs; ray, as many as the cluster takes",
    )
    p.add_argument("--out", default=None, metavar="DIR", help="output folder. Default: out/sweeps/<SWEEP file stem>")
    p.add_argument("--fresh", action="store_true", help="ignore the run store: train every point again")
    p.set_defaults(func=cmd_sweep)
