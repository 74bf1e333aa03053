"""Fuzz the assertions and detectors with arbitrary series: NaN, ±inf, zeros, negatives, huge
and tiny values, empty and length-1 logs, gaps in the step axis, missing columns.

The contract: an assertion passes, fails with :class:`SpikeCheckError` (the check failed) or
rejects invalid input with a ``ValueError`` naming the problem — nothing else, and no stray
numpy warning (this suite runs with ``filterwarnings = error``, as many users' suites do). A
detector returns detections on the series' own steps and flags every non-finite value.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from pytest_spikecheck.judge import assertions
from pytest_spikecheck.judge.detectors import DETECTORS, get_detector
from pytest_spikecheck.errors import SpikeCheckError

#: Longer than every detector's window (olmo-core: 128 steps) so that baselines fill up.
MAX_LENGTH = 160

values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(0.5, 2.0),  # a realistic level, so that spikes and baselines happen
    st.sampled_from([0.0, -0.0, 1e-300, 1e300, -1.0]),
)


@st.composite
def series(draw, min_size: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values): strictly increasing steps with gaps, any values."""
    n = draw(st.integers(min_size, MAX_LENGTH))
    gaps = draw(st.lists(st.integers(1, 7), min_size=n, max_size=n))
    start = draw(st.integers(0, 1000))
    steps = start + np.cumsum(np.asarray(gaps, dtype=np.int64))
    return steps, np.asarray(draw(st.lists(values, min_size=n, max_size=n)), dtype=np.float64)


@st.composite
def metric_logs(draw) -> dict[str, np.ndarray]:
    """A metrics mapping as a user would pass it: some of our columns, any values."""
    steps, loss = draw(series())
    log = {"step": steps, "loss": loss}
    for name in ("grad_norm_pre", "grad_norm_post", "eval_loss", "clip_factor"):
        if draw(st.booleans()):
            log[name] = np.asarray(draw(st.lists(values, min_size=steps.size, max_size=steps.size)), dtype=np.float64)
    return log


def some_step(draw, log: dict[str, np.ndarray]) -> int | None:
    """None, a logged step, or a step the log does not have."""
    logged = log["step"]
    options = [st.none(), st.integers(-5, 2000)]
    if logged.size:
        options.append(st.sampled_from(logged.tolist()))
    return draw(st.one_of(*options))


@st.composite
def assertion_calls(draw) -> tuple[str, dict]:
    log = draw(metric_logs())
    name = draw(st.sampled_from(sorted(assertions.__all__)))
    kwargs: dict = {}
    if name == "assert_spike":
        kwargs = {"at": some_step(draw, log), "min_ratio": draw(st.floats(0.5, 100)), "window": draw(st.integers(1, 200))}
    elif name == "assert_no_spike":
        kwargs = {"detector": draw(st.sampled_from(sorted(DETECTORS))), "metric": draw(st.sampled_from(["grad_norm_pre", "loss"]))}
    elif name == "assert_clip_contains":
        kwargs = {"max_norm": draw(st.floats(0, 10)), "rtol": draw(st.sampled_from([0.0, 1e-5, 0.1]))}
    elif name == "assert_recovers":
        kwargs = {"within": draw(st.integers(1, 200)), "at": some_step(draw, log)}
    elif name == "assert_diverges":
        kwargs = {"within": draw(st.one_of(st.none(), st.integers(0, 200))), "at": some_step(draw, log)}
    return name, {"run": log, **kwargs}


@given(assertion_calls())
def test_assertions_fail_cleanly_on_any_series(call):
    name, kwargs = call
    try:
        getattr(assertions, name)(**kwargs)
    except (SpikeCheckError, ValueError):
        pass  # a failed check, or invalid input named as such: the contract


@given(name=st.sampled_from(sorted(DETECTORS)), data=series(), threshold=st.one_of(st.none(), st.floats(0.01, 100)))
def test_detectors_never_crash_and_flag_every_nonfinite_value(name, data, threshold):
    detector = get_detector(name)
    if threshold is not None:
        detector = detector.with_threshold(threshold)
    steps, values = data
    hits = detector.detect(steps, values)
    flagged = [h.step for h in hits]
    assert set(flagged) <= set(steps.tolist())
    assert len(flagged) == len(set(flagged)), f"{name} flagged a step twice"
    assert set(steps[~np.isfinite(values)].tolist()) <= set(flagged)
    assert all(isinstance(h.score, float) and not math.isnan(h.score) for h in hits)
