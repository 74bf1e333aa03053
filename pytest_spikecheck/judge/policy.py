"""One judgement of a training log, behind both doors: ``spikecheck check`` and the assertions.

The default CI policy (calibrated on real public training logs, ``tests/data/reallogs``;
the measurements are in ``docs/detectors.md``):

- **loss** (nats): ``loss-jump`` (a jump of ln 2 nats, or 6 robust σ on a noisy loss, above
  the median of the previous points) and ``loss-sustained`` (a rise of ln 2 nats that the
  next points keep);
- **gradient norm** (robust ratio): ``grad-ratio`` (10x the recent median and 2.5 robust σ
  above it in log space, against a baseline never below half the run's long-run median);
- **largest attention logit** (``attn_logit_max``, where the record has it): ``logit-growth``
  (10x in 10 steps from 10 up, or above Kimi K2's tau 100; with QK-Clip on, above 2 tau:
  :mod:`pytest_spikecheck.judge.logit_growth`);
- **non-finite values**: decided per value by :mod:`pytest_spikecheck.judge.finiteness` (the
  gradient norm of a skipped step is excused and counted; ``strict_finite`` fails every
  non-finite value in any column).

The series checked are the pre-clip gradient norm (``grad_norm`` in other tools' logs) and
the loss, those the log has, and the largest attention logit where it is recorded. On an RL or preference log (:func:`detect_kind`) the loss is a
surrogate (near 0, negative, ~ln 2 for DPO): the loss rules step aside, the grad-norm rule
still runs. A series is *judged* when at least one of its rules had the history it needs
for at least one value; otherwise it is "not judged" and the report says what was missing,
never "no spike". numpy only.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from pytest_spikecheck.errors import ConfigError, SpikeCheckError
from pytest_spikecheck.judge import rolling
from pytest_spikecheck.judge.verdict import Verdict
from pytest_spikecheck.judge.analysis import spike_ratio, value_at
from pytest_spikecheck.judge.detectors import Detector, get_detector, log_interval
from pytest_spikecheck.judge.finiteness import judge_finite
from pytest_spikecheck.judge.logit_growth import LOGIT_METRIC, LogitGrowth, for_record
from pytest_spikecheck.judge.text import sparkline
from pytest_spikecheck.records import Record

#: The rules of the default policy, per role of a series.
POLICY: dict[str, tuple[str, ...]] = {
    "loss": ("loss-jump", "loss-sustained"),
    "grad_norm": ("grad-ratio",),
    LOGIT_METRIC: (LogitGrowth.name,),
}
#: What ``--kind`` accepts: ``rl`` covers RL and preference (DPO) training.
KINDS = ("sft", "pretrain", "rl")
#: Series checked unless others are named: the pre-clip gradient norm, then the loss.
DEFAULT_METRICS = ("grad_norm_pre", "loss")
#: Where a log has neither (nanochat's and build-nanogpt's evaluation-only logs): its validation
#: loss or bits per byte, judged as what it is.
EVAL_METRICS = ("eval_loss", "eval_bpb")

#: Keys an RL or preference trainer logs (TRL GRPO/PPO/DPO/KTO, OpenRLHF, LLaMA-Factory DPO). TRL's
#: PPO/RLOO value-head keys by name: ``val/`` alone is how Lightning users namespace their validation
#: metrics (Eve-ning/opal-v2's ``val/rmse_loss``; lightning-hydra-template's ``val/acc``), no RL mark.
_RL_KEYS = (
    "reward",
    "reward_std",
    "kl",
    "frac_reward_zero_std",
    "entropy",
    "clip_ratio",
    "cri_loss",
    "val/ratio",
    "val/ratio_var",
    "val/clipfrac_avg",
    "val/num_eos_tokens",
)
_RL_PREFIXES = ("rewards/", "objective/", "logps/", "logits/", "policy/", "clip_ratio/")
#: A DPO loss starts at ln 2 (policy = reference) and wanders around it: a first logged loss this close
#: to ln 2 is read as one (a language-model loss starts at ~ln(vocabulary), an SFT loss at 1-3 nats).
_DPO_START = 0.05
#: A surrogate loss: more than this share of the logged losses exactly 0, or any negative.
_ZERO_LOSS_SHARE = 0.2
#: An RL gradient norm is bimodal when its log10 splits (Otsu's threshold) into two groups this many
#: decades apart at least (30x), the lower holding at least this share of the points.
_DEGENERATE_DECADES = math.log10(30)
_DEGENERATE_SHARE = 0.2


def pick_metric(rec: Record, metric: str) -> str:
    """The series that stands for ``metric``: itself, or ``grad_norm`` (what other tools call
    the pre-clip norm) for ``grad_norm_pre``."""
    if metric in rec.metrics:
        return metric
    if metric == "grad_norm_pre" and "grad_norm" in rec.metrics:
        return "grad_norm"
    have = ", ".join(sorted(k for k in rec.metrics if k != "step")) or "nothing"
    raise SpikeCheckError(f"the record has no {metric!r} series (it has {have})")


def detect_kind(rec: Record) -> tuple[str | None, str]:
    """("rl", why) for an RL or preference log, else (None, ""): recognised by its keys, or
    by a loss that is a surrogate (negative values, or many exactly 0)."""
    keys = [k for k in rec.metrics if k in _RL_KEYS or k.startswith(_RL_PREFIXES)]
    if "accuracy" in rec.metrics and rec.log_format == "jsonl":
        # LLaMA-Factory's trainer_log.jsonl logs a bare train-time "accuracy" only for its
        # preference stages (DPO, reward model); SFT logs have none, HF evals say eval_accuracy.
        keys.append("accuracy")
    if keys:
        shown = ", ".join(keys[:4]) + (", ..." if len(keys) > 4 else "")
        return "rl", f"an RL/preference log (it logs {shown})"
    if "loss" in rec.metrics:
        _, loss = rec.series("loss")
        loss = loss[np.isfinite(loss)]
        if loss.size and (np.any(loss < 0) or np.mean(loss == 0) > _ZERO_LOSS_SHARE):
            return "rl", "its loss is a surrogate (negative or mostly exactly 0), as RL objectives are"
        if loss.size >= 2 and abs(loss[0] - math.log(2)) <= _DPO_START:
            return "rl", (
                f"its loss starts at {loss[0]:.4g}, about ln 2 = 0.693: a preference (DPO) loss, whose value "
                f"is ln 2 while the policy equals its reference"
            )
    return None, ""


def _judged_series(rec: Record, name: str, excused: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of ``name`` where logged, less the values the finiteness decisions excused."""
    if excused is None:
        return rec.series(name)
    keep = ~excused if name not in rec.missing else ~(excused | rec.missing[name])
    return np.asarray(rec.metrics["step"])[keep], np.asarray(rec.metrics[name], dtype=np.float64)[keep]


def _split_decades(norms: np.ndarray) -> tuple[float, float, float] | None:
    """(threshold, separation in decades, lower share) of Otsu's two-group split of log10(norms),
    or None below 20 points."""
    x = np.sort(np.log10(norms))
    n = x.size
    if n < 20:
        return None
    total = np.cumsum(x)
    k = np.arange(1, n)
    lower_mean = total[:-1] / k
    upper_mean = (total[-1] - total[:-1]) / (n - k)
    share = k / n
    between = share * (1 - share) * (upper_mean - lower_mean) ** 2
    best = int(np.argmax(between))
    return float((x[best] + x[best + 1]) / 2), float(upper_mean[best] - lower_mean[best]), float(share[best])


def degenerate_steps(rec: Record, steps: np.ndarray, norms: np.ndarray) -> tuple[np.ndarray, str]:
    """The points of an RL run's gradient norm that are no level: steps where every group's rewards
    were equal (a zero-std share of 1: zero advantage, only the KL or entropy term is left), or the
    lower group of a bimodal norm (most steps ~0, the rest ~100x). (mask over the points, why)."""
    mask = np.zeros(steps.size, dtype=bool)
    reasons = []
    for name in rec.metrics:
        if "zero_std" in name.lower():
            zs, share = rec.series(name)
            degenerate_at = zs[np.isfinite(share) & (share >= 1 - 1e-9)]
            hit = np.isin(steps, degenerate_at)
            if hit.any():
                mask |= hit
                reasons.append(f"{name} = 1 at {int(hit.sum())}")
    positive = np.isfinite(norms) & (norms > 0)
    split = _split_decades(norms[positive & ~mask])
    if split is not None:
        threshold, decades, share = split
        if decades >= _DEGENERATE_DECADES and share >= _DEGENERATE_SHARE:
            low = positive & ~mask & (np.log10(np.where(positive, norms, 1.0)) < threshold)
            mask |= low
            reasons.append(
                f"{int(low.sum())} below {10**threshold:.3g}, the lower group of a bimodal norm ({decades:.1f} decades apart)"
            )
    return mask, "; ".join(reasons)


def _role(metric: str) -> str:
    if metric == LOGIT_METRIC:
        return LOGIT_METRIC
    return "loss" if "loss" in metric or "bpb" in metric else "grad_norm"


def _policy_rules(rec: Record, name: str) -> list[Detector]:
    """The default policy's rules for one series: the logit rule is set from the record's
    facts (QK-Clip's tau), the others are the named rules at their defaults."""
    if _role(name) == LOGIT_METRIC:
        return [for_record(rec)]
    return [get_detector(d) for d in POLICY[_role(name)]]


def _unknown_qk_clip(rec: Record) -> bool:
    """QK-Clip was on (its ``qk_clipped_heads`` column) but the record does not say its tau."""
    return "qk_clipped_heads" in rec.metrics and for_record(rec).growth is not None


def judge_log(
    rec: Record,
    detectors: Sequence[str | Detector] = (),
    metrics: Sequence[str] = (),
    kind: str | None = None,
    strict_finite: bool = False,
) -> dict:
    """The judgement of a record, as plain data (``spikecheck check --json`` prints it).

    ``detectors`` (names) replace the default policy and run on every series; ``metrics``
    replace the default series; ``kind`` overrides the RL recognition. ``ok`` is False for a
    spike or a non-finite value that fails the run (:func:`~.finiteness.judge_finite`; with
    ``strict_finite``, any non-finite value in any column); ``judged`` is False when no series
    could be judged, and ``not_judged`` names the series that could not. A value the
    finiteness decisions excuse (a skipped step's gradient norm) is left out of the series
    the rules judge: it is neither a level nor a spike.
    """
    if kind is not None and kind not in KINDS:
        raise ConfigError(f"unknown kind {kind!r}; choose one of {', '.join(KINDS)}")
    names, evaluation_only = _series_names(rec, metrics, detectors)
    found_kind, why = detect_kind(rec)
    kind_used = kind or found_kind or "sft/pretrain"
    explicit = [get_detector(d) for d in detectors]
    notes = list(rec.notes)
    if kind is None and found_kind == "rl":
        notes.append(
            f"{why}: its loss is no likelihood, so the loss rules step aside; "
            f"the gradient-norm rule still runs (--kind sft to judge the loss anyway)"
        )
    if evaluation_only:
        notes.append(
            f"no training loss or gradient norm: the validation series ({', '.join(names)}) judged by the "
            f"loss rules, as a validation curve (a bar of ln 2 reads bits per byte as they are: 1.6x its perplexity)"
        )
    finite = judge_finite(rec, strict=strict_finite)
    if finite.skipped_steps:
        skipped = len(finite.skipped_steps)
        notes.append(
            f"{skipped} step{'s' if skipped != 1 else ''} skipped by the "
            f"optimizer (the log says so or the reader inferred it): their gradient norms are not judged"
        )
    series = [_judge_series(rec, name, explicit, kind_used, finite, notes) for name in names]
    first = finite.first_failure
    steps = rec.metrics["step"]
    if steps.size == 1:
        notes.append("a single logged entry: nothing to compare it with")
    return {
        "log": rec.source,
        "format": rec.log_format,
        "kind": kind_used,
        "notes": notes,
        "steps": {"logged": int(steps.size), "first": int(steps[0]), "last": int(steps[-1])},
        "policy": "default" if not explicit else "named detectors",
        "detectors": sorted({r["name"] for s in series for r in s["rules"]}),
        "series": series,
        "nonfinite": None if first is None else {"step": first.first_step, "metric": first.metric, "value": first.first_value},
        "finite": finite.as_dict(),
        "judged": any(s["status"] == "judged" for s in series),
        "not_judged": [s["metric"] for s in series if s["status"] == "not judged"],
        "ok": not any(s["spikes"] for s in series) and first is None,
    }


def _series_names(rec: Record, metrics: Sequence[str], detectors: Sequence[Any]) -> tuple[list[str], bool]:
    """The series to judge (the named ones, else the default policy's) and whether they are a
    validation curve standing in for a training log that has none."""

    def resolve(name: str) -> str | None:
        try:
            return pick_metric(rec, name)
        except SpikeCheckError as exc:
            if metrics:
                raise ConfigError(f"{rec.source}: {exc}") from None
            return None

    names = list(dict.fromkeys(n for n in (resolve(m) for m in (metrics or DEFAULT_METRICS)) if n is not None))
    evaluation_only = not names and not metrics and any(m in rec.metrics for m in EVAL_METRICS)
    if evaluation_only:
        names = [m for m in EVAL_METRICS if m in rec.metrics]
    if not names:
        have = ", ".join(k for k in rec.metrics if k != "step")
        raise ConfigError(
            f"{rec.source}: no loss or gradient-norm series (it has {have}); "
            f"name one with --metric or map one with --map loss=COLUMN"
        )
    if not metrics and not detectors and LOGIT_METRIC in rec.metrics and LOGIT_METRIC not in names:
        names.append(LOGIT_METRIC)  # the default policy judges the logit wherever it is recorded
    return names, evaluation_only


def _judge_series(
    rec: Record, name: str, explicit: list[Detector], kind_used: str, finite: Any, notes: list[str]
) -> dict[str, Any]:
    """One series' entry of the report: its rules, what each judged and flagged, its spikes (the
    steps any rule flagged, with every rule that agreed). Appends what the reader must know to ``notes``."""
    steps, values = _judged_series(rec, name, finite.excused.get(name))
    entry: dict[str, Any] = {
        "metric": name,
        "logged": int(steps.size),
        "interval": log_interval(steps),
        "sparkline": sparkline(values),
        "spikes": [],
        "rules": [],
    }
    if not explicit and kind_used == "rl" and _role(name) == "loss":
        entry.update(status="skipped", message="an RL/preference loss: loss rules step aside")
        return entry
    if not explicit and _role(name) == LOGIT_METRIC and _unknown_qk_clip(rec):
        entry.update(
            status="skipped",
            message="QK-Clip was on (qk_clipped_heads) and the record does not say its tau: "
            "assert_qk_clip_contains(run, tau=...) judges its containment",
        )
        return entry
    if not explicit and kind_used == "rl" and _role(name) == "grad_norm":
        degenerate, why = degenerate_steps(rec, steps, values)
        if degenerate.any():
            # Zero-advantage steps collapse the baseline: the rule judges the others against each other.
            steps, values = steps[~degenerate], values[~degenerate]
            entry["degenerate"] = {"count": int(degenerate.sum()), "why": why}
            notes.append(
                f"{name}: {int(degenerate.sum())} of {degenerate.size} points are degenerate RL steps "
                f"({why}): left out of the baseline and not judged"
            )
    rules = explicit or _policy_rules(rec, name)
    agreeing: dict[int, dict[str, Any]] = {}
    judged = 0
    steps, values = np.ascontiguousarray(steps, dtype=np.int64), np.ascontiguousarray(values, dtype=np.float64)
    with rolling.sharing():  # the loss rules share the loss's histories
        verdicts = [rule.judge(steps, values) for rule in rules]
    for rule, verdict in zip(rules, verdicts):
        judged = max(judged, verdict.judged)
        entry["rules"].append(
            {
                "name": rule.name,
                "rule": rule.describe(),
                "judged": verdict.judged,
                "needs": verdict.needs,
                "flags": len(verdict.detections),
            }
        )
        for hit in verdict.detections:
            found = agreeing.setdefault(
                hit.step, {"baseline": hit.baseline, "detectors": [], "scores": [], "units": [], "score_texts": []}
            )
            found["detectors"].append(rule.name)
            found["scores"].append(float(hit.score))  # a number in --json; the text is score_texts'
            found["units"].append(rule.unit)
            found["score_texts"].append(f"{hit.score:+.3g} {rule.unit}" if rule.unit == "nats" else f"{hit.score:.3g}{rule.unit}")
    entry["judged"] = judged
    entry["spikes"] = [
        {"step": step, "value": value_at(rec.metrics, name, step), **found, "ratio": spike_ratio(rec.metrics, step, name)}
        for step, found in sorted(agreeing.items())
    ]
    if judged:
        entry["status"] = "judged"
        entry["message"] = f"judged {judged} of {steps.size} points"
    else:
        every = "" if entry["interval"] is None else f", interval {entry['interval']} steps"
        needs = "; ".join(f"{r['name']} {r['needs']}" for r in entry["rules"])
        entry.update(
            status="not judged", message=f"not judged: {steps.size} point{'s' if steps.size != 1 else ''}{every}, needs {needs}"
        )
    return entry


def log_verdicts(report: dict) -> list[Verdict]:
    """The verdicts of ``spikecheck check``'s judgement (:func:`judge_log`'s report): one per
    judged series (its first spike, else how it was judged) and one on finiteness."""
    out = []
    for s in report["series"]:
        if s["spikes"]:
            first = s["spikes"][0]
            more = f" (and {len(s['spikes']) - 1} more)" if len(s["spikes"]) > 1 else ""
            out.append(
                Verdict(
                    "spikecheck check",
                    False,
                    f"the default policy flagged a {s['metric']} spike at step "
                    f"{first['step']} ({', '.join(first['detectors'])}){more}",
                    metric=s["metric"],
                    measured=_plain(first["ratio"]),
                    step=int(first["step"]),
                )
            )
        else:
            out.append(Verdict("spikecheck check", True, f"{s['metric']}: {s['message']}", metric=s["metric"]))
    bad = report["nonfinite"]
    out.append(
        Verdict(
            "spikecheck check",
            bad is None,
            "every value is finite" if bad is None else f"non-finite {bad['metric']} at step {bad['step']}",
            metric=None if bad is None else bad["metric"],
            measured=None if bad is None else _plain(bad["value"]),
            step=None if bad is None else int(bad["step"]),
        )
    )
    return out


def _plain(value: Any) -> float | None:
    return None if value is None else float(value)
