"""The spike baseline: one definition of "what this value is compared against".

Used by the engine's online trigger (event records, ``SkipSpikes``), the analysis (spike
ratio, largest spike, recovery), probes and the ``ratio`` detector, so that a spike the
engine records at step S is the spike every judgement finds there. numpy only.
"""

from __future__ import annotations

import math

import numpy as np

#: Steps before a value that its baseline looks back over.
BASELINE_WINDOW = 50
#: Fewer finite values than this in the window: no baseline (the value is not judged).
MIN_BASELINE_POINTS = 10


def spike_baseline(steps: np.ndarray, values: np.ndarray, at_step: int, window: int = BASELINE_WINDOW,
                   min_points: int = MIN_BASELINE_POINTS) -> float:
    """Median of the finite ``values`` logged at steps in ``[at_step - window, at_step)``;
    NaN when fewer than ``min_points`` of them are finite. ``steps`` must ascend."""
    lo = int(np.searchsorted(steps, at_step - window, side="left"))
    hi = int(np.searchsorted(steps, at_step, side="left"))
    history = values[lo:hi]
    history = history[np.isfinite(history)]
    if history.size < max(1, min_points):
        return math.nan
    with np.errstate(over="ignore"):  # two values near float64's limit: their mean is inf, honestly
        return float(np.median(history))
