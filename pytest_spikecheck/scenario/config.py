"""The YAML codec of scenarios: ``config.yaml`` to a :class:`~.spec.Scenario` and back.

Loading checks as it goes: an unknown key, a key given twice, a value of the wrong type is
one line naming the file and the field (the section specs in :mod:`.sections` do the range
checks). Values are coerced to their field's type (YAML reads ``1e-2`` as a string).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from pytest_spikecheck.errors import ConfigError, shown
from pytest_spikecheck.models.config import GPTConfig, model_preset
from pytest_spikecheck.scenario.break_base import break_from_config, break_to_config
from pytest_spikecheck.scenario.sections import CLIP_MODE_ALIAS, IMPORT_PATH, SCALARS, SECTIONS, BurstSpec, OptimizerSpec

if TYPE_CHECKING:
    from pytest_spikecheck.scenario.spec import Scenario


def scenario_from_dict(cls: type[Scenario], raw: Mapping[str, Any], *, where: str = "config") -> Scenario:
    """``cls`` built from the YAML shape (see ``experiments/*/config.yaml``); unknown keys raise."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a mapping at the top level, was {type(raw).__name__}")
    raw = dict(raw)
    base = cls.preset(raw.pop("preset")) if "preset" in raw else cls()
    unknown = sorted(set(raw) - CONFIG_KEYS, key=str)  # key=str: YAML reads a bare `on:` as the key True
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; expected one of {', '.join(sorted(CONFIG_KEYS | {'preset'}))}")
    return apply_config(base, raw, where=where)


#: The keys of a config.yaml besides ``preset``: the scalars, the sections and the breaks.
CONFIG_KEYS = frozenset(SECTIONS) | frozenset(SCALARS) | {"breaks"}


def apply_config(scenario: Scenario, raw: Mapping[str, Any], *, where: str = "config") -> Scenario:
    """``scenario`` with a partial config (the YAML shape, without ``preset``) applied: each
    scalar replaced, each key of a section replaced on the scenario's own section and coerced to
    its field's type (``model: {preset: mini}`` takes that shape first), ``model.factory`` and
    ``model.kwargs`` replaced (kwargs alone are merged onto the current ones), the breaks
    appended. The one way the YAML reaches a scenario: a config.yaml, a sweep's overrides and
    a sweep's dotted axes (:func:`dotted_config`) all come through here."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a mapping, was {type(raw).__name__}")
    raw = dict(raw)
    unknown = sorted(set(raw) - CONFIG_KEYS, key=str)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; expected one of {', '.join(sorted(CONFIG_KEYS))}")
    changes: dict[str, Any] = {k: raw[k] for k in SCALARS if k in raw}
    if isinstance(raw.get("model"), Mapping) and ("factory" in raw["model"] or "kwargs" in raw["model"]):
        model = dict(raw["model"])
        given = "factory" in model
        factory, kwargs = model.pop("factory", None), model.pop("kwargs", None) or {}
        if given and (not isinstance(factory, str) or not IMPORT_PATH.match(factory)):
            raise ConfigError(f"{where}: model.factory must be an import path 'package.module:function', was {shown(factory)}")
        if not given and scenario.model_factory is None:
            raise ConfigError(f"{where}: model.kwargs needs a model.factory (they are its keyword arguments)")
        if not isinstance(kwargs, Mapping):
            raise ConfigError(f"{where}: model.kwargs must be a mapping of keyword arguments, was {shown(kwargs)}")
        changes["model_factory"] = factory if given else scenario.model_factory
        changes["model_kwargs"] = dict(kwargs) if given else {**scenario.model_kwargs, **kwargs}
        raw["model"] = model
    for section, spec_type in SECTIONS.items():
        if section in raw:
            changes[section] = _section_from_dict(section, spec_type, getattr(scenario, section), raw[section], where)
    try:
        scenario = replace(scenario, **changes)
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


def dotted_config(path: str, value: Any, *, where: str = "config") -> dict[str, Any]:
    """A field's dotted YAML path and a value as the nested config mapping that
    :func:`apply_config` reads: ``dotted_config("optimizer.lr", 0.01)`` is
    ``{"optimizer": {"lr": 0.01}}``, ``"sampler.mixture.concentration"`` nests twice, ``"seed"``
    stays at the top. The path's first part must be a key of a config.yaml."""
    if not isinstance(path, str) or not path or any(not part for part in path.split(".")):
        raise ConfigError(f"{where}: a field path is a dotted YAML path such as optimizer.lr, was {path!r}")
    parts = path.split(".")
    if parts[0] not in CONFIG_KEYS:
        raise ConfigError(f"{where}: unknown field {path}; a path starts with one of {', '.join(sorted(CONFIG_KEYS))}")
    if parts[0] in SCALARS and len(parts) > 1:
        raise ConfigError(f"{where}: unknown field {path}: {parts[0]} has no fields")
    nested: Any = value
    for part in reversed(parts[1:]):
        nested = {part: nested}
    return {parts[0]: nested}


def scenario_from_yaml(cls: type[Scenario], path: str | Path) -> Scenario:
    """``cls`` loaded from a YAML file, or from an experiment directory holding ``config.yaml``."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"no such config file or experiment directory: {path}")
    raw = read_yaml(path)
    if raw is None or raw == {}:
        raise ConfigError(f"{path} is empty (or only comments): a config needs at least a preset, e.g. 'preset: phase-19'")
    scenario = cls.from_dict(raw, where=str(path))
    if "name" not in raw:
        scenario = replace(scenario, name=path.parent.name if path.name == "config.yaml" else path.stem)
    return scenario


def read_yaml(path: Path) -> Any:
    """The YAML document of ``path`` (a key given twice in one mapping is refused), or a
    one-line :class:`ConfigError` naming the file and line where it is not valid YAML."""
    import yaml

    try:
        text = Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason}); save the config as UTF-8") from None
    try:
        return yaml.load(text, Loader=_unique_key_loader())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}:{line} is not valid YAML ({getattr(exc, 'problem', None) or exc})") from None
    except ValueError as exc:  # an integer of more than 4300 digits (Python's limit on reading one)
        raise ConfigError(f"{path}: a value YAML cannot read ({shown(str(exc))})") from None


def scenario_to_dict(scenario: Scenario) -> dict[str, Any]:
    """The YAML shape of ``scenario`` (breaks listed by name, not folded in)."""
    out: dict[str, Any] = {"name": str.__str__(scenario.name), "seed": scenario.seed, "steps": scenario.steps}
    if scenario.stop_after is not None:  # only when set: every other scenario's content hash stays as it was
        out["stop_after"] = scenario.stop_after
    for section in SECTIONS:
        out[section] = _plain(dataclasses.asdict(getattr(scenario, section)))
    if scenario.model_factory is not None:
        out["model"]["factory"] = scenario.model_factory_path
        if scenario.model_kwargs:
            out["model"]["kwargs"] = _plain(dict(scenario.model_kwargs))
    if scenario.breaks:
        out["breaks"] = [break_to_config(b) for b in scenario.breaks]
    return out


def scenario_to_yaml(scenario: Scenario) -> str:
    import yaml

    return yaml.safe_dump(scenario_to_dict(scenario), sort_keys=False, allow_unicode=True)


def _unique_key_loader() -> type:
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        """A SafeLoader that refuses a key given twice in one mapping (YAML keeps the last one
        silently), and a document whose aliases would expand it beyond :data:`MAX_YAML_VALUES`
        values (a "billion laughs" of 1 KB reached 3 GB), counted before anything is built."""

        def construct_document(self, node: Any) -> Any:
            _check_expanded_size(node)
            return super().construct_document(node)

        def construct_mapping(scenario, node: Any, deep: bool = False) -> Any:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = scenario.construct_object(key_node, deep=deep)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r} (the second one would silently win)", key_node.start_mark
                    )
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


#: The most values (scalars, lists, mappings) a YAML document may expand to through its aliases.
MAX_YAML_VALUES = 100_000


def _check_expanded_size(root: Any) -> None:
    """Count the values the node graph expands to (an alias counts its node again each time it is
    used), memoised per node, so the count itself is linear in the file; refuse past the limit."""
    import yaml

    sizes: dict[int, int] = {}
    visiting: set[int] = set()
    # iterative post-order: a deep document cannot overflow the stack
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in sizes:
            continue
        if not done:
            if id(node) in visiting:
                raise yaml.YAMLError("an alias refers to a value that holds it (a recursive document)")
            visiting.add(id(node))
        children = (
            [c for pair in node.value for c in pair]
            if isinstance(node, yaml.MappingNode)
            else list(node.value)
            if isinstance(node, yaml.SequenceNode)
            else []
        )
        if done:
            visiting.discard(id(node))
            sizes[id(node)] = total = 1 + sum(sizes.get(id(c), 0) for c in children)
            if total > MAX_YAML_VALUES:
                raise yaml.YAMLError(
                    f"its aliases expand it to more than {MAX_YAML_VALUES:,} values (an alias bomb?): write the values out"
                )
            continue
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)


def _plain(value: Any) -> Any:
    """Tuples to lists and inf to the string 'inf' so YAML/JSON round-trip cleanly."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def _number(value: Any, label: str, expected: str) -> float:
    """A float from a YAML number, or from a string YAML did not read as one (PyYAML reads
    ``1e-2`` as a string: accepted); anything else (a bool included) is one line."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{label} must be {expected}, was {shown(value)}")
    return float(value)


def _coerce(section: str, name: str, current: Any, value: Any, where: str) -> Any:
    """Convert a YAML value to the type of the field's current value, with a clear error."""
    label = f"{where}: {section}.{name}"
    if name == "grad_clip":
        if value is None or (isinstance(value, str) and value.lower() in ("inf", "none", "null")):
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{label} must be a number, inf or null, was {shown(value)}")
        return float(value)
    if name == "loss_scale":
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        if value == "dynamic":
            return value
        try:
            if isinstance(value, bool):
                raise ValueError
            return float(value)  # a static scale (YAML reads 1e4 as a string)
        except (TypeError, ValueError):
            raise ConfigError(f"{label} must be 'dynamic', a number (a static scale) or null, was {shown(value)}") from None
    if name in ("skip_spike_ratio", "new_source", "qk_clip"):
        if value is None:
            return None
        if name == "new_source":
            if not isinstance(value, str):
                raise ConfigError(f"{label} must be a source name or null, was {shown(value)}")
            return value
        return _number(value, label, "a number or null")
    if dataclasses.is_dataclass(current):
        return _section_from_dict(f"{section}.{name}", type(current), current, value, where)
    if name == "bursts":
        if not isinstance(value, list):
            raise ConfigError(f"{label} must be a list of bursts, was {shown(value)}")
        return tuple(_section_from_dict(f"{section}.bursts", BurstSpec, None, b, where) for b in value)
    if isinstance(current, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{label} must be true or false, was {shown(value)}")
        return value
    if isinstance(current, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{label} must be an integer, was {shown(value)}")
        return value
    if isinstance(current, float):
        return _number(value, label, "a number")
    if name == "texts":
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{label} must be a list of strings, was {type(value).__name__}")
        return tuple(value)
    if name == "phase_lengths":
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{label} must be a list of integers, was {shown(value)}")
        return tuple(_coerce(section, name, 0, v, where) for v in value)
    if isinstance(current, tuple):
        if not isinstance(value, (list, tuple)) or len(value) != len(current):
            raise ConfigError(f"{label} must be a list of {len(current)} numbers, was {shown(value)}")
        return tuple(_coerce(section, name, c, v, where) for c, v in zip(current, value))
    if isinstance(current, str):
        if not isinstance(value, str):
            raise ConfigError(f"{label} must be a string, was {shown(value)}")
        return value
    return value


def _clip_mode_alias(raw: dict[str, Any], where: str) -> dict[str, str]:
    """``optimizer.clip_mode`` (the spelling before ClipSpec) as ``clip_kind`` and ``clip_when``."""
    mode = raw.pop("clip_mode")
    if "clip_kind" in raw or "clip_when" in raw:
        raise ConfigError(f"{where}: optimizer.clip_mode is the old spelling of clip_kind and clip_when: give one or the other")
    if mode not in CLIP_MODE_ALIAS:
        raise ConfigError(f"{where}: optimizer.clip_mode must be one of {', '.join(CLIP_MODE_ALIAS)}, was {mode!r}")
    kind, when = CLIP_MODE_ALIAS[mode]
    return {"clip_kind": kind, "clip_when": when}


def _section_from_dict(section: str, spec_type: type, base: Any, raw: Any, where: str) -> Any:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: {section} must be a mapping, was {shown(raw)}")
    raw = dict(raw)
    if spec_type is GPTConfig and "preset" in raw:
        base = model_preset(str(raw.pop("preset")))
    if spec_type is OptimizerSpec and "clip_mode" in raw:
        raw.update(_clip_mode_alias(raw, where))
    names = [f.name for f in fields(spec_type)]
    unknown = sorted(set(raw) - set(names), key=str)
    if unknown:
        raise ConfigError(f"{where}: unknown key {section}.{unknown[0]}; expected one of {', '.join(names)}")
    if base is None:  # a fresh item (a burst): required fields must be present
        required = [
            f.name for f in fields(spec_type) if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
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
