import pytest

from conftest import BASE
from pytest_spikecheck import ClipAt, assert_clip_contains, assert_no_spike, assert_spike


def test_without_clipping_the_burst_spikes(no_clip):
    assert_spike(no_clip, at=40, min_ratio=3)


def test_the_clip_holds_through_the_burst(control):
    assert_clip_contains(control, max_norm=1.0)


def test_tighter_clips_hold_too(clipped):
    assert_clip_contains(clipped, max_norm=clipped.scenario.max_norm)


@pytest.mark.parametrize("max_norm", [2.0, 4.0])
def test_a_sweep_through_spikecheck_run(spikecheck, max_norm):
    # No name given: each sweep point is named after its content (…+clip(2), …+clip(4)).
    run = spikecheck.run(BASE.with_breaks(ClipAt(max_norm=max_norm)))
    assert_clip_contains(run, max_norm=max_norm)


@pytest.mark.xfail(reason="on purpose: without a clip the burst is a spike", strict=True)
def test_no_spike_without_a_clip_fails_on_purpose(no_clip):
    assert_no_spike(no_clip, at=40, max_ratio=3)
