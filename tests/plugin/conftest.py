"""pytester helpers: tiny scenarios (declared in a conftest.py, as users share them) that
train in well under a second.

Inner sessions run in this process (``pytester.runpytest``), which saves each of them ~4 s of
imports: torch, and ``torch._dynamo``, which torch imports the first time an optimizer is built.
Pytester removes the modules an inner run imported when it ends, and torch cannot be unloaded
and imported again, so everything an inner run would import that is heavy or registers itself
with torch is imported here first and stays. What must see a fresh interpreter (the plugin
imports nothing heavy; xdist workers) uses ``runpytest_subprocess``.
"""

from __future__ import annotations

import matplotlib.pyplot  # noqa: F401
import pytest
import torch
import torch._dynamo  # noqa: F401  (torch.optim imports it on the first optimizer; here, once)

import pytest_spikecheck.cli.commands  # noqa: F401
import pytest_spikecheck.report  # noqa: F401
import pytest_spikecheck.training.engine  # noqa: F401


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

TINY_TESTS = """
from pytest_spikecheck import assert_clip_contains, assert_spike


def test_break_spikes(tiny_break):
    assert_spike(tiny_break, at=30, min_ratio=3)


def test_control_contains(tiny_control):
    assert_clip_contains(tiny_control, max_norm=1.0)


def test_seed(tiny_break):
    print("SEED", tiny_break.scenario.seed)
"""


@pytest.fixture
def tiny(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(TINY_CONFTEST)  # scenarios in conftest.py: every test module sees them
    pytester.makepyfile(test_tiny=TINY_TESTS)
    return pytester
