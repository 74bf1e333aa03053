"""Scenarios: everything that decides a training run, as frozen, hashable data.

A :class:`Scenario` names a model shape, the data, the batch sampler, the optimizer and
clip, the LR schedule, what to record, the number of steps, the seed, and its *breaks*.
Breaks (see :mod:`pytest_spikecheck.scenario.breaks`) are data too: each one is folded into the
scenario as a config switch or a sampler change by :meth:`Scenario.resolved`, so the
training loop never forks. Two scenarios that resolve to the same config train the same
run, whatever their names, and share a :meth:`content_hash`.

The rooms of this package: the sections and their checks (:mod:`.sections`), this type, the
YAML codec (:mod:`.config`), derived names (:mod:`.naming`), the break base class and its
registry (:mod:`.break_base`) beside the breaks (:mod:`.breaks`), the preset registry
(:mod:`.preset_registry`) beside the presets (:mod:`.presets`).

No torch here: scenarios can be built, compared, hashed and written to YAML for free.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.models.config import GPTConfig, model_preset
from pytest_spikecheck.scenario import config
from pytest_spikecheck.scenario.break_base import Break
from pytest_spikecheck.scenario.naming import AUTO_NAME, DerivedName, derived_name
from pytest_spikecheck.scenario.preset_registry import preset_base
from pytest_spikecheck.scenario.sections import (
    IMPORT_PATH,
    SECTIONS,
    AmpSpec,
    DataSpec,
    OptimizerSpec,
    RecordSpec,
    SamplerSpec,
    ScheduleSpec,
    check,
    check_ranges,
    check_section_types,
    check_section_values,
    is_int,
)


@dataclass(frozen=True)
class Scenario:
    """A declared training run. Build one with :meth:`preset`, :meth:`from_yaml` or the constructor.

    Frozen and hashable: ``replace(...)`` (a section's field as ``optimizer__lr=3e-3``) and
    ``with_breaks(...)`` return new scenarios; ``content_hash()`` identifies what trains (the name
    aside). Every value is checked when the scenario is built: a bad one raises ``ConfigError``.

    >>> from pytest_spikecheck import NoClip, RareTokenBurst, Scenario
    >>> s = Scenario.preset("phase-19").replace(steps=120).with_breaks(NoClip(), RareTokenBurst(count=3, at_step=60))
    >>> s.name, s.steps, s.resolved().optimizer.grad_clip
    ('phase-19+steps=120+no_clip+burst(3×greek@60)', 120, None)
    """

    #: Given by hand, or (the default) derived from the content: the preset, the changed fields
    #: and the breaks, e.g. ``phase-19+steps=120+no_clip+burst(3×greek@60)``; see :func:`derived_name`.
    name: str = AUTO_NAME
    #: The built-in GPT's shape (``model:`` in YAML; ignored with ``model_factory``).
    model: GPTConfig = field(default_factory=lambda: model_preset("micro"))
    #: The corpus (``data:`` in YAML).
    data: DataSpec = DataSpec()
    #: How batches are drawn and accumulated (``sampler:``).
    sampler: SamplerSpec = SamplerSpec()
    #: The optimizer, its clip and its skip rule (``optimizer:``).
    optimizer: OptimizerSpec = OptimizerSpec()
    #: The learning-rate schedule (``schedule:``).
    schedule: ScheduleSpec = ScheduleSpec()
    #: What is recorded beyond the per-step metrics (``record:``).
    record: RecordSpec = RecordSpec()
    #: Mixed precision and the loss scaler (``amp:``).
    amp: AmpSpec = AmpSpec()
    #: Optimizer steps to train.
    steps: int = 500
    #: Seeds the weights, the data order and every sampler: same scenario and seed, same metrics.
    seed: int = 42
    #: Break instances, applied by :meth:`resolved`.
    breaks: tuple[Any, ...] = ()
    #: Bring your own model: a callable, or its import path "pkg.module:function", called as
    #: factory(vocab_size, **model_kwargs) -> nn.Module (the contract: docs "Your own model",
    #: checked by pytest_spikecheck.training.model_contract). None = the built-in GPT from ``model``.
    model_factory: Callable[..., Any] | str | None = None
    #: Keyword arguments for ``model_factory``.
    model_kwargs: Mapping[str, Any] = field(default_factory=dict)
    #: The preset this scenario starts from ("" for none): the base of its derived name.
    preset_name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        check(isinstance(self.name, str), f"name must be a string, was {self.name!r}")
        check(is_int(self.steps) and self.steps >= 1, f"steps must be a positive integer, was {self.steps!r}")
        check(is_int(self.seed), f"seed must be an integer, was {self.seed!r}")
        check_section_types(self)
        check(
            isinstance(self.breaks, tuple) and all(isinstance(b, Break) for b in self.breaks),
            f"breaks must be a tuple of Break instances (NoClip(), RareTokenBurst(...)), was {self.breaks!r}",
        )
        f = self.model_factory
        check(
            f is None or callable(f) or (isinstance(f, str) and bool(IMPORT_PATH.match(f))),
            f"model_factory must be a callable or an import path 'package.module:function', was {f!r}",
        )
        check(
            isinstance(self.model_kwargs, Mapping) and all(isinstance(k, str) for k in self.model_kwargs),
            f"model_kwargs must be a mapping of keyword arguments, was {self.model_kwargs!r}",
        )
        check(f is not None or not self.model_kwargs, "model_kwargs needs a model_factory (they are its keyword arguments)")
        # Frozen and hashable: the keyword arguments as a sorted tuple of pairs behind a mapping view.
        object.__setattr__(self, "model_kwargs", _FrozenKwargs(self.model_kwargs))
        for b in self.breaks:
            at = getattr(b, "at_step", None)
            if at is not None:
                check(
                    at <= self.steps,
                    f"{type(b).__name__} at step {at} is after the last step ({self.steps} steps): "
                    f"move it to a step <= {self.steps} or train more steps",
                )
        check_ranges(self)
        check_section_values(self)
        if isinstance(self.name, DerivedName):
            object.__setattr__(self, "name", DerivedName(derived_name(self)))

    # -- construction -------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str) -> Scenario:
        """A named starting point. ``phase-19``: Seed A's model, data, AdamW and clip 1.0,
        plain shuffled batching, no breaks (add them with :meth:`with_breaks`)."""
        return replace(preset_base(name), name=AUTO_NAME, preset_name=name)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], *, where: str = "config") -> Scenario:
        """Build from the YAML shape (see ``experiments/*/config.yaml``); unknown keys raise."""
        return config.scenario_from_dict(cls, raw, where=where)

    @classmethod
    def from_yaml(cls, path: str | Path) -> Scenario:
        """Load a scenario from a YAML file, or from an experiment directory holding ``config.yaml``."""
        return config.scenario_from_yaml(cls, path)

    # -- derivation -----------------------------------------------------------------------
    def with_breaks(self, *breaks: Any) -> Scenario:
        """A copy with ``breaks`` appended (they apply in order when the scenario is resolved)."""
        for b in breaks:
            if not isinstance(b, Break):
                raise ConfigError(f"with_breaks expects Break instances (NoClip(), RareTokenBurst(...)), was {b!r}")
        return replace(self, breaks=self.breaks + tuple(breaks))

    def replace(self, **changes: Any) -> Scenario:
        """``dataclasses.replace`` that also reaches into sections: ``replace(optimizer__lr=3e-3)``.
        ``name=`` fixes the name (a derived name passed back in is kept as it reads now)."""
        top: dict[str, Any] = {}
        if "name" in changes and isinstance(changes["name"], str):
            changes["name"] = str.__str__(changes["name"])
        nested: dict[str, dict[str, Any]] = {}
        for key, value in changes.items():
            if "__" in key:
                section, attr = key.split("__", 1)
                nested.setdefault(section, {})[attr] = value
            else:
                top[key] = value
        for section, attrs in nested.items():
            if section not in SECTIONS:
                raise ConfigError(f"unknown section {section!r}; expected one of {', '.join(SECTIONS)}")
            known = [f.name for f in fields(SECTIONS[section])]
            unknown = sorted(set(attrs) - set(known))
            if unknown:
                raise ConfigError(f"unknown field {section}.{unknown[0]}; expected one of {', '.join(known)}")
            top[section] = replace(top.get(section, getattr(self, section)), **attrs)
        unknown = sorted(set(top) - {f.name for f in fields(Scenario)})
        if unknown:
            raise ConfigError(
                f"unknown scenario field {unknown[0]!r}; expected one of "
                f"{', '.join(f.name for f in fields(Scenario))} or section__field"
            )
        return replace(self, **top)

    def resolved(self) -> Scenario:
        """This scenario with every break folded in (``breaks`` then empty): what the engine trains."""
        scenario = replace(self, breaks=(), name=str.__str__(self.name))  # the name of what was declared
        for b in self.breaks:
            scenario = b.apply(scenario)
        return scenario

    @property
    def max_norm(self) -> float:
        clip = self.optimizer.grad_clip
        return math.inf if clip is None else float(clip)

    @property
    def burst_steps(self) -> tuple[int, ...]:
        return tuple(sorted({b.at_step for b in self.resolved().sampler.bursts}))

    # -- serialisation ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The YAML shape of this scenario (breaks listed by name, not folded in)."""
        return config.scenario_to_dict(self)

    def to_yaml(self) -> str:
        return config.scenario_to_yaml(self)

    @property
    def model_factory_path(self) -> str | None:
        """The model factory as an import path ``package.module:function`` (None: the built-in GPT)."""
        f = self.model_factory
        if f is None or isinstance(f, str):
            return f
        return f"{getattr(f, '__module__', '?')}:{getattr(f, '__qualname__', getattr(f, '__name__', repr(f)))}"

    def content_hash(self) -> str:
        """Hash of what decides the run (resolved config, seed, steps; not the name)."""
        data = self.resolved().to_dict()
        data.pop("name")
        blob = json.dumps(data, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def describe(self) -> str:
        return f"{self.name}: {self.describe_setup()}"

    def describe_setup(self) -> str:
        """What :meth:`describe` says after the name: steps, seed, clip, batches, precision, bursts
        (what a run's run.json ``description`` states)."""
        r = self.resolved()
        clip = r.optimizer.clip.describe()
        bursts = ", ".join(f"{b.count}×{b.content}@{b.at_step}" for b in r.sampler.bursts) or "no bursts"
        k = r.sampler.accumulation
        batches = (
            f"{r.sampler.kind} batches"
            if k == 1
            else f"{r.sampler.kind} batches of {r.sampler.batch_size} in {k} micro-batches ({r.sampler.accumulate})"
        )
        scale = r.amp.loss_scale
        amp = (
            ""
            if r.amp.dtype == "float32"
            else (
                f", {r.amp.dtype} autocast"
                + ("" if scale is None else f" + loss scale {scale if scale == 'dynamic' else format(scale, 'g')}")
            )
        )
        return f"{r.steps} steps, seed {r.seed}, {clip}, {batches}{amp}, {bursts}"


class _FrozenKwargs(Mapping):
    """Keyword arguments as an immutable, hashable mapping (a frozen scenario holds them)."""

    def __init__(self, items: Mapping[str, Any]) -> None:
        self._items = tuple(sorted(dict(items).items()))

    def __getitem__(self, key: str) -> Any:
        return dict(self._items)[key]

    def __iter__(self):
        return iter(k for k, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(json.dumps(self._items, default=repr))

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Mapping) and dict(self._items) == dict(other)

    def __repr__(self) -> str:
        return repr(dict(self._items))
