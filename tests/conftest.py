"""Shared fixtures: small, fast runs trained once per session (no --spikecheck needed:
these test the engine and the analysis themselves)."""

from __future__ import annotations

import pytest

from pytest_spikecheck import NoClip, RareTokenBurst, Scenario

#: A short Phase-19 run with a burst early enough to be cheap (~0.5 s on one thread).
SHORT_BURST = 60


def short_scenario(*breaks, steps: int = 90, seed: int = 0) -> Scenario:
    return (Scenario.preset("phase-19").replace(name="short", steps=steps, seed=seed)
            .with_breaks(RareTokenBurst(count=3, at_step=SHORT_BURST, content="greek"), *breaks))


@pytest.fixture(scope="session")
def short_runs():
    """(control, break) of the short scenario: clip 1.0 vs no clip, same batches."""
    from pytest_spikecheck import train

    return train(short_scenario().replace(name="short-control")), train(short_scenario(NoClip()).replace(name="short-break"))
