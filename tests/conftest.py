"""Shared fixtures: small, fast runs trained once per session (no --spikecheck needed:
these test the engine and the analysis themselves)."""

from __future__ import annotations

import pytest
from short_runs import short_scenario

from pytest_spikecheck import NoClip


@pytest.fixture(scope="session")
def short_runs():
    """(control, break) of the short scenario: clip 1.0 vs no clip, same batches."""
    from pytest_spikecheck import train

    return train(short_scenario().replace(name="short-control")), train(short_scenario(NoClip()).replace(name="short-break"))
