"""The assertions on a run's logits: the largest attention logit and |log Z| bounded
(:func:`assert_logits_bounded`), and QK-Clip holding the attention logits from its first clip on
(:func:`assert_qk_clip_contains`). Each failure carries the evidence of every assertion (the table
of the logit columns around the step, a sparkline, the diagnosis, the reproduce command) and its
:class:`~pytest_spikecheck.judge.verdict.Verdict`. numpy only."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.judge.defences import QK_CLIP_FACTOR, qk_clip_tau
from pytest_spikecheck.judge.evidence import fail, passed
from pytest_spikecheck.judge.text import fmt
from pytest_spikecheck.judge.verdict import Verdict
from pytest_spikecheck.records import Record, as_record

__all__ = ["QK_CLIP_FACTOR", "assert_logits_bounded", "assert_qk_clip_contains"]

#: The columns a logit failure's table shows beside the one asked about.
LOGIT_COLUMNS = ("attn_logit_max", "qk_clipped_heads", "logz_absmax", "loss")


def assert_logits_bounded(run: Any, attention: float | None = None, z: float | None = None) -> Verdict:
    """Assert the largest |attention logit| (``attn_logit_max``) stays <= ``attention`` and the
    largest |log Z| of the output logits (``logz_absmax``) stays <= ``z`` at every step of
    ``run`` (a :class:`~pytest_spikecheck.records.run.Run`, a run folder, a record); a bound
    left None is not judged."""
    __tracebackhide__ = True
    rec = as_record(run)
    if attention is None and z is None:
        raise ConfigError("assert_logits_bounded needs a bound: attention=..., z=... or both")
    held = []
    for column, bound, what in (("attn_logit_max", attention, "attention logit"), ("logz_absmax", z, "|log Z|")):
        if bound is None:
            continue
        if column not in rec.metrics:
            raise ConfigError(
                f"{rec.source} has no {column} column (the model reports it through the spikecheck "
                f"stats hook: README, 'Attention and output logits')"
            )
        steps, values = np.asarray(rec.metrics["step"]), np.asarray(rec.metrics[column], dtype=np.float64)
        over = np.flatnonzero(~(values <= bound))
        worst = int(np.nanargmax(np.where(np.isnan(values), np.inf, values))) if values.size else None
        if over.size:
            first = int(over[0])
            fail(
                "assert_logits_bounded",
                f"{what} {values[first]:,.4g} exceeds {bound:g} at step {int(steps[first])} "
                f"(largest {fmt(values[worst], '.4g')} at step {int(steps[worst])})",
                rec,
                int(steps[first]),
                column,
                measured=float(values[worst]),
                limit=bound,
                columns=LOGIT_COLUMNS,
            )
        held.append((column, bound, what, None if worst is None else (float(values[worst]), int(steps[worst]))))
    column, bound, what, largest = held[0]
    reason = "; ".join(f"{w} ≤ {b:g} at every step (max {fmt(lg[0], ',.4g') if lg else '—'})" for _, b, w, lg in held)
    return passed(
        "assert_logits_bounded",
        reason,
        rec,
        column,
        measured=largest[0] if largest else None,
        limit=bound,
        step=largest[1] if largest else None,
    )


def _largest(rec: Record) -> str:
    """``the largest attention logit reached 3,146 at step 40`` (empty without the column)."""
    if "attn_logit_max" not in rec.metrics:
        return ""
    values = np.asarray(rec.metrics["attn_logit_max"], dtype=np.float64)
    if not values.size:
        return ""
    worst = int(np.nanargmax(np.where(np.isnan(values), np.inf, values)))
    return (
        f"; the largest attention logit reached {fmt(values[worst], ',.4g')} at step "
        f"{int(np.asarray(rec.metrics['step'])[worst])}"
    )


def assert_qk_clip_contains(run: Any, tau: float | None = None, factor: float = QK_CLIP_FACTOR) -> int | None:
    """Assert QK-Clip held the attention logits: from the first step at which it had to act (its
    ``qk_clipped_heads`` column is > 0 there, or the largest attention logit exceeded ``tau``),
    the largest attention logit of every later step is at most ``factor * tau``. ``tau`` defaults
    to the run's own (``optimizer.qk_clip``). Returns that first step (None if it never had to act).
    A run that trained without QK-Clip fails ("QK-Clip was not on in this run").

    A clip acts after its step's update, on that step's logits, so the next forward is the first
    it bounds; the weights move again in the next update, hence the ``factor`` (2 by default)."""
    __tracebackhide__ = True
    rec = as_record(run)
    m = rec.metrics
    own = qk_clip_tau(rec)
    metric = "attn_logit_max"
    if tau is None and own is None:
        if rec.run is None:
            raise ConfigError(f"{rec.source}: pass tau=... (the record does not say it trained with QK-Clip)")
        fail(
            "assert_qk_clip_contains",
            f"QK-Clip was not on in this run: it trained without QKClip(), so nothing held its attention logits{_largest(rec)}",
            rec,
            None,
            metric,
            diagnose_step=False,
        )
    tau = own if tau is None else tau
    if not (isinstance(tau, (int, float)) and 0 < tau < math.inf) or not (isinstance(factor, (int, float)) and factor >= 1):
        raise ConfigError(f"assert_qk_clip_contains needs tau > 0 and factor >= 1, was tau={tau!r}, factor={factor!r}")
    if metric not in m:
        raise ConfigError(
            f"{rec.source} has no attn_logit_max column (the model's stats hook reports the largest "
            f"attention logit: README, 'Attention and output logits')"
        )
    if "qk_clipped_heads" not in m:
        fail(
            "assert_qk_clip_contains",
            f"QK-Clip was not on in this run: no qk_clipped_heads column (QK-Clip records "
            f"how many heads it clipped per step){_largest(rec)}",
            rec,
            None,
            metric,
            limit=factor * tau,
            diagnose_step=False,
        )
    steps = np.asarray(m["step"])
    logits = np.asarray(m[metric], dtype=np.float64)
    clipped = np.asarray(m["qk_clipped_heads"], dtype=np.float64)
    acted = np.flatnonzero((np.nan_to_num(clipped) > 0) | ~(logits <= tau))
    if not acted.size:
        passed(
            "assert_qk_clip_contains",
            f"the largest attention logit never exceeded tau {tau:g} "
            f"(max {fmt(float(np.max(logits)) if logits.size else None, ',.4g')}): QK-Clip never had to act",
            rec,
            metric,
            measured=float(np.max(logits)) if logits.size else None,
            limit=factor * tau,
        )
        return None  # the logits never exceeded tau: nothing to contain
    first = int(acted[0])
    if not clipped[first] > 0:
        fail(
            "assert_qk_clip_contains",
            f"the largest attention logit {fmt(logits[first], ',.4g')} exceeded tau {tau:g} "
            f"at step {int(steps[first])} and QK-Clip clipped no head there",
            rec,
            int(steps[first]),
            metric,
            measured=float(logits[first]),
            limit=tau,
            columns=LOGIT_COLUMNS,
        )
    after = np.arange(first + 1, len(steps))
    over = after[~(logits[after] <= factor * tau)]
    if over.size:
        worst = int(after[np.nanargmax(np.where(np.isnan(logits[after]), np.inf, logits[after]))])
        fail(
            "assert_qk_clip_contains",
            f"QK-Clip (tau {tau:g}) first clipped at step {int(steps[first])}, yet the "
            f"largest attention logit is {fmt(logits[over[0]], ',.4g')} > {factor:g} x tau at step {int(steps[over[0]])} "
            f"(largest {fmt(logits[worst], ',.4g')} at step {int(steps[worst])})",
            rec,
            int(steps[over[0]]),
            metric,
            measured=float(logits[over[0]]),
            limit=factor * tau,
            columns=LOGIT_COLUMNS,
        )
    later = logits[after]
    largest = float(np.max(later)) if later.size else None
    passed(
        "assert_qk_clip_contains",
        f"QK-Clip (tau {tau:g}) first clipped at step {int(steps[first])} and held the "
        f"largest attention logit ≤ {factor:g} x tau after it (max {fmt(largest, ',.4g')})",
        rec,
        metric,
        measured=largest,
        limit=factor * tau,
        step=int(steps[first]),
    )
    return int(steps[first])
