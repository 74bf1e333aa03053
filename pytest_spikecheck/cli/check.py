"""``spikecheck check LOG``: the default CI policy (or named detectors) on a training log.

The judgement itself is :func:`pytest_spikecheck.judge.policy.judge_log`, the one the
assertions use; this module reads the log(s), adds the clip check, prints and picks the
exit status.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence


if TYPE_CHECKING:
    from pytest_spikecheck.records import Record

#: Exit status: a spike, a non-finite value or an uncontained clip.
EXIT_FOUND = 1
#: Exit status with ``--strict`` when a checked series could not be judged (too few points).
EXIT_NOT_JUDGED = 3
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


def check_record(
    record: Record,
    detectors: Sequence[str] = (),
    metrics: Sequence[str] = (),
    max_norm: float | None = None,
    kind: str | None = None,
    strict_finite: bool = False,
) -> dict:
    """What ``spikecheck check`` finds in a record, as plain data (``--json`` prints it):
    :func:`~pytest_spikecheck.judge.policy.judge_log`, plus (with ``max_norm``) whether the
    post-clip norm stayed under it."""
    from pytest_spikecheck.errors import SpikeCheckError
    from pytest_spikecheck.judge.assertions import assert_clip_contains
    from pytest_spikecheck.judge.policy import judge_log, log_verdicts

    report = judge_log(record, detectors, metrics, kind, strict_finite)
    verdicts = log_verdicts(report)
    clip = None
    if max_norm is not None:
        clip = {
            "max_norm": max_norm,
            "checked": "grad_norm_post" in record.metrics,
            "ok": True,
            "message": f"post-clip grad norm <= {max_norm:g} at every logged step",
        }
        if not clip["checked"]:
            clip["message"] = "not checked: the log has no grad_norm_post series"
        else:
            try:
                verdicts.append(assert_clip_contains(record, max_norm))
            except SpikeCheckError as exc:
                clip.update(ok=False, message=str(exc).splitlines()[0])
                verdicts.append(exc.verdict)
    report["clip"] = clip
    #: what each check measured (pytest_spikecheck.judge.verdict.Verdict), as the assertions report it
    report["verdicts"] = [dict(v.to_json(), diagnosis=None) for v in verdicts if v is not None]
    report["ok"] = report["ok"] and (clip is None or clip["ok"])
    return report


def exit_status(report: dict, strict: bool) -> int:
    if not report["ok"]:
        return EXIT_FOUND
    return EXIT_NOT_JUDGED if strict and (report["not_judged"] or not report["judged"]) else 0


def _check_text(report: dict, strict: bool) -> str:
    from pytest_spikecheck.judge.text import table

    steps = report["steps"]
    lines = [
        f"{report['log']}: {report['format']}, {steps['logged']} logged steps ({steps['first']}–{steps['last']}), "
        f"kind {report['kind']}"
    ]
    lines += [f"note: {note}" for note in report["notes"]]
    lines.append(f"policy: {report['policy']} ({', '.join(report['detectors']) or 'none'})")
    for s in report["series"]:
        lines += ["", f"{s['metric']}  {s['sparkline']}"]
        if s["status"] != "judged":
            lines.append(f"  {s['message']}")
            continue
        blind = [f"{r['name']} judged none (needs {r['needs']})" for r in s["rules"] if not r["judged"]]
        lines.append(f"  {s['message']}" + (f"; {'; '.join(blind)}" if blind else ""))
        if not s["spikes"]:
            lines.append("  no spike")
            continue
        # A flagged value was logged, so NaN here is a real NaN: printed as such, not as "—".
        rows = [
            [
                str(h["step"]),
                format(h["value"], ".4g"),
                format(h["baseline"], ".4g") if math.isfinite(h["baseline"]) else "—",
                ", ".join(f"{d} {score}" for d, score in zip(h["detectors"], h["score_texts"])),
            ]
            for h in s["spikes"][:_CHECK_MAX_ROWS]
        ]
        lines += ["  " + line for line in table(["step", "value", "baseline", "flagged by"], rows).splitlines()]
        if len(s["spikes"]) > _CHECK_MAX_ROWS:
            lines.append(f"  … and {len(s['spikes']) - _CHECK_MAX_ROWS} more (--json lists them all)")
    bad = report["nonfinite"]
    excused = [d for d in report["finite"]["decisions"] if d["decision"] != "fails"]
    if bad is not None:
        headline = f"{bad['metric']} = {bad['value']} at step {bad['step']} (the first)"
    elif excused:
        headline = "none that fails the run (--strict-finite fails every one)"
    else:
        headline = "none"
    lines += ["", "non-finite values: " + headline]
    for d in excused:
        where = f"step {d['first_step']}" if d["count"] == 1 else f"{d['count']} steps from step {d['first_step']}"
        lines.append(f"  {d['metric']} = {d['first_value']} at {where}: {d['why']}")
    if report["clip"] is not None:
        lines.append(f"clip containment: {report['clip']['message']}")
    spiky = [s["metric"] for s in report["series"] if s["spikes"]]
    found = (
        ([f"spikes in {', '.join(spiky)}"] if spiky else [])
        + (["a non-finite value"] if bad else [])
        + (["an uncontained clip"] if report["clip"] and not report["clip"]["ok"] else [])
    )
    if found:
        lines.append(f"FOUND {' and '.join(found)} (exit {EXIT_FOUND})")
    else:
        judged = [s["metric"] for s in report["series"] if s["status"] == "judged"]
        finite = "every value finite" if not excused else "no non-finite value that fails the run"
        verdict = f"OK: no spike in {', '.join(judged)}, {finite}" if judged else finite
        status = f"exit {EXIT_NOT_JUDGED}, --strict" if strict else f"exit 0; --strict makes it exit {EXIT_NOT_JUDGED}"
        if report["not_judged"]:
            verdict += f"; NOT JUDGED: {', '.join(report['not_judged'])} ({status})"
        elif not judged:
            verdict += f"; NOT JUDGED: no series left to judge ({status})"
        lines.append(verdict)
    return "\n".join(lines)


def _json_safe(value: Any) -> Any:
    """Strict JSON: non-finite floats become the strings "NaN", "Infinity", "-Infinity"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def cmd_check(args: argparse.Namespace) -> int:
    from pytest_spikecheck.records.logs import find_logs, read_runs

    mapping = {k: v for part in args.map for k, v in part.items()}
    path = Path(args.log)
    logs = find_logs(path) if path.is_dir() else [path]
    reports = []
    for log in logs:
        # A log whose step counter starts again holds several runs: each is judged on its own.
        for record in read_runs(log, format=args.format, mapping=mapping):
            reports.append(check_record(record, args.detector or (), args.metric, args.max_norm, args.kind, args.strict_finite))
    status = max(exit_status(r, args.strict) for r in reports)
    if args.json:
        single = len(reports) == 1 and not path.is_dir()
        out = reports[0] if single else {"folder" if path.is_dir() else "log": str(path), "logs": reports}
        print(json.dumps(_json_safe(out), indent=2, allow_nan=False, ensure_ascii=False))
    else:
        if len(logs) > 1 or (path.is_dir() and logs[0].parent != path and logs[0] != path):
            print(
                f"{path}: {len(logs)} log{'s' if len(logs) != 1 else ''} found one level down: "
                + ", ".join(str(p.relative_to(path)) for p in logs)
                + "\n"
            )
        if not path.is_dir() and len(reports) > 1:
            print(f"{path}: {len(reports)} runs in one file (the step counter starts again): each judged on its own\n")
        print("\n\n".join(_check_text(r, args.strict) for r in reports))
    return status


def add_parser(sub: Any) -> None:
    from pytest_spikecheck.judge.detectors import DETECTORS
    from pytest_spikecheck.judge.policy import KINDS, POLICY
    from pytest_spikecheck.records.logs import FORMATS

    policy = "; ".join(f"{role}: {', '.join(rules)}" for role, rules in POLICY.items())
    p = sub.add_parser(
        "check",
        help="find spikes and non-finite values in a training log (exit 1 if any)",
        description="Read a trainer_state.json, Lightning metrics.csv, TensorBoard events, an MLflow run, "
        "a CSV or JSONL log, or a training log printed to stdout (Megatron-LM, torchtitan, "
        "nanoGPT, llm.c, HF Trainer, key=value lines), or a folder holding them (one level "
        "down too); judge every run it holds with the "
        f"default policy ({policy}; non-finite values) or named detectors. A series too "
        "short for its rules is reported as 'not judged', never as 'no spike'. Exit 0: "
        f"clean; {EXIT_FOUND}: a spike, a non-finite value or an uncontained clip; 2: the "
        f"log or an option is wrong; {EXIT_NOT_JUDGED}: with --strict, a series not judged.",
    )
    p.add_argument(
        "log",
        metavar="LOG",
        help="a log file, or a folder holding one (TensorBoard event files, a run, "
        "checkpoint-*/, lightning_logs/version_*/, runs/*/, an MLflow run, "
        "experiment or mlruns folder)",
    )
    p.add_argument(
        "--detector",
        action="append",
        choices=list(DETECTORS),
        metavar="NAME",
        help=f"run this detector on every series instead of the default policy (repeatable): {', '.join(DETECTORS)}",
    )
    p.add_argument(
        "--metric",
        action="append",
        default=[],
        metavar="M",
        help="a series to check (repeatable). Default: the pre-clip grad norm and the loss",
    )
    p.add_argument(
        "--kind",
        choices=list(KINDS),
        default=None,
        help="what the run is. Default: recognised from the log (rl: RL/preference keys or a surrogate "
        "loss; the loss rules then step aside)",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help=f"exit {EXIT_NOT_JUDGED} when a series could not be judged (too few points for its rules)",
    )
    p.add_argument(
        "--strict-finite",
        action="store_true",
        help="fail on every non-finite value in any column, excusing none (default: the gradient norm "
        "of a step the optimizer skipped is reported, not a failure)",
    )
    p.add_argument(
        "--max-norm",
        type=_max_norm,
        default=None,
        metavar="X",
        help="also check that the post-clip grad norm (grad_norm_post) never exceeds X",
    )
    p.add_argument(
        "--map",
        action="append",
        type=_column_mapping,
        default=[],
        metavar="OURS=THEIRS,...",
        help="read a column under our name, e.g. loss=train/loss,grad_norm_pre=grad_norm,step=_step",
    )
    p.add_argument("--format", choices=list(FORMATS), default=None, help="the log's format. Default: detected from the content")
    p.add_argument("--json", action="store_true", help="print a machine-readable report (strict JSON)")
    p.set_defaults(func=cmd_check)
