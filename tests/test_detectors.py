import math

import numpy as np
import pytest

from pytest_spikecheck.judge.detectors import DETECTORS, OLMoCore, get_detector


def _series(n=300, spike_at=None, size=20.0, seed=0, level=1.0, noise=0.05):
    rng = np.random.default_rng(seed)
    v = level + noise * rng.standard_normal(n)
    if spike_at is not None:
        v[spike_at - 1] *= size
    return np.arange(1, n + 1), v


@pytest.mark.parametrize("name", sorted(DETECTORS))
def test_every_detector_finds_a_big_spike_and_ignores_noise(name):
    det = get_detector(name)
    steps, clean = _series()
    # Gaussian noise: z > 2.5 happens on ~0.6% of steps, so zclip may flag a few; no rule may flag many.
    assert len(det.detect(steps, clean)) <= 0.02 * steps.size, name
    steps, spiked = _series(spike_at=250)
    if name == "llm-foundry":  # needs `patience` consecutive high steps
        spiked[249:253] *= 20
    if name == "loss-sustained":  # a one-point spike is not its business: the loss must stay high
        spiked[249:260] *= 20
    flagged = {h.step for h in det.detect(steps, spiked)}
    assert flagged & set(range(250, 254)), (name, sorted(flagged))


@pytest.mark.parametrize("name", sorted(DETECTORS))
def test_detectors_survive_degenerate_series(name):
    det = get_detector(name)
    assert det.detect([], []) == []
    assert isinstance(det.detect([1], [1.0]), list)
    hits = det.detect(np.arange(1, 6), [1.0, math.nan, math.inf, -math.inf, 1.0])
    assert {h.step for h in hits} >= {2, 3, 4}  # non-finite values are always flagged
    assert det.detect(np.arange(1, 201), np.zeros(200)) == []


def test_windows_are_measured_in_steps_not_rows():
    # Logged every 10 steps: a 50-step window holds 5 rows, not 50.
    det = get_detector("ratio", threshold=5.0, window=50, min_history=3)
    steps = np.arange(10, 1010, 10)
    values = np.ones(steps.size)
    values[60] = 10.0
    hits = det.detect(steps, values)
    assert [h.step for h in hits] == [610] and hits[0].baseline == 1.0


def test_olmo_core_compares_to_mean_plus_sigmas_not_sigmas_alone():
    # mean 10, std ~0.1: the buggy rule (value > 6 * std = 0.6) would flag every step.
    steps, v = _series(level=10.0, noise=0.1)
    assert OLMoCore().detect(steps, v) == []
    buggy = [s for i, s in enumerate(steps[128:], 128) if v[i] > 6 * np.std(v[i - 128:i])]
    assert len(buggy) == len(steps) - 128  # what the bug did
    v[200] = 10.0 + 0.1 * 8  # 8 sigma above the mean
    assert [h.step for h in OLMoCore().detect(steps, v)] == [201]


def test_zclip_keeps_watching_after_a_spike():
    steps, v = _series()
    v[99] *= 30
    v[199] *= 30
    hits = [h.step for h in get_detector("zclip").detect(steps, v)]
    assert 100 in hits and 200 in hits


def test_unknown_detector_and_parameter():
    with pytest.raises(ValueError, match="unknown detector 'spiky'"):
        get_detector("spiky")
    with pytest.raises(ValueError, match="has no parameter 'sigma'"):
        get_detector("olmo-core", sigma=3)
    assert get_detector("olmo-core", sigmas=3).sigmas == 3
    assert get_detector("zclip").with_threshold(4.0).threshold == 4.0


def test_dense_baseline_is_the_plain_window_median():
    # The engine's runs log every step: widening must never change their baseline.
    from pytest_spikecheck.judge.baseline import spike_baseline

    steps, v = _series(n=400, noise=0.3)
    for at in range(1, 401):
        window = v[max(0, at - 1 - 50):at - 1]
        expected = float(np.median(window)) if window.size >= 10 else math.nan
        got = spike_baseline(steps, v, at)
        assert got == expected or (math.isnan(got) and math.isnan(expected)), at


@pytest.mark.parametrize("name", sorted(DETECTORS))
def test_every_detector_judges_a_log_written_every_50_steps(name):
    # 60 points, one every 50 steps: windows of 10-128 steps hold 0-2 points, so each rule widens
    # to the logged points it needs and judges (megatron compares with its first 100 steps).
    steps, v = _series(n=60)
    steps = steps * 50
    judgement = get_detector(name).judge(steps, v)
    assert judgement.points == 60 and judgement.interval == 50 and judgement.judged >= 30, judgement
    short = get_detector(name).judge(steps[:1], v[:1])
    assert short.judged == 0 and short.not_judged_text().startswith("not judged: 1 point, needs ")
