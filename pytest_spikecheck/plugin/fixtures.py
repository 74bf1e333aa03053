"""``@spikecheck_scenario``: declare a scenario once; tests receive its trained run.

>>> from pytest_spikecheck import Scenario, NoClip, RareTokenBurst, spikecheck_scenario  # doctest: +SKIP
>>> @spikecheck_scenario
... def phase19_break():
...     return Scenario.preset("phase-19").with_breaks(NoClip(), RareTokenBurst(count=3, at_step=312))
>>> def test_spike(phase19_break):
...     assert_spike(phase19_break, at=312, min_ratio=10)
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

#: Names of the fixtures made by @spikecheck_scenario (the plugin maps tests to scenarios with it).
SCENARIO_FIXTURES: set[str] = set()


def spikecheck_scenario(factory: Callable[[], Any] | None = None, *, name: str | None = None) -> Any:
    """Turn a function returning a :class:`~pytest_spikecheck.scenario.Scenario` into a
    session-scoped fixture (named after the function, or ``name``) whose value is the
    trained :class:`~pytest_spikecheck.records.run.Run`. Tests using it are skipped unless pytest
    runs with ``--spikecheck``; each scenario trains once per session however many tests use it.
    """

    def decorate(func: Callable[[], Any]) -> Any:
        fixture_name = name or func.__name__

        def scenario_fixture(spikecheck: Any) -> Any:
            return spikecheck.run(func(), name=fixture_name)

        scenario_fixture.__name__ = fixture_name
        scenario_fixture.__qualname__ = fixture_name
        scenario_fixture.__module__ = func.__module__
        scenario_fixture.__doc__ = (func.__doc__ or "").strip() or f"The trained run of spikecheck scenario {fixture_name!r}."
        SCENARIO_FIXTURES.add(fixture_name)
        return pytest.fixture(scope="session", name=fixture_name)(scenario_fixture)

    return decorate(factory) if factory is not None else decorate
