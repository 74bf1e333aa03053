import math

import numpy as np
import pytest

from pytest_spikecheck.judge.baseline import baseline_history, spike_baseline
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
    buggy = [s for i, s in enumerate(steps[128:], 128) if v[i] > 6 * np.std(v[i - 128 : i])]
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
        window = v[max(0, at - 1 - 50) : at - 1]
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


# -- each rule at its threshold, with how many values it judged ---------------------------------


def _judge(name, values, steps=None, **params):
    values = np.asarray(values, dtype=float)
    steps = np.arange(1, values.size + 1) if steps is None else np.asarray(steps)
    judgement = get_detector(name, **params).judge(steps, values)
    # NaN -> None so that a flagged NaN compares equal to the expectation
    clean = lambda x: None if isinstance(x, float) and math.isnan(x) else pytest.approx(x)  # noqa: E731
    return judgement.judged, [(d.step, clean(d.value), clean(d.baseline), clean(d.score)) for d in judgement.detections]


NAN = math.nan
AT_THE_THRESHOLD = [
    # (detector, params, values, judged, [(step, value, baseline, score)])
    # ratio: 10 earlier points needed (steps 11-23 judged); exactly 5x is a spike, 4.99x is not
    ("ratio", {}, [1.0] * 20 + [5.0, 4.99, NAN], 13, [(21, 5.0, 1.0, 5.0), (23, None, None, math.inf)]),
    # llm-foundry: 2x the running mean (exactly 2 at step 21 counts), 4 in a row, flagged at the 4th
    ("llm-foundry", {}, [1.0] * 20 + [2.0, 3, 3, 3, 1], 15, [(24, 3.0, 28 / 23, 3 / (28 / 23))]),
    # ... and a non-finite value breaks the streak: 3 high, NaN, 3 high is no spike
    ("llm-foundry", {}, [1.0] * 20 + [3, 3, 3, NAN, 3, 3, 3], 17, [(24, None, None, math.inf)]),
    # lightning: |x - mean| >= 2|mean| (3 vs mean 1); 5 earlier points (half its window) needed
    ("lightning", {}, [1.0] * 10 + [3.0, 1.0, 2.9], 8, [(11, 3.0, 1.0, 2.0)]),
    ("lightning", {}, [0.0] * 8 + [5.0], 4, []),  # a zero mean: judged, no relative score, not flagged
    # olmo-core: strictly above mean + 6 sigma (mean 1, sigma 1: 7 is not above)
    ("olmo-core", {}, [0.0, 2.0] * 20 + [7.0], 21, []),
    # ... with no spread, only a value above the mean is infinitely far
    ("olmo-core", {"sigmas": 0.5}, [1.0] * 20 + [1.0, 1.5], 2, [(22, 1.5, 1.0, math.inf)]),
    # megatron: the reference is the first 100 steps (1-100); step 101 is the first judged
    ("megatron", {}, [1.0] * 100 + [10.0, 9.99, NAN], 3, [(101, 10.0, 1.0, 10.0), (103, None, 1.0, math.inf)]),
    # loss-jump: a jump of exactly `nats` over the median
    ("loss-jump", {"nats": 0.5}, [2.0] * 5 + [2.5, 2.49], 2, [(6, 2.5, 2.0, 0.5)]),
    # ... and of 6 robust sigmas on a noisy history (median 2, MAD 1: bar 6 x 1.4826 = 8.8956);
    # without the log-noise floor the alternation's first points, judged on 5 values with no
    # spread yet, are flagged too
    (
        "loss-jump",
        {"noise_sigmas": 0.0},
        [1.0, 3.0] * 5 + [10.9, 10.8],
        7,
        [(6, 3.0, 1.0, 2.0), (8, 3.0, 1.0, 2.0), (10, 3.0, 1.0, 2.0), (11, 10.9, 2.0, 8.9)],
    ),
    # ... with it, the alternation is the log's own noise (second differences of 4: sigma
    # 1.4826 x 4 / sqrt 6 = 2.421) and the bar is 4 of those, 9.684: 8.9 is no spike, 10.5 is
    ("loss-jump", {}, [1.0, 3.0] * 5 + [10.9, 10.8], 7, []),
    ("loss-jump", {}, [1.0, 3.0] * 5 + [12.5, 12.4], 7, [(11, 12.5, 2.0, 10.5)]),
    # loss-sustained: up 1 nat and staying up for `hold` points; once per episode; the last two
    # points lack 2 later ones (not judged)
    ("loss-sustained", {}, [2.0] * 6 + [3.0] * 4 + [2.0] * 3 + [3.0] * 3, 13, [(7, 3.0, 2.0, 1.0), (14, 3.0, 2.0, 1.0)]),
    ("loss-sustained", {"nats": 0.5}, [2.0] * 6 + [2.5] * 3, 6, [(7, 2.5, 2.0, 0.5)]),  # exactly `nats`, point and level
    ("loss-sustained", {"nats": 0.5}, [2.0] * 6 + [2.5, 2.4, 2.4], 6, []),  # the point is up, the level is not
    ("loss-sustained", {}, [2.0] + [3.0] * 3, 1, [(2, 3.0, 2.0, 1.0)]),  # early in a log: every earlier point (1)
    ("loss-sustained", {}, [2.0] * 6 + [3.0, NAN, 3.0], 7, [(8, None, None, math.inf)]),  # a NaN ahead: no level
    ("loss-sustained", {}, [2.0] * 6 + [3.0] * 6, 9, [(7, 3.0, 2.0, 1.0)]),  # one episode, one flag
    # grad-ratio: exactly 10x the median of the last 10 points
    ("grad-ratio", {}, [1.0] * 10 + [10.0, 9.9], 2, [(11, 10.0, 1.0, 10.0)]),
    # ... never against less than half the long-run level: after a collapse to 0.001, 0.6 is no spike
    ("grad-ratio", {}, [1.0] * 20 + [0.001] * 10 + [0.6], 21, []),
    # ... half the long-run median exactly: 10 values 1-10 then 10 of 0.01 (median (0.01 + 1) / 2)
    (
        "grad-ratio",
        {},
        list(range(1, 11)) + [0.01] * 10 + [10 * 0.5 * (0.01 + 1.0) / 2],
        11,
        [(21, 10 * 0.5 * (0.01 + 1.0) / 2, 0.5 * (0.01 + 1.0) / 2, 10.0)],
    ),
    ("grad-ratio", {}, list(range(1, 12)) + [0.01] * 10 + [5.0], 12, [(22, 5.0, 0.5, 10.0)]),  # odd count: median 1
    ("grad-ratio", {}, list(range(1, 12)) + [0.01] * 10 + [4.99], 12, []),
    # zero norms (no gradient) are judged but are no level: the 10 after them is 10x the ones before
    ("grad-ratio", {}, [1.0] * 10 + [0.0] * 5 + [10.0], 6, [(16, 10.0, 1.0, 10.0)]),
    # the window is the caller's: over 100 steps the level is 100 (no spike); over the last 10, 1 (floored at 50)
    (
        "grad-ratio",
        {"window": 100, "min_history": 5},
        [1.0] * 5 + [100.0] * 20 + [1.0] * 10 + [1000.0],
        31,
        [(s, 100.0, 1.0, 100.0) for s in range(6, 11)],
    ),
    (
        "grad-ratio",
        {"min_history": 5},
        [1.0] * 5 + [100.0] * 20 + [1.0] * 10 + [1000.0],
        31,
        [(s, 100.0, 1.0, 100.0) for s in range(6, 11)] + [(36, 1000.0, 50.0, 20.0)],
    ),
]


@pytest.mark.parametrize(
    ("name", "params", "values", "judged", "found"), AT_THE_THRESHOLD, ids=[f"{c[0]}-{i}" for i, c in enumerate(AT_THE_THRESHOLD)]
)
def test_each_rule_at_its_threshold(name, params, values, judged, found):
    assert _judge(name, values, **params) == (judged, found)


def test_megatron_without_a_finite_reference_flags_only_the_non_finite_values():
    assert _judge("megatron", [NAN, NAN, NAN, 5.0], steps=[1, 2, 3, 200]) == (
        3,
        [(1, None, None, math.inf), (2, None, None, math.inf), (3, None, None, math.inf)],
    )


def test_zclip_follows_the_ema_of_zclip():
    # An oracle from ZClip's definition: plain mean/variance of the first 25 values, then
    # mean <- a mean + (1 - a) x, var <- a var + (1 - a) (x - old mean)^2; a flagged value enters clipped.
    values = [1.0, 1.2] * 13 + [5.0, 1.1, NAN]
    mean, var = float(np.mean(values[:25])), float(np.var(values[:25]))
    expected = []
    for step, x in enumerate(values[25:], 26):
        if not math.isfinite(x):
            expected.append((step, None, pytest.approx(mean), math.inf))
            continue
        z = (x - mean) / math.sqrt(var)
        if z > 2.5:
            expected.append((step, x, pytest.approx(mean), pytest.approx(z)))
            x = mean + 2.5 * math.sqrt(var)
        mean, var = 0.97 * mean + 0.03 * x, 0.97 * var + 0.03 * (x - mean) ** 2
    assert [s for s, *_ in expected] == [27, 29]
    assert _judge("zclip", values) == (4, expected)


def test_what_a_detector_says_it_needs_and_could_not_judge():
    judgement = get_detector("ratio").judge([10, 20, 30], [1.0, 1.0, 1.0])
    assert judgement.blind and judgement.not_judged_text() == (
        "not judged: 3 points, interval 10 steps, needs 10 earlier logged points (over at least 50 steps)"
    )
    assert get_detector("ratio").judge([5], [1.0]).not_judged_text() == (
        "not judged: 1 point, needs 10 earlier logged points (over at least 50 steps)"
    )
    assert get_detector("lightning").judge([1, 2], [1.0, 1.0]).not_judged_text() == (
        "not judged: 2 points, interval 1 step, needs 5 earlier logged points (over at least 10 steps)"
    )
    assert not get_detector("ratio").judge(np.arange(1, 12), np.ones(11)).blind
    assert [
        get_detector(name, **params).needs()
        for name, params in [
            ("ratio", {"min_history": 1}),
            ("lightning", {"window": 1}),
            ("lightning", {"window": 7}),
            ("loss-sustained", {}),
            ("loss-sustained", {"min_history": 2, "hold": 2}),
            ("zclip", {"warmup": 3}),
            ("megatron", {"reference_steps": 7}),
        ]
    ] == [
        "1 earlier logged point (over at least 50 steps)",
        "1 earlier logged points (over at least 1 steps)",
        "3 earlier logged points (over at least 7 steps)",
        "1 earlier logged point and 2 later ones",
        "2 earlier logged points and 1 later one",
        "3 earlier logged points (the EMA's warm-up)",
        "a finite value in the first 7 steps and a value after them",
    ]
    assert get_detector("olmo-core", sigmas=4).describe() == "olmo-core(sigmas=4, window=128, min_history=20)"
    assert get_detector("lightning", window=7).judge(np.arange(1, 5), np.ones(4)).judged == 1  # 3 earlier points


# -- the spike baseline every judge shares (pytest_spikecheck.judge.baseline) ----------------------

_EVERY_10 = np.arange(10, 1001, 10)  # a log written every 10 steps, values 1, 2, ..., 100
_VALUES = np.arange(1.0, 101.0)


@pytest.mark.parametrize(
    ("values", "at", "window", "min_points", "expected"),
    [
        (_VALUES, 500, 50, 10, list(range(40, 50))),  # 5 in [450, 500), widened back to 10 points
        (_VALUES, 500, 50, 3, [45, 46, 47, 48, 49]),  # the window alone has enough
        (_VALUES, 500, 50, 0, [45, 46, 47, 48, 49]),  # at least one point, always
        (_VALUES, 500, 20, 2, [48, 49]),  # [480, 500): 490 and 480
        (_VALUES, 100, 50, 10, []),  # 9 points before step 100: no baseline
        (_VALUES, 110, 50, 10, list(range(1, 11))),  # exactly 10
        (np.where((_VALUES > 40) & (_VALUES < 46), np.nan, _VALUES), 500, 50, 10, [35, 36, 37, 38, 39, 40, 46, 47, 48, 49]),
    ],
)
def test_the_baseline_history_is_the_window_widened_to_min_points(values, at, window, min_points, expected):
    assert baseline_history(_EVERY_10, values, at, window, min_points).tolist() == expected


def test_the_spike_baseline_is_the_median_of_that_history():
    assert spike_baseline(_EVERY_10, _VALUES, 500) == 44.5
    assert math.isnan(spike_baseline(_EVERY_10, _VALUES, 100))
    assert spike_baseline(_EVERY_10, _VALUES, 500, window=20, min_points=2) == 48.5


def test_loss_sustained_refuses_an_unknown_early_rule():
    from pytest_spikecheck.judge.detectors import get_detector

    with pytest.raises(ValueError, match="loss-sustained's early must be 'lowest' or 'median', was 'bogus'"):
        get_detector("loss-sustained", early="bogus")
