"""Bounded inputs and every field validated at load (issue 37): each numeric field of every
section has a documented range (scenario/sections.py RANGES, docs/limits.md) checked before
anything is built; a YAML alias bomb, a recursive alias, a non-UTF-8 file or an integer too long
to read is one line; no error message formats an unbounded value. Nothing trains."""

from __future__ import annotations

import dataclasses
import math
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_spikecheck import ConfigError, Scenario
from pytest_spikecheck.cli import main
from pytest_spikecheck.scenario.config import MAX_YAML_VALUES, apply_config, dotted_config, read_yaml
from pytest_spikecheck.scenario.sections import CLIP_FIELDS, RANGES, SECTIONS, field_value

BASE = Scenario.preset("phase-19")


def _numeric_paths(prefix: str, spec: object) -> list[str]:
    out = []
    for f in dataclasses.fields(spec):
        value, path = getattr(spec, f.name), f"{prefix}.{f.name}"
        if dataclasses.is_dataclass(value):
            out += _numeric_paths(path, value)
        elif not isinstance(value, bool) and (
            isinstance(value, (int, float))
            or value is None
            and path != "sampler.mixture.new_source"
            or isinstance(value, tuple)
            and path in RANGES
        ):
            out.append(path)
    return out


NUMERIC = ["steps", "seed"] + [p for s, t in SECTIONS.items() for p in _numeric_paths(s, t())]


def test_every_numeric_field_has_a_documented_range():
    assert sorted(p for p in NUMERIC if p not in RANGES and p not in CLIP_FIELDS) == []
    assert sorted(p for p in RANGES if p not in NUMERIC) == []  # no stale entry
    limits = (__import__("pathlib").Path(__file__).parents[1] / "docs" / "limits.md").read_text()
    assert all(f"`{p}`" in limits for p in RANGES)


def _outside(path: str) -> st.SearchStrategy:
    r = RANGES[path]
    integer = isinstance(field_value(BASE, path), int) or (
        isinstance(field_value(BASE, path), tuple) and path.endswith("lengths")
    )
    if integer:
        below = st.integers(max_value=int(r.low) - (0 if r.low_open else 1))
        above = st.integers(min_value=int(r.high) + (0 if r.high_open else 1))
        return st.one_of(below.filter(lambda v: v > -(10**30)), above.filter(lambda v: v < 10**30))
    below = st.floats(max_value=r.low, exclude_max=not r.low_open, allow_nan=False)
    above = st.floats(min_value=r.high, exclude_min=not r.high_open, allow_nan=False)
    return st.one_of(below, above, st.just(math.nan), st.just(math.inf), st.just(-math.inf))


def _config(path: str, value: object) -> dict:
    current = field_value(BASE, path)
    if isinstance(current, tuple):
        value = [value, *current[1:]] if current else [value]
    return dotted_config(path, value)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.sampled_from(sorted(RANGES)).flatmap(lambda p: st.tuples(st.just(p), _outside(p))))
def test_an_out_of_range_value_of_any_numeric_field_is_one_line_naming_it(drawn):
    path, value = drawn
    with pytest.raises(ConfigError) as info:
        apply_config(BASE, _config(path, value))
    text = str(info.value)
    assert path in text and "\n" not in text and len(text) < 400, text


def test_defaults_and_closed_ends_are_in_range_and_open_ends_are_not():
    for path, r in RANGES.items():
        value = field_value(BASE, path)
        assert all(v is None or isinstance(v, str) or r.holds(v) for v in (value if isinstance(value, tuple) else (value,))), path
        assert r.holds(r.low) != r.low_open and r.holds(r.high) != r.high_open, path


def test_a_yaml_alias_bomb_is_one_line_before_it_expands(tmp_path):
    levels = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        levels.append(f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]")
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(levels) + "\nseed: *i\n")  # 9^9 = 387 million strings, 1 KB of YAML
    assert path.stat().st_size < 1100
    with pytest.raises(ConfigError, match=f"more than {MAX_YAML_VALUES:,} values"):
        read_yaml(path)
    (tmp_path / "recursive.yaml").write_text("a: &a [1, *a]\n")
    with pytest.raises(ConfigError, match="recursive"):
        read_yaml(tmp_path / "recursive.yaml")
    (tmp_path / "fine.yaml").write_text("base: &b {lr: 0.01}\nother: *b\n")
    assert read_yaml(tmp_path / "fine.yaml") == {"base": {"lr": 0.01}, "other": {"lr": 0.01}}  # aliases still work


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("preset: phase-19\nname: caf\xe9\n".encode("latin-1"), "not UTF-8 text"),
        ("preset: phase-19\n".encode("utf-16"), "not UTF-8 text"),
        (f"preset: phase-19\nseed: {'9' * 5000}\n".encode(), "a value YAML cannot read"),
        (b"preset: phase-19\nseed: 99999999999999999999999\n", "seed must be in [0, 9223372036854775807]"),
        (b"preset: phase-19\nsteps: 1000000000000\n", "steps must be in [1, 1000000]"),
    ],
)
def test_unreadable_or_unbounded_configs_are_one_short_line_naming_the_file(tmp_path, capsys, monkeypatch, content, message):
    import types

    never = types.ModuleType("pytest_spikecheck.training.launch")  # no torch import; a refusal never gets here
    never.train = lambda *a, **k: pytest.fail("trained: the config was not refused")
    monkeypatch.setitem(sys.modules, "pytest_spikecheck.training.launch", never)
    path = tmp_path / "config.yaml"
    path.write_bytes(content)
    assert main(["train", str(path), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"spikecheck: error: {path}") and message in err and "\n" not in err and len(err) < 400
    assert not (tmp_path / "run").exists()


def test_a_sweep_beyond_its_point_limit_is_refused_before_it_expands(tmp_path):
    from pytest_spikecheck.sweep import load_sweep
    from pytest_spikecheck.sweep.spec import MAX_POINTS

    path = tmp_path / "sweep.yaml"
    path.write_text(
        "base: {preset: phase-19}\ngrid: {seed: [" + ", ".join(map(str, range(1000))) + "],\n"
        "  optimizer.lr: [" + ", ".join(f"{i + 1}e-3" for i in range(1000)) + "]}\n"
    )
    with pytest.raises(ConfigError, match=f"1,000,000 points .* more than the {MAX_POINTS:,}"):
        load_sweep(path)


def test_a_sweep_expands_its_points_once(tmp_path, monkeypatch):
    """sweep/spec.py expanded every point in load_sweep and threw the result away; the engine
    expanded them again."""
    from pytest_spikecheck.sweep import load_sweep, spec, sweep

    path = tmp_path / "sweep.yaml"
    path.write_text("base: {preset: phase-19}\nsteps: 20\ngrid: {seed: [0, 1, 2]}\n")
    plan = load_sweep(path)
    applied = []
    original = spec.apply_config
    monkeypatch.setattr(spec, "apply_config", lambda *a, **k: applied.append(1) or original(*a, **k))

    class Nothing:
        name = "nothing"

        def describe(self):
            return "nothing"

        def run(self, jobs, deliver):
            pass

    result = sweep(plan, executor=Nothing(), progress=False, name="renamed")
    assert len(result.points) == 3 and plan.expand() == result.points
    expanding = len(applied)
    assert expanding == 0, expanding  # the points load_sweep expanded, not a second expansion


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        ("os:_exit", "is a built-in function, not a model factory"),  # it was called: the process ended silently
        ("no_such_module_x:make", "cannot import 'no_such_module_x'"),
        ("os:sep", "is not callable"),
        ("os:no_such_attr", "has no attribute 'no_such_attr'"),
    ],
)
def test_a_model_factory_that_is_not_one_is_a_refusal_line(factory, message):
    from pytest_spikecheck.training.model_contract import resolve_factory

    with pytest.raises(ConfigError, match=message):
        resolve_factory(factory)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda p: p.write_bytes(b'{"step": 1, "loss": 2.0}\n{"step": 2, "loss": ' + b"1" * (3 << 20) + b"}\n"),
            "line 2 is longer than 1,048,576 bytes",
        ),  # a 200 MB line took 47 s and 4.68 GB
        (lambda p: p.write_text('[{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.9}]'), "a JSON array, not one JSON object"),
        (lambda p: __import__("os").mkfifo(p), "is not a regular file"),  # was "no such log file"
    ],
)
def test_check_refuses_unbounded_or_mistaken_logs_in_one_line(tmp_path, capsys, make, message):
    path = tmp_path / "log"
    make(path)
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
