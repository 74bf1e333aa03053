"""Measures on recorded series: spike ratio, loss jump, recovery, final gap.

Everything works on a *metrics mapping*: ``{"step": int array, "loss": ..., ...}`` with
NaN where a value was not recorded (a Run's ``metrics``, a loaded ``metrics.jsonl``, or a
user's own arrays). Steps are the real step numbers, so logs with gaps work: a "window of
50 steps" means steps, not rows. numpy only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from pytest_spikecheck.judge.baseline import BASELINE_WINDOW, MIN_BASELINE_POINTS, spike_baseline

Metrics = Mapping[str, np.ndarray]

#: Composer's recovery criterion: back within 1.10x the pre-spike average.
RECOVERY_FACTOR = 1.10
#: How long a recovered series must stay recovered (steps after the event).
RECOVERY_HORIZON = 50
#: A post-clip norm is "contained" when at most max_norm·(1 + CLIP_RTOL): float32 rounding of a
#: norm scaled to exactly max_norm lands a few ulps either side.
CLIP_RTOL = 1e-5
#: torch's clip coefficient is max_norm / (norm + 1e-6) (ours too): a clipped gradient ends up to
#: 1e-6 below max_norm, which a tiny max_norm makes a large relative shortfall. Not over-clipping.
CLIP_EPS = 1e-6


def overclipped(pre: Any, post: Any, limit: Any, rtol: float = CLIP_RTOL) -> np.ndarray:
    """Where a clip scaled too far: the post-clip norm below min(pre-clip, limit)·(1 − rtol) −
    CLIP_EPS, with both norms finite. A correct clip leaves min(pre, limit) (the gradient
    untouched, or scaled to the limit); a clip of loss-scaled gradients leaves 1/scale of it."""
    pre, post = np.asarray(pre, dtype=np.float64), np.asarray(post, dtype=np.float64)
    expected = np.minimum(pre, np.asarray(limit, dtype=np.float64))
    with np.errstate(invalid="ignore", over="ignore"):
        return np.isfinite(pre) & np.isfinite(post) & (post < expected * (1 - rtol) - CLIP_EPS)


def contained(post: Any, limit: Any, rtol: float = CLIP_RTOL) -> np.ndarray:
    """Where the clip held: the post-clip norm at most limit·(1 + rtol). The one rule of
    containment (assert_clip_contains, the diagnosis and the report's cell all ask it). An
    infinite limit (no clip) holds any finite norm; a NaN post-clip norm is not contained."""
    post, limit = np.asarray(post, dtype=np.float64), np.asarray(limit, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        return post <= limit * (1 + rtol)


def clip_limits(rec: Any, max_norm: float | None = None) -> np.ndarray | None:
    """The clip limit of each step of ``rec`` (a Record): ``max_norm`` when the caller gives it;
    else the record's own ``clip_limit`` column (null or inf: no clip at that step, inf here);
    else its facts' fixed limit (a Run's, a log's). None when the record does not say (a log
    without the column or the parameters, or facts that do not know the clip)."""
    steps = np.asarray(rec.metrics["step"])
    if max_norm is not None:
        return np.full(steps.shape, float(max_norm))
    if "clip_limit" in rec.metrics:
        values = np.asarray(rec.metrics["clip_limit"], dtype=np.float64)
        return np.where(np.isnan(values), np.inf, values)
    facts = getattr(rec, "facts", None) or getattr(getattr(rec, "run", None), "facts", None)
    clip = getattr(facts, "clip", None)
    if clip is None or clip.kind == "adaptive":
        return None  # unknown, or a limit that moves every step and was not recorded
    return np.full(steps.shape, clip.limit)


#: Means, medians, differences and ratios of values near float64's limit overflow; inf is then
#: the honest result (a ratio too large to represent is still a spike), so numpy need not warn
#: (a warning is an error in suites run with ``filterwarnings = error``).
_overflow_is_inf = np.errstate(over="ignore")


def column(metrics: Metrics, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of one metric, dropping steps where it was not recorded (NaN kept
    only where the record says the value itself was non-finite is impossible to tell, so
    NaN means 'not recorded' here; use :func:`first_nonfinite` for real NaNs)."""
    if name not in metrics:
        raise KeyError(f"no {name!r} series; have {', '.join(sorted(k for k in metrics if k != 'step'))}")
    steps = np.asarray(metrics["step"], dtype=np.int64)
    values = np.asarray(metrics[name], dtype=np.float64)
    keep = ~np.isnan(values)
    return steps[keep], values[keep]


def value_at(metrics: Metrics, name: str, step: int) -> float:
    steps = np.asarray(metrics["step"])
    idx = np.flatnonzero(steps == step)
    return float(np.asarray(metrics[name], dtype=np.float64)[idx[-1]]) if idx.size else math.nan


@_overflow_is_inf
def baseline(
    metrics: Metrics, name: str, step: int, window: int = BASELINE_WINDOW, min_points: int = MIN_BASELINE_POINTS
) -> float:
    """Median of ``name`` over the ``window`` steps before ``step`` (finite values only; NaN
    with fewer than ``min_points``): :func:`~pytest_spikecheck.judge.baseline.spike_baseline`."""
    steps, values = column(metrics, name)
    return spike_baseline(steps, values, step, window, min_points)


def spike_ratio(metrics: Metrics, step: int, name: str = "grad_norm_pre", window: int = BASELINE_WINDOW) -> float:
    """Value at ``step`` divided by the median of the ``window`` steps before it."""
    base = baseline(metrics, name, step, window)
    value = value_at(metrics, name, step)
    return value / base if base and base > 0 and not math.isnan(base) else math.nan


@_overflow_is_inf
def ratio_series(
    metrics: Metrics, name: str = "grad_norm_pre", window: int = BASELINE_WINDOW, min_history: int = MIN_BASELINE_POINTS
) -> tuple[np.ndarray, np.ndarray]:
    """(steps, value / its spike baseline) for every recorded step (NaN where not judged)."""
    steps, values = column(metrics, name)
    out = np.full(values.shape, np.nan)
    for i, s in enumerate(steps):
        med = spike_baseline(steps[:i], values[:i], int(s), window, min_history)
        if med > 0:
            out[i] = values[i] / med
    return steps, out


def largest_spike(metrics: Metrics, name: str = "grad_norm_pre", window: int = BASELINE_WINDOW) -> tuple[int | None, float]:
    """(step, ratio) of the largest ratio to the rolling median; (None, nan) for short series."""
    steps, ratios = ratio_series(metrics, name, window)
    finite = np.isfinite(ratios)
    if not finite.any():
        return None, math.nan
    i = int(np.nanargmax(np.where(finite, ratios, -np.inf)))
    return int(steps[i]), float(ratios[i])


@_overflow_is_inf
def loss_jump(metrics: Metrics, step: int, after: int = 10, name: str = "eval_loss") -> float:
    """Worst ``name`` in the ``after`` steps from ``step`` minus the last value before ``step``."""
    steps, values = column(metrics, name)
    before = values[steps < step]
    window = values[(steps >= step) & (steps < step + after)]
    if before.size == 0 or window.size == 0:
        return math.nan
    return float(np.max(window) - before[-1])


@_overflow_is_inf
def pre_event_mean(metrics: Metrics, step: int, before: int = 10, name: str = "eval_loss") -> float:
    steps, values = column(metrics, name)
    sel = (steps >= step - before) & (steps < step)
    return float(np.mean(values[sel])) if sel.any() else math.nan


def recovery_steps(
    metrics: Metrics,
    step: int,
    factor: float = RECOVERY_FACTOR,
    name: str = "eval_loss",
    before: int = 10,
    reference: float | None = None,
    horizon: int = RECOVERY_HORIZON,
) -> int | None:
    """Steps from ``step`` until ``name`` is back within ``factor`` x the pre-event mean (or
    ``reference``) and stays there until ``step + horizon``. 0 = never left; None = not back
    within the horizon. The horizon is bounded because a tiny corpus overfits: late in a run
    the eval loss drifts up for reasons that have nothing to do with the event."""
    steps, values = column(metrics, name)
    level = reference if reference is not None else pre_event_mean(metrics, step, before, name)
    if math.isnan(level):
        return None
    window = (steps >= step) & (steps <= step + horizon)
    s_after, v_after = steps[window], values[window]
    bad = ~(v_after <= factor * level)  # NaN/inf count as not recovered
    if not bad.any():
        return 0
    last_bad = int(np.flatnonzero(bad)[-1])
    if last_bad + 1 >= len(s_after):
        return None
    return int(s_after[last_bad + 1] - step)


@_overflow_is_inf
def final_value(metrics: Metrics, name: str = "eval_loss", last: int = 3) -> float:
    """Mean of the last ``last`` recorded values of ``name``."""
    _, values = column(metrics, name)
    return float(np.mean(values[-last:])) if values.size else math.nan


def first_nonfinite(
    metrics: Metrics, names: Sequence[str] = ("loss", "grad_norm_pre"), missing: Mapping[str, np.ndarray] | None = None
) -> tuple[int, str] | None:
    """(step, metric) of the first NaN/inf among ``names``; ``missing`` masks mark steps where
    a metric was not logged (those NaNs are not counted)."""
    steps = np.asarray(metrics["step"])
    first: tuple[int, str] | None = None
    for name in names:
        if name not in metrics:
            continue
        nonfinite = ~np.isfinite(np.asarray(metrics[name], dtype=np.float64))
        if missing and name in missing:
            nonfinite &= ~missing[name]
        bad = np.flatnonzero(nonfinite)
        if bad.size and (first is None or steps[bad[0]] < first[0]):
            first = (int(steps[bad[0]]), name)
    return first


@dataclass(frozen=True)
class EventSummary:
    """One row of a control-vs-break comparison."""

    step: int | None
    ratio: float
    loss_jump: float
    recovery: int | None
    post_clip_at_step: float | None  # None: the record has no post-clip norm at that step
    final_eval: float  # NaN when nothing was evaluated (never the train loss in its place)
    evaluated: bool = True  # the record has eval losses (the jump and recovery are then the eval loss's)

    @classmethod
    def measure(cls, metrics: Metrics, step: int | None) -> EventSummary:
        if step is None:
            step, _ = largest_spike(metrics)
        has_eval = "eval_loss" in metrics and np.isfinite(np.asarray(metrics["eval_loss"], dtype=float)).any()
        final = final_value(metrics) if has_eval else math.nan
        if step is None:
            return cls(None, math.nan, math.nan, None, None, final, has_eval)
        return cls(
            step=step,
            ratio=spike_ratio(metrics, step),
            loss_jump=loss_jump(metrics, step) if has_eval else loss_jump(metrics, step, name="loss"),
            recovery=recovery_steps(metrics, step) if has_eval else recovery_steps(metrics, step, name="loss"),
            post_clip_at_step=value_at(metrics, "grad_norm_post", step) if "grad_norm_post" in metrics else None,
            final_eval=final,
            evaluated=has_eval,
        )
