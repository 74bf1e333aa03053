"""Sabotage suite for the judges: deliberately wrong spike baselines and ratios, kept here, and
the checks that must catch each one.

A judgement that a broken judge still passes guards nothing. Each sabotage below is a bug that
reads plausibly in review: a baseline window one step too long or too short, a window that
takes in the step being judged, a ratio turned upside down. With each one patched in, the
guard checks below must fail; with the honest code they pass (``test_the_honest_judges_pass``).
The record is built so that the exact window matters: its baseline is 2 over steps 10–59 and
1 or 3 if a single step is added, dropped or shifted.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pytest_spikecheck import SpikeCheckError, assert_no_spike, assert_spike, diagnose
from pytest_spikecheck.judge import analysis, assertions, baseline, detectors
from pytest_spikecheck.judge.detectors import RatioToMedian

SPIKE_STEP = 60
SPIKE = 20.0


def _window_record() -> dict[str, np.ndarray]:
    """Steps 1–60. Steps 10–59 (the 50-step window before 60) alternate 1 and 3, so their
    median is 2; every step before them is 1, so a step more makes the median 1, a step fewer
    (or the window shifted onto step 60) makes it 3. Step 60 is 20: exactly 10× the right
    baseline, never 10× a wrong one."""
    steps = np.arange(1, SPIKE_STEP + 1)
    values = np.ones(steps.size)
    window = (steps >= SPIKE_STEP - baseline.BASELINE_WINDOW) & (steps < SPIKE_STEP)
    values[window] = np.where(steps[window] % 2 == 1, 3.0, 1.0)  # step 10 is a 1, step 59 a 3
    values[-1] = SPIKE
    return {"step": steps, "grad_norm_pre": values}


# -- the guards: what the assertion and detector tests check -----------------------------------


def guard_spike_ratio_is_exact() -> None:
    record = _window_record()
    assert assert_spike(record, at=SPIKE_STEP, min_ratio=9.9) == pytest.approx(10.0)
    with pytest.raises(SpikeCheckError):
        assert_spike(record, at=SPIKE_STEP, min_ratio=10.1)


def guard_ratio_detector_baseline_is_exact() -> None:
    record = _window_record()
    hits = RatioToMedian(threshold=9.9).detect(record["step"], record["grad_norm_pre"])
    assert [(h.step, h.baseline) for h in hits] == [(SPIKE_STEP, 2.0)]
    assert RatioToMedian(threshold=10.1).detect(record["step"], record["grad_norm_pre"]) == []


def guard_no_spike_fails_on_a_spike(detector) -> None:
    with pytest.raises(SpikeCheckError, match=f"spike at step {SPIKE_STEP}"):
        assert_no_spike(_window_record(), detector=detector)


def guard_diagnosis_sees_the_spike() -> None:
    d = diagnose(_window_record(), SPIKE_STEP)
    assert d.facts["ratio"] == pytest.approx(10.0) and not d.verdict.startswith("no clear spike")


# -- the sabotages -----------------------------------------------------------------------------

honest_baseline = baseline.spike_baseline


def window_one_step_too_long(steps, values, at_step, window=baseline.BASELINE_WINDOW, min_points=baseline.MIN_BASELINE_POINTS):
    return honest_baseline(steps, values, at_step, window + 1, min_points)


def window_one_step_too_short(steps, values, at_step, window=baseline.BASELINE_WINDOW, min_points=baseline.MIN_BASELINE_POINTS):
    return honest_baseline(steps, values, at_step, window - 1, min_points)


def window_takes_in_the_step(steps, values, at_step, window=baseline.BASELINE_WINDOW, min_points=baseline.MIN_BASELINE_POINTS):
    return honest_baseline(steps, values, at_step + 1, window, min_points)


def inverted_spike_ratio(metrics, step, name="grad_norm_pre", window=baseline.BASELINE_WINDOW):
    value = analysis.value_at(metrics, name, step)
    return analysis.baseline(metrics, name, step, window) / value if value else math.nan


class InvertedRatio(RatioToMedian):
    """The ratio detector with median / value: a spike scores below 1 and is never flagged."""

    def _detect(self, steps, values):
        every, judged = super(InvertedRatio, self.with_threshold(0.0))._detect(steps, values)
        inverted = [hit for hit in every if math.isfinite(hit.score) and hit.score > 0 and 1 / hit.score >= self.threshold]
        return inverted, judged


BASELINE_SABOTAGES = [window_one_step_too_long, window_one_step_too_short, window_takes_in_the_step]


@pytest.fixture
def sabotage_baseline(monkeypatch):
    def apply(wrong) -> None:
        # Every judge that imported the one baseline function gets the wrong one.
        monkeypatch.setattr(analysis, "spike_baseline", wrong)
        monkeypatch.setattr(detectors, "spike_baseline", wrong)

    return apply


def test_the_honest_judges_pass():
    guard_spike_ratio_is_exact()
    guard_ratio_detector_baseline_is_exact()
    guard_no_spike_fails_on_a_spike("ratio")
    guard_diagnosis_sees_the_spike()


@pytest.mark.parametrize("wrong", BASELINE_SABOTAGES, ids=lambda f: f.__name__)
def test_a_wrong_baseline_window_fails_the_ratio_guards(sabotage_baseline, wrong):
    sabotage_baseline(wrong)
    with pytest.raises(AssertionError):
        guard_spike_ratio_is_exact()
    with pytest.raises(AssertionError):
        guard_ratio_detector_baseline_is_exact()
    with pytest.raises(AssertionError):
        guard_diagnosis_sees_the_spike()


def test_an_inverted_ratio_fails_assert_spike_and_the_diagnosis(monkeypatch):
    monkeypatch.setattr(analysis, "spike_ratio", inverted_spike_ratio)
    monkeypatch.setattr(assertions, "spike_ratio", inverted_spike_ratio)
    with pytest.raises(AssertionError):
        guard_spike_ratio_is_exact()
    monkeypatch.setattr("pytest_spikecheck.judge.diagnosis.spike_ratio", inverted_spike_ratio)
    with pytest.raises(AssertionError):
        guard_diagnosis_sees_the_spike()


def test_an_inverted_ratio_detector_finds_nothing_and_fails_the_guard():
    assert InvertedRatio().detect(*_window_record().values()) == []
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        guard_no_spike_fails_on_a_spike(InvertedRatio())
