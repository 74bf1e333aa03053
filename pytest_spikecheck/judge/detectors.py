"""Spike detectors: the rules the field uses, named, configurable, and testable on any series.

Each detector walks a series on its real step axis and returns the steps it flags. Windows
and minimum histories are measured in steps *and* in logged points: a window of W steps is
widened back to the detector's minimum number of logged values when the log is sparser (a
log written every 500 steps still gets judged), and :meth:`Detector.judge` says how many
values could be judged and what a value needs, so a series too short to judge is reported
as such, never as "no spike". The published detectors keep their published defaults:

========== ===============================================================================
ratio       value >= ``threshold`` x the median of the previous ``window`` steps (ours; default)
llm-foundry loss >= 2 x the mean of the last 100 steps, for ``patience`` (4) consecutive steps
lightning   |loss - mean| >= 2 x |mean| over the last 10 steps (Lightning's SpikeDetection, relative mode)
olmo-core   value > mean + 6 sigma over the last 128 steps
zclip       EMA z-score > 2.5 with alpha 0.97 (ZClip); spikes are not folded into the EMA
megatron    loss >= 10 x the max of the first 100 steps
========== ===============================================================================

and the rules of the default CI policy (:mod:`pytest_spikecheck.judge.policy`), calibrated
on real public training logs (``tests/data/reallogs``, ``docs/detectors.md``):

============== ===========================================================================
loss-jump       loss >= median + max(ln 2 nats, 6 x 1.4826 MAD) of the previous points (MAD of their changes if less)
loss-sustained  the loss rises ln 2 nats (and 3 robust sigmas) above its median and stays there
grad-ratio      norm >= 10 x the median of the previous points and 6 robust sigmas above it
============== ===========================================================================

numpy only. A detector never raises on empty, short or non-finite series: non-finite
values are flagged (a NaN loss is the worst spike) and never enter a baseline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

import numpy as np

from pytest_spikecheck.judge import rolling
from pytest_spikecheck.judge.baseline import BASELINE_WINDOW, MIN_BASELINE_POINTS, baseline_history, spike_baseline


@dataclass(frozen=True)
class Detection:
    step: int
    value: float
    baseline: float  # what the value was compared against (mean, median, EMA...)
    score: float  # ratio or z-score, in the detector's own unit


def log_interval(steps: Any) -> int | None:
    """The step spacing a log was written at: the median gap between logged steps (None
    for fewer than two)."""
    s = np.asarray(steps, dtype=np.int64).reshape(-1)
    return int(np.median(np.diff(s))) if s.size > 1 else None


@dataclass(frozen=True)
class Judgement:
    """What one detector made of one series: its flags, and how much of the series it could
    judge (a value is judged when the detector had the history it needs for it; a
    non-finite value is always judged, and flagged)."""

    detector: str
    points: int  # finite or not, every logged value
    judged: int
    interval: int | None  # the log's step spacing (median gap), None below two points
    needs: str  # what a value needs to be judged, in words
    detections: tuple[Detection, ...] = ()

    @property
    def blind(self) -> bool:
        """Not a single value judged: "no spike" would be a guess."""
        return self.judged == 0

    def not_judged_text(self) -> str:
        every = "" if self.interval is None else f", interval {self.interval} step{'s' if self.interval != 1 else ''}"
        return f"not judged: {self.points} point{'s' if self.points != 1 else ''}{every}, needs {self.needs}"


@dataclass(frozen=True)
class Detector:
    name: ClassVar[str] = ""
    unit: ClassVar[str] = "×"

    def detect(self, steps: Any, values: Any) -> list[Detection]:
        return list(self.judge(steps, values).detections)

    def judge(self, steps: Any, values: Any) -> Judgement:
        """The flags on a series, with how many of its values could be judged."""
        s = np.asarray(steps, dtype=np.int64).reshape(-1)
        v = np.asarray(values, dtype=np.float64).reshape(-1)
        if s.shape != v.shape:
            raise ValueError(f"steps and values must have the same length, were {s.size} and {v.size}")
        # Means, variances and ratios of values near float64's limit overflow to inf; the rules
        # then compare against inf, which is the honest answer, so numpy need not warn about it.
        with np.errstate(over="ignore"):
            found, judged = self._detect(s, v) if v.size else ([], 0)
        return Judgement(self.name, int(v.size), int(judged), log_interval(s), self.needs(), tuple(found))

    def needs(self) -> str:
        """What a value needs before it can be judged, in words (the "not judged" line)."""
        window, points = getattr(self, "window", None), getattr(self, "min_history", None)
        if points is None:
            return "nothing"
        return f"{points} earlier logged point{'s' if points != 1 else ''}" + (
            f" (over at least {window} steps)" if window else ""
        )

    def _detect(self, steps: np.ndarray, values: np.ndarray) -> tuple[list[Detection], int]:  # pragma: no cover
        """(flags, number of values judged)."""
        raise NotImplementedError

    @property
    def threshold_name(self) -> str:
        """The field that sets the detector's sensitivity (swept by calibration)."""
        return "threshold"

    def with_threshold(self, value: float) -> Detector:
        return replace(self, **{self.threshold_name: value})

    def describe(self) -> str:
        params = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self))
        return f"{self.name}({params})"


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


@dataclass(frozen=True)
class LLMFoundry(Detector):
    """llm-foundry's loss-spike rule: ``patience`` consecutive steps above ``threshold`` x the
    running mean of the previous ``window`` steps; flagged at the step the patience runs out."""

    name: ClassVar[str] = "llm-foundry"
    threshold: float = 2.0
    window: int = 100
    patience: int = 4
    min_history: int = 10

    def _detect(self, steps, values):
        ok = np.isfinite(values)
        out, streak, judged = [], 0, 0
        for i in range(values.size):
            if not ok[i]:
                out.append(_nonfinite(steps, values, i))
                streak = 0
                judged += 1
                continue
            hist = _history(steps, values, i, self.window, self.min_history)
            if hist.size == 0:
                continue
            judged += 1
            mean = float(np.mean(hist))
            if mean > 0 and values[i] >= self.threshold * mean:
                streak += 1
                if streak == self.patience:
                    out.append(Detection(int(steps[i]), float(values[i]), mean, float(values[i] / mean)))
            else:
                streak = 0
        return out, judged


@dataclass(frozen=True)
class Lightning(_HistoryRule):
    name: ClassVar[str] = "lightning"
    threshold: float = 2.0
    window: int = 10

    def needs(self) -> str:
        return f"{max(1, self.window // 2)} earlier logged points (over at least {self.window} steps)"

    def _history_points(self) -> int:
        # Lightning needs half its window filled: on a sparse log, that many logged values.
        return max(1, self.window // 2)

    def _rule(self, value, history):
        mean = float(np.mean(history))
        if not math.isfinite(mean):
            return None  # the window's mean overflows float64: no baseline to judge against
        if mean == 0:
            return mean, math.nan, False
        score = abs(value - mean) / abs(mean)
        return mean, score, abs(value - mean) >= self.threshold * abs(mean)


@dataclass(frozen=True)
class OLMoCore(_HistoryRule):
    """``value > mean + sigmas * std`` over the previous ``window`` steps. (OLMo-core once
    compared against ``sigmas * std`` alone, which flags every step of a series whose mean
    is large against its spread; the tests keep that bug out.)"""

    name: ClassVar[str] = "olmo-core"
    unit: ClassVar[str] = "σ"
    sigmas: float = 6.0
    window: int = 128
    min_history: int = 20

    @property
    def threshold_name(self) -> str:
        return "sigmas"

    def _rule(self, value, history):
        mean, std = float(np.mean(history)), float(np.std(history))
        if not (math.isfinite(mean) and math.isfinite(std)):
            return None  # the window's moments overflow float64: no baseline to judge against
        z = (value - mean) / std if std > 0 else (math.inf if value > mean else 0.0)
        return mean, float(z), z > self.sigmas


class EmaMoments:
    """Exponential moving mean and variance, ZClip's way: ``x`` updates the mean with weight
    ``1 - alpha`` and the variance with the squared deviation from the old mean. Started from
    the plain mean/variance of the first ``warmup`` values. Shared by the zclip detector and
    the adaptive clip policy so both follow one definition."""

    def __init__(self, alpha: float, warmup: int) -> None:
        self.alpha, self.warmup = alpha, warmup
        self.mean = self.var = 0.0
        self._first: list[float] = []

    @property
    def ready(self) -> bool:
        return len(self._first) >= self.warmup

    @property
    def std(self) -> float:
        return math.sqrt(self.var) if self.var > 0 else 0.0

    def update(self, x: float) -> None:
        if not self.ready:
            self._first.append(x)
            if self.ready:
                self.mean, self.var = float(np.mean(self._first)), float(np.var(self._first))
            return
        delta = x - self.mean
        self.mean = self.alpha * self.mean + (1 - self.alpha) * x
        self.var = self.alpha * self.var + (1 - self.alpha) * delta * delta


@dataclass(frozen=True)
class ZClip(Detector):
    """ZClip's detector: EMA mean/variance (``alpha`` 0.97); z = (x - μ) / σ. A flagged value
    enters the EMA clipped to μ + threshold·σ, as ZClip does, so one spike does not blind it."""

    name: ClassVar[str] = "zclip"
    unit: ClassVar[str] = "z"
    threshold: float = 2.5
    alpha: float = 0.97
    warmup: int = 25

    def needs(self) -> str:
        return f"{self.warmup} earlier logged points (the EMA's warm-up)"

    def _detect(self, steps, values):
        out, judged = [], 0
        ema = EmaMoments(self.alpha, self.warmup)
        for i in range(values.size):
            x = float(values[i])
            if not math.isfinite(x):
                out.append(Detection(int(steps[i]), x, ema.mean if ema.ready else math.nan, math.inf))
                judged += 1
                continue
            if ema.ready:
                judged += 1
                if ema.std > 0:
                    z = (x - ema.mean) / ema.std
                    if z > self.threshold:
                        out.append(Detection(int(steps[i]), x, ema.mean, z))
                        x = ema.mean + self.threshold * ema.std
            ema.update(x)
        return out, judged


@dataclass(frozen=True)
class Megatron(Detector):
    name: ClassVar[str] = "megatron"
    threshold: float = 10.0
    reference_steps: int = 100

    def needs(self) -> str:
        return f"a finite value in the first {self.reference_steps} steps and a value after them"

    def _detect(self, steps, values):
        ok = np.isfinite(values)
        first = steps[0]
        ref_sel = (steps < first + self.reference_steps) & ok
        out = []
        if not ref_sel.any():
            return [Detection(int(s), float(v), math.nan, math.inf) for s, v in zip(steps, values) if not math.isfinite(v)], int(
                (~ok).sum()
            )
        ref = float(np.max(values[ref_sel]))
        judged = 0
        for s, v, good in zip(steps, values, ok):
            if not good:
                out.append(Detection(int(s), float(v), ref, math.inf))
                judged += 1
            elif s >= first + self.reference_steps:
                judged += 1
                if ref > 0 and v >= self.threshold * ref:
                    out.append(Detection(int(s), float(v), ref, float(v / ref)))
        return out, judged


#: 1.4826 x the median absolute deviation estimates a normal spread's σ, robustly: one wild
#: value in the history moves neither the median nor the MAD much.
MAD_TO_SIGMA = 1.4826


def log_noise(values: np.ndarray, quantile: float = 0.4) -> float:
    """The log's own point-to-point noise, as a standard deviation, from the absolute second
    differences of its finite values, over sqrt(6) (the second difference of independent noise has
    variance 6 sigma^2, and a straight descent has none, so a falling loss does not count as noise
    the way its spread around a median does). Read at their 40th percentile (``quantile`` 0.4, scaled
    to sigma) where their median reads more than twice that: an isolated spike makes three large
    second differences, so a log with a spike every few points (five 1.4-nat jumps in 30 rows)
    would read its own spikes as its noise at the median; and at half that quantile, down to the
    10th, while the higher reading is more than twice the lower (where the spikes and a fast first
    descent are most of the differences, the 40th percentile is theirs too); elsewhere the median's
    reading, the steadier one. 0.5: the median alone, as before issue 35. 0 below three finite values."""
    v = values[np.isfinite(values)]
    if v.size < 3:
        return 0.0
    d2 = np.abs(v[2:] - 2 * v[1:-1] + v[:-2])
    at_median = MAD_TO_SIGMA * np.median(d2)
    if quantile == 0.5:
        return float(at_median / math.sqrt(6))
    # Where the two readings of a normal noise would agree (within 2x), the median's, the steadier; where
    # the median reads more than twice the lower percentile, the largest differences are the log's own
    # spikes, not its noise: the percentile's.
    low = _quantile_scale(quantile) * np.quantile(d2, quantile)
    if at_median <= _CONTAMINATED * low:
        return float(at_median / math.sqrt(6))
    # Contaminated. Where the spikes (and a fast first descent) make most of the differences, the
    # percentile can be theirs too (a Trainer's 30 rows of means with five jumps of 0.9 to 2.6 nats,
    # starting 5 nats up: 17 of 28); read at half the quantile while that reads less than half of it.
    while quantile > _LOWEST_QUANTILE:
        lower = _quantile_scale(quantile / 2) * np.quantile(d2, quantile / 2)
        if low <= _CONTAMINATED * lower:
            break
        quantile, low = quantile / 2, lower
    return float(low / math.sqrt(6))


#: The median's reading of the noise over the lower percentile's above which the median is read as
#: contaminated by the log's own spikes (on normal noise of 28 points the two agree within 2x).
_CONTAMINATED = 2.0
#: The lowest quantile the contaminated reading descends to (0.4, 0.2, then 0.1).
_LOWEST_QUANTILE = 0.1


def _quantile_scale(quantile: float) -> float:
    """1 / the ``quantile`` of |x| for a standard normal x (1.4826 at the median)."""
    from statistics import NormalDist

    return 1 / NormalDist().inv_cdf(0.5 + quantile / 2)


@dataclass(frozen=True)
class LossJump(Detector):
    """The loss is a log-likelihood, so a spike is an *additive* event: a jump of ``nats``
    above the median of the previous points means the same thing at any baseline (ln 2: the
    model's perplexity doubled). On a noisy per-batch loss the bar rises to ``sigmas``
    robust standard deviations (1.4826 MAD) of the history, so ordinary batch-to-batch noise
    does not fire it; and never below ``noise_sigmas`` times the log's own noise
    (:func:`log_noise`): the spread of five quiet points says little about a short, noisy log's
    scale, and a move a noisy log makes every few points is no spike (0: no such floor)."""

    name: ClassVar[str] = "loss-jump"
    unit: ClassVar[str] = "nats"
    nats: float = math.log(2)
    sigmas: float = 6.0
    window: int = BASELINE_WINDOW
    min_history: int = 5
    noise_sigmas: float = 4.0
    detrend: bool = True  # the sigmas measure the history's noise, not its descent (False: as before issue 35)

    @property
    def threshold_name(self) -> str:
        return "nats"

    def _detect(self, steps, values):
        ok = np.isfinite(values)
        h = rolling.histories(steps, values, self.window, self.min_history)
        med, mad = rolling.median_and_spread(h)
        has = ok & ~np.isnan(med)
        jump = values - med
        if self.detrend:
            # The spread of a falling history around its median is mostly the slope: the noise
            # is what its point-to-point changes vary by (never more than the plain spread).
            mad = np.fmin(mad, rolling.step_spread(h))
        bar = np.maximum(self.nats, self.sigmas * (MAD_TO_SIGMA * mad))
        if self.noise_sigmas:
            bar = np.maximum(bar, self.noise_sigmas * log_noise(values))
        flagged = has & (jump >= bar)
        return _in_order(steps, values, ok, flagged, med, jump), int((~ok).sum() + has.sum())


@dataclass(frozen=True)
class SustainedLoss(Detector):
    """A loss that rises and *stays* high is worse than a one-point spike, and a log written
    every 500 steps shows nothing else: flagged where the loss first rises ``nats`` (and
    ``sigmas`` robust standard deviations of the history: a median of ``hold`` points carries
    less noise than one point, hence a lower bar than the jump's) above the median of the
    points before it and the median of it and the next ``hold - 1`` points is still that high. Needs only ``min_history`` earlier points, because the level that follows
    is the evidence; flagged once per episode, at its onset. The baseline is the median of the
    last ``history_points`` logged points (over at least ``window`` steps); before a log has
    that many, of every earlier point (at least ``min_history``). There, with ``early="lowest"``,
    the baseline is the lowest loss so far and the sigmas are the log's own noise
    (:func:`log_noise`): "a rise that the next points keep is a divergence whatever the history"
    - a log's first points fall fast, so the median of two or three of them sits above where the
    model already is and their spread is the slope, not the noise, and both hid such a rise (an
    LR sweep logged every 200 steps diverging at its third point); and later the spread is never
    taken below that noise (five quiet points of a noisy short log would let its noise through).
    The noise raises the bar to ``ceiling`` nats at most (ln 8): on a log that is mostly its event
    the second differences are the event's own (issue 35's trials: a divergence from its second
    step, a sweep that rises at its third, each flagged one to four points late without it).
    ``early="median"``: the median and spread of the points before everywhere, as before."""

    name: ClassVar[str] = "loss-sustained"
    unit: ClassVar[str] = "nats"
    nats: float = math.log(2)
    sigmas: float = 3.0
    hold: int = 3
    window: int = BASELINE_WINDOW
    min_history: int = 1
    history_points: int = 5  # the baseline's usual size; a log's first points have fewer
    early: str = "lowest"  # before history_points: "lowest" (lowest loss so far, the log's noise) or "median"
    noise_min_points: int = 8  # fewer finite values: the log's noise is not measured (0: always, as before issue 35)
    ceiling: float = 3 * math.log(2)  # the most the noise raises the bar, in nats (inf: no ceiling)

    def __post_init__(self) -> None:
        if self.early not in ("lowest", "median"):
            raise ValueError(f"loss-sustained's early must be 'lowest' or 'median', was {self.early!r}")

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
        h = rolling.histories(steps, values, self.window, self.history_points)  # loss-jump's, at its defaults
        before = h.stop  # finite values before each point
        # Early in the log (no usual history yet): every earlier finite value, if there are enough.
        early = (h.size == 0) & (before >= self.min_history) & (before > 0)
        med, mad = rolling.median_and_spread(h)
        spread = MAD_TO_SIGMA * mad
        if early.any() and self.early == "median":
            at = rolling.Histories(h.finite, np.where(early, 0, before), before)  # only the early points' histories
            early_med, early_mad = rolling.median_and_spread(at)
            med, spread = np.where(early, early_med, med), np.where(early, MAD_TO_SIGMA * early_mad, spread)
        if self.early == "lowest":
            # On a log of a handful of points the second differences are the event's own (a rise
            # at the third of five points makes two of the three): no noise can be read there.
            noise = log_noise(values) if np.isfinite(values).sum() >= self.noise_min_points else 0.0
            spread = np.where(early, noise, np.maximum(spread, noise))  # never below the log's own noise
            if early.any():
                lowest = np.minimum.accumulate(h.finite)
                med = np.where(early, lowest[np.maximum(before - 1, 0)], med)
        sizes = np.where(early, before, h.size)
        level, level_ok = rolling.forward_median(values, self.hold)
        # judged: a finite value with a history and `hold` values from it (any of them non-finite: no level)
        has = ok & (sizes > 0) & (np.arange(values.size) + self.hold <= values.size)
        # The noise raises the bar, never past `ceiling` nats: a rise the next points keep of ln 8 (the
        # perplexity doubled three times) is no noise on any log, and on a log that is mostly its event
        # (a divergence from its second point, a sweep that rises at its third) the second differences
        # the noise is read from are the event's own.
        bar = np.maximum(self.nats, np.minimum(self.sigmas * spread, self.ceiling))
        level = np.where(level_ok, level, np.nan)
        now = has & (values - med >= bar) & (level - med >= bar)
        # Flagged once per episode: where `now` starts, over the judged values in order.
        judged_at = np.flatnonzero(has)
        now_j = now[judged_at]
        onset = np.zeros(values.size, dtype=bool)
        onset[judged_at] = now_j & ~np.concatenate([[False], now_j[:-1]])
        return _in_order(steps, values, ok, onset, med, level - med), int((~ok).sum() + has.sum())


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
        level = ok & (values > 0)  # zero norms (no gradient at all) are no level
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.where(level, np.log(np.where(level, values, 1.0)), np.nan)
        h = rolling.histories(steps, logs, self.window, self.min_history, usable=level)
        log_med, log_mad = rolling.median_and_spread(h)
        has = ok & (h.size > 0)
        log_spread = MAD_TO_SIGMA * log_mad
        # Necessary conditions, a hair looser than the rule (numpy's exp/log may differ from the
        # C library's by an ulp): the few candidates are then judged exactly, one by one.
        with np.errstate(over="ignore", invalid="ignore"):
            maybe = (
                has
                & level
                & (values >= self.threshold * np.exp(log_med) * (1 - 1e-12))
                & (logs - log_med >= self.sigmas * log_spread - 1e-12 * (1 + np.abs(log_med)))
            )
        candidates = np.flatnonzero(maybe)
        levels = values[level]
        long_run = rolling.expanding_median_at(levels, h.stop[candidates])  # every earlier level value
        flagged = np.zeros(values.size, dtype=bool)
        base_at = np.full(values.size, np.nan)
        for i, lrm in zip(candidates.tolist(), long_run.tolist()):
            lm, spread, x = float(log_med[i]), float(log_spread[i]), float(values[i])
            base = max(math.exp(lm), self.floor * lrm)
            if x >= self.threshold * base and math.log(x) - lm >= self.sigmas * spread:
                flagged[i], base_at[i] = True, base
        with np.errstate(divide="ignore", invalid="ignore"):
            out = _in_order(steps, values, ok, flagged, base_at, values / base_at)
        return out, int((~ok).sum() + has.sum())


def _in_order(
    steps: np.ndarray, values: np.ndarray, ok: np.ndarray, flagged: np.ndarray, baseline: np.ndarray, score: np.ndarray
) -> list[Detection]:
    """The detections of a vectorised rule, in step order: every non-finite value (the worst
    spike, score inf, no baseline) and every flagged finite one."""
    rows = np.flatnonzero(~ok | flagged)
    return [
        Detection(
            int(steps[i]), float(values[i]), float(baseline[i]) if ok[i] else math.nan, float(score[i]) if ok[i] else math.inf
        )
        for i in rows.tolist()
    ]


DETECTORS: dict[str, type[Detector]] = {
    cls.name: cls for cls in (RatioToMedian, LLMFoundry, Lightning, OLMoCore, ZClip, Megatron, LossJump, SustainedLoss, GradRatio)
}


def get_detector(spec: str | Detector, **params: Any) -> Detector:
    """A detector by name (``"zclip"``) with optional parameters, or a Detector passed through.

    ``spec`` is one of the names of ``DETECTORS`` (``ratio``, ``llm-foundry``, ``lightning``,
    ``olmo-core``, ``zclip``, ``megatron``) or a :class:`Detector` (``params`` then replace its
    fields). ``params`` are the detector's own fields, at their published defaults when left out.
    Returns the detector; its ``detect(steps, values)`` lists a ``Detection`` (step, value,
    baseline, score) per flagged step. Raises ``ValueError`` naming the choices for an unknown
    name or parameter.

    >>> import numpy as np
    >>> values = np.ones(200); values[150] = 50.0
    >>> [(d.step, d.score) for d in get_detector("ratio").detect(np.arange(1, 201), values)]
    [(151, 50.0)]
    >>> get_detector("olmo-core", sigmas=4)
    OLMoCore(sigmas=4, window=128, min_history=20)
    """
    if isinstance(spec, Detector):
        return replace(spec, **params) if params else spec
    try:
        cls = DETECTORS[spec]
    except KeyError:
        raise ValueError(f"unknown detector {spec!r}; choose one of {', '.join(DETECTORS)}") from None
    allowed = {f.name for f in fields(cls)}
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise ValueError(f"detector {spec!r} has no parameter {unknown[0]!r}; it takes {', '.join(sorted(allowed))}")
    return cls(**params)
