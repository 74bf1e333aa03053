"""MLflow's file store: a run folder ``mlruns/<experiment>/<run>/`` whose ``metrics/<name>``
files hold one line per logged value, ``<timestamp ms> <value> <step>`` (a name with ``/`` is
a nested path: ``metrics/train/loss``). Every metric of the run is read, rows in the order they
were logged (by timestamp), so a resumed run reads as a restart like any other log. A single
metric file reads as that one series. ``params/`` says whether the run was fp16 (HF's
``MLflowCallback`` logs every training argument there), and what the record's facts say:
the clip (``max_grad_norm``), the accumulation, the seed, the optimizer (``optim``), the lr, the
precision. numpy only: MLflow is not needed."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.records.facts import OptimizerGroup
from pytest_spikecheck.records.logs.base import Column, Reader, Table, read_text
from pytest_spikecheck.scenario.sections import ClipSpec

DESCRIPTION = "an MLflow run folder (mlruns/<experiment>/<run>/ with metrics/ files of 'timestamp value step' lines)"
_LINE = re.compile(rb"^\d{9,14} \S+( -?\d+)?$")


def is_run(folder: Path) -> bool:
    return (folder / "metrics").is_dir() and (folder / "meta.yaml").is_file()


def is_experiment(folder: Path) -> bool:
    return (folder / "meta.yaml").is_file() and not (folder / "metrics").is_dir()


def detect(path: Path, head: bytes) -> bool:
    if path.is_dir():
        return is_run(path)
    lines = [line for line in head.splitlines()[:5] if line.strip()]
    return bool(lines) and all(_LINE.match(line.strip()) for line in lines)


def _metric_files(run: Path) -> list[tuple[str, Path]]:
    root = run / "metrics"
    return sorted((str(p.relative_to(root).as_posix()), p) for p in root.rglob("*") if p.is_file())


def _fp16(run: Path) -> bool | None:
    params = run / "params"
    if not params.is_dir():
        return None

    def param(name: str) -> str | None:
        file = params / name
        return file.read_text(errors="replace").strip().lower() if file.is_file() else None

    if param("fp16") == "true" or param("mixed_precision") == "fp16" or param("precision") in ("16", "16-mixed"):
        return True
    if param("fp16") == "false" or param("bf16") == "true" or (param("precision") or "").startswith(("32", "bf16")):
        return False
    return None


def _facts(run: Path) -> dict[str, Any]:
    """RunFacts fields the run's params state (HF's TrainingArguments names); {} when none do."""
    params = run / "params"
    if not params.is_dir():
        return {}
    raw = {p.name: p.read_text(errors="replace").strip() for p in params.iterdir() if p.is_file()}

    def number(name: str, kind: type = float) -> Any:
        try:
            return kind(float(raw[name])) if kind is int else float(raw[name])
        except (KeyError, ValueError):
            return None

    facts: dict[str, Any] = {}
    clip = number("max_grad_norm")
    if clip is not None and clip >= 0:  # 0: the Trainer's "no clip"
        facts["clip"] = ClipSpec("global", clip) if clip > 0 else ClipSpec("none", None)
    for field_name, name in (("accumulation", "gradient_accumulation_steps"), ("seed", "seed")):
        if number(name, int) is not None:
            facts[field_name] = number(name, int)
    optim, lr = raw.get("optim"), number("learning_rate")
    if optim is not None or lr is not None:
        word = optim.lower() if optim else None
        word = "adamw" if word and word.startswith("adamw") else word
        facts["optimizers"] = (OptimizerGroup(name=word, lr=lr, weight_decay=number("weight_decay")),)
    if raw.get("bf16", "").lower() == "true":
        facts["amp_dtype"] = "bfloat16"
    elif raw.get("fp16", "").lower() == "true":
        facts["amp_dtype"] = "float16"
    return facts


def read(path: Path) -> Table:
    if path.is_dir():
        files = _metric_files(path)
        if not files:
            raise ConfigError(f"{path}: an MLflow run with no metrics (metrics/ is empty); expected {DESCRIPTION}")
        fp16, facts = _fp16(path), _facts(path)
    else:
        metrics = next((p for p in path.parents if p.name == "metrics"), None)
        files = [(path.relative_to(metrics).as_posix() if metrics else path.name, path)]
        fp16, facts = (_fp16(metrics.parent), _facts(metrics.parent)) if metrics else (None, {})
    names, times, steps, values, wheres = [], [], [], [], []
    for k, (name, file) in enumerate(files):
        for n, line in enumerate(read_text(file, DESCRIPTION).splitlines(), 1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) not in (2, 3):
                raise ConfigError(f"{file}: line {n} is not 'timestamp value step'; expected {DESCRIPTION}")
            try:
                t, v, s = int(fields[0]), float(fields[1]), int(fields[2]) if len(fields) == 3 else 0
            except ValueError:
                raise ConfigError(
                    f"{file}: line {n} is not 'timestamp value step' ({line.strip()!r}); expected {DESCRIPTION}"
                ) from None
            names.append(k)
            times.append(t)
            steps.append(s)
            values.append(v)
            wheres.append(f"metrics/{name} line {n}")
    if not steps:
        raise ConfigError(
            f"{path}: no logged values in {len(files)} metric file{'s' if len(files) != 1 else ''}; expected {DESCRIPTION}"
        )
    order = np.lexsort((np.asarray(steps), np.asarray(times)))  # logged order; a tie by step
    metric_of = np.asarray(names)[order]
    value_of = np.asarray(values, dtype=np.float64)[order]
    columns = {}
    for k, (name, _) in enumerate(files):
        mine = metric_of == k
        columns[name] = Column(np.where(mine, value_of, np.nan), ~mine)
    where = [wheres[i] for i in order]
    return Table(np.asarray(steps, dtype=np.int64)[order], columns, where.__getitem__, fp16=fp16, facts=facts)


READER = Reader("mlflow", DESCRIPTION, detect, read, steps_own="an MLflow value carries its own step", folder=True)
