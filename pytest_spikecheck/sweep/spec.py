"""What a sweep trains: a base scenario, axes (any scenario field by its dotted YAML path) and
recipes (named sets of breaks), expanded into points, each a scenario named after its content.

Everything here is checked before anything trains: an unknown field, an empty axis, a value of
the wrong type, a recipe naming an unknown break, an axis a recipe's break would override, and
two points that are the same scenario are each one line (:class:`ConfigError`) naming the file
and the field. Values reach the scenario through the YAML codec (``scenario.config``): the same
coercion and checks as a config.yaml. No torch here.
"""

from __future__ import annotations

import copy
import itertools
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.scenario import Break, Scenario, break_from_config
from pytest_spikecheck.scenario.config import CONFIG_KEYS, apply_config, dotted_config, read_yaml
from pytest_spikecheck.scenario.naming import AUTO_NAME, MAX_NAME_LENGTH, fmt_value

#: The keys of a sweep file besides the config overrides of its base (steps, seed, optimizer, ...).
SWEEP_KEYS = ("base", "grid", "points", "recipes", "name")
#: The table's name for the recipe column.
RECIPE = "recipe"
#: The most points one sweep may have (each is a scenario to train; docs/limits.md).
MAX_POINTS = 10_000


@dataclass(frozen=True)
class Point:
    """One scenario of a sweep: its place in the sweep, its recipe (None without recipes), the
    axis values that made it (dotted path -> value as the scenario holds it) and the scenario."""

    index: int
    recipe: str | None
    values: tuple[tuple[str, Any], ...]
    scenario: Scenario

    @property
    def name(self) -> str:
        return self.scenario.name

    def value(self, path: str) -> Any:
        """The point's value on an axis (``recipe`` included); None where it sets none."""
        if path == RECIPE:
            return self.recipe
        return dict(self.values).get(path)

    @property
    def cost(self) -> float:
        """A rough relative cost, to start the dearest points first: steps x tokens per step
        (batch size x block size) x layers x width². Width and depth are the model's as it is
        trained: the preset's, or for a model factory the ones its keyword arguments give
        (:func:`factory_size`), so that a sweep over factory widths is ordered by them."""
        resolved = self.scenario.resolved()
        model = resolved.model
        width, layers = model.n_embd, model.n_layer
        if resolved.model_factory is not None:
            width, layers = factory_size(resolved.model_kwargs, width, layers)
        tokens = resolved.sampler.batch_size * model.block_size
        return float(resolved.steps) * tokens * layers * width**2


def factory_size(kwargs: Mapping[str, Any], width: int, layers: int) -> tuple[int, int]:
    """(width, layers) of a model factory's model as its keyword arguments name them: a Hugging
    Face ``config`` mapping's ``hidden_size`` / ``num_hidden_layers`` (the preflight's proxies),
    or ``n_embd`` / ``n_layer`` (our presets' names); ``width`` and ``layers`` where they name
    neither."""
    config = kwargs.get("config")
    for source, w, n in (
        (config if isinstance(config, Mapping) else {}, "hidden_size", "num_hidden_layers"),
        (kwargs, "n_embd", "n_layer"),
    ):
        if isinstance(source.get(w), int):
            width = source[w]
        if isinstance(source.get(n), int):
            layers = source[n]
    return width, layers


@dataclass
class Sweep:
    """A base scenario and what varies: ``grid`` (dotted path -> values, crossed), ``points``
    (an explicit list of {dotted path: value}, crossed with the grid) and ``recipes`` (name ->
    breaks added to the base's, as :class:`Break` instances or their YAML forms). Every point is
    the base with its values applied through the YAML codec, then its recipe's breaks, named
    after its content (a derived name). ``where`` labels error messages (the sweep file)."""

    base: Scenario
    grid: Mapping[str, Sequence[Any]] = field(default_factory=dict)
    recipes: Mapping[str, Sequence[Any]] | None = None
    points: Sequence[Mapping[str, Any]] = ()
    name: str = ""
    where: str = "sweep"
    #: the points, once expanded (expand() builds them once: each point is a checked scenario)
    _expanded: list[Point] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        w = self.where
        if not isinstance(self.base, Scenario):
            raise ConfigError(f"{w}: the base must be a Scenario, was {type(self.base).__name__}")
        if not isinstance(self.grid, Mapping):
            raise ConfigError(f"{w}: grid must be a mapping of field paths to lists of values, was {self.grid!r}")
        for path, values in self.grid.items():
            _check_path(path, f"{w}: grid")
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
                raise ConfigError(f"{w}: grid {path} must be a list of values, was {values!r}")
            if len(values) == 0:
                raise ConfigError(f"{w}: grid {path} is empty: give it at least one value")
        if isinstance(self.points, (str, bytes, Mapping)) or not isinstance(self.points, Sequence):
            raise ConfigError(f"{w}: points must be a list of mappings {{field path: value}}, was {self.points!r}")
        for i, point in enumerate(self.points):
            if not isinstance(point, Mapping) or not point:
                raise ConfigError(f"{w}: points[{i}] must be a non-empty mapping {{field path: value}}, was {point!r}")
            for path in point:
                _check_path(path, f"{w}: points[{i}]")
                if path in self.grid:
                    raise ConfigError(f"{w}: {path} is both a grid axis and set by points[{i}]: give it in one place")
        if self.recipes is not None:
            if not isinstance(self.recipes, Mapping) or not self.recipes:
                raise ConfigError(f"{w}: recipes must be a non-empty mapping of names to lists of breaks, was {self.recipes!r}")
            recipes = {}
            for name, breaks in self.recipes.items():
                if not isinstance(name, str) or not name:
                    raise ConfigError(f"{w}: a recipe's name must be a non-empty string, was {name!r}")
                if isinstance(breaks, (str, bytes, Mapping)) or not isinstance(breaks, Sequence):
                    raise ConfigError(f"{w}: recipes.{name} must be a list of breaks ([] for none), was {breaks!r}")
                recipes[name] = tuple(
                    b if isinstance(b, Break) else break_from_config(b, where=f"{w}: recipes.{name}") for b in breaks
                )
            self.recipes = recipes
        size = (
            (len(self.recipes) if self.recipes is not None else 1)
            * max(len(self.points), 1)
            * math.prod(len(values) for values in self.grid.values())
        )
        if size > MAX_POINTS:
            raise ConfigError(
                f"{w}: {size:,} points (recipes x points x grid), more than the {MAX_POINTS:,} a sweep may "
                f"have (docs/limits.md): split it into several sweeps"
            )

    @property
    def axes(self) -> tuple[str, ...]:
        """The columns that tell points apart: ``recipe`` (with recipes), the points' fields, the grid's."""
        from_points = list(dict.fromkeys(path for point in self.points for path in point))
        return ((RECIPE,) if self.recipes is not None else ()) + tuple(from_points) + tuple(self.grid)

    def expand(self) -> list[Point]:
        """Every point, in order: recipes outermost, then the explicit points, then the grid
        (crossed in the order its axes are given). Checked as a whole (see the module docstring),
        once: a second call returns the same points."""
        if self._expanded is None:
            self._expanded = self._expand()
        return list(self._expanded)

    def _expand(self) -> list[Point]:
        w = self.where
        base = replace(self.base, name=AUTO_NAME)  # each point is named after its own content
        explicit = list(self.points) or [{}]
        combos = [dict(zip(self.grid, values)) for values in itertools.product(*self.grid.values())]
        recipes: Iterable[tuple[str | None, tuple[Break, ...]]] = (
            self.recipes.items() if self.recipes is not None else [(None, ())]
        )
        out: list[Point] = []
        seen: dict[str, Point] = {}
        for recipe, breaks in recipes:
            for given in explicit:
                for combo in combos:
                    values = {**given, **combo}
                    label = f"{w}: " + ("" if recipe is None else f"recipe {recipe}, ") + _label(values)
                    changes: dict[str, Any] = {}
                    for path, value in values.items():
                        _merge(changes, dotted_config(path, value, where=label), label)
                    # one application: model.preset then takes its shape before the other model fields
                    scenario = apply_config(base, changes, where=label) if changes else base
                    try:
                        scenario = scenario.with_breaks(*breaks)
                    except ConfigError as exc:
                        raise ConfigError(f"{label}: {exc}") from None
                    _check_not_overridden(scenario, values, recipe, label)
                    held = tuple((p, _plain(_read(scenario, p, v), v)) for p, v in values.items())
                    scenario = _named_by_every_axis(scenario, held)
                    point = Point(len(out), recipe, held, scenario)
                    digest = scenario.content_hash()
                    if digest in seen:
                        raise ConfigError(
                            f"{w}: two points are the same scenario ({_describe(seen[digest])} and "
                            f"{_describe(point)}, content hash {digest}): drop one"
                        )
                    seen[digest] = point
                    out.append(point)
        return out


def _named_by_every_axis(scenario: Scenario, values: tuple[tuple[str, Any], ...]) -> Scenario:
    """The point's scenario named by every axis value it has: a derived name lists only what
    differs from its preset, so the point at the preset's own lr was ``phase-19+steps=100`` beside
    ``phase-19+steps=100+lr=0.1``. An axis the name leaves out is added as ``+field=value``
    (the content hash, which keys the run store, does not read the name)."""
    name = str(scenario.name)
    if "…" in name:  # already cut to its ends and its content hash: unique, and an axis may be in the cut
        return scenario
    missing = [
        f"{_labels(path)[-1]}={fmt_value(value)}"
        for path, value in values
        if not any(part.split("=", 1)[0] in _labels(path) for part in name.split("+")[1:])
    ]
    if not missing:
        return scenario
    name = "+".join([name, *missing])
    if len(name) > MAX_NAME_LENGTH:  # as a derived name is cut: both ends kept, the content hash at the end
        keep = (MAX_NAME_LENGTH - 10) // 2
        name = f"{name[:keep]}…{name[-keep:]}~{scenario.content_hash()[:8]}"
    return replace(scenario, name=name)


def _labels(path: str) -> tuple[str, ...]:
    """How a derived name may label an axis: the field (``lr``), section and field where the
    field name is ambiguous (``optimizer.lr``), and ``model`` for a model preset."""
    return (path, path.rsplit(".", 1)[-1], *(("model",) if path == "model.preset" else ()))


def _merge(into: dict[str, Any], more: Mapping[str, Any], where: str, prefix: str = "") -> None:
    for key, value in more.items():
        if key in into and isinstance(into[key], dict) and isinstance(value, Mapping):
            _merge(into[key], value, where, f"{prefix}{key}.")
        elif key in into:
            raise ConfigError(f"{where}: {prefix}{key} is given twice (by two axes)")
        else:
            into[key] = copy.deepcopy(dict(value)) if isinstance(value, Mapping) else value


def _check_path(path: Any, where: str) -> None:
    if not isinstance(path, str):
        raise ConfigError(f"{where}: a field path is a dotted YAML path such as optimizer.lr, was {path!r}")
    head = path.split(".")[0]
    if head == "breaks":
        raise ConfigError(f"{where}: breaks are not an axis: sweep them as recipes (recipes: {{name: [break, ...]}})")
    if head == "name":
        raise ConfigError(f"{where}: name is not an axis: every point is named after its content")
    dotted_config(path, None, where=where)  # an unknown top-level key is one line here


def _read(scenario: Scenario, path: str, given: Any) -> Any:
    """The value ``path`` holds in ``scenario`` (coerced as the codec coerced it), or ``given``
    where the path is no field (``model.preset``: a shape, not a field)."""
    parts = path.split(".")
    if parts[0] == "model" and parts[1:2] == ["factory"]:
        return scenario.model_factory_path
    if parts[0] == "model" and parts[1:2] == ["kwargs"]:
        value: Any = dict(scenario.model_kwargs)
        for part in parts[2:]:
            value = value.get(part) if isinstance(value, Mapping) else None
        return value
    value = scenario
    for part in parts:
        if not hasattr(value, part):
            return given
        value = getattr(value, part)
    return value


def _plain(value: Any, given: Any) -> Any:
    """An axis value as a row holds it: the scenario's (coerced) value when it is a number, a
    string, a bool, None or a list of those, else ``given`` (a burst list as the YAML wrote it):
    sweep.json and the panels take only such values."""
    scalar = (str, int, float, bool, type(None))
    if isinstance(value, scalar) or (isinstance(value, (tuple, list)) and all(isinstance(v, scalar) for v in value)):
        return list(value) if isinstance(value, tuple) else value
    return given


def axis_value(scenario: Scenario, path: str) -> Any:
    """The value a point's scenario holds on an axis it does not set (the base's), as rows hold them."""
    return _plain(_read(scenario, path, None), None)


def _check_not_overridden(scenario: Scenario, values: Mapping[str, Any], recipe: str | None, label: str) -> None:
    """A break applies after the axes (when the scenario resolves): refuse an axis value that
    one of the point's breaks would silently replace (a grid over optimizer.lr with a high_lr break)."""
    resolved = scenario.resolved()
    for path, given in values.items():
        declared, trained = _read(scenario, path, given), _read(resolved, path, given)
        if declared != trained and not (_is_nan(declared) and _is_nan(trained)):
            by = f"recipe {recipe}'s breaks" if recipe is not None else "the base's breaks"
            raise ConfigError(
                f"{label}: {path}={declared!r} is overridden by {by} (the run would train "
                f"{path}={trained!r}): sweep the break's parameter instead, or drop the break"
            )


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _label(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{p}={v!r}" for p, v in values.items()) or "the base"


def _describe(point: Point) -> str:
    parts = ([f"recipe {point.recipe}"] if point.recipe is not None else []) + [f"{p}={v!r}" for p, v in point.values]
    return ", ".join(parts) or "the base"


def load_sweep(path: str | Path) -> Sweep:
    """A :class:`Sweep` from a sweep file (README, "Sweeps")::

        base: experiments/19-control        # a config path, or an inline scenario mapping
        steps: 150                          # optional overrides of the base, as in a config.yaml
        grid:
          optimizer.lr: [0.01, 0.03, 0.1, 0.3]
          seed: [0, 1, 2]
        points:                             # optional explicit points, crossed with the grid
          - {model.n_embd: 32, model.n_head: 2}
        recipes:                            # optional; each recipe's breaks are added to the base's
          baseline: []
          qk-layernorm: [qk_layernorm]

    A relative ``base`` path is looked up beside the sweep file first, then from the current
    directory. The whole sweep is expanded (and so checked) before this returns."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no such sweep file: {path}")
    raw = read_yaml(path)
    where = str(path)
    if not isinstance(raw, Mapping) or not raw:
        raise ConfigError(f"{where}: a sweep file is a mapping with at least a base and a grid, points or recipes")
    known = set(SWEEP_KEYS) | set(CONFIG_KEYS)
    unknown = sorted(set(raw) - known, key=str)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key {unknown[0]!r}; expected one of {', '.join(SWEEP_KEYS)} or a config "
            f"key of the base ({', '.join(sorted(CONFIG_KEYS - {'name'}))})"
        )
    if "base" not in raw:
        raise ConfigError(
            f"{where}: no base: give a config path (base: experiments/19-control) or an inline "
            f"scenario mapping (base: {{preset: phase-19}})"
        )
    if not any(k in raw for k in ("grid", "points", "recipes")):
        raise ConfigError(f"{where}: nothing to sweep: give a grid, points or recipes")
    base = _base(raw["base"], path)
    overrides = {k: v for k, v in raw.items() if k in CONFIG_KEYS and k != "name"}
    if overrides:
        base = apply_config(base, overrides, where=where)
    grid = raw.get("grid") or {}
    if "grid" in raw and not grid:
        raise ConfigError(f"{where}: grid is empty: give it at least one axis (a field path and a list of values)")
    points = raw.get("points") if "points" in raw else ()
    if points is None or points == []:
        raise ConfigError(f"{where}: points is empty: give at least one point, or leave the key out")
    name = raw.get("name") or path.stem
    if not isinstance(name, str):
        raise ConfigError(f"{where}: name must be a string, was {name!r}")
    sweep = Sweep(base=base, grid=grid, recipes=raw.get("recipes"), points=points, name=name, where=where)
    sweep.expand()
    return sweep


def _base(raw: Any, sweep_file: Path) -> Scenario:
    where = f"{sweep_file}: base"
    if isinstance(raw, Mapping):
        return Scenario.from_dict(raw, where=where)
    if not isinstance(raw, str) or not raw:
        raise ConfigError(f"{where} must be a config path or an inline scenario mapping, was {raw!r}")
    given = Path(raw)
    tried = [given] if given.is_absolute() else [sweep_file.parent / given, given]
    for candidate in tried:
        if candidate.is_dir() and (candidate / "config.yaml").is_file() or candidate.is_file():
            return Scenario.from_yaml(candidate)
    raise ConfigError(f"{where}: no config file or experiment directory {raw} (looked in {' and '.join(str(t) for t in tried)})")
