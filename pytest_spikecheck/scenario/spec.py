"""Scenarios: everything that decides a training run, as frozen, hashable data.

A :class:`Scenario` names a model shape, the data, the batch sampler, the optimizer and
clip, the LR schedule, what to record, the number of steps, the seed, and its *breaks*.
Breaks (see :mod:`pytest_spikecheck.scenario.breaks`) are data too: each one is folded into the
scenario as a config switch or a sampler change by :meth:`Scenario.resolved`, so the
training loop never forks. Two scenarios that resolve to the same config train the same
run, whatever their names, and share a :meth:`content_hash`.

No torch here: scenarios can be built, compared, hashed and written to YAML for free.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.models.config import PRESETS as MODEL_PRESETS, GPTConfig, model_preset


#: Rare content a RareTokenBurst can inject (built by pytest_spikecheck.data.corpus). ``written``
#: is Seed A's own rare family (corpus sentences held out until the burst); ``caps`` and
#: ``greek`` are fresh sentences the model has never seen: ALL-CAPS English and English
#: transliterated into Greek script; ``blank`` is an empty document (a blank line in a data
#: shard), which encodes to a row of padding only: harmless unless the model masks padding
#: keys (then a numeric break).
BURST_CONTENTS = ("written", "caps", "greek", "blank")
#: The three sources of Seed B's mixture corpus (pytest_spikecheck.data.sources builds them).
BASE_SOURCES = ("docs", "prose", "qa")
#: Sources that can enter the mixture late, never seen before (MixtureShift(new_source=...)).
NEW_SOURCES = ("foreign",)


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class _DerivedName(str):
    """A scenario name computed from its content (see :func:`derived_name`). Carried along by
    ``dataclasses.replace``, it marks the name as "recompute me": a derived scenario never keeps
    the name of the one it came from. A plain ``str`` is a name given by hand and always wins."""


#: The default of ``Scenario.name``: derive the name from the content.
AUTO_NAME = _DerivedName("")
#: Derived names longer than this are cut and end in a short content hash (still unique).
MAX_NAME_LENGTH = 64
#: Where the import path of a model factory must look like ``pkg.module:function``.
_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


@dataclass(frozen=True)
class BurstSpec:
    """Put ``count`` samples of rare ``content`` into the batch of step ``at_step``.

    ``content="written"`` holds Seed A's *written* sentences out of the rotation until the
    burst (first seen there) and lets them rejoin afterwards; ``caps``/``greek`` inject
    fresh sentences that appear at the burst only (a contaminated batch).
    """

    at_step: int
    count: int = 3
    content: str = "greek"

    def __post_init__(self) -> None:
        _check(_is_int(self.at_step) and self.at_step >= 1, f"burst at_step must be an integer >= 1, was {self.at_step!r}")
        _check(_is_int(self.count) and self.count >= 1, f"burst count must be an integer >= 1, was {self.count!r}")
        _check(self.content in BURST_CONTENTS,
               f"burst content must be one of {', '.join(BURST_CONTENTS)}, was {self.content!r}")


#: optimizer.clip_mode values.
CLIP_MODES = ("global", "per_tensor", "adaptive", "shard_local")

#: Corpora the engine can build: Seed A's sentences, or Seed B's three-source mixture.
CORPORA = ("phase19", "mixture", "texts")


@dataclass(frozen=True)
class DataSpec:
    corpus: str = "phase19"  # phase19 (data.corpus) | mixture (data.sources) | texts (your own, below)
    n_sentences: int = 240  # Seed A: 240 training sentences (mixture: split evenly over its sources)
    eval_sentences: int = 96  # fixed in-distribution eval set
    vocab_size: int = 384  # byte-level BPE; 312-448 split " written" into Ġwri + tt + en
    corpus_seed: int = 0  # the corpus is fixed; the training seed changes init and batch order
    padding_side: str = "right"  # right | left (left puts padding first: meets mask_padding as all-masked rows)
    texts: tuple[str, ...] = ()  # corpus "texts": your documents; the last eval_sentences are the eval set


@dataclass(frozen=True)
class MixtureSpec:
    """Seed B's bandit: source weights redrawn from Dirichlet(``concentration``) at phase
    boundaries whose lengths are drawn from ``phase_lengths`` (empty: fixed uniform weights).
    ``new_source`` is held out until the first boundary at or after ``new_source_at``, where
    the bandit tries it alone for one phase; it then joins the draws."""

    phase_lengths: tuple[int, ...] = ()
    concentration: float = 0.3
    new_source: str | None = None
    new_source_at: int = 0


@dataclass(frozen=True)
class SamplerSpec:
    kind: str = "shuffle"  # shuffle (epochs in random order) | stratified (caps rare samples per batch) | mixture
    batch_size: int = 8
    rare_cap: int = 1  # stratified: at most this many rare samples per batch
    rare_doc_freq: int = 5  # a token is rare if at most this many training samples contain it
    bursts: tuple[BurstSpec, ...] = ()
    mixture: MixtureSpec = MixtureSpec()


@dataclass(frozen=True)
class OptimizerSpec:
    name: str = "adamw"
    lr: float = 1e-2
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.1  # applied to matrices (embeddings included), not to biases and norms
    grad_clip: float | None = 1.0  # global-L2 max_norm; None (YAML null) or inf = no clipping
    clip_mode: str = "global"  # global | per_tensor | adaptive (ZClip-style: max_norm from an EMA z-score)
    # | shard_local (on several ranks, each clips its gradient shard to its own norm: a bug, see ShardLocalNorm)
    adaptive_z: float = 2.5  # adaptive: clip at EMA mean + z * EMA std of the pre-clip norm ...
    adaptive_alpha: float = 0.97  # ... with this EMA decay (ZClip's defaults); grad_clip until warm
    skip_spike_ratio: float | None = None  # skip the optimizer step when pre-clip norm / median >= this

    def __post_init__(self) -> None:
        clip = self.grad_clip
        _check(clip is None or _is_number(clip),
               f"optimizer.grad_clip must be a number, inf or None (no clipping), was {clip!r}")
        _check(clip is None or not math.isnan(clip), "optimizer.grad_clip must be a number, inf or None, was nan")
        _check(clip is None or clip > 0,
               f"optimizer.grad_clip must be > 0, was {clip!r} (0 would zero every update; to clip as hard as "
               f"possible use a tiny max_norm such as 1e-3, for no clipping use None or inf)")
        # One spelling of "no clipping" so equal runs hash equal: inf becomes None.
        if clip is not None and math.isinf(clip):
            object.__setattr__(self, "grad_clip", None)


@dataclass(frozen=True)
class ScheduleSpec:
    name: str = "cosine"  # cosine | constant
    warmup_steps: int = 20  # linear warmup from lr/warmup_steps to lr
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio at the last step


@dataclass(frozen=True)
class RecordSpec:
    eval_every: int = 20  # evaluate the fixed eval set every N steps ...
    dense_before: int = 10  # ... and at every step from burst-10 ...
    dense_after: int = 50  # ... to burst+50 (and for 50 steps after any detected spike)
    spike_ratio: float = 5.0  # online detector: pre-clip norm / median of the last 50 steps
    spike_window: int = 50
    top_tokens: int = 20  # per-token losses kept at event steps


_SECTIONS: dict[str, type] = {
    "model": GPTConfig,
    "data": DataSpec,
    "sampler": SamplerSpec,
    "optimizer": OptimizerSpec,
    "schedule": ScheduleSpec,
    "record": RecordSpec,
}

_SCALARS = ("name", "steps", "seed")

#: Section fields that may be None (YAML null) besides their type.
_NULLABLE = {("optimizer", "grad_clip"), ("optimizer", "skip_spike_ratio"), ("sampler.mixture", "new_source")}


def _check_types(section: str, spec: Any) -> None:
    """Every field of a section has its default's type: one line naming the field otherwise
    (a string where a number belongs would else fail later as a bare TypeError)."""
    defaults = type(spec)()
    for f in fields(spec):
        value, default = getattr(spec, f.name), getattr(defaults, f.name)
        label = f"{section}.{f.name}"
        if value is None and (section, f.name) in _NULLABLE:
            continue
        if dataclasses.is_dataclass(default):
            _check(isinstance(value, type(default)), f"{label} must be a {type(default).__name__}, was {value!r}")
            _check_types(label, value)
        elif isinstance(default, bool):
            _check(isinstance(value, bool), f"{label} must be True or False, was {value!r}")
        elif isinstance(default, int):
            _check(_is_int(value), f"{label} must be an integer, was {value!r}")
        elif isinstance(default, float) or (section, f.name) in _NULLABLE and default is None and f.name != "new_source":
            _check(_is_number(value), f"{label} must be a number, was {value!r}")
        elif isinstance(default, str) or f.name == "new_source":
            _check(isinstance(value, str), f"{label} must be a string, was {value!r}")
        elif isinstance(default, tuple):
            _check(isinstance(value, tuple), f"{label} must be a tuple, was {value!r}")


@dataclass(frozen=True)
class Scenario:
    """A declared training run. Build one with :meth:`preset`, :meth:`from_yaml` or the constructor."""

    #: Given by hand, or (the default) derived from the content: the preset, the changed fields
    #: and the breaks, e.g. ``phase-19+steps=120+no_clip+burst(3×greek@60)``; see :func:`derived_name`.
    name: str = AUTO_NAME
    model: GPTConfig = field(default_factory=lambda: model_preset("micro"))
    data: DataSpec = DataSpec()
    sampler: SamplerSpec = SamplerSpec()
    optimizer: OptimizerSpec = OptimizerSpec()
    schedule: ScheduleSpec = ScheduleSpec()
    record: RecordSpec = RecordSpec()
    steps: int = 500
    seed: int = 42
    breaks: tuple[Any, ...] = ()  # Break instances, applied by resolved()
    # Bring your own model: a callable, or its import path "pkg.module:function", called as
    # factory(vocab_size, **model_kwargs) -> nn.Module (the contract: README "Your own model",
    # checked by pytest_spikecheck.training.model_contract). None = the built-in GPT from ``model``.
    model_factory: Callable[..., Any] | str | None = None
    model_kwargs: Mapping[str, Any] = field(default_factory=dict)
    #: The preset this scenario starts from ("" for none): the base of its derived name.
    preset_name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        _check(isinstance(self.name, str), f"name must be a string, was {self.name!r}")
        _check(_is_int(self.steps) and self.steps >= 1, f"steps must be a positive integer, was {self.steps!r}")
        _check(_is_int(self.seed), f"seed must be an integer, was {self.seed!r}")
        for section, spec_type in _SECTIONS.items():
            _check(isinstance(getattr(self, section), spec_type),
                   f"{section} must be a {spec_type.__name__}, was {getattr(self, section)!r}")
            _check_types(section, getattr(self, section))
        _check(isinstance(self.breaks, tuple) and all(isinstance(b, Break) for b in self.breaks),
               f"breaks must be a tuple of Break instances (NoClip(), RareTokenBurst(...)), was {self.breaks!r}")
        f = self.model_factory
        _check(f is None or callable(f) or (isinstance(f, str) and bool(_IMPORT_PATH.match(f))),
               f"model_factory must be a callable or an import path 'package.module:function', was {f!r}")
        _check(isinstance(self.model_kwargs, Mapping) and all(isinstance(k, str) for k in self.model_kwargs),
               f"model_kwargs must be a mapping of keyword arguments, was {self.model_kwargs!r}")
        _check(f is not None or not self.model_kwargs, "model_kwargs needs a model_factory (they are its keyword arguments)")
        # Frozen and hashable: the keyword arguments as a sorted tuple of pairs behind a mapping view.
        object.__setattr__(self, "model_kwargs", _FrozenKwargs(self.model_kwargs))
        for b in self.breaks:
            at = getattr(b, "at_step", None)
            if at is not None:
                _check(at <= self.steps, f"{type(b).__name__} at step {at} is after the last step ({self.steps} steps): "
                                         f"move it to a step <= {self.steps} or train more steps")
        s, o, sch = self.sampler, self.optimizer, self.schedule
        _check(s.kind in ("shuffle", "stratified", "mixture"),
               f"sampler.kind must be shuffle, stratified or mixture, was {s.kind!r}")
        _check((s.kind == "mixture") == (self.data.corpus == "mixture"),
               f"sampler.kind mixture goes with data.corpus mixture (was {s.kind!r} with {self.data.corpus!r})")
        m = s.mixture
        _check(all(isinstance(n, int) and n >= 1 for n in m.phase_lengths),
               f"sampler.mixture.phase_lengths must be positive integers, was {m.phase_lengths!r}")
        _check(m.concentration > 0, f"sampler.mixture.concentration must be > 0, was {m.concentration}")
        _check(self.data.padding_side in ("right", "left"), f"data.padding_side must be right or left, was {self.data.padding_side!r}")
        _check(s.batch_size >= 1, f"sampler.batch_size must be >= 1, was {s.batch_size}")
        _check(s.rare_cap >= 0, f"sampler.rare_cap must be >= 0, was {s.rare_cap}")
        for b in s.bursts:
            _check(b.content != "written" or self.data.corpus == "phase19",
                   f"a 'written' burst needs the phase19 corpus (its rare sentences), not {self.data.corpus!r}")
            _check(b.count >= 1, f"burst count must be >= 1, was {b.count}")
            _check(b.count <= s.batch_size, f"burst count {b.count} exceeds the batch size {s.batch_size}")
            _check(1 <= b.at_step, f"burst at_step must be >= 1, was {b.at_step}")
            _check(b.at_step <= self.steps, f"a burst at step {b.at_step} is after the last step ({self.steps} steps): "
                                            f"move it to a step <= {self.steps} or train more steps")
        _check(o.name == "adamw", f"optimizer.name must be adamw (the only optimizer so far), was {o.name!r}")
        _check(o.lr > 0, f"optimizer.lr must be > 0, was {o.lr}")
        _check(all(0 <= b < 1 for b in o.betas) and len(o.betas) == 2, f"optimizer.betas must be two numbers in [0, 1), was {o.betas!r}")
        _check(o.eps >= 0, f"optimizer.eps must be >= 0, was {o.eps}")
        _check(o.weight_decay >= 0, f"optimizer.weight_decay must be >= 0, was {o.weight_decay}")
        _check(o.clip_mode in CLIP_MODES, f"optimizer.clip_mode must be one of {', '.join(CLIP_MODES)}, was {o.clip_mode!r}")
        _check(o.adaptive_z > 0 and 0 < o.adaptive_alpha < 1,
               f"optimizer.adaptive_z must be > 0 and adaptive_alpha in (0, 1), was {o.adaptive_z}, {o.adaptive_alpha}")
        _check(o.skip_spike_ratio is None or o.skip_spike_ratio > 1,
               f"optimizer.skip_spike_ratio must be > 1 or null, was {o.skip_spike_ratio!r}")
        _check(sch.name in ("cosine", "constant"), f"schedule.name must be cosine or constant, was {sch.name!r}")
        _check(sch.warmup_steps >= 0, f"schedule.warmup_steps must be >= 0, was {sch.warmup_steps}")
        _check(0 <= sch.min_lr_ratio <= 1, f"schedule.min_lr_ratio must be in [0, 1], was {sch.min_lr_ratio}")
        _check(self.data.corpus in CORPORA, f"data.corpus must be one of {', '.join(CORPORA)}, was {self.data.corpus!r}")
        if self.data.corpus == "texts":
            n_train = len(self.data.texts) - self.data.eval_sentences
            _check(n_train >= s.batch_size and self.data.eval_sentences >= 1,
                   f"data.texts needs more than eval_sentences + batch_size texts ({self.data.eval_sentences} + "
                   f"{s.batch_size}), had {len(self.data.texts)}")
            _check(all(isinstance(t, str) for t in self.data.texts), "data.texts must be strings")
        if isinstance(self.name, _DerivedName):
            object.__setattr__(self, "name", _DerivedName(derived_name(self)))

    # -- construction -------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str) -> "Scenario":
        """A named starting point. ``phase-19``: Seed A's model, data, AdamW and clip 1.0,
        plain shuffled batching, no breaks (add them with :meth:`with_breaks`)."""
        return replace(_preset_base(name), name=AUTO_NAME, preset_name=name)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], *, where: str = "config") -> "Scenario":
        """Build from the YAML shape (see ``experiments/*/config.yaml``); unknown keys raise."""
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{where}: expected a mapping at the top level, was {type(raw).__name__}")
        raw = dict(raw)
        base = cls.preset(raw.pop("preset")) if "preset" in raw else cls()
        known = set(_SECTIONS) | set(_SCALARS) | {"breaks"}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ConfigError(f"{where}: unknown key {unknown[0]!r}; expected one of {', '.join(sorted(known | {'preset'}))}")
        changes: dict[str, Any] = {k: raw[k] for k in _SCALARS if k in raw}
        if isinstance(raw.get("model"), Mapping) and ("factory" in raw["model"] or "kwargs" in raw["model"]):
            model = dict(raw["model"])
            factory, kwargs = model.pop("factory", None), model.pop("kwargs", None) or {}
            if not isinstance(factory, str) or not _IMPORT_PATH.match(factory):
                raise ConfigError(f"{where}: model.factory must be an import path 'package.module:function', was {factory!r}")
            if not isinstance(kwargs, Mapping):
                raise ConfigError(f"{where}: model.kwargs must be a mapping of keyword arguments, was {kwargs!r}")
            changes["model_factory"], changes["model_kwargs"] = factory, dict(kwargs)
            raw["model"] = model
        for section, spec_type in _SECTIONS.items():
            if section in raw:
                changes[section] = _section_from_dict(section, spec_type, getattr(base, section), raw[section], where)
        try:
            scenario = replace(base, **changes)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: {exc}") from None
        breaks = raw.get("breaks") or []
        if not isinstance(breaks, list):
            raise ConfigError(f"{where}: breaks must be a list, was {type(breaks).__name__}")
        declared = [break_from_config(b, where=where) for b in breaks]
        try:
            return scenario.with_breaks(*declared)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None

    @classmethod
    def from_yaml(cls, path: str | Path) -> "Scenario":
        """Load a scenario from a YAML file, or from an experiment directory holding ``config.yaml``."""
        import yaml

        path = Path(path)
        if path.is_dir():
            path = path / "config.yaml"
        if not path.is_file():
            raise ConfigError(f"no such config file or experiment directory: {path}")
        try:
            raw = yaml.load(path.read_text(), Loader=_unique_key_loader())
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = f" line {mark.line + 1}" if mark else ""
            raise ConfigError(f"{path}:{line} is not valid YAML ({getattr(exc, 'problem', exc)})") from None
        if raw is None or raw == {}:
            raise ConfigError(f"{path} is empty (or only comments): a config needs at least a preset, "
                              f"e.g. 'preset: phase-19'")
        scenario = cls.from_dict(raw, where=str(path))
        if "name" not in raw:
            scenario = replace(scenario, name=path.parent.name if path.name == "config.yaml" else path.stem)
        return scenario

    # -- derivation -----------------------------------------------------------------------
    def with_breaks(self, *breaks: Any) -> "Scenario":
        """A copy with ``breaks`` appended (they apply in order when the scenario is resolved)."""
        for b in breaks:
            if not isinstance(b, Break):
                raise ConfigError(f"with_breaks expects Break instances (NoClip(), RareTokenBurst(...)), was {b!r}")
        return replace(self, breaks=self.breaks + tuple(breaks))

    def replace(self, **changes: Any) -> "Scenario":
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
            if section not in _SECTIONS:
                raise ConfigError(f"unknown section {section!r}; expected one of {', '.join(_SECTIONS)}")
            known = [f.name for f in fields(_SECTIONS[section])]
            unknown = sorted(set(attrs) - set(known))
            if unknown:
                raise ConfigError(f"unknown field {section}.{unknown[0]}; expected one of {', '.join(known)}")
            top[section] = replace(top.get(section, getattr(self, section)), **attrs)
        unknown = sorted(set(top) - {f.name for f in fields(Scenario)})
        if unknown:
            raise ConfigError(f"unknown scenario field {unknown[0]!r}; expected one of "
                              f"{', '.join(f.name for f in fields(Scenario))} or section__field")
        return replace(self, **top)

    def resolved(self) -> "Scenario":
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
        out: dict[str, Any] = {"name": str.__str__(self.name), "seed": self.seed, "steps": self.steps}
        for section in _SECTIONS:
            out[section] = _plain(dataclasses.asdict(getattr(self, section)))
        if self.model_factory is not None:
            out["model"]["factory"] = self.model_factory_path
            if self.model_kwargs:
                out["model"]["kwargs"] = _plain(dict(self.model_kwargs))
        if self.breaks:
            out["breaks"] = [break_to_config(b) for b in self.breaks]
        return out

    def to_yaml(self) -> str:
        import yaml

        return yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True)

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
        r = self.resolved()
        clip = "no clip" if r.max_norm == math.inf else f"clip {r.max_norm:g} ({r.optimizer.clip_mode})"
        bursts = ", ".join(f"{b.count}×{b.content}@{b.at_step}" for b in r.sampler.bursts) or "no bursts"
        return f"{self.name}: {r.steps} steps, seed {r.seed}, {clip}, {r.sampler.kind} batches, {bursts}"


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


def _unique_key_loader() -> type:
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        """A SafeLoader that refuses a key given twice in one mapping (YAML keeps the last one silently)."""

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r} (the second one would silently win)", key_node.start_mark)
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


def _preset_base(name: str) -> "Scenario":
    """The preset's scenario as its factory builds it (cached: derived names compare against it)."""
    if name not in _PRESET_BASES:
        try:
            factory = _PRESETS[name]
        except KeyError:
            raise ConfigError(f"unknown scenario preset {name!r}; choose one of {', '.join(sorted(_PRESETS))}") from None
        _PRESET_BASES[name] = replace(factory(), name=name, preset_name=name)
    return _PRESET_BASES[name]


_PRESET_BASES: dict[str, "Scenario"] = {}


def _fmt_value(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return "inf" if value == math.inf else repr(value)
    if isinstance(value, tuple):
        return "(" + ",".join(_fmt_value(v) for v in value) + ")"
    if isinstance(value, BurstSpec):
        return f"{value.count}×{value.content}@{value.at_step}"
    return str(value)


def _field_names_in(spec_type: type) -> set[str]:
    return {f.name for f in fields(spec_type)}


def derived_name(scenario: "Scenario") -> str:
    """A readable name unique to the scenario's content: the preset it starts from, every field
    that differs from that preset, and its breaks, joined with ``+`` — for example
    ``phase-19+steps=120+no_clip+burst(3×greek@60)``. Names longer than :data:`MAX_NAME_LENGTH`
    are cut in the middle (``…``) and end in ``~`` and 8 characters of the content hash, so two different contents
    never share a derived name."""
    base = _preset_base(scenario.preset_name) if scenario.preset_name else _DEFAULT_BASE()
    parts = [scenario.preset_name or "scenario"]
    for key in ("steps", "seed"):
        if getattr(scenario, key) != getattr(base, key):
            parts.append(f"{key}={getattr(scenario, key)}")
    if scenario.model_factory is not None:
        kwargs = ",".join(f"{k}={_fmt_value(v)}" for k, v in scenario.model_kwargs.items())
        parts.append(f"model={scenario.model_factory_path}" + (f"({kwargs})" if kwargs else ""))
    preset = None
    if scenario.model != base.model:
        preset = next((n for n, c in MODEL_PRESETS.items() if c == scenario.model), None)
        if preset is not None:
            parts.append(f"model={preset}")
    ambiguous = {n for a in _SECTIONS.values() for b in _SECTIONS.values() if a is not b
                 for n in _field_names_in(a) & _field_names_in(b)}
    for section in _SECTIONS:
        mine, theirs = getattr(scenario, section), getattr(base, section)
        if mine == theirs or (section == "model" and preset is not None):
            continue
        for f in fields(mine):
            value = getattr(mine, f.name)
            if value != getattr(theirs, f.name):
                label = f"{section}.{f.name}" if f.name in ambiguous else f.name
                parts.append(f"{label}={_fmt_value(value)}")
    parts += [b.label() for b in scenario.breaks]
    name = "+".join(parts)
    if len(name) > MAX_NAME_LENGTH:  # keep both ends readable (the preset, the last breaks)
        keep = (MAX_NAME_LENGTH - 10) // 2
        name = f"{name[:keep]}…{name[-keep:]}~{scenario.content_hash()[:8]}"
    return name


def _DEFAULT_BASE() -> "Scenario":
    if "" not in _PRESET_BASES:
        _PRESET_BASES[""] = Scenario(name="scenario")
    return _PRESET_BASES[""]


def _plain(value: Any) -> Any:
    """Tuples to lists and inf to the string 'inf' so YAML/JSON round-trip cleanly."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def _coerce(section: str, name: str, current: Any, value: Any, where: str) -> Any:
    """Convert a YAML value to the type of the field's current value, with a clear error."""
    label = f"{where}: {section}.{name}"
    if name == "grad_clip":
        if value is None or (isinstance(value, str) and value.lower() in ("inf", "none", "null")):
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{label} must be a number, inf or null, was {value!r}")
        return float(value)
    if name in ("skip_spike_ratio", "new_source"):
        if value is None:
            return None
        if name == "new_source":
            if not isinstance(value, str):
                raise ConfigError(f"{label} must be a source name or null, was {value!r}")
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{label} must be a number or null, was {value!r}")
        return float(value)
    if dataclasses.is_dataclass(current):
        return _section_from_dict(f"{section}.{name}", type(current), current, value, where)
    if name == "bursts":
        if not isinstance(value, list):
            raise ConfigError(f"{label} must be a list of bursts, was {value!r}")
        return tuple(_section_from_dict(f"{section}.bursts", BurstSpec, None, b, where) for b in value)
    if isinstance(current, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{label} must be true or false, was {value!r}")
        return value
    if isinstance(current, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{label} must be an integer, was {value!r}")
        return value
    if isinstance(current, float):
        if isinstance(value, str):
            try:
                return float(value)  # YAML reads 1e-2 as a string; accept it
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{label} must be a number, was {value!r}")
        return float(value)
    if name == "texts":
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{label} must be a list of strings, was {type(value).__name__}")
        return tuple(value)
    if name == "phase_lengths":
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{label} must be a list of integers, was {value!r}")
        return tuple(_coerce(section, name, 0, v, where) for v in value)
    if isinstance(current, tuple):
        if not isinstance(value, (list, tuple)) or len(value) != len(current):
            raise ConfigError(f"{label} must be a list of {len(current)} numbers, was {value!r}")
        return tuple(_coerce(section, name, c, v, where) for c, v in zip(current, value))
    if isinstance(current, str):
        if not isinstance(value, str):
            raise ConfigError(f"{label} must be a string, was {value!r}")
        return value
    return value


def _section_from_dict(section: str, spec_type: type, base: Any, raw: Any, where: str) -> Any:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: {section} must be a mapping, was {raw!r}")
    raw = dict(raw)
    if spec_type is GPTConfig and "preset" in raw:
        base = model_preset(str(raw.pop("preset")))
    names = [f.name for f in fields(spec_type)]
    unknown = sorted(set(raw) - set(names))
    if unknown:
        raise ConfigError(f"{where}: unknown key {section}.{unknown[0]}; expected one of {', '.join(names)}")
    if base is None:  # a fresh item (a burst): required fields must be present
        required = [f.name for f in fields(spec_type)
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        missing = [n for n in required if n not in raw]
        if missing:
            raise ConfigError(f"{where}: {section} needs {missing[0]}")
        defaults = {f.name: f.default for f in fields(spec_type) if f.default is not dataclasses.MISSING}
        values = {n: _coerce(section, n, defaults.get(n, 0), v, where) for n, v in raw.items()}
        try:
            return spec_type(**values)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: {section}: {exc}") from None
    values = {n: _coerce(section, n, getattr(base, n), v, where) for n, v in raw.items()}
    try:
        return replace(base, **values)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None


# -- breaks and presets: the base class and the registries ---------------------------------
# The concrete breaks (scenario/breaks.py) and presets (scenario/presets.py) register
# themselves here when the package is imported, so this module never imports them.

_REGISTRY: dict[str, type["Break"]] = {}


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
                _check(isinstance(value, bool), f"{label} must be True or False, was {value!r}")
            elif isinstance(default, int):
                _check(_is_int(value), f"{label} must be an integer, was {value!r}")
            elif isinstance(default, float):
                _check(_is_number(value) and not math.isnan(value), f"{label} must be a number, was {value!r}")
            elif isinstance(default, str) or default is None:
                _check(isinstance(value, str), f"{label} must be a string, was {value!r}")
            elif isinstance(default, tuple):
                _check(isinstance(value, tuple), f"{label} must be a tuple, was {value!r}")
        self.validate()

    def validate(self) -> None:
        """Range checks of the parameters (raise ConfigError); types are checked already."""

    def apply(self, scenario: "Scenario") -> "Scenario":  # pragma: no cover - abstract
        raise NotImplementedError

    def label(self) -> str:
        """Short, unique text for derived scenario names: the YAML name and the parameters that
        differ from their defaults, e.g. ``skip_spikes(ratio=3.0)``."""
        changed = [f"{f.name}={_fmt_value(getattr(self, f.name))}" for f in fields(self)
                   if f.default is dataclasses.MISSING or getattr(self, f.name) != f.default]
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
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ConfigError(f"{where}: unknown parameter {unknown[0]!r} for break {name!r}; expected {', '.join(allowed) or 'none'}")
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in params.items()}
    try:
        return cls(**values)
    except (TypeError, ConfigError) as exc:
        raise ConfigError(f"{where}: break {name!r}: {exc}") from None


def break_to_config(b: Break) -> Any:
    params = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(b).items()}
    return {b.config_name: params} if params else b.config_name


#: preset name -> a function building it (filled by :func:`register_preset`).
_PRESETS: dict[str, Callable[[], Scenario]] = {}


def register_preset(name: str) -> Callable[[Callable[[], Scenario]], Callable[[], Scenario]]:
    """Decorator: make ``Scenario.preset(name)`` build a scenario with the decorated function."""
    def register(factory: Callable[[], Scenario]) -> Callable[[], Scenario]:
        _PRESETS[name] = factory
        return factory
    return register


def scenario_preset_names() -> list[str]:
    return sorted(_PRESETS)
