"""The ``spikecheck`` command line: train, compare, diagnose, search, check (a training log).

Errors a user can fix (a bad config key, an unknown break, a negative clip, a missing
directory) print one line ``spikecheck: error: ...`` and exit with status 2, no traceback.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from pytest_spikecheck import __version__
from pytest_spikecheck.errors import ConfigError

if TYPE_CHECKING:
    from pytest_spikecheck.records import Record

EXIT_USAGE = 2


def _grad_clip(text: str) -> float | None:
    if text.lower() in ("inf", "none", "null", "off"):
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, inf or none, was {text!r}") from None
    if math.isnan(value) or value < 0:
        raise argparse.ArgumentTypeError(f"max_norm must be >= 0 (or inf/none for no clipping), was {text!r}")
    return value


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

    config = Path(args.config)
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

    from pytest_spikecheck.training.launch import train

    callbacks = []
    bar = None
    if not args.quiet and args.nproc == 1:  # with several ranks the loop runs in other processes
        from tqdm import tqdm

        bar = tqdm(total=scenario.steps, desc=scenario.name, unit="step", file=sys.stderr, leave=False, disable=None)
        def progress(ctx) -> None:
            bar.update(1)
            bar.set_postfix(loss=f"{ctx.row['loss']:.3f}", gnorm=f"{ctx.row['grad_norm_pre']:.2f}", refresh=False)

        callbacks.append(progress)
    from pytest_spikecheck.training.distributed import DistributedError

    try:
        run = train(scenario, backend=args.backend, device=args.device, threads=args.threads, callbacks=callbacks,
                    nproc=args.nproc)
    except DistributedError as exc:  # a rank crashed: one line, then the rank's traceback
        print(f"spikecheck: error: {exc}", *getattr(exc, "__notes__", ()), sep="\n", file=sys.stderr)
        return 1
    finally:
        if bar is not None:
            bar.close()
    clip = "inf" if math.isinf(run.scenario.max_norm) else f"{run.scenario.max_norm:g}"
    nproc = f" --nproc {args.nproc}" if args.nproc > 1 else ""
    run.meta["reproduce"] = (f"spikecheck train {config} --seed {run.scenario.seed} --grad-clip {clip} "
                             f"--steps {run.scenario.steps}{nproc} --out {out}")
    run.save(out)
    from pytest_spikecheck.judge.analysis import EventSummary
    from pytest_spikecheck.judge.text import fmt

    bursts = run.declared_events
    s = EventSummary.measure(run.metrics, bursts[0] if bursts else None)
    status = f"stopped at step {run.meta['stopped_at']} ({run.meta['stop_reason']})" if run.stopped_early else f"{len(run)} steps"
    ranks = f" on {args.nproc} ranks" if args.nproc > 1 else ""
    print(f"{run.name}: {status} in {run.meta['seconds']:.1f}s{ranks}, backend {run.meta['backend']}; "
          f"largest event at step {fmt(s.step)}: ratio {fmt(s.ratio, '.1f')}×, post-clip norm {fmt(s.post_clip_at_step)}, "
          f"final eval loss {fmt(s.final_eval, '.3f')} → {out}")
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
    print(run.scenario.describe())
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


#: ``check`` exits with this when it finds a spike, a non-finite value or an uncontained clip.
EXIT_FOUND = 1
#: ``check``'s detectors unless --detector names others: the published rules that stay quiet
#: on healthy runs. ZClip's z > 2.5 is a clipping rule meant to fire on ~1% of ordinary
#: steps, so it would fail CI on noise; name it to see it.
CHECK_DETECTORS = ("ratio", "llm-foundry", "lightning", "olmo-core", "megatron")
_CHECK_MAX_ROWS = 20  # spike rows printed per metric; --json lists them all


def _max_norm(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, was {text!r}") from None
    if not (0 < value < math.inf):
        raise argparse.ArgumentTypeError(f"max_norm must be a finite number > 0, was {text!r}")
    return value


def _column_mapping(text: str) -> dict[str, str]:
    """``loss=train/loss,grad_norm_pre=grad_norm`` -> ``{"loss": "train/loss", ...}`` (ours=theirs)."""
    mapping = {}
    for pair in text.split(","):
        ours, sep, theirs = (part.strip() for part in pair.partition("="))
        if not (sep and ours and theirs):
            raise argparse.ArgumentTypeError(f"expected OURS=THEIRS[,OURS=THEIRS...] such as loss=train/loss, was {text!r}")
        mapping[ours] = theirs
    return mapping


def check_record(record: Record, detectors: Sequence[str], metrics: Sequence[str] = (), max_norm: float | None = None) -> dict:
    """What ``spikecheck check`` finds in a record, as plain data (``--json`` prints it).

    Every detector runs on every metric (default: the pre-clip grad norm and the loss, those
    the record has); a step flagged by any of them is a spike, listed once with the
    detectors that agree. ``ok`` is False for a spike, a non-finite value in any column, or
    (with ``max_norm``) a post-clip norm above it.
    """
    from pytest_spikecheck.judge.analysis import first_nonfinite, spike_ratio, value_at
    from pytest_spikecheck.judge.assertions import _pick_metric, assert_clip_contains
    from pytest_spikecheck.judge.detectors import get_detector
    from pytest_spikecheck.errors import SpikeCheckError
    from pytest_spikecheck.judge.text import sparkline

    def resolve(name: str) -> str | None:
        try:
            return _pick_metric(record, name)  # the one rule for "grad_norm" standing in for the pre-clip norm
        except SpikeCheckError as exc:
            if metrics:
                raise ConfigError(f"{record.source}: {exc}") from None
            return None

    names = [n for n in (resolve(m) for m in (metrics or ("grad_norm_pre", "loss"))) if n is not None]
    if not names:
        have = ", ".join(k for k in record.metrics if k != "step")
        raise ConfigError(f"{record.source}: no loss or gradient-norm series (it has {have}); "
                          f"name one with --metric or map one with --map loss=COLUMN")
    rules = [get_detector(d) for d in detectors]
    series = []
    for name in dict.fromkeys(names):
        steps, values = record.series(name)
        agreeing: dict[int, list[str]] = {}
        for rule in rules:
            for hit in rule.detect(steps, values):
                agreeing.setdefault(hit.step, []).append(rule.name)
        series.append({"metric": name, "logged": int(steps.size), "sparkline": sparkline(values), "spikes": [
            {"step": step, "value": value_at(record.metrics, name, step),
             "ratio": spike_ratio(record.metrics, step, name), "detectors": found}
            for step, found in sorted(agreeing.items())]})
    first = first_nonfinite(record.metrics, [k for k in record.metrics if k != "step"], record.missing)
    clip = None
    if max_norm is not None:
        clip = {"max_norm": max_norm, "checked": "grad_norm_post" in record.metrics, "ok": True,
                "message": f"post-clip grad norm <= {max_norm:g} at every logged step"}
        if not clip["checked"]:
            clip["message"] = "not checked: the log has no grad_norm_post series"
        else:
            try:
                assert_clip_contains(record, max_norm)
            except SpikeCheckError as exc:
                clip.update(ok=False, message=str(exc).splitlines()[0])
    steps = record.metrics["step"]
    return {
        "log": record.source, "format": record.log_format, "notes": list(record.notes),
        "steps": {"logged": int(steps.size), "first": int(steps[0]), "last": int(steps[-1])},
        "detectors": [{"name": rule.name, "rule": rule.describe()} for rule in rules],
        "series": series,
        "nonfinite": None if first is None else {"step": first[0], "metric": first[1],
                                                 "value": value_at(record.metrics, first[1], first[0])},
        "clip": clip,
        "ok": not any(s["spikes"] for s in series) and first is None and (clip is None or clip["ok"]),
    }


def _check_text(report: dict) -> str:
    from pytest_spikecheck.judge.text import table

    steps = report["steps"]
    lines = [f"{report['log']}: {report['format']}, {steps['logged']} logged steps ({steps['first']}–{steps['last']})"]
    lines += [f"note: {note}" for note in report["notes"]]
    lines.append("detectors: " + ", ".join(d["name"] for d in report["detectors"]))
    for s in report["series"]:
        lines += ["", f"{s['metric']}  {s['sparkline']}"]
        if not s["spikes"]:
            lines.append("  no spike")
            continue
        # A flagged value was logged, so NaN here is a real NaN: printed as such, not as "—".
        rows = [[str(h["step"]), format(h["value"], ".4g"), f"{h['ratio']:.3g}×" if math.isfinite(h["ratio"]) else "—",
                 ", ".join(h["detectors"])]
                for h in s["spikes"][:_CHECK_MAX_ROWS]]
        lines += ["  " + line for line in table(["step", "value", "× baseline", "flagged by"], rows).splitlines()]
        if len(s["spikes"]) > _CHECK_MAX_ROWS:
            lines.append(f"  … and {len(s['spikes']) - _CHECK_MAX_ROWS} more (--json lists them all)")
    bad = report["nonfinite"]
    lines += ["", "non-finite values: " + ("none" if bad is None else f"{bad['metric']} = {bad['value']} at step {bad['step']} (the first)")]
    if report["clip"] is not None:
        lines.append(f"clip containment: {report['clip']['message']}")
    spiky = [s["metric"] for s in report["series"] if s["spikes"]]
    found = ([f"spikes in {', '.join(spiky)}"] if spiky else []) + (["a non-finite value"] if bad else []) + (
        ["an uncontained clip"] if report["clip"] and not report["clip"]["ok"] else [])
    lines.append(f"FOUND {' and '.join(found)} (exit {EXIT_FOUND})" if found else "OK: no spike, every value finite")
    return "\n".join(lines)


def _json_safe(value):
    """Strict JSON: non-finite floats become the strings "NaN", "Infinity", "-Infinity"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def cmd_check(args: argparse.Namespace) -> int:
    import json

    from pytest_spikecheck.records.logs import read_log

    mapping = {k: v for part in args.map for k, v in part.items()}
    record = read_log(args.log, format=args.format, mapping=mapping)
    report = check_record(record, args.detector or CHECK_DETECTORS, args.metric, args.max_norm)
    print(json.dumps(_json_safe(report), indent=2, allow_nan=False, ensure_ascii=False) if args.json else _check_text(report))
    return 0 if report["ok"] else EXIT_FOUND


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spikecheck", description="Reproduce gradient spikes on tiny LMs and check the defences.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("train", help="train a scenario (YAML file or experiment dir) and write its run folder")
    p.add_argument("config", metavar="CONFIG_OR_DIR", help="a config.yaml or an experiment directory holding one")
    p.add_argument("--seed", type=_int, default=None, metavar="N", help="override the scenario's seed")
    p.add_argument("--grad-clip", type=_grad_clip, default=False, metavar="X|inf|none",
                   help="override optimizer.grad_clip (inf or none = no clipping)")
    p.add_argument("--steps", type=_positive_int, default=None, metavar="N", help="override the number of steps")
    p.add_argument("--out", default=None, metavar="DIR", help="run folder to write. Default: <experiment dir>/run")
    p.add_argument("--backend", default="auto", choices=["auto", "torch", "cupy", "emulator"],
                   help="clipping backend. Default: %(default)s (cupy when a CUDA device is usable)")
    p.add_argument("--device", default="cpu", metavar="DEVICE", help="torch device to train on (cpu, cuda, auto). Default: %(default)s")
    p.add_argument("--threads", type=_positive_int, default=1, metavar="N",
                   help="torch threads (per rank), pinned for bit-identical reruns. Default: %(default)s")
    p.add_argument("--nproc", type=_positive_int, default=1, metavar="N",
                   help="train on N processes with torch.distributed (gloo on CPU, NCCL with one GPU per rank), "
                        "gradients and AdamW state sharded across them; rank 0 writes the run. Default: %(default)s")
    p.add_argument("--quiet", action="store_true", help="no progress bar (there is none with --nproc > 1)")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("compare", help="compare two runs: panels and a table of spike, jump, recovery")
    p.add_argument("run_a", metavar="DIR_A", help="run folder (or experiment dir with run/), e.g. the control")
    p.add_argument("run_b", metavar="DIR_B", help="run folder (or experiment dir with run/), e.g. the break")
    p.add_argument("--out", default="spikecheck-compare", metavar="DIR", help="where to write the panels. Default: %(default)s")
    p.add_argument("--step", type=_positive_int, default=None, metavar="N",
                   help="the event step to measure. Default: the declared burst, else the largest spike")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("diagnose", help="walk the diagnostic ladder at a spike of a run")
    p.add_argument("run", metavar="RUN_DIR", help="run folder (or experiment dir with run/)")
    p.add_argument("--step", type=_positive_int, default=None, metavar="N",
                   help="the step to diagnose. Default: the largest pre-clip grad-norm spike")
    p.set_defaults(func=cmd_diagnose)

    from pytest_spikecheck.fuzz.search import DEFAULT_MAX_EXAMPLES as DEFAULT_SEARCH_EXAMPLES

    p = sub.add_parser("search", help="find the batch composition that would spike a step the most (Hypothesis)",
                       description="Train the scenario to just before step S once, then search the pool for the batch "
                                   "of S with the largest pre-clip grad-norm ratio, shrink it to the samples that "
                                   "matter, and print them with their token losses.")
    p.add_argument("config", metavar="CONFIG_OR_DIR", help="a config.yaml or an experiment directory holding one")
    p.add_argument("--at-step", type=_positive_int, required=True, metavar="S", help="the step whose batch is searched")
    p.add_argument("--max-examples", type=_positive_int, default=DEFAULT_SEARCH_EXAMPLES, metavar="N",
                   help="Hypothesis examples (probes) of the climb. Default: %(default)s")
    p.add_argument("--seed", type=_int, default=None, metavar="N", help="override the scenario's seed (as train)")
    p.add_argument("--search-seed", type=_int, default=0, metavar="N",
                   help="seed of the search itself (same seed, same result). Default: %(default)s")
    p.set_defaults(func=cmd_search)

    from pytest_spikecheck.judge.detectors import DETECTORS
    from pytest_spikecheck.records.logs import FORMATS

    p = sub.add_parser("check", help="find spikes and non-finite values in a training log (exit 1 if any)",
                       description="Read a trainer_state.json, Lightning metrics.csv, TensorBoard events, CSV or "
                                   "JSONL log; print the spikes each detector finds. Exit 0: clean; 1: a spike, a "
                                   "non-finite value or an uncontained clip; 2: the log or an option is wrong.")
    p.add_argument("log", metavar="LOG", help="a log file, or a folder holding one (TensorBoard event files, a run)")
    p.add_argument("--detector", action="append", choices=list(DETECTORS), metavar="NAME",
                   help=f"a detector to run (repeatable): {', '.join(DETECTORS)}. Default: {', '.join(CHECK_DETECTORS)}")
    p.add_argument("--metric", action="append", default=[], metavar="M",
                   help="a series to check (repeatable). Default: the pre-clip grad norm and the loss")
    p.add_argument("--max-norm", type=_max_norm, default=None, metavar="X",
                   help="also check that the post-clip grad norm (grad_norm_post) never exceeds X")
    p.add_argument("--map", action="append", type=_column_mapping, default=[], metavar="OURS=THEIRS,...",
                   help="read a column under our name, e.g. loss=train/loss,grad_norm_pre=grad_norm,step=_step")
    p.add_argument("--format", choices=list(FORMATS), default=None, help="the log's format. Default: detected from the content")
    p.add_argument("--json", action="store_true", help="print a machine-readable report (strict JSON)")
    p.set_defaults(func=cmd_check)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"spikecheck: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (ValueError, NotImplementedError) as exc:
        print(f"spikecheck: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("spikecheck: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into head/less that closed early
        sys.stderr.close()
        return 0


