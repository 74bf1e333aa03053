"""pytester helpers (every inner run is a subprocess: see ``--runpytest=subprocess`` in
pyproject.toml; torch cannot be unloaded and reloaded in one process): tiny scenarios (declared in a conftest.py, as users share them) that
train in well under a second."""

from __future__ import annotations

import pytest

TINY_CONFTEST = '''
from pytest_spikecheck import NoClip, RareTokenBurst, Scenario, spikecheck_scenario


@spikecheck_scenario
def tiny_break():
    """40 steps, a burst of 3 unseen sentences at step 30, no clip."""
    return Scenario.preset("phase-19").replace(steps=40).with_breaks(NoClip(), RareTokenBurst(count=3, at_step=30))


@spikecheck_scenario
def tiny_control():
    return Scenario.preset("phase-19").replace(steps=40).with_breaks(RareTokenBurst(count=3, at_step=30))
'''

TINY_TESTS = '''
from pytest_spikecheck import assert_clip_contains, assert_spike


def test_break_spikes(tiny_break):
    assert_spike(tiny_break, at=30, min_ratio=3)


def test_control_contains(tiny_control):
    assert_clip_contains(tiny_control, max_norm=1.0)


def test_seed(tiny_break):
    print("SEED", tiny_break.scenario.seed)
'''


@pytest.fixture
def tiny(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(TINY_CONFTEST)  # scenarios in conftest.py: every test module sees them
    pytester.makepyfile(test_tiny=TINY_TESTS)
    return pytester
