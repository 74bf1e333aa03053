"""The :class:`Break` base class and the registry of breaks by YAML name.

A break is a frozen dataclass whose ``apply(scenario)`` returns the scenario with a config
switch flipped or the sampler changed; the concrete breaks and defences live in
:mod:`.breaks` and register here (``config_name``) when they are defined.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.scenario.naming import fmt_value
from pytest_spikecheck.scenario.sections import check, check_max_norm, is_int, is_number

if TYPE_CHECKING:
    from pytest_spikecheck.scenario.spec import Scenario

_REGISTRY: dict[str, type[Break]] = {}


@dataclass(frozen=True)
class Break:
    """Base class. Subclasses set ``config_name`` (their YAML name) and implement ``apply``."""

    config_name: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.config_name:
            _REGISTRY[cls.config_name] = cls

    def __post_init__(self) -> None:
        # Each parameter has its default's type, checked here so a bad value fails where it is
        # written (ClipAt(max_norm="1")), not at train time; subclasses add ranges in validate().
        for f in fields(self):
            value, default, label = getattr(self, f.name), f.default, f"{type(self).__name__}({f.name}=...)"
            if default is dataclasses.MISSING or (default is None and value is None):
                continue
            if isinstance(default, bool):
                check(isinstance(value, bool), f"{label} must be True or False, was {value!r}")
            elif isinstance(default, int):
                check(is_int(value), f"{label} must be an integer, was {value!r}")
            elif f.name == "max_norm":  # a clip limit: the one rule (check_max_norm); validate() adds the rest
                check_max_norm(value, label)
            elif isinstance(default, float):
                check(is_number(value) and not math.isnan(value), f"{label} must be a number, was {value!r}")
            elif isinstance(default, str) or default is None:
                check(isinstance(value, str), f"{label} must be a string, was {value!r}")
            elif isinstance(default, tuple):
                check(isinstance(value, tuple), f"{label} must be a tuple, was {value!r}")
        self.validate()

    def validate(self) -> None:
        """Range checks of the parameters (raise ConfigError); types are checked already."""

    def apply(self, scenario: Scenario) -> Scenario:  # pragma: no cover - abstract
        raise NotImplementedError

    def label(self) -> str:
        """Short, unique text for derived scenario names: the YAML name and the parameters that
        differ from their defaults, e.g. ``skip_spikes(ratio=3.0)``."""
        changed = [
            f"{f.name}={fmt_value(getattr(self, f.name))}"
            for f in fields(self)
            if f.default is dataclasses.MISSING or getattr(self, f.name) != f.default
        ]
        return self.config_name + (f"({','.join(changed)})" if changed else "")

    def describe(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in asdict(self).items())
        return f"{type(self).__name__}({args})"


def break_names() -> list[str]:
    return sorted(_REGISTRY)


def break_from_config(raw: Any, *, where: str = "config") -> Break:
    """A break from its YAML form: ``no_clip`` or ``{rare_token_burst: {count: 3, at_step: 312}}``."""
    if isinstance(raw, str):
        name, params = raw, {}
    elif isinstance(raw, Mapping) and len(raw) == 1:
        name, params = next(iter(raw.items()))
        params = params or {}
    else:
        raise ConfigError(f"{where}: a break is a name or a one-key mapping {{name: {{params}}}}, was {raw!r}")
    if name not in _REGISTRY:
        raise ConfigError(f"{where}: unknown break {name!r}; choose one of {', '.join(break_names())}")
    cls = _REGISTRY[name]
    if not isinstance(params, Mapping):
        raise ConfigError(f"{where}: parameters of break {name!r} must be a mapping, was {params!r}")
    allowed = [f.name for f in fields(cls)]
    unknown = sorted(set(params) - set(allowed), key=str)
    if unknown:
        raise ConfigError(
            f"{where}: unknown parameter {unknown[0]!r} for break {name!r}; expected {', '.join(allowed) or 'none'}"
        )
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in params.items()}
    try:
        return cls(**values)
    except (TypeError, ConfigError) as exc:
        raise ConfigError(f"{where}: break {name!r}: {exc}") from None


def break_to_config(b: Break) -> Any:
    params = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(b).items()}
    return {b.config_name: params} if params else b.config_name
