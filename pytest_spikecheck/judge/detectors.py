"""Spike detectors: the rules the field uses, named, configurable, and testable on any series.

Each detector walks a series on its real step axis (windows are measured in steps, so a
log written every k steps or with gaps works) and returns the steps it flags. Defaults are
the published ones:

========== ===============================================================================
ratio       value >= ``threshold`` x the median of the previous ``window`` steps (ours; default)
llm-foundry loss >= 2 x the mean of the last 100 steps, for ``patience`` (4) consecutive steps
lightning   |loss - mean| >= 2 x |mean| over the last 10 steps (Lightning's SpikeDetection, relative mode)
olmo-core   value > mean + 6 sigma over the last 128 steps
zclip       EMA z-score > 2.5 with alpha 0.97 (ZClip); spikes are not folded into the EMA
megatron    loss >= 10 x the max of the first 100 steps
========== ===============================================================================

numpy only. A detector never raises on empty, short or non-finite series: non-finite
values are flagged (a NaN loss is the worst spike) and never enter a baseline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

import numpy as np

from pytest_spikecheck.judge.baseline import BASELINE_WINDOW, MIN_BASELINE_POINTS, spike_baseline


@dataclass(frozen=True)
class Detection:
    step: int
    value: float
    baseline: float  # what the value was compared against (mean, median, EMA...)
    score: float  # ratio or z-score, in the detector's own unit


@dataclass(frozen=True)
class Detector:
    name: ClassVar[str] = ""
    unit: ClassVar[str] = "×"

    def detect(self, steps: Any, values: Any) -> list[Detection]:
        s = np.asarray(steps, dtype=np.int64).reshape(-1)
        v = np.asarray(values, dtype=np.float64).reshape(-1)
        if s.shape != v.shape:
            raise ValueError(f"steps and values must have the same length, were {s.size} and {v.size}")
        # Means, variances and ratios of values near float64's limit overflow to inf; the rules
        # then compare against inf, which is the honest answer, so numpy need not warn about it.
        with np.errstate(over="ignore"):
            return self._detect(s, v) if v.size else []

    def _detect(self, steps: np.ndarray, values: np.ndarray) -> list[Detection]:  # pragma: no cover
        raise NotImplementedError

    @property
    def threshold_name(self) -> str:
        """The field that sets the detector's sensitivity (swept by calibration)."""
        return "threshold"

    def with_threshold(self, value: float) -> "Detector":
        return replace(self, **{self.threshold_name: value})

    def describe(self) -> str:
        params = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self))
        return f"{self.name}({params})"


def _history(steps: np.ndarray, values: np.ndarray, ok: np.ndarray, i: int, window: int) -> np.ndarray:
    lo = np.searchsorted(steps, steps[i] - window)
    hist = values[lo:i]
    return hist[ok[lo:i]]


@dataclass(frozen=True)
class RatioToMedian(Detector):
    name: ClassVar[str] = "ratio"
    threshold: float = 5.0
    window: int = BASELINE_WINDOW
    min_history: int = MIN_BASELINE_POINTS

    def _detect(self, steps, values):
        ok = np.isfinite(values)
        out = []
        for i in range(values.size):
            if not ok[i]:
                out.append(Detection(int(steps[i]), float(values[i]), math.nan, math.inf))
                continue
            med = spike_baseline(steps[:i], values[:i], int(steps[i]), self.window, self.min_history)
            if med > 0 and values[i] / med >= self.threshold:
                out.append(Detection(int(steps[i]), float(values[i]), med, float(values[i] / med)))
        return out


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
        out, streak = [], 0
        for i in range(values.size):
            if not ok[i]:
                out.append(Detection(int(steps[i]), float(values[i]), math.nan, math.inf))
                streak = 0
                continue
            hist = _history(steps, values, ok, i, self.window)
            if hist.size < self.min_history:
                continue
            mean = float(np.mean(hist))
            if mean > 0 and values[i] >= self.threshold * mean:
                streak += 1
                if streak == self.patience:
                    out.append(Detection(int(steps[i]), float(values[i]), mean, float(values[i] / mean)))
            else:
                streak = 0
        return out


@dataclass(frozen=True)
class Lightning(Detector):
    name: ClassVar[str] = "lightning"
    threshold: float = 2.0
    window: int = 10

    def _detect(self, steps, values):
        ok = np.isfinite(values)
        out = []
        for i in range(values.size):
            if not ok[i]:
                out.append(Detection(int(steps[i]), float(values[i]), math.nan, math.inf))
                continue
            hist = _history(steps, values, ok, i, self.window)
            if hist.size < self.window // 2 or hist.size == 0:
                continue
            mean = float(np.mean(hist))
            if mean != 0 and abs(values[i] - mean) >= self.threshold * abs(mean):
                out.append(Detection(int(steps[i]), float(values[i]), mean, float(abs(values[i] - mean) / abs(mean))))
        return out


@dataclass(frozen=True)
class OLMoCore(Detector):
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

    def _detect(self, steps, values):
        ok = np.isfinite(values)
        out = []
        for i in range(values.size):
            if not ok[i]:
                out.append(Detection(int(steps[i]), float(values[i]), math.nan, math.inf))
                continue
            hist = _history(steps, values, ok, i, self.window)
            if hist.size < self.min_history:
                continue
            mean, std = float(np.mean(hist)), float(np.std(hist))
            if not (math.isfinite(mean) and math.isfinite(std)):
                continue  # the window's moments overflow float64: no baseline to judge against
            z = (values[i] - mean) / std if std > 0 else (math.inf if values[i] > mean else 0.0)
            if z > self.sigmas:
                out.append(Detection(int(steps[i]), float(values[i]), mean, float(z)))
        return out


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

    def _detect(self, steps, values):
        out = []
        ema = EmaMoments(self.alpha, self.warmup)
        for i in range(values.size):
            x = float(values[i])
            if not math.isfinite(x):
                out.append(Detection(int(steps[i]), x, ema.mean if ema.ready else math.nan, math.inf))
                continue
            if ema.ready and ema.std > 0:
                z = (x - ema.mean) / ema.std
                if z > self.threshold:
                    out.append(Detection(int(steps[i]), x, ema.mean, z))
                    x = ema.mean + self.threshold * ema.std
            ema.update(x)
        return out


@dataclass(frozen=True)
class Megatron(Detector):
    name: ClassVar[str] = "megatron"
    threshold: float = 10.0
    reference_steps: int = 100

    def _detect(self, steps, values):
        ok = np.isfinite(values)
        first = steps[0]
        ref_sel = (steps < first + self.reference_steps) & ok
        out = []
        if not ref_sel.any():
            return [Detection(int(s), float(v), math.nan, math.inf) for s, v in zip(steps, values) if not math.isfinite(v)]
        ref = float(np.max(values[ref_sel]))
        for s, v, good in zip(steps, values, ok):
            if not good:
                out.append(Detection(int(s), float(v), ref, math.inf))
            elif s >= first + self.reference_steps and ref > 0 and v >= self.threshold * ref:
                out.append(Detection(int(s), float(v), ref, float(v / ref)))
        return out


DETECTORS: dict[str, type[Detector]] = {
    cls.name: cls for cls in (RatioToMedian, LLMFoundry, Lightning, OLMoCore, ZClip, Megatron)
}


def get_detector(spec: "str | Detector", **params: Any) -> Detector:
    """A detector by name (``"zclip"``) with optional parameters, or a Detector passed through."""
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
