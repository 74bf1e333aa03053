"""The spike baseline: one definition of "what this value is compared against".

Used by the engine's online trigger (event records, ``SkipSpikes``), the analysis (spike
ratio, largest spike, recovery), probes and the ``ratio`` detector, so that a spike the
engine records at step S is the spike every judgement finds there. numpy only.

The window is measured in steps *and* in logged points: it covers the ``window`` steps
before the value, widened back to the last ``min_points`` logged values when the log is
sparser than that (a log written every 10 steps has 5 values in 50 steps; HF's default
writes one every 500). On a log written every step the widening never happens once
``min_points`` steps have passed, so dense runs get the same baseline as a plain window.
"""

from __future__ import annotations

import math

import numpy as np

#: Steps before a value that its baseline looks back over (widened on sparse logs, above).
BASELINE_WINDOW = 50
#: Fewer finite values than this before a value: no baseline (the value is not judged).
MIN_BASELINE_POINTS = 10


def baseline_history(
    steps: np.ndarray, values: np.ndarray, at_step: int, window: int = BASELINE_WINDOW, min_points: int = MIN_BASELINE_POINTS
) -> np.ndarray:
    """The finite ``values`` a value at ``at_step`` is compared against: those logged at steps in
    ``[at_step - window, at_step)``, widened back to the last ``min_points`` finite values
    when the window holds fewer. Empty when fewer than ``min_points`` were logged before
    ``at_step`` at all. ``steps`` must ascend."""
    lo = int(np.searchsorted(steps, at_step - window, side="left"))
    hi = int(np.searchsorted(steps, at_step, side="left"))
    history = values[lo:hi]
    history = history[np.isfinite(history)]
    need = max(1, min_points)
    if history.size < need and lo > 0:
        earlier = values[:lo]
        earlier = earlier[np.isfinite(earlier)]
        history = np.concatenate([earlier[max(0, earlier.size - (need - history.size)) :], history])
    return history if history.size >= need else history[:0]


def spike_baseline(
    steps: np.ndarray, values: np.ndarray, at_step: int, window: int = BASELINE_WINDOW, min_points: int = MIN_BASELINE_POINTS
) -> float:
    """Median of :func:`baseline_history`; NaN when it is empty (too few values before)."""
    history = baseline_history(steps, values, at_step, window, min_points)
    if history.size == 0:
        return math.nan
    with np.errstate(over="ignore"):  # two values near float64's limit: their mean is inf, honestly
        return float(np.median(history))
