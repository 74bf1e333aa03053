"""The ``spikecheck`` command line: train, compare, diagnose, search, check (a training log), sweep, preflight.

Errors a user can fix (a bad config key, an unknown break, a negative clip, a missing
directory) print one line ``spikecheck: error: ...`` and exit with status 2, no traceback.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any, Sequence

from pytest_spikecheck import __version__
from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.scenario.sections import check_max_norm


EXIT_USAGE = 2


def _grad_clip(text: str) -> float | None:
    if text.lower() in ("inf", "none", "null", "off"):
        return None
    try:
        return check_max_norm(float(text), "--grad-clip")
    except ValueError as exc:  # not a number, or ConfigError: the one rule of a clip limit
        raise argparse.ArgumentTypeError(
            str(exc) if isinstance(exc, ConfigError) else f"expected a number, inf or none, was {text!r}"
        ) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, was {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, was {text!r}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, was {text!r}") from None


def default_run_dir(config: Path) -> Path:
    """Where ``train`` writes when no ``--out`` is given: ``<experiment dir>/run``."""
    return (config if config.is_dir() else config.parent) / "run"


def cmd_train(args: argparse.Namespace) -> int:
    from pytest_spikecheck.scenario import Scenario

    from pytest_spikecheck.records.run import TRAINER_NAMES, recorded_by

    config = Path(args.config)
    trainer = recorded_by(config) if config.is_dir() else None
    if trainer is not None:  # its config is the user's trainer's, not a scenario we could train
        who = TRAINER_NAMES.get(trainer, trainer) + ("" if trainer == "loop" else " run")
        raise ConfigError(
            f"{config}: recorded from {who}; retrain it with your trainer "
            f"(spikecheck train trains scenarios: a config.yaml or an experiment directory)"
        )
    scenario = Scenario.from_yaml(config)
    changes = {}
    if args.seed is not None:
        changes["seed"] = args.seed
    if args.steps is not None:
        changes["steps"] = args.steps
    if args.grad_clip is not False:
        changes["optimizer__grad_clip"] = args.grad_clip
    scenario = scenario.replace(**changes) if changes else scenario
    out = Path(args.out) if args.out else default_run_dir(config)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is an existing file; the run is a folder: give a folder path")
    source = config / "config.yaml" if config.is_dir() else config
    if (out / "config.yaml").exists() and (out / "config.yaml").resolve() == source.resolve():
        raise ConfigError(
            f"--out {out} is the folder of the config it trains ({source}); the run would replace that "
            f"file: give another folder (the default is {default_run_dir(config)})"
        )

    from pytest_spikecheck.training.launch import train  # refuses an unusable device or backend first

    from pytest_spikecheck.progress import Progress
    from pytest_spikecheck.training.distributed import DistributedError

    # A bar (steps, ETA, loss) on a terminal; elsewhere the result line below is the one line of
    # this scenario. With several ranks the loop runs in other processes: no bar.
    progress = Progress(sys.stderr, mode="quiet" if args.quiet or args.nproc > 1 else "auto", leave=False)
    with progress.task(scenario.name, total=scenario.steps) as task:
        try:
            run = train(
                scenario,
                backend=args.backend,
                device=args.device,
                threads=args.threads,
                callbacks=[task.step_callback()] if progress.mode == "bar" else [],
                nproc=args.nproc,
            )
        except DistributedError as exc:  # a rank crashed: one line, then the rank's traceback
            print(f"spikecheck: error: {exc}", *getattr(exc, "__notes__", ()), sep="\n", file=sys.stderr)
            return 1
        task.finish()
    clip = "inf" if math.isinf(run.scenario.max_norm) else f"{run.scenario.max_norm:g}"
    nproc = f" --nproc {args.nproc}" if args.nproc > 1 else ""
    run.meta["reproduce"] = (
        f"spikecheck train {config} --seed {run.scenario.seed} --grad-clip {clip} --steps {run.scenario.steps}{nproc} --out {out}"
    )
    run.save(out)
    from pytest_spikecheck.judge.analysis import EventSummary
    from pytest_spikecheck.judge.text import fmt, fmt_measure

    bursts = run.declared_events
    s = EventSummary.measure(run.metrics, bursts[0] if bursts else None)
    status = f"stopped at step {run.meta['stopped_at']} ({run.meta['stop_reason']})" if run.stopped_early else f"{len(run)} steps"
    ranks = f" on {args.nproc} ranks" if args.nproc > 1 else ""
    print(
        f"{run.name}: {status} in {run.meta['seconds']:.1f}s{ranks}, backend {run.meta['backend']}; "
        f"largest event at step {fmt(s.step)}: ratio {fmt_measure(s.ratio, '.1f')}×, post-clip norm {fmt(s.post_clip_at_step)}, "
        f"final eval loss {fmt_measure(s.final_eval, '.3f')} → {out}"
    )
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from pytest_spikecheck.report import write_comparison
    from pytest_spikecheck.records.run import Run, resolve_run_dir

    run_a, run_b = Run.load(resolve_run_dir(args.run_a)), Run.load(resolve_run_dir(args.run_b))
    result, files = write_comparison(run_a, run_b, args.out, step=args.step)
    print(result.text())
    print("\nwrote " + ", ".join(str(f) for f in files))
    return 0


def cmd_diagnose(args: argparse.Namespace) -> int:
    from pytest_spikecheck.judge.diagnosis import diagnose
    from pytest_spikecheck.records.run import Run, resolve_run_dir

    run = Run.load(resolve_run_dir(args.run))
    if args.step is not None and not (run.steps == args.step).any():
        raise ConfigError(f"step {args.step} is not in the run (it covers 1–{int(run.steps[-1])})")
    print(run.describe())
    print(diagnose(run, args.step).text())
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    from pytest_spikecheck.scenario import Scenario
    from pytest_spikecheck.fuzz.search import find_worst_batch

    scenario = Scenario.from_yaml(Path(args.config))
    if args.seed is not None:
        scenario = scenario.replace(seed=args.seed)
    try:
        result = find_worst_batch(scenario, args.at_step, max_examples=args.max_examples, seed=args.search_seed)
    except ImportError as exc:  # Hypothesis is an optional dependency: one line, not a traceback
        raise ConfigError(str(exc)) from None
    print(result.text())
    return 0


# ``check`` lives in its own module (cli/check.py); its names stay importable from here.
from pytest_spikecheck.cli.check import EXIT_FOUND, EXIT_NOT_JUDGED, check_record, cmd_check  # noqa: E402,F401


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spikecheck", description="Reproduce gradient spikes on tiny LMs and check the defences."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("train", help="train a scenario (YAML file or experiment dir) and write its run folder")
    p.add_argument("config", metavar="CONFIG_OR_DIR", help="a config.yaml or an experiment directory holding one")
    p.add_argument("--seed", type=_int, default=None, metavar="N", help="override the scenario's seed")
    p.add_argument(
        "--grad-clip",
        type=_grad_clip,
        default=False,
        metavar="X|inf|none",
        help="override optimizer.grad_clip (inf or none = no clipping)",
    )
    p.add_argument("--steps", type=_positive_int, default=None, metavar="N", help="override the number of steps")
    p.add_argument("--out", default=None, metavar="DIR", help="run folder to write. Default: <experiment dir>/run")
    p.add_argument(
        "--backend",
        default="auto",
        choices=["auto", "torch", "cupy", "emulator"],
        help="clipping backend. Default: %(default)s (cupy when a CUDA device is usable)",
    )
    p.add_argument(
        "--device", default="cpu", metavar="DEVICE", help="torch device to train on (cpu, cuda, auto). Default: %(default)s"
    )
    p.add_argument(
        "--threads",
        type=_positive_int,
        default=1,
        metavar="N",
        help="torch threads (per rank), pinned for bit-identical reruns. Default: %(default)s",
    )
    p.add_argument(
        "--nproc",
        type=_positive_int,
        default=1,
        metavar="N",
        help="train on N processes with torch.distributed (gloo on CPU, NCCL with one GPU per rank), "
        "gradients and AdamW state sharded across them; rank 0 writes the run. Default: %(default)s",
    )
    p.add_argument(
        "--quiet", action="store_true", help="no progress bar (a bar is drawn on a terminal only, never with --nproc > 1)"
    )
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("compare", help="compare two runs: panels and a table of spike, jump, recovery")
    p.add_argument("run_a", metavar="DIR_A", help="run folder (or experiment dir with run/), e.g. the control")
    p.add_argument("run_b", metavar="DIR_B", help="run folder (or experiment dir with run/), e.g. the break")
    p.add_argument("--out", default="spikecheck-compare", metavar="DIR", help="where to write the panels. Default: %(default)s")
    p.add_argument(
        "--step",
        type=_positive_int,
        default=None,
        metavar="N",
        help="the event step to measure. Default: the declared burst, else the largest spike",
    )
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("diagnose", help="walk the diagnostic ladder at a spike of a run")
    p.add_argument("run", metavar="RUN_DIR", help="run folder (or experiment dir with run/)")
    p.add_argument(
        "--step",
        type=_positive_int,
        default=None,
        metavar="N",
        help="the step to diagnose. Default: the largest pre-clip grad-norm spike",
    )
    p.set_defaults(func=cmd_diagnose)

    from pytest_spikecheck.fuzz.search import DEFAULT_MAX_EXAMPLES as DEFAULT_SEARCH_EXAMPLES

    p = sub.add_parser(
        "search",
        help="find the batch composition that would spike a step the most (Hypothesis)",
        description="Train the scenario to just before step S once, then search the pool for the batch "
        "of S with the largest pre-clip grad-norm ratio, shrink it to the samples that "
        "matter, and print them with their token losses.",
    )
    p.add_argument("config", metavar="CONFIG_OR_DIR", help="a config.yaml or an experiment directory holding one")
    p.add_argument("--at-step", type=_positive_int, required=True, metavar="S", help="the step whose batch is searched")
    p.add_argument(
        "--max-examples",
        type=_positive_int,
        default=DEFAULT_SEARCH_EXAMPLES,
        metavar="N",
        help="Hypothesis examples (probes) of the climb. Default: %(default)s",
    )
    p.add_argument("--seed", type=_int, default=None, metavar="N", help="override the scenario's seed (as train)")
    p.add_argument(
        "--search-seed",
        type=_int,
        default=0,
        metavar="N",
        help="seed of the search itself (same seed, same result). Default: %(default)s",
    )
    p.set_defaults(func=cmd_search)

    from pytest_spikecheck.cli.check import add_parser as add_check_parser

    add_check_parser(sub)
    from pytest_spikecheck.cli.sweep import add_parser as add_sweep_parser

    add_sweep_parser(sub, _positive_int)
    from pytest_spikecheck.cli.preflight import add_parser as add_preflight_parser

    add_preflight_parser(sub, _positive_int)
    return parser


class _EscapedStdout:
    """Standard output with every control character from data shown escaped (a log key, a run's
    name or a token string that holds a terminal escape sequence never reaches the terminal)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        from pytest_spikecheck.judge.escape import terminal_text

        return self.stream.write(terminal_text(text, lines=True))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    stdout, sys.stdout = sys.stdout, _EscapedStdout(sys.stdout)
    try:
        return args.func(args)
    except (ConfigError, ValueError, NotImplementedError) as exc:
        from pytest_spikecheck.judge.escape import terminal_text

        print(f"spikecheck: error: {terminal_text(exc, lines=True)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("spikecheck: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into head/less that closed early
        sys.stderr.close()
        return 0
    finally:
        sys.stdout = stdout
