"""Assertions on the update the optimizer applied: defence bugs that leave the gradient right and
the step wrong (docs/defence-bugs.md).

- :func:`assert_muon_update_scale`: Muon's orthogonalised update has a known size, its adjusted
  lr times the RMS of an orthogonal matrix (``muon_update_ratio``, recorded by the engine's
  update recorder: about 0.9 on the nano GPT); a run whose Muon matrices moved far less (or far
  more) than that has something scaling Muon's step. DeepSpeed issue 8439's clip of the
  orthogonalised update (``ClipMuonUpdate``) divides it by the update's own norm and fails it.
- :func:`assert_optimizer_steps`: the optimizer's own count of the steps it applied (``step``
  in its state, what Adam's bias correction reads; the ``optimizer_steps`` column) must equal
  the steps the run applied (its steps less those skipped). OLMo-core's SkipStepAdamW whose
  counter never advanced (PR 317, ``SkipStepCounter``) fails it at step 1.
- :func:`assert_clip_keeps_finite`: the clip (and whatever the trainer calls between the
  pre-clip measurement and the optimizer) must never turn finite gradients non-finite: a step
  whose gradients were all finite before the clip (a finite ``grad_norm_pre``, or, where that
  norm overflowed, the recorded ``grad_finite_pre``) must hand the optimizer a finite
  ``grad_norm_post``. ``torch.nn.utils.clip_grad_norm_(max_norm=inf)`` called only to log the
  norm (the review of Skovorp/feral PR 16, ``ClipInfToLog``) multiplies them by inf / inf = NaN
  where the float32 norm overflows, and fails it.

numpy only; records as every assertion takes them (a Run, a run folder, arrays, a log).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.judge.analysis import clip_limits
from pytest_spikecheck.judge.evidence import fail, passed
from pytest_spikecheck.judge.text import fmt
from pytest_spikecheck.records import Record, as_record

__all__ = ["assert_clip_keeps_finite", "assert_muon_update_scale", "assert_optimizer_steps"]

#: The band of RMS(ΔW) / Muon's expected RMS a healthy run stays in: Newton-Schulz's five
#: iterations leave singular values between about 0.7 and 1.2 (Keller Jordan's coefficients);
#: measured 0.87-0.90 on the nano GPT (docs/defence-bugs.md). Weight decay adds lr x wd x |W|.
MUON_RATIO_BAND = (0.5, 2.0)


def _column(rec: Record, name: str, what: str) -> tuple[np.ndarray, np.ndarray]:
    if name not in rec.metrics:
        raise ConfigError(
            f"the record has no {name!r} column ({what}); the engine records it "
            f"(training/recorders.py, UpdateRecorder) where it applies"
        )
    steps, values = rec.series(name)
    return np.asarray(steps, dtype=np.int64), np.asarray(values, dtype=np.float64)


def assert_muon_update_scale(run: Any, band: tuple[float, float] = MUON_RATIO_BAND) -> dict[str, float]:
    """Assert every applied step of ``run`` (a :class:`~pytest_spikecheck.records.run.Run`, a
    run folder, a record) moved Muon's matrices by about Muon's own scale: the recorded
    ``muon_update_ratio`` (median over Muon's matrices of RMS(ΔW) over the adjusted lr /
    sqrt(max(rows, cols)), torch.optim.Muon's ``adjust_lr`` rule) within ``band``. Returns
    ``{"min": ..., "max": ..., "median": ...}`` over the steps. A skipped step (no update) and a
    step without the column are not judged."""
    __tracebackhide__ = True
    rec = as_record(run)
    low, high = band
    if not 0 < low < 1 < high:
        raise ConfigError(f"band must be (low, high) with 0 < low < 1 < high, was {band!r}")
    steps, ratio = _column(rec, "muon_update_ratio", "RMS of Muon's update over its expected scale")
    keep = np.isfinite(ratio) & ~np.isin(steps, list(rec.skipped))
    if not keep.any():
        raise ConfigError("no step with a recorded Muon update to judge (every step skipped, or none recorded)")
    steps, ratio = steps[keep], ratio[keep]
    worst = int(np.argmax(np.maximum(low / ratio, ratio / high)))
    if not low <= ratio[worst] <= high:
        step, r = int(steps[worst]), float(ratio[worst])
        why = ""
        if "update_clip_norm" in rec.metrics:
            clip_steps, clip_norm = rec.series("update_clip_norm")
            at = np.flatnonzero(np.asarray(clip_steps) == step)
            if at.size and math.isfinite(clip_norm[at[0]]):
                why = (
                    f"; the clip was taken over Muon's update and divided it by {fmt(float(clip_norm[at[0]]))} "
                    f"(update_clip_norm), the norm of the update itself: clip the gradient, not the update "
                    f"(DeepSpeed issue 8439)"
                )
        fail(
            "assert_muon_update_scale",
            f"Muon's update at step {step} was {fmt(r)}x its expected scale (allowed "
            f"{fmt(low)}-{fmt(high)}x): the step was {'attenuated' if r < low else 'amplified'} "
            f"{fmt(1 / r if r < low else r)}x by something other than the lr{why}",
            rec,
            step,
            "muon_update_ratio",
            measured=r,
            limit=low if r < low else high,
            diagnose_step=False,
        )
    passed(
        "assert_muon_update_scale",
        f"Muon's update stayed within {fmt(low)}-{fmt(high)}x its expected scale "
        f"at every applied step (worst {fmt(float(ratio[worst]))}x)",
        rec,
        "muon_update_ratio",
        measured=float(ratio[worst]),
        step=int(steps[worst]),
    )
    return {"min": float(ratio.min()), "max": float(ratio.max()), "median": float(np.median(ratio))}


def assert_optimizer_steps(run: Any) -> dict[str, int]:
    """Assert the optimizer counted the steps it applied: at each step the recorded
    ``optimizer_steps`` (the largest ``step`` in its state) equals the run's steps so far less
    those whose update was skipped (``Record.skipped``: SkipSpikes, a loss scaler's overflow).
    Returns ``{"applied": ..., "counted": ...}`` at the last step."""
    __tracebackhide__ = True
    rec = as_record(run)
    steps, counted = _column(rec, "optimizer_steps", "the optimizer's own step count")
    all_steps = np.asarray(rec.metrics["step"], dtype=np.int64)
    skipped = np.isin(all_steps, list(rec.skipped))
    applied = dict(zip(all_steps.tolist(), np.cumsum(~skipped).tolist()))
    for step, count in zip(steps.tolist(), counted.tolist()):
        if not math.isfinite(count):
            continue
        expected = applied[step]
        if int(count) != expected:
            stuck = (
                " (it never advanced: Adam's bias correction stays that of its first step; OLMo-core PR 317)"
                if count == 0 or count == 1 < expected
                else ""
            )
            fail(
                "assert_optimizer_steps",
                f"at step {step} the optimizer counted {fmt(count)} steps but {expected} "
                f"were applied ({int(skipped[all_steps <= step].sum())} skipped){stuck}",
                rec,
                step,
                "optimizer_steps",
                measured=count,
                limit=expected,
                diagnose_step=False,
            )
    last = int(steps[-1]) if steps.size else 0
    passed(
        "assert_optimizer_steps",
        f"the optimizer counted every applied step ({int(applied.get(last, 0))})",
        rec,
        "optimizer_steps",
        measured=float(counted[-1]) if steps.size else None,
        step=last or None,
    )
    return {"applied": int(applied.get(last, 0)), "counted": int(counted[-1]) if steps.size else 0}


#: The recorded fact that says whether a step's gradient elements were all finite before the clip
#: where its pre-clip norm is not (records/run.py, SETUP_KEYS).
FINITE_PRE = "grad_finite_pre"


def finite_before_clip(rec: Record) -> np.ndarray:
    """Per row of ``rec``: 1.0 where every gradient element was finite before the clip, 0.0 where
    one was not, NaN where the record does not say. A finite pre-clip norm says it (every element
    is finite); a non-finite one is read from the recorded ``grad_finite_pre`` (null or absent:
    unknown, as in a log that records only the norm)."""
    pre = np.asarray(rec.metrics["grad_norm_pre"], dtype=np.float64)
    out = np.full(pre.shape, np.nan)
    if FINITE_PRE in rec.metrics:
        out = np.asarray(rec.metrics[FINITE_PRE], dtype=np.float64).copy()
        if FINITE_PRE in rec.missing:
            out[rec.missing[FINITE_PRE]] = np.nan
    said_by_norm = np.isfinite(pre)
    if "grad_norm_pre" in rec.missing:
        said_by_norm &= ~rec.missing["grad_norm_pre"]
    out[said_by_norm] = 1.0
    return out


#: The largest gradient norm float32 can hold while summing squares: sqrt(float32's max), ~1.84e19.
#: Above it torch's float32 norm (``clip_grad_norm_``, ``get_total_norm``) is inf with every element finite.
FLOAT32_NORM_LIMIT = math.sqrt(float(np.finfo(np.float32).max))


def _clip_cause(limit: float, pre: float) -> str:
    """Why a clip at ``limit`` turned finite gradients whose pre-clip norm was ``pre`` (inf:
    overflowed) non-finite, in words."""
    overflows = not math.isfinite(pre) or pre > FLOAT32_NORM_LIMIT  # a recorder's float64 tap holds it
    if math.isinf(limit) and overflows:
        return (
            "with no clip (clip_limit inf) that is torch.nn.utils.clip_grad_norm_(max_norm=inf) called only "
            "to log the norm: its coefficient max_norm / norm = inf / inf = NaN multiplied every gradient; "
            "log the norm with torch.nn.utils.get_total_norm, which leaves the gradients alone "
            "(Skovorp/feral PR 16; pytorch issue 46849)"
        )
    if overflows:
        told = "with no clip limit recorded" if math.isnan(limit) else f"at max_norm {fmt(limit)}"
        return (
            f"a clip coefficient computed from a norm that overflows float32 ({told}) multiplied them; "
            "torch.nn.utils.clip_grad_norm_ at max_norm=inf does that (inf / inf = NaN)"
        )
    return "something between the pre-clip measurement and the optimizer (the clip, a hook) made them so"


def assert_clip_keeps_finite(run: Any) -> dict[str, int]:
    """Assert the clip never turned finite gradients non-finite: at every applied step of ``run``
    (a :class:`~pytest_spikecheck.records.run.Run`, a run folder, a record) whose gradients were
    all finite before the clip (:func:`finite_before_clip`: a finite ``grad_norm_pre``, or the
    recorded ``grad_finite_pre`` where that norm overflowed), the norm of what the optimizer
    received (``grad_norm_post``) is finite. A failure names the step and the cause in one line
    (with no clip: ``torch.nn.utils.clip_grad_norm_(max_norm=inf)`` called to log the norm,
    ``ClipInfToLog``). A run that diverged on its own passes it: its gradients were already
    non-finite, or only their norm overflowed and they reached the optimizer finite
    (``assert_finite`` fails those). Skipped steps (nothing reached the optimizer) and steps
    whose finiteness before the clip is not recorded are not judged. Returns ``{"judged": ...,
    "norm_overflowed": ..., "not_judged": ...}``: the steps judged, those among them whose
    gradients were finite with an overflowed pre-clip norm, and those left out as unknown."""
    __tracebackhide__ = True
    rec = as_record(run)
    for name in ("grad_norm_pre", "grad_norm_post"):
        if name not in rec.metrics:
            raise ConfigError(
                f"the record has no {name!r} column: assert_clip_keeps_finite compares the gradients before "
                f"and after the clip (the engine and the recorder write both)"
            )
    steps = np.asarray(rec.metrics["step"], dtype=np.int64)
    pre = np.asarray(rec.metrics["grad_norm_pre"], dtype=np.float64)
    post = np.asarray(rec.metrics["grad_norm_post"], dtype=np.float64)
    applied = ~np.isin(steps, list(rec.skipped))
    if "grad_norm_post" in rec.missing:
        applied &= ~rec.missing["grad_norm_post"]
    before = finite_before_clip(rec)
    known = applied & ~np.isnan(before)
    if not known.any():
        raise ConfigError(
            "no step to judge: every step was skipped, or none records whether its gradients were finite "
            "before the clip (a finite grad_norm_pre, or grad_finite_pre where it is not)"
        )
    turned = known & (before == 1.0) & ~np.isfinite(post)
    overflowed = known & (before == 1.0) & ~np.isfinite(pre)
    if turned.any():
        i = int(np.flatnonzero(turned)[0])
        step = int(steps[i])
        limits = clip_limits(rec)
        limit = float(limits[i]) if limits is not None else math.nan
        if math.isinf(pre[i]):
            before_text = (
                f"every gradient element was finite before the clip (grad_finite_pre 1; only their norm "
                f"overflowed to {fmt(float(pre[i]))}, summed in the gradients' dtype)"
            )
        else:
            before_text = f"every gradient was finite before the clip (grad_norm_pre {fmt(float(pre[i]))})"
        fail(
            "assert_clip_keeps_finite",
            f"at step {step} the clip turned finite gradients non-finite: {before_text}, but the optimizer "
            f"received {fmt(float(post[i]))} (grad_norm_post); {_clip_cause(limit, float(pre[i]))}",
            rec,
            step,
            "grad_norm_post",
            measured=float(post[i]),
            diagnose_step=False,
        )
    unknown = int((applied & np.isnan(before)).sum())
    overflow_note = (
        f"; {int(overflowed.sum())} with finite gradients whose pre-clip norm overflowed reached the optimizer finite"
        if overflowed.any()
        else ""
    )
    passed(
        "assert_clip_keeps_finite",
        f"the clip kept finite gradients finite at every judged step ({int(known.sum())}){overflow_note}"
        + (
            f"; {unknown} step{'s' if unknown != 1 else ''} not judged (finiteness before the clip not recorded)"
            if unknown
            else ""
        ),
        rec,
        "grad_norm_post",
        step=int(steps[np.flatnonzero(known)[-1]]),
    )
    return {"judged": int(known.sum()), "norm_overflowed": int(overflowed.sum()), "not_judged": unknown}
