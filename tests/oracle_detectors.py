"""Today's loop implementation of the default policy's rules and the ratio detector (the code of
``judge/detectors.py`` and ``judge/baseline.py`` before they were vectorised, kept verbatim
apart from this docstring and the imports): the oracle that tests/test_detectors_vectorised.py
compares the vectorised rules with, point by point, on synthetic series and the real corpus.
Not used by the package."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from pytest_spikecheck.judge.detectors import Detection, Detector

BASELINE_WINDOW = 50
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


def _history(steps: np.ndarray, values: np.ndarray, i: int, window: int, min_points: int) -> np.ndarray:
    """The finite values before index ``i`` a detector compares it with: the ``window`` steps
    before, widened to ``min_points`` logged values on a sparse log (empty when fewer were
    logged). The same rule as the spike baseline, so every detector reads a log alike."""
    return baseline_history(steps[:i], values[:i], int(steps[i]), window, min_points)


def _nonfinite(steps: np.ndarray, values: np.ndarray, i: int, baseline: float = math.nan) -> Detection:
    return Detection(int(steps[i]), float(values[i]), baseline, math.inf)


class _HistoryRule(Detector):
    """A detector that judges each value against the history before it alone (no state carried
    from one value to the next): one loop, each rule its own :meth:`_rule`. A non-finite value
    is always flagged; a value whose history is empty, or gives no baseline, is not judged."""

    def _history_points(self) -> int:
        return self.min_history  # type: ignore[attr-defined]

    def _rule(self, value: float, history: np.ndarray) -> tuple[float, float, bool] | None:  # pragma: no cover
        """(baseline, score, flagged) for one value, or None when its history gives no baseline."""
        raise NotImplementedError

    def _detect(self, steps, values):
        ok = np.isfinite(values)
        out, judged = [], 0
        for i in range(values.size):
            if not ok[i]:
                out.append(_nonfinite(steps, values, i))
                judged += 1
                continue
            history = _history(steps, values, i, self.window, self._history_points())  # type: ignore[attr-defined]
            verdict = self._rule(float(values[i]), history) if history.size else None
            if verdict is None:
                continue
            judged += 1
            baseline, score, flagged = verdict
            if flagged:
                out.append(Detection(int(steps[i]), float(values[i]), baseline, score))
        return out, judged


@dataclass(frozen=True)
class RatioToMedian(Detector):
    name: ClassVar[str] = "ratio"
    threshold: float = 5.0
    window: int = BASELINE_WINDOW
    min_history: int = MIN_BASELINE_POINTS

    def _detect(self, steps, values):
        # Its own loop, through spike_baseline: the ratio detector is the engine's online trigger
        # offline, so both read the one baseline function.
        ok = np.isfinite(values)
        out, judged = [], 0
        for i in range(values.size):
            if not ok[i]:
                out.append(_nonfinite(steps, values, i))
                judged += 1
                continue
            med = spike_baseline(steps[:i], values[:i], int(steps[i]), self.window, self.min_history)
            if math.isnan(med):
                continue
            judged += 1
            if med > 0 and values[i] / med >= self.threshold:
                out.append(Detection(int(steps[i]), float(values[i]), med, float(values[i] / med)))
        return out, judged


#: 1.4826 x the median absolute deviation estimates a normal spread's σ, robustly: one wild
#: value in the history moves neither the median nor the MAD much.
MAD_TO_SIGMA = 1.4826


def _median(values: np.ndarray) -> float:
    """np.median's value for a small finite array, without its per-call overhead (the rules
    take a median at every logged point, and the corpus test judges ~30,000 of them)."""
    ordered = np.sort(values)
    mid = ordered.size // 2
    return float(ordered[mid]) if ordered.size % 2 else float((ordered[mid - 1] + ordered[mid]) / 2)


def _median_and_spread(hist: np.ndarray) -> tuple[float, float]:
    med = _median(hist)
    return med, MAD_TO_SIGMA * _median(np.abs(hist - med))


@dataclass(frozen=True)
class LossJump(_HistoryRule):
    """The loss is a log-likelihood, so a spike is an *additive* event: a jump of ``nats``
    above the median of the previous points means the same thing at any baseline (ln 2: the
    model's perplexity doubled). On a noisy per-batch loss the bar rises to ``sigmas``
    robust standard deviations (1.4826 MAD) of the history, so ordinary batch-to-batch noise
    does not fire it."""

    name: ClassVar[str] = "loss-jump"
    unit: ClassVar[str] = "nats"
    nats: float = math.log(2)
    sigmas: float = 6.0
    window: int = BASELINE_WINDOW
    min_history: int = 5

    @property
    def threshold_name(self) -> str:
        return "nats"

    def _rule(self, value, history):
        med, spread = _median_and_spread(history)
        jump = value - med
        return med, jump, jump >= max(self.nats, self.sigmas * spread)


@dataclass(frozen=True)
class SustainedLoss(Detector):
    """A loss that rises and *stays* high is worse than a one-point spike, and a log written
    every 500 steps shows nothing else: flagged where the loss first rises ``nats`` (and
    ``sigmas`` robust standard deviations of the history: a median of ``hold`` points carries
    less noise than one point, hence a lower bar than the jump's) above the median of the
    points before it and the median of it and the next ``hold - 1`` points is still that high. Needs only ``min_history`` earlier points, because the level that follows
    is the evidence; flagged once per episode, at its onset. The baseline is the median of the
    last ``history_points`` logged points (over at least ``window`` steps); before a log has
    that many, of every earlier point (at least ``min_history``)."""

    name: ClassVar[str] = "loss-sustained"
    unit: ClassVar[str] = "nats"
    nats: float = math.log(2)
    sigmas: float = 3.0
    hold: int = 3
    window: int = BASELINE_WINDOW
    min_history: int = 1
    history_points: int = 5  # the baseline's usual size; a log's first points have fewer

    @property
    def threshold_name(self) -> str:
        return "nats"

    def needs(self) -> str:
        return (
            f"{self.min_history} earlier logged point{'s' if self.min_history != 1 else ''} and "
            f"{self.hold - 1} later one{'s' if self.hold != 2 else ''}"
        )

    def _detect(self, steps, values):
        ok = np.isfinite(values)
        out, judged, elevated = [], 0, False
        for i in range(values.size):
            if not ok[i]:
                out.append(_nonfinite(steps, values, i))
                judged += 1
                continue
            later = values[i : i + self.hold]
            hist = _history(steps, values, i, self.window, self.history_points)
            if hist.size == 0:  # early in the log: every earlier point, if there are enough
                earlier = values[:i][ok[:i]]
                hist = earlier if earlier.size >= self.min_history else hist
            if hist.size == 0 or later.size < self.hold:
                continue
            judged += 1
            med, spread = _median_and_spread(hist)
            bar = max(self.nats, self.sigmas * spread)
            # A non-finite value among the next points: no level (flagged on its own).
            level = _median(later) if np.isfinite(later).all() else math.nan
            now = float(values[i]) - med >= bar and level - med >= bar
            if now and not elevated:
                out.append(Detection(int(steps[i]), float(values[i]), med, level - med))
            elevated = now
        return out, judged


@dataclass(frozen=True)
class GradRatio(Detector):
    """A gradient norm ``threshold`` x its recent level *and* ``sigmas`` robust standard
    deviations (1.4826 MAD) above it in log space (a norm is a scale: its noise is
    multiplicative; 2.5 is ZClip's published z threshold). The recent level is the median of the last
    ``min_history`` logged points (at least ``window`` steps), but never less than
    ``floor`` x the median of every earlier point: a norm that collapses towards 0 (a
    memorised data set, an RL group with no reward variance) would otherwise make its next
    ordinary value a "spike" of 1000x. Zero norms (no gradient at all) are no level and are
    left out of both medians. Never raw σ: one spike in the history inflates it for the
    whole window."""

    name: ClassVar[str] = "grad-ratio"
    threshold: float = 10.0
    sigmas: float = 2.5
    floor: float = 0.5
    window: int = 10
    min_history: int = MIN_BASELINE_POINTS

    def _detect(self, steps, values):
        ok = np.isfinite(values)
        level = ok & (values > 0)
        level_steps, level_values = steps[level], values[level]
        seen = 0  # how many of level_values come before the value being judged
        long_run: list[float] = []  # every earlier level value, sorted: its median is the long-run level
        out, judged = [], 0
        for i in range(values.size):
            if not ok[i]:
                out.append(_nonfinite(steps, values, i))
                judged += 1
                continue
            hist = baseline_history(level_steps[:seen], level_values[:seen], int(steps[i]), self.window, self.min_history)
            if level[i]:
                seen += 1
            if hist.size == 0:
                if level[i]:
                    bisect.insort(long_run, float(values[i]))
                continue
            judged += 1
            log_med, log_spread = _median_and_spread(np.log(hist))
            n = len(long_run)
            long_run_median = long_run[n // 2] if n % 2 else (long_run[n // 2 - 1] + long_run[n // 2]) / 2
            if level[i]:
                bisect.insort(long_run, float(values[i]))
            base = max(math.exp(log_med), self.floor * long_run_median)
            x = float(values[i])
            if x >= self.threshold * base and math.log(x) - log_med >= self.sigmas * log_spread:
                out.append(Detection(int(steps[i]), x, base, x / base))
        return out, judged
