"""``@spikecheck_scenario``: declare a scenario once; tests receive its trained run.

>>> from pytest_spikecheck import Scenario, NoClip, RareTokenBurst, spikecheck_scenario  # doctest: +SKIP
>>> @spikecheck_scenario
... def phase19_break():
...     return Scenario.preset("phase-19").with_breaks(NoClip(), RareTokenBurst(count=3, at_step=312))
>>> def test_spike(phase19_break):
...     assert_spike(phase19_break, at=312, min_ratio=10)
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import pytest

#: The fixtures made by @spikecheck_scenario: fixture name -> the ids of its params (None when it
#: has none). The plugin maps tests to the scenario runs they use with it.
SCENARIO_FIXTURES: dict[str, list[str] | None] = {}


def run_name(fixture_name: str, param_id: str | None) -> str:
    """The scenario name a @spikecheck_scenario fixture trains under: its own name, and for a
    parametrized one the param's id in brackets, as pytest writes test ids: ``clipped[0.5]``."""
    return fixture_name if param_id is None else f"{fixture_name}[{param_id}]"


def _param_ids(params: list[Any], ids: Any) -> list[str]:
    if ids is None:
        ids = [p if isinstance(p, (str, int, float, bool)) or p is None else f"{i}" for i, p in enumerate(params)]
    elif callable(ids):
        ids = [ids(p) for p in params]
    ids = [str(i) for i in ids]
    if len(ids) != len(params):
        raise ValueError(f"@spikecheck_scenario: {len(ids)} ids for {len(params)} params")
    if len(set(ids)) != len(ids):
        raise ValueError(f"@spikecheck_scenario: param ids must be unique (they name the runs), were {ids}")
    return ids


def spikecheck_scenario(
    factory: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    params: Iterable[Any] | None = None,
    ids: Iterable[str] | Callable[[Any], str] | None = None,
) -> Any:
    """Turn ``factory``, a function returning a :class:`~pytest_spikecheck.scenario.Scenario`, into a
    session-scoped fixture (named after the function, or ``name``) whose value is the
    trained :class:`~pytest_spikecheck.records.run.Run`. Tests using it are skipped unless pytest
    runs with ``--spikecheck``; each scenario trains once per session however many tests use it.

    With ``params=[...]`` (and optionally ``ids``) it is parametrized like ``pytest.fixture``:
    the function takes the param as its one argument, every test using the fixture runs once
    per param, and each param's run is named ``<fixture>[<id>]`` (ids default to the param
    itself for str/int/float/bool/None params, else its index)::

        @spikecheck_scenario(params=[0.25, 0.5, 1.0])
        def clipped(max_norm):
            return BASE.with_breaks(ClipAt(max_norm=max_norm))     # runs clipped[0.25], ...
    """

    def decorate(func: Callable[..., Any]) -> Any:
        fixture_name = name or func.__name__
        param_list = None if params is None else list(params)
        param_ids = (
            None if param_list is None else _param_ids(param_list, None if ids is None else (ids if callable(ids) else list(ids)))
        )

        def scenario_fixture(spikecheck: Any, request: Any) -> Any:
            if param_ids is None:
                return spikecheck.run(func(), name=fixture_name)
            return spikecheck.run(func(request.param), name=run_name(fixture_name, param_ids[request.param_index]))

        scenario_fixture.__name__ = fixture_name
        scenario_fixture.__qualname__ = fixture_name
        scenario_fixture.__module__ = func.__module__
        scenario_fixture.__doc__ = (func.__doc__ or "").strip() or f"The trained run of spikecheck scenario {fixture_name!r}."
        SCENARIO_FIXTURES[fixture_name] = param_ids
        return pytest.fixture(scope="session", name=fixture_name, params=param_list, ids=param_ids)(scenario_fixture)

    return decorate(factory) if factory is not None else decorate
