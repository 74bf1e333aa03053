"""Megatron-LM's golden values (``tests/functional_tests/test_cases/*/golden_values_*.json``,
Megatron-Bridge's and NeMo's copies): one JSON object, a metric per key (``lm loss``,
``num-zeros``, ``iteration-time``, ``mem-allocated-bytes``), each ``{"start_step", "end_step",
"step_interval", "values"}``, the values a ``{"step": value}`` object (or, in older files, a list
from ``start_step`` every ``step_interval``). A value may be the string ``"nan"`` (an iteration
time not measured at the first steps): read as NaN, in its own column, so it fails nothing but
itself (``iteration-time`` is bookkeeping, :mod:`.names`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.records.logs.base import Column, Reader, Table, read_text, to_number, TEXT

DESCRIPTION = "a Megatron golden-values JSON (metric -> {start_step, end_step, step_interval, values})"


def _is_metric(v: object) -> bool:
    return isinstance(v, dict) and "values" in v and isinstance(v["values"], (dict, list))


def detect(path: Path, head: bytes) -> bool:
    text = head.lstrip()
    if not text.startswith(b"{") or b'"values"' not in head or b'"step_interval"' not in head:
        return False
    try:
        doc = json.loads(text)
    except ValueError:
        return path.name.startswith("golden_values")  # more than the 64 KiB head: trust its name
    return isinstance(doc, dict) and bool(doc) and all(_is_metric(v) for v in doc.values())


def _points(path: Path, name: str, spec: dict) -> dict[int, object]:
    values = spec["values"]
    if isinstance(values, list):
        start, every = int(spec.get("start_step", 1)), int(spec.get("step_interval", 1))
        return {start + i * every: v for i, v in enumerate(values)}
    out = {}
    for key, v in values.items():
        step = to_number(key)
        if step is None or step is TEXT or step != int(step) or step < 0:
            raise ConfigError(f"{path}: {name!r} has the step {key!r}, expected a whole number >= 0; expected {DESCRIPTION}")
        out[int(step)] = v
    return out


def read(path: Path) -> Table:
    try:
        doc = json.loads(read_text(path, DESCRIPTION))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}); expected {DESCRIPTION}") from None
    if not isinstance(doc, dict) or not all(_is_metric(v) for v in doc.values()):
        raise ConfigError(f'{path}: not every key holds {{..., "values": ...}}; expected {DESCRIPTION}')
    points = {name: _points(path, name, spec) for name, spec in doc.items()}
    steps = np.asarray(sorted({s for p in points.values() for s in p}), dtype=np.int64)
    columns = {}
    for name, p in points.items():
        raw = [p.get(int(s)) for s in steps]
        columns[name] = Column.of(["nan" if isinstance(v, str) and v.strip().lower() == "nan" else v for v in raw])
    return Table(
        steps,
        columns,
        lambda i: f"step {int(steps[i])}",
        [f"read as golden values: {len(points)} metric{'s' if len(points) != 1 else ''}"],
    )


READER = Reader("golden-values", DESCRIPTION, detect, read, steps_own="golden values carry their own steps")
