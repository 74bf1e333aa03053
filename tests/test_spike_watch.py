"""The engine's online spike trigger (SpikeWatch) decides every step exactly as the full spike
baseline does, though it skips computing the baseline on steps that cannot be a spike."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from pytest_spikecheck.judge.baseline import spike_baseline
from pytest_spikecheck.training.step import SpikeWatch


def _norm(kind: int, steady: float, spike: float, special: float) -> float:
    """A training run's norms are mostly steady: 1 draw in 20 a spike, 1 in 20 a special value."""
    return special if kind == 0 else spike if kind == 1 else steady


norm_values = st.builds(
    _norm,
    st.integers(0, 19),
    st.floats(0.8, 1.25),
    st.floats(1.25, 200.0),
    st.sampled_from([0.0, 1e-30, 7.0, math.nan, math.inf]),
)


@given(
    norms=st.lists(norm_values, min_size=12, max_size=80),
    spike_ratio=st.sampled_from([1.5, 3.0, 10.0, math.inf]),
    skip_ratio=st.sampled_from([None, 1.2, 5.0, 50.0]),
    window=st.sampled_from([10, 12, 50]),
    declared_at=st.integers(1, 80),
)
def test_quiet_steps_are_decided_as_the_full_baseline_decides_them(norms, spike_ratio, skip_ratio, window, declared_at):
    watch = SpikeWatch(spike_ratio, window, skip_ratio, {declared_at: "burst"})
    for step, norm in enumerate(norms, start=1):
        nonfinite = not math.isfinite(norm)
        verdict = watch.judge_norm(step, norm, nonfinite=nonfinite)
        base = spike_baseline(np.arange(1, step, dtype=np.int64), np.asarray(norms[: step - 1], dtype=float), step, window)
        ratio = norm / base if base > 0 else math.nan
        assert verdict.is_spike == (not nonfinite and ratio >= spike_ratio)
        assert verdict.skip == (not nonfinite and skip_ratio is not None and ratio >= skip_ratio)
        assert verdict.declared == ("burst" if step == declared_at else None)
        if verdict.is_event or not math.isnan(verdict.baseline):  # whenever a baseline is reported, it is the one
            assert verdict.baseline == base or (math.isnan(verdict.baseline) and math.isnan(base))
        watch.observe_norm(step, norm)
