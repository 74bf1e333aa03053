"""Assertions on how a trainer computes its step: gradient accumulation and loss scaling.

- :func:`assert_accumulation_invariant`: two runs of the same set-up at different
  ``accumulation`` must agree on the loss and the pre-clip norm at step 1 (the same weights
  and the same batch: only float rounding can differ) and stay close over the first steps.
  Summing the micro-batch losses instead of averaging them (``AccumulateSum``, the
  normalisation bugs of transformers PRs 34191 and 35207) fails it at ~k×.
- :func:`assert_overflow_skips`: a loss scaler may skip a step now and then (its gradients
  overflowed at the current scale); a run that skips more than ``max_fraction`` of its steps
  is a run whose scale cannot settle, or whose gradients overflow for another reason.

numpy only; records as every assertion takes them (a Run, a run folder, arrays, a log).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pytest_spikecheck.errors import SpikeCheckError
from pytest_spikecheck.judge.policy import pick_metric
from pytest_spikecheck.judge.text import fmt, fmt_compact, fmt_scale
from pytest_spikecheck.judge.verdict import Verdict, emit
from pytest_spikecheck.records import Record, as_record

__all__ = ["assert_accumulation_invariant", "assert_overflow_skips"]

#: How far apart two accumulations may drift over the first steps (relative): float rounding of
#: different micro-batch sums, compounded by the optimizer. Measured: 4e-7 over 10 Phase-19 steps
#: in float32 at accumulation 4 vs 1 (docs/fidelity.md); bf16 autocast a few 1e-3.
DRIFT_RTOL = 1e-2


def accumulation_of(rec: Record) -> int | None:
    """The record's gradient accumulation, where its facts say (None: a log, or facts that do not know)."""
    facts = getattr(rec.run, "facts", None)
    return None if facts is None or facts.accumulation is None else int(facts.accumulation)


def _label(rec: Record, fallback: str) -> str:
    k = accumulation_of(rec)
    return f"accumulation {k}" if k is not None else fallback


def _value(rec: Record, metric: str, step: int) -> float:
    steps = np.asarray(rec.metrics["step"])
    at = np.flatnonzero(steps == step)
    if not at.size or (metric in rec.missing and rec.missing[metric][at[0]]):
        return math.nan
    return float(np.asarray(rec.metrics[metric], dtype=np.float64)[at[0]])


def _relative(a: float, b: float) -> float:
    if a == b:
        return 0.0
    return abs(a - b) / max(abs(a), abs(b)) if math.isfinite(a) and math.isfinite(b) else math.inf


def _failure(assertion: str, rec: Record, message: str, **fields: Any) -> SpikeCheckError:
    """The error of a failed set-up check, carrying (and emitting) its verdict."""
    verdict = emit(Verdict(assertion, False, message.splitlines()[0], scenario=getattr(rec.run, "name", None), **fields))
    return SpikeCheckError(message, verdict=verdict)


def assert_accumulation_invariant(
    run_a: Any, run_b: Any, rtol: float = 1e-4, steps: int = 10, drift: float = DRIFT_RTOL
) -> dict[str, float]:
    """Assert two runs of one set-up, ``run_a`` and ``run_b`` (runs, run folders or records),
    at different gradient accumulation compute the same step:
    at their first step (same weights, same batch) the loss and the pre-clip gradient norm agree
    within ``rtol`` (relative), and over the first ``steps`` steps within ``drift``. Returns the
    step-1 relative differences (``{"loss": ..., "grad_norm_pre": ...}``).

    Give the two runs the same data order (the same seed, or the same ``inject_burst`` stream);
    where both record their batches, step 1's samples are compared first."""
    __tracebackhide__ = True
    a, b = as_record(run_a), as_record(run_b)
    label_a, label_b = _label(a, "run A"), _label(b, "run B")
    batch_a = a.run.batch_at(int(a.metrics["step"][0])) if a.run is not None and len(a.metrics["step"]) else None
    batch_b = b.run.batch_at(int(b.metrics["step"][0])) if b.run is not None and len(b.metrics["step"]) else None
    if batch_a and batch_b and sorted(map(str, batch_a["samples"])) != sorted(map(str, batch_b["samples"])):
        raise _failure(
            "assert_accumulation_invariant",
            a,
            f"the runs saw different batches at their first step ({label_a}: "
            f"{len(batch_a['samples'])} samples, {label_b}: {len(batch_b['samples'])}, not the same ones): "
            f"give both the same data order (the same seed, or the same inject_burst stream)",
        )
    common = np.intersect1d(a.metrics["step"], b.metrics["step"])
    if not common.size:
        raise _failure(
            "assert_accumulation_invariant",
            a,
            f"the runs share no step ({label_a}: {len(a.metrics['step'])} steps, {label_b}: {len(b.metrics['step'])})",
        )
    metrics = ["loss", pick_metric(a, "grad_norm_pre")]
    first = int(common[0])
    differences: dict[str, float] = {}
    for metric in metrics:
        if metric not in b.metrics:
            raise _failure(
                "assert_accumulation_invariant", b, f"{label_b} has no {metric} column to compare with {label_a}'s", metric=metric
            )
        va, vb = _value(a, metric, first), _value(b, metric, first)
        rel = _relative(va, vb)
        differences[metric] = rel
        if not rel <= rtol:
            ratio = va / vb if vb else math.inf
            apart = f"×{fmt(ratio, '.3g')}" if not 0.67 < ratio < 1.5 else f"{fmt_compact(rel)} apart"
            raise _failure(
                "assert_accumulation_invariant",
                a,
                f"accumulation changed the step-{first} {metric}: {fmt(va, '.6g')} ({label_a}) vs {fmt(vb, '.6g')} "
                f"({label_b}), {apart} (rtol {rtol:g}; the same weights and batch differ only by float rounding)"
                f"{_accumulation_hint(va, vb, a, b)}",
                metric=metric,
                measured=rel,
                limit=rtol,
                step=first,
            )
    skipped = set(a.skipped) | set(b.skipped)
    window = [int(s) for s in common[:steps] if int(s) not in skipped]
    for metric in metrics:
        for step in window:
            va, vb = _value(a, metric, step), _value(b, metric, step)
            if math.isnan(va) or math.isnan(vb):
                continue  # not logged at this step in one of them
            if not _relative(va, vb) <= drift:
                raise _failure(
                    "assert_accumulation_invariant",
                    a,
                    f"the runs drift apart at step {step}: {metric} {fmt(va, '.6g')} ({label_a}) vs {fmt(vb, '.6g')} "
                    f"({label_b}), {fmt_compact(_relative(va, vb))} relative (drift {drift:g} allowed over the first "
                    f"{steps} steps; step {first} agreed within {fmt_compact(differences[metric])})",
                    metric=metric,
                    measured=_relative(va, vb),
                    limit=drift,
                    step=step,
                )
    worst = max(differences, key=lambda k: differences[k])
    emit(
        Verdict(
            "assert_accumulation_invariant",
            True,
            f"the runs agree at step {first} (largest difference "
            f"{fmt_compact(differences[worst])} in {worst}, rtol {rtol:g}) and within {drift:g} over the first "
            f"{steps} steps",
            metric=worst,
            measured=differences[worst],
            limit=rtol,
            step=first,
            scenario=getattr(a.run, "name", None),
        )
    )
    return differences


def _accumulation_hint(va: float, vb: float, a: Record, b: Record) -> str:
    """Say AccumulateSum where the ratio is the ratio of the accumulations (or the accumulation itself)."""
    ka, kb = accumulation_of(a), accumulation_of(b)
    if not (vb and math.isfinite(va / vb)):
        return ""
    ratio = va / vb
    candidates = {k for k in (ka, kb, (ka / kb) if ka and kb else None, (kb / ka) if ka and kb else None) if k and k > 1}
    for k in sorted(candidates):
        if abs(ratio - k) <= 0.05 * k or abs(1 / ratio - k) <= 0.05 * k:
            return f": a factor of {k:g}, as when the micro-batch losses are summed instead of averaged (AccumulateSum)"
    return ""


def _ranges(steps: list[int], limit: int = 8) -> str:
    """``1–6, 8, 9`` (capped)."""
    out, start = [], None
    for i, s in enumerate(steps):
        if start is None:
            start = s
        if i + 1 == len(steps) or steps[i + 1] != s + 1:
            out.append(f"{start}–{s}" if s > start + 1 else (f"{start}, {s}" if s == start + 1 else f"{s}"))
            start = None
    text = ", ".join(out[:limit])
    return text + (", …" if len(out) > limit else "")


def overflow_steps(rec: Record) -> list[int]:
    """The steps a loss scaler skipped (``Record.skipped`` reasons that start with ``overflow``)."""
    return sorted(s for s, why in rec.skipped.items() if str(why).startswith("overflow"))


def assert_overflow_skips(run: Any, max_fraction: float = 0.01, after_step: int = 0) -> float:
    """Assert the loss scaler skipped at most ``max_fraction`` of the steps after ``after_step``
    on overflow (leave out a high ``init_scale`` finding its level with ``after_step``). Returns
    the fraction. A record that cannot say (no ``skipped`` marks, no ``loss_scale`` column, not a
    run) fails: it shows nothing."""
    __tracebackhide__ = True
    if not 0 <= max_fraction <= 1:
        raise ValueError(f"max_fraction must be in [0, 1], was {max_fraction!r}")
    rec = as_record(run)
    if rec.run is None and not rec.skipped and "loss_scale" not in rec.metrics:
        raise _failure(
            "assert_overflow_skips",
            rec,
            f"{rec.source} has no skipped marks and no loss_scale column: it cannot show whether a loss scaler skipped steps",
        )
    steps = np.asarray(rec.metrics["step"])
    judged = steps[steps > after_step]
    skipped = [s for s in overflow_steps(rec) if s > after_step]
    fraction = len(skipped) / judged.size if judged.size else 0.0
    if fraction > max_fraction:
        scale = ""
        if "loss_scale" in rec.metrics:
            _, values = rec.series("loss_scale")
            finite = values[np.isfinite(values)]
            if finite.size:
                scale = f"; the loss scale went from {fmt_scale(float(finite[0]))} to {fmt_scale(float(finite[-1]))}"
        raise _failure(
            "assert_overflow_skips",
            rec,
            f"the loss scaler skipped {len(skipped)} of {judged.size} steps{f' after step {after_step}' if after_step else ''} "
            f"on overflow ({fraction:.0%}, more than {max_fraction:.0%}): steps {_ranges(skipped)}{scale}\n\n"
            f"record: {rec.source}",
            metric="loss_scale",
            measured=fraction,
            limit=max_fraction,
            step=skipped[0] if skipped else None,
        )
    emit(
        Verdict(
            "assert_overflow_skips",
            True,
            f"the loss scaler skipped {len(skipped)} of {judged.size} steps on "
            f"overflow ({fraction:.0%}, at most {max_fraction:.0%})",
            metric="loss_scale",
            measured=fraction,
            limit=max_fraction,
            scenario=getattr(rec.run, "name", None),
        )
    )
    return fraction
