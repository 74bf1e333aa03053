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
from pytest_spikecheck.judge.finiteness import column_role
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
        kwargs = {
            "detector": draw(st.sampled_from(sorted(DETECTORS))),
            "metric": draw(st.sampled_from(["grad_norm_pre", "loss"])),
        }
    elif name == "assert_clip_contains":
        kwargs = {"max_norm": draw(st.floats(0, 10)), "rtol": draw(st.sampled_from([0.0, 1e-5, 0.1]))}
    elif name == "assert_recovers":
        kwargs = {"within": draw(st.integers(1, 200)), "at": some_step(draw, log)}
    elif name == "assert_diverges":
        kwargs = {"within": draw(st.one_of(st.none(), st.integers(0, 200))), "at": some_step(draw, log)}
    return name, {"run": log, **kwargs}


def _expected_verdict(name: str, kwargs: dict) -> bool | None:
    """Whether ``name`` must pass (True) or fail (False) on this log, from the definitions;
    None where no simple oracle exists (then only the return value is checked)."""
    log = kwargs["run"]
    if name == "assert_clip_contains":
        if "grad_norm_post" not in log:
            return False  # no series to judge: a clear failure
        post, limit = log["grad_norm_post"], kwargs["max_norm"] * (1 + kwargs["rtol"])
        if not np.isfinite(post).any() and not np.isfinite(log.get("grad_norm_pre", np.nan)).any():
            return False  # nothing finite shows the clip held
        bad = ~(post <= limit) & ~np.isnan(post)
        if "grad_norm_pre" in log:
            pre = np.asarray(log["grad_norm_pre"], dtype=float)
            bad |= np.isnan(post) & np.isfinite(pre)
            # over-clipped: below min(pre-clip, max_norm) by more than rtol and torch's 1e-6 epsilon
            with np.errstate(invalid="ignore"):
                bad |= (
                    np.isfinite(pre)
                    & np.isfinite(post)
                    & (post < np.minimum(pre, kwargs["max_norm"]) * (1 - kwargs["rtol"]) - 1e-6)
                )
        return not bad.any()
    if name == "assert_finite":
        # judge.finiteness: evaluation columns (eval_loss) are no training failure; the loss fails
        # at any inf, and at a NaN unless before its first finite value ("not yet computed"); a
        # gradient norm likewise, unless at a step a loss scaler skipped (no oracle for that here)
        judged = [k for k in log if k != "step" and column_role(k) != "evaluation"]
        if all(np.isfinite(log[k]).all() for k in judged):
            return True
        loss = log["loss"]
        started = np.cumsum(np.isfinite(loss)) > 0
        if np.isinf(loss).any() or (np.isnan(loss) & started).any() or (loss.size and not started.any()):
            return False
        return None
    if name == "assert_diverges" and kwargs["within"] is None:
        return any(not np.isfinite(log[k]).all() for k in ("loss", "grad_norm_pre") if k in log)
    return None


@given(assertion_calls())
def test_assertions_fail_cleanly_on_any_series(call):
    name, kwargs = call
    expected = _expected_verdict(name, kwargs)
    try:
        returned = getattr(assertions, name)(**kwargs)
    except SpikeCheckError:
        assert expected is not True, f"{name} failed on a log it must pass"
        return
    except ValueError:
        return  # invalid input named as such: the contract
    assert expected is not False, f"{name} passed on a log it must fail"
    # what a passing assertion returns is what it claims
    if name == "assert_spike":
        assert returned >= kwargs["min_ratio"]
    elif name == "assert_recovers":
        assert 0 <= returned <= kwargs["within"]
    elif name == "assert_diverges":
        log = kwargs["run"]
        bad = [
            int(log["step"][np.flatnonzero(~np.isfinite(log[k]))[0]])
            for k in ("loss", "grad_norm_pre")
            if k in log and not np.isfinite(log[k]).all()
        ]
        assert returned == min(bad)


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


@given(
    max_norm=st.floats(0.01, 10),
    rtol=st.sampled_from([0.0, 1e-5, 0.1]),
    factors=st.lists(st.sampled_from([0.5, 1.0, 1 + 4e-6, 1 + 2e-5, 1.05, 1.2, math.nan, math.inf]), min_size=1, max_size=20),
    with_pre=st.booleans(),
)
def test_clip_contains_fails_exactly_when_a_post_clip_norm_is_over_the_limit_or_over_clipped(max_norm, rtol, factors, with_pre):
    post = max_norm * np.asarray(factors)
    log = {"grad_norm_post": post, **({"grad_norm_pre": np.full(post.size, 2.0 * max_norm)} if with_pre else {})}
    expected = _expected_verdict("assert_clip_contains", {"run": log, "max_norm": max_norm, "rtol": rtol})
    try:
        assertions.assert_clip_contains(log, max_norm, rtol)
    except SpikeCheckError as exc:
        assert expected is False
        if not np.isfinite(post).any() and not with_pre:
            assert str(exc).startswith("no finite grad_norm_post in the record")
            return
        over = ~(post <= max_norm * (1 + rtol)) & ~np.isnan(post) | (np.isnan(post) & with_pre)
        if over.any():
            assert f"at step {int(np.flatnonzero(over)[0]) + 1} (" in str(exc)
        else:  # nothing over the limit: the failure is a clip that scaled too far
            under = np.isfinite(post) & (post < max_norm * (1 - rtol) - 1e-6)
            assert str(exc).startswith(f"over-clipped at step {int(np.flatnonzero(under)[0]) + 1}: ")
    else:
        assert expected is True
