"""Seed A's Break 19 as a scenario suite: the break spikes, the clip contains it, the
lessons hold. Thresholds come from measured runs (docs/fidelity.md, seeds 0-9) with margin.

Run with ``pytest --spikecheck scenarios/``. Each scenario trains once per session.
"""

from __future__ import annotations

import numpy as np
import pytest

from pytest_spikecheck import (
    ClipAt,
    NoClip,
    RareTokenBurst,
    Scenario,
    StratifiedBatches,
    assert_clip_contains,
    assert_finite,
    assert_no_spike,
    assert_recovers,
    assert_spike,
    spikecheck_scenario,
)
from pytest_spikecheck.judge.analysis import RECOVERY_HORIZON, loss_jump, recovery_steps, spike_ratio
from pytest_spikecheck.scenario.presets import PHASE19_BURST_STEP as BURST

#: Every test reads the burst and the recovery window after it (50 steps), never the run's tail:
#: each run trains the first 362 of Phase-19's 500 steps (``stop_after``), the same steps, LR
#: schedule, batches and records as the whole run's, bit for bit (tests/test_train_prefix.py).
STOP = BURST + RECOVERY_HORIZON


def _preset() -> Scenario:
    return Scenario.preset("phase-19").replace(stop_after=STOP)


def _phase19(*breaks) -> Scenario:
    return _preset().with_breaks(RareTokenBurst(count=3, at_step=BURST, content="greek"), *breaks)


@spikecheck_scenario
def phase19_control():
    """Seed A's Run A: clip 1.0, a burst of 3 never-seen sentences at step 312."""
    return _phase19()


@spikecheck_scenario
def phase19_break():
    """Seed A's Run B: the same batches without clipping."""
    return _phase19(NoClip())


@spikecheck_scenario
def phase19_clip_half():
    """Seed A's lesson: clip at 0.5, just under the grad-norm baseline."""
    return _phase19(ClipAt(max_norm=0.5))


@spikecheck_scenario
def phase19_written_break():
    """Seed A as written: 3 of the 5 *written* sentences concentrated at step 312, no clip."""
    return _preset().with_breaks(RareTokenBurst(count=3, at_step=BURST, content="written"), NoClip())


@spikecheck_scenario
def phase19_written_stratified():
    """The deeper fix: stratified batching spreads the *written* sentences (at most 1 per batch)."""
    return _preset().with_breaks(
        RareTokenBurst(count=3, at_step=BURST, content="written"), NoClip(), StratifiedBatches(rare_cap=1)
    )


def test_break_spikes_at_the_burst(phase19_break):
    assert_spike(phase19_break, at=BURST, min_ratio=10)
    # ...and nothing spikes before it: the largest ratio to the rolling median over steps
    # 1–311 measured 1.88× (break) and 1.63× (control) on 2026-11-30; the ratio detector's 5×
    # leaves a 2.7× margin. (docs/fidelity.md cites this test for both claims.)
    steps = phase19_break["step"]
    before = {name: values[steps < BURST] for name, values in phase19_break.metrics.items()}
    assert_no_spike(before, detector="ratio", threshold=5.0)


def test_the_spike_comes_from_the_data_not_the_clip(phase19_control):
    # The pre-clip norm spikes in the control too: clipping does not prevent the spike, it contains it.
    assert_spike(phase19_control, at=BURST, min_ratio=10)


def test_control_clip_contains_every_step(phase19_control):
    assert_clip_contains(phase19_control, max_norm=1.0)


def test_break_is_not_clipped(phase19_break):
    # Seed A's smoking gun: without a clip the post-clip norm equals the pre-clip norm. The
    # post-clip norm is measured on the gradients AdamW receives (float64, independent of the
    # clipping backend), so they agree to float32 rounding, not by construction.
    at = np.flatnonzero(phase19_break["step"] == BURST)[0]
    assert phase19_break["grad_norm_post"][at] == pytest.approx(phase19_break["grad_norm_pre"][at], rel=1e-6)


def test_clip_shrinks_the_eval_loss_jump(phase19_control, phase19_break):
    control, broken = loss_jump(phase19_control.metrics, BURST), loss_jump(phase19_break.metrics, BURST)
    assert broken > 0.1, f"the break's eval-loss jump is only {broken:.3f} nats"
    assert broken > 5 * max(control, 1e-3), f"clip 1.0 jump {control:.3f} vs no clip {broken:.3f}"


def test_break_recovers_and_control_never_leaves(phase19_control, phase19_break):
    assert recovery_steps(phase19_control.metrics, BURST) == 0
    took = assert_recovers(phase19_break, within=50)
    assert took > 0


def test_break_stays_finite(phase19_break):
    # fp32 + AdamW at this scale recovers; divergence to NaN needs a numeric break.
    assert_finite(phase19_break)


def test_clip_half_contains_and_is_gentle_on_the_jump(phase19_clip_half, phase19_break):
    assert_clip_contains(phase19_clip_half, max_norm=0.5)
    assert loss_jump(phase19_clip_half.metrics, BURST) < 0.5 * loss_jump(phase19_break.metrics, BURST)


def test_seed_faithful_written_burst_is_small(phase19_written_break):
    # Seed A's exact break barely registers at our scale (docs/fidelity.md): a 2-6x bump.
    ratio = spike_ratio(phase19_written_break.metrics, BURST)
    assert 1.5 < ratio < 10, ratio


def test_stratified_batches_spread_the_rare_sentences(phase19_written_break, phase19_written_stratified):
    assert max(b["rare_samples"] for b in phase19_written_stratified.batches) <= 1
    concentrated = phase19_written_break.batch_at(BURST)["rare_samples"]
    assert concentrated >= 3
    assert spike_ratio(phase19_written_stratified.metrics, BURST) < spike_ratio(phase19_written_break.metrics, BURST)
