"""What a run was, as its writer knew it: the facts block of run.json (format 2).

Every writer fills one :class:`RunFacts`: the engine from its Scenario
(:func:`facts_from_scenario`), the recorder and the framework callbacks from what they
observe (the optimizer's class and param groups, the trainer's arguments), a log reader from
what the log says. A fact the writer does not know is None (``null`` in run.json), never a
default. Every reader (judge, diagnosis, report) reads the facts, never a Scenario: a run
recorded from someone else's trainer has none. The published JSON Schema of a run folder is
docs/run-schema.json. numpy only (no torch).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Mapping

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.scenario.sections import ClipSpec

if TYPE_CHECKING:
    from pytest_spikecheck.scenario.spec import Scenario

#: run.json's ``format_version`` this code writes. Format 1 (no version, no facts; the released
#: code's and the docs' data) is read and upgraded in memory (:func:`facts_from_format_1`).
FORMAT_VERSION = 2
#: Who wrote a run folder.
SOURCES = ("engine", "recorder", "hf", "lightning", "log")
#: Format 1's ``recorded.trainer`` (absent: ``loop``), and the source each is in format 2.
FORMAT_1_TRAINERS = {"hf": "hf", "lightning": "lightning", "loop": "recorder"}


@dataclass(frozen=True)
class ModelFacts:
    """The model's shape, as far as the writer knows it (None: unknown)."""

    arch: str | None = None  # gpt | llama | a class name of someone else's model
    n_layer: int | None = None
    n_head: int | None = None
    n_kv_head: int | None = None
    n_embd: int | None = None
    vocab_size: int | None = None
    norm: str | None = None  # layernorm | rmsnorm
    qk_layernorm: bool | None = None
    attn_gate: bool | None = None
    tied_head: bool | None = None
    parameters: int | None = None


@dataclass(frozen=True)
class OptimizerGroup:
    """One parameter group of the run's optimizer(s): which optimizer updates it and how."""

    name: str | None = None  # adamw | muon | sgd | adam | another optimizer's class name, lower case
    lr: float | None = None  # the group's lr at the first step (peak lr for the engine)
    betas: tuple[float, float] | None = None
    momentum: float | None = None
    weight_decay: float | None = None
    tensors: int | None = None  # how many tensors the group holds


@dataclass(frozen=True)
class QKClipFacts:
    """QK-Clip after each update (Kimi K2): ``tau`` None means it was off."""

    tau: float | None = None
    alpha: float | None = None
    per_head: bool | None = None


@dataclass(frozen=True)
class RunFacts:
    """How a run was trained. Fields a writer does not know are None."""

    source: str
    model: ModelFacts = field(default_factory=ModelFacts)
    optimizers: tuple[OptimizerGroup, ...] | None = None  # one per parameter group; None: unknown
    clip: ClipSpec | None = None  # None: unknown
    qk_clip: QKClipFacts | None = None  # None: unknown; QKClipFacts() (tau None): off
    amp_dtype: str | None = None  # float32 | bfloat16 | float16
    loss_scale: str | float | None = None  # "none" | "dynamic" | a static scale; None: unknown
    accumulation: int | None = None
    accumulate: str | None = None  # mean | sum (AccumulateSum: the micro-batch losses summed)
    batch_size: int | None = None  # samples per optimizer step (all micro-batches, all ranks)
    world_size: int | None = None
    seed: int | None = None
    #: The pre-clip grad-norm ratio to its running median at which the writer's online detector
    #: called a step a spike (the engine's ``record.spike_ratio``, the recorder's ``spike_ratio``):
    #: what the summary's recovery is measured from. None: unknown (a log), the reader's default.
    spike_ratio: float | None = None
    package_version: str | None = None
    torch_version: str | None = None
    python: str | None = None

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ConfigError(f"run facts source must be one of {', '.join(SOURCES)}, was {self.source!r}")

    @property
    def optimizer(self) -> str | None:
        """The run's optimizer in one word: ``muon`` when any group is Muon's (its AdamW part is
        Muon's companion), else the first group's name; None when unknown."""
        names = [g.name for g in self.optimizers or () if g.name is not None]
        return "muon" if "muon" in names else (names[0] if names else None)

    @property
    def max_norm(self) -> float | None:
        """The fixed clip limit (None: no clip, an adaptive one, or unknown)."""
        return None if self.clip is None or self.clip.kind == "adaptive" else self.clip.max_norm

    def to_json(self) -> dict[str, Any]:
        return _plain(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, raw: Any, *, where: str = "run.json facts") -> RunFacts:
        """The facts of a run.json; an unknown field is one line naming the known ones."""
        return _build(cls, raw, where)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


#: The nested types of RunFacts' fields (the rest are plain values).
_NESTED: dict[str, type] = {"model": ModelFacts, "clip": ClipSpec, "qk_clip": QKClipFacts}


def check_fields(cls: type, raw: Any, where: str, what: str = "") -> None:
    """``raw`` is a JSON object whose keys are fields of the dataclass ``cls``; else one line
    naming the first unknown field and the known ones (``what``: "event " in "unknown event field")."""
    if not isinstance(raw, Mapping):
        article = "an" if what[:1] in tuple("aeiou") else "a"
        raise ConfigError(
            f"{where}: {article} {what} must be a JSON object, was {type(raw).__name__}"
            if what
            else f"{where} must be a JSON object, was {type(raw).__name__}"
        )
    known = [f.name for f in fields(cls)]
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ConfigError(f"{where}: unknown {what + ' ' if what else ''}field {unknown[0]!r}; known: {', '.join(known)}")


def _build(cls: type, raw: Any, where: str) -> Any:
    check_fields(cls, raw, where)
    values: dict[str, Any] = {}
    for name, value in raw.items():
        if value is None:
            values[name] = None
        elif name in _NESTED and cls is RunFacts:
            values[name] = _build(_NESTED[name], value, f"{where}.{name}")
        elif name == "optimizers" and cls is RunFacts:
            if not isinstance(value, list):
                raise ConfigError(f"{where}.optimizers must be a list of parameter groups, was {value!r}")
            values[name] = tuple(_build(OptimizerGroup, g, f"{where}.optimizers[{i}]") for i, g in enumerate(value))
        elif name == "betas":
            values[name] = tuple(float(b) for b in value)
        else:
            values[name] = value
    try:
        return cls(**values)
    except TypeError as exc:  # a required field missing (RunFacts.source)
        raise ConfigError(f"{where}: {exc}") from None


# -- writers ------------------------------------------------------------------------------------


def facts_from_scenario(
    resolved: Scenario,
    *,
    parameters: int | None,
    vocab_size: int | None,
    world_size: int,
    groups: tuple[OptimizerGroup, ...] | None,
    versions: Mapping[str, str],
) -> RunFacts:
    """The facts of an engine run: everything from its resolved Scenario, the parameter groups
    the engine built (``groups``), and what only the built model knows (its size, vocabulary)."""
    m, o = resolved.model, resolved.optimizer
    custom = resolved.model_factory is not None
    model = (
        ModelFacts(arch=resolved.model_factory_path, parameters=parameters, vocab_size=vocab_size)
        if custom
        else ModelFacts(
            arch=m.arch,
            n_layer=m.n_layer,
            n_head=m.n_head,
            n_kv_head=m.n_kv_head or m.n_head,
            n_embd=m.n_embd,
            vocab_size=vocab_size,
            norm="rmsnorm" if m.arch == "llama" else "layernorm",
            qk_layernorm=m.qk_layernorm,
            attn_gate=m.attn_gate,
            tied_head=False,
            parameters=parameters,
        )
    )
    scale = resolved.amp.loss_scale
    return RunFacts(
        source="engine",
        model=model,
        optimizers=groups,
        clip=o.clip,
        qk_clip=QKClipFacts(o.qk_clip, o.qk_clip_alpha, o.qk_clip_per_head) if o.qk_clip is not None else QKClipFacts(),
        amp_dtype=resolved.amp.dtype,
        loss_scale="none" if scale is None else scale,
        accumulation=resolved.sampler.accumulation,
        accumulate=resolved.sampler.accumulate,
        batch_size=resolved.sampler.batch_size,
        world_size=world_size,
        seed=resolved.seed,
        spike_ratio=resolved.record.spike_ratio,
        **{k: versions.get(k) for k in ("package_version", "torch_version", "python")},
    )


def facts_from_format_1(meta: Mapping[str, Any], scenario: Scenario | None) -> RunFacts:
    """Format 1's facts, upgraded in memory: an engine run's from its config.yaml (``scenario``),
    a recorded run's from what its ``recorded`` block says; what format 1 never wrote is None."""
    versions = {k: meta.get(k) for k in ("package_version", "torch_version", "python")}
    recorded = meta.get("recorded")
    if not recorded:
        if scenario is None:
            return RunFacts(source="engine", **versions)
        return facts_from_scenario(
            scenario,
            parameters=meta.get("parameters"),
            vocab_size=meta.get("vocab_size"),
            world_size=_world_size(meta),
            groups=None,
            versions=versions,
        )
    trainer = str(recorded.get("trainer") or meta.get("trainer") or "loop")
    if trainer not in FORMAT_1_TRAINERS:  # never "recorder" by default
        raise ConfigError(f"run.json recorded.trainer must be one of {', '.join(FORMAT_1_TRAINERS)}, was {trainer!r}")
    clip = recorded.get("max_grad_norm")
    lr = recorded.get("lr")
    ratio = (meta.get("record") or {}).get("spike_ratio")
    return RunFacts(
        source=FORMAT_1_TRAINERS[trainer],
        model=ModelFacts(parameters=meta.get("parameters")),
        optimizers=(OptimizerGroup(lr=float(lr)),) if isinstance(lr, (int, float)) and math.isfinite(lr) else None,
        # a block that never said max_grad_norm says nothing of the clip: unknown, not "no clip"
        clip=ClipSpec(kind="global", max_norm=float(clip))
        if clip
        else (ClipSpec(kind="none", max_norm=None) if "max_grad_norm" in recorded else None),
        accumulation=recorded.get("accumulation"),
        batch_size=recorded.get("batch_size"),
        seed=recorded.get("seed"),
        spike_ratio=float(ratio) if isinstance(ratio, (int, float)) else None,
        **versions,
    )


def meta_from_format_1(meta: Mapping[str, Any], scenario: Scenario | None) -> dict[str, Any]:
    """run.json's own statements of what a run is, which format 1 left to the scenario: its
    ``name``, its ``description`` (the set-up in words, without the name) and its
    ``declared_events`` (the steps of its bursts), filled from ``scenario`` where ``meta`` lacks
    them (in memory: a format-1 engine folder, or a Run built in code from a scenario). Without
    a scenario nothing is filled: a recorded or hand-written run states its own or has none."""
    if scenario is None:
        return dict(meta)
    stated = {"name": scenario.name, "description": scenario.describe_setup(), "declared_events": list(scenario.burst_steps)}
    return {**{k: v for k, v in stated.items() if k not in meta}, **meta}


def _world_size(meta: Mapping[str, Any]) -> int | None:
    distributed = meta.get("distributed")
    if isinstance(distributed, Mapping) and isinstance(distributed.get("world_size"), int):
        return int(distributed["world_size"])
    return 1 if distributed in (None, "single process") else None
