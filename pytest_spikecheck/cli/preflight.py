"""``spikecheck preflight CONFIG.json --recipe RECIPE.yaml``: will this Hugging Face model
config stay stable at scale with this recipe, and which defence does it need?
(:mod:`pytest_spikecheck.preflight`, docs/preflight.md)

Exit 0: the study trained (or came from the run store) and the verdict is written; 1: a point
failed to train (the others ran, the outputs are written); 2: a bad config, recipe or option
(one line, before anything trains); 130: interrupted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pytest_spikecheck.errors import ConfigError

EXIT_FAILED_POINTS = 1
EXIT_INTERRUPTED = 130


def _list(kind: Any) -> Any:
    def parse(text: str) -> list:
        try:
            return [kind(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {kind.__name__}s, was {text!r}") from None

    return parse


def _words(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def default_out(config: Path) -> Path:
    """Where ``preflight`` writes when no ``--out`` is given: ``out/preflight/<config's folder or stem>``."""
    name = config.parent.name if config.name == "config.json" and config.parent.name else config.stem
    return Path("out") / "preflight" / (name or "config")


def cmd_preflight(args: argparse.Namespace) -> int:
    from pytest_spikecheck import preflight as pf
    from pytest_spikecheck.sweep import SweepInterrupted, make_executor

    options = {
        k: v
        for k, v in {
            "widths": args.widths,
            "lr_factors": args.lr_factors,
            "defences": args.defences,
            "seeds": args.seeds,
            "corpora": args.corpora,
            "steps": args.steps,
            "head_dim": args.head_dim,
        }.items()
        if v is not None
    }
    study, lines = pf.plan(
        args.config,
        args.recipe,
        allow_untested=args.allow_untested_transformers,
        quick=args.quick,
        layers=args.layers,
        heads=args.heads,
        **options,
    )
    print("\n".join(lines))
    if args.plan_only:
        return 0
    if args.address is not None and args.executor != "ray":
        raise ConfigError("--address joins a Ray cluster: use it with --executor ray")
    make_executor(args.executor, jobs=args.jobs, address=args.address)  # no Ray: one line, before anything trains
    out = Path(args.out) if args.out else default_out(Path(args.config))
    try:
        result = pf.preflight(
            study.config,
            study.recipe,
            executor=args.executor,
            jobs=args.jobs,
            address=args.address,
            out=out,
            fresh=args.fresh,
            allow_untested=args.allow_untested_transformers,
            quick=args.quick,
            layers=args.layers,
            heads=args.heads,
            **options,
        )
    except SweepInterrupted as stopped:
        print(f"spikecheck: interrupted: kept {stopped.result.counts_text()} → {out}/sweep", file=sys.stderr)
        return EXIT_INTERRUPTED
    print("\nverdict:\n" + "\n".join(f"  {line}" for line in result.lines()))
    failed = [r for r in result.rows if r["status"] == "failed"]
    for row in failed:
        print(
            f"failed: width {row['width']} lr {row['lr']:g} {row['defence']} seed {row['seed']}: {row['error']}", file=sys.stderr
        )
    print(
        f"\n{len(result.rows)} points ({result.counts}) in {result.wall_seconds:.0f} s "
        f"→ {out}/preflight.md, preflight.json, index.html, sweep/"
    )
    return EXIT_FAILED_POINTS if failed else 0


def add_parser(sub: Any, positive_int: Any) -> None:
    p = sub.add_parser(
        "preflight",
        help="will a Hugging Face config.json stay stable at scale with your recipe, and which defence does it need",
        description="Read CONFIG.json (offline), build proxies of it at a few widths with transformers' "
        "own classes, train each at an LR grid around the recipe's LR with and without each "
        "defence (qk-norm, QK-Clip, z-loss, clipping) on two corpora through the sweep "
        "engine, and write the verdict: DIR/preflight.md, preflight.json, index.html. "
        "docs/preflight.md has the scaling rule, the study and the failure criterion.",
    )
    p.add_argument("config", metavar="CONFIG.json", help="a Hugging Face config.json (or the folder holding it)")
    p.add_argument(
        "--recipe",
        required=True,
        metavar="RECIPE.yaml",
        help="the optimizer recipe: its own keys or TrainingArguments keys (docs/preflight.md)",
    )
    p.add_argument(
        "--widths",
        type=_list(int),
        default=None,
        metavar="W,W,...",
        help="proxy widths, increasing. Default: 64,128,256,512 up to the config's (--quick: the two smallest)",
    )
    p.add_argument(
        "--head-dim", type=positive_int, default=None, metavar="N", help="the proxies' head size. Default: the config's"
    )
    p.add_argument(
        "--heads",
        choices=["scale", "keep"],
        default="scale",
        help="scale: head_dim kept, heads grow with width; keep: the config's head counts. Default: %(default)s",
    )
    p.add_argument("--layers", type=positive_int, default=2, metavar="N", help="proxy depth. Default: %(default)s")
    p.add_argument(
        "--lr-factors",
        type=_list(float),
        default=None,
        metavar="F,F,...",
        help="the LR grid as factors of the recipe's LR. Default: 1/8,1/4,...,8 (--quick: 1,2,4)",
    )
    p.add_argument(
        "--defences",
        type=_words,
        default=None,
        metavar="D,D,...",
        help="as-given, qk-norm, qk-clip, z-loss, clip-1. Default: all that apply (--quick: as-given,qk-norm)",
    )
    p.add_argument("--seeds", type=_list(int), default=None, metavar="S,S,...", help="Default: 0,1,2 (--quick: 0)")
    p.add_argument("--corpora", type=_words, default=None, metavar="C,C", help="phase19, induction. Default: both")
    p.add_argument(
        "--steps", type=positive_int, default=None, metavar="N", help="training steps per point. Default: 150 (--quick: 100)"
    )
    p.add_argument("--quick", action="store_true", help="the documented subset (docs/preflight.md): <= 15 min on 2 cores")
    p.add_argument("--executor", default="local", choices=["local", "ray"], help="Default: %(default)s")
    p.add_argument("--address", default=None, metavar="ADDR", help="with --executor ray: 'auto' or ray://HOST:10001")
    p.add_argument("--jobs", type=positive_int, default=None, metavar="N", help="points at a time. Default: the CPUs")
    p.add_argument("--out", default=None, metavar="DIR", help="output folder. Default: out/preflight/<config>")
    p.add_argument("--fresh", action="store_true", help="ignore the run store: train every point again")
    p.add_argument("--plan-only", action="store_true", help="print the scaling rule and the plan, train nothing")
    p.add_argument(
        "--allow-untested-transformers",
        action="store_true",
        help="build the proxies with a transformers version other than the one tested (5.24.0)",
    )
    p.set_defaults(func=cmd_preflight)
