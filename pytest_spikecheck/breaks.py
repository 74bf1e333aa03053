"""Breaks: the ways a scenario is deliberately broken, as frozen dataclasses.

A break never touches the training loop. ``apply(scenario)`` returns a new scenario with a
config switch flipped (``NoClip`` sets ``optimizer.grad_clip`` to None) or the sampler
changed (``RareTokenBurst`` adds a burst). Seed A's control is ``preset + burst``; its
break is ``preset + burst + NoClip()`` — the same batches, one safety net removed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any, ClassVar, Mapping

from pytest_spikecheck.data.corpus import BURST_CONTENTS
from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.scenario import BurstSpec, Scenario

_REGISTRY: dict[str, type["Break"]] = {}


@dataclass(frozen=True)
class Break:
    """Base class. Subclasses set ``config_name`` (their YAML name) and implement ``apply``."""

    config_name: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.config_name:
            _REGISTRY[cls.config_name] = cls

    def apply(self, scenario: Scenario) -> Scenario:  # pragma: no cover - abstract
        raise NotImplementedError

    def describe(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in asdict(self).items())
        return f"{type(self).__name__}({args})"


@dataclass(frozen=True)
class NoClip(Break):
    """Seed A's break: train without gradient clipping (``grad_clip: null``)."""

    config_name: ClassVar[str] = "no_clip"

    def apply(self, scenario: Scenario) -> Scenario:
        return scenario.replace(optimizer__grad_clip=None)


@dataclass(frozen=True)
class ClipAt(Break):
    """Clip at a different ``max_norm`` (e.g. Seed A's lesson: 0.5 sits at the grad-norm baseline)."""

    config_name: ClassVar[str] = "clip_at"
    max_norm: float = 0.5
    mode: str = "global"

    def apply(self, scenario: Scenario) -> Scenario:
        return scenario.replace(optimizer__grad_clip=float(self.max_norm), optimizer__clip_mode=self.mode)


@dataclass(frozen=True)
class RareTokenBurst(Break):
    """Concentrate ``count`` rare samples in the batch of step ``at_step``.

    ``content`` picks them: ``"greek"`` (default, the calibrated Phase-19 content: English
    sentences in Greek script, whose bytes the model has never seen), ``"caps"`` (ALL-CAPS
    English, never seen) or ``"written"`` (Seed A's own rare family: the corpus sentences
    with *written*, held out until the burst). See docs/fidelity.md for what each does.
    """

    config_name: ClassVar[str] = "rare_token_burst"
    count: int = 3
    at_step: int = 312
    content: str = "greek"

    def __post_init__(self) -> None:
        if self.content not in BURST_CONTENTS:
            raise ConfigError(f"RareTokenBurst content must be one of {', '.join(BURST_CONTENTS)}, was {self.content!r}")
        if self.count < 1 or self.at_step < 1:
            raise ConfigError(f"RareTokenBurst needs count >= 1 and at_step >= 1, was count={self.count}, at_step={self.at_step}")

    def apply(self, scenario: Scenario) -> Scenario:
        burst = BurstSpec(at_step=self.at_step, count=self.count, content=self.content)
        return scenario.replace(sampler__bursts=scenario.sampler.bursts + (burst,))


@dataclass(frozen=True)
class StratifiedBatches(Break):
    """Not a break but a defence, declared the same way: cap rare samples per batch (Seed A's deeper fix)."""

    config_name: ClassVar[str] = "stratified_batches"
    rare_cap: int = 1

    def apply(self, scenario: Scenario) -> Scenario:
        return scenario.replace(sampler__kind="stratified", sampler__rare_cap=self.rare_cap)


@dataclass(frozen=True)
class MixtureShift(Break):
    """Re-weight data sources at phase boundaries (Seed B's bandit).

    Not implemented yet: it needs the multi-source corpus of the Seed B issue, and raises
    NotImplementedError when applied until then.
    """

    config_name: ClassVar[str] = "mixture_shift"
    phase_lengths: tuple[int, ...] = (7, 14, 21, 28, 42)

    def apply(self, scenario: Scenario) -> Scenario:
        raise NotImplementedError("MixtureShift needs the multi-source corpus (Seed B), which has not landed yet")


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
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ConfigError(f"{where}: unknown parameter {unknown[0]!r} for break {name!r}; expected {', '.join(allowed) or 'none'}")
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in params.items()}
    try:
        return cls(**values)
    except TypeError as exc:
        raise ConfigError(f"{where}: break {name!r}: {exc}") from None


def break_to_config(b: Break) -> Any:
    params = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(b).items()}
    return {b.config_name: params} if params else b.config_name
