"""Derived scenario names: a readable name unique to a scenario's content.

``Scenario.preset("phase-19").with_breaks(NoClip())`` is named ``phase-19+no_clip``: the preset
it starts from, every field that differs from that preset, and its breaks. A name given by hand
always wins; a derived one is recomputed whenever the content changes.
"""

from __future__ import annotations

import math
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from pytest_spikecheck.models.config import PRESETS as MODEL_PRESETS
from pytest_spikecheck.scenario.preset_registry import preset_base
from pytest_spikecheck.scenario.sections import SECTIONS, BurstSpec

if TYPE_CHECKING:
    from pytest_spikecheck.scenario.spec import Scenario


class DerivedName(str):
    """A scenario name computed from its content (see :func:`derived_name`). Carried along by
    ``dataclasses.replace``, it marks the name as "recompute me": a derived scenario never keeps
    the name of the one it came from. A plain ``str`` is a name given by hand and always wins."""


#: The default of ``Scenario.name``: derive the name from the content.
AUTO_NAME = DerivedName("")
#: Derived names longer than this are cut and end in a short content hash (still unique).
MAX_NAME_LENGTH = 64


def fmt_value(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return "inf" if value == math.inf else repr(value)
    if isinstance(value, tuple):
        return "(" + ",".join(fmt_value(v) for v in value) + ")"
    if isinstance(value, BurstSpec):
        return f"{value.count}×{value.content}@{value.at_step}"
    return str(value)


def _field_names_in(spec_type: type) -> set[str]:
    return {f.name for f in fields(spec_type)}


def derived_name(scenario: Scenario) -> str:
    """A readable name unique to the scenario's content: the preset it starts from, every field
    that differs from that preset, and its breaks, joined with ``+`` — for example
    ``phase-19+steps=120+no_clip+burst(3×greek@60)``. Names longer than :data:`MAX_NAME_LENGTH`
    are cut in the middle (``…``) and end in ``~`` and 8 characters of the content hash, so two different contents
    never share a derived name."""
    base = preset_base(scenario.preset_name) if scenario.preset_name else _default_base(type(scenario))
    parts = [scenario.preset_name or "scenario"]
    for key in ("steps", "stop_after", "seed"):
        if getattr(scenario, key) != getattr(base, key):
            parts.append(f"{key}={getattr(scenario, key)}")
    if scenario.model_factory is not None:
        kwargs = ",".join(f"{k}={fmt_value(v)}" for k, v in scenario.model_kwargs.items())
        parts.append(f"model={scenario.model_factory_path}" + (f"({kwargs})" if kwargs else ""))
    preset = None
    if scenario.model != base.model:
        preset = next((n for n, c in MODEL_PRESETS.items() if c == scenario.model), None)
        if preset is not None:
            parts.append(f"model={preset}")
    ambiguous = {
        n for a in SECTIONS.values() for b in SECTIONS.values() if a is not b for n in _field_names_in(a) & _field_names_in(b)
    }
    for section in SECTIONS:
        mine, theirs = getattr(scenario, section), getattr(base, section)
        if mine == theirs or (section == "model" and preset is not None):
            continue
        for f in fields(mine):
            value = getattr(mine, f.name)
            if value != getattr(theirs, f.name):
                label = f"{section}.{f.name}" if f.name in ambiguous else f.name
                parts.append(f"{label}={fmt_value(value)}")
    parts += [b.label() for b in scenario.breaks]
    name = "+".join(parts)
    if len(name) > MAX_NAME_LENGTH:  # keep both ends readable (the preset, the last breaks)
        keep = (MAX_NAME_LENGTH - 10) // 2
        name = f"{name[:keep]}…{name[-keep:]}~{scenario.content_hash()[:8]}"
    return name


#: The default-constructed scenario of each scenario type (the base of a name with no preset).
_DEFAULT_BASES: dict[type, Scenario] = {}


def _default_base(scenario_type: type) -> Scenario:
    if scenario_type not in _DEFAULT_BASES:
        _DEFAULT_BASES[scenario_type] = scenario_type(name="scenario")
    return _DEFAULT_BASES[scenario_type]
