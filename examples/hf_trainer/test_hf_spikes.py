"""Run with ``pytest --spikecheck examples/hf_trainer`` (needs the [hf] extra)."""

import pytest

from pytest_spikecheck import assert_clip_contains, assert_recovers, assert_spike, diagnose

pytestmark = pytest.mark.spikecheck


def test_the_clip_contains_the_burst(hf_control):
    burst_step = hf_control.declared_events[0]  # the run remembers where its burst was injected
    assert_spike(hf_control, at=burst_step, min_ratio=3)  # the burst is there, pre-clip (3.35x measured) ...
    assert_clip_contains(hf_control)  # ... and the Trainer's clip held it (its max_grad_norm, from the run's facts)


def test_the_clipped_run_recovers(hf_control):
    assert_recovers(hf_control, within=10, metric="loss")


def test_without_the_clip_the_diagnosis_names_the_burst(hf_break):
    d = diagnose(hf_break)
    assert d.step == hf_break.declared_events[0] and d.facts["burst_samples"] == 3
    assert "no clip" in d.verdict and len(d.facts["injected"]) == 3
