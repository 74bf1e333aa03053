"""The preset registry: ``Scenario.preset(name)`` builds the scenario a registered function
returns. The presets themselves live in :mod:`.presets` and register when the package is
imported, so this module (and :mod:`.spec`) never imports them."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Callable

from pytest_spikecheck.errors import ConfigError

if TYPE_CHECKING:
    from pytest_spikecheck.scenario.spec import Scenario

#: preset name -> a function building it (filled by :func:`register_preset`).
_PRESETS: dict[str, Callable[[], Scenario]] = {}
#: preset name -> the scenario it builds (derived names compare against it, so it is built once).
_PRESET_BASES: dict[str, Scenario] = {}


def register_preset(name: str) -> Callable[[Callable[[], Scenario]], Callable[[], Scenario]]:
    """Decorator: make ``Scenario.preset(name)`` build a scenario with the decorated function."""

    def register(factory: Callable[[], Scenario]) -> Callable[[], Scenario]:
        _PRESETS[name] = factory
        return factory

    return register


def scenario_preset_names() -> list[str]:
    return sorted(_PRESETS)


def preset_base(name: str) -> Scenario:
    """The preset's scenario as its factory builds it (cached: derived names compare against it)."""
    if name not in _PRESET_BASES:
        try:
            factory = _PRESETS[name]
        except KeyError:
            raise ConfigError(f"unknown scenario preset {name!r}; choose one of {', '.join(sorted(_PRESETS))}") from None
        _PRESET_BASES[name] = replace(factory(), name=name, preset_name=name)
    return _PRESET_BASES[name]
