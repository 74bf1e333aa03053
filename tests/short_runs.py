"""The short Phase-19 scenario the unit tests train (imported by conftest.py and test modules;
a plain module because ``from conftest import ...`` is ambiguous with tests/plugin/conftest.py)."""

from __future__ import annotations

from pytest_spikecheck import RareTokenBurst, Scenario

#: A burst early enough to be cheap: the whole run takes ~0.5 s on one thread.
SHORT_BURST = 60


def short_scenario(*breaks, steps: int = 90, seed: int = 0) -> Scenario:
    return (
        Scenario.preset("phase-19")
        .replace(name="short", steps=steps, seed=seed)
        .with_breaks(RareTokenBurst(count=3, at_step=SHORT_BURST, content="greek"), *breaks)
    )
