"""Hugging Face ``trainer_state.json``: ``log_history`` entries with ``step``, ``loss``,
``grad_norm``, ``learning_rate``, ``epoch``; ``eval_*`` entries mixed in. The end-of-training
summary (the entry with ``train_runtime``: its ``train_loss`` is the mean over the run) and
entries without a step (``trainer.predict()`` rows) are skipped, the latter with a note."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.records.logs.base import Reader, Table, columns_of, read_text, to_number, TEXT
from pytest_spikecheck.records.logs.names import listing

DESCRIPTION = "a Hugging Face trainer_state.json (an object with a log_history list)"
#: Keys only a trainer state has at its top level: a compact one-line state is still one.
STATE_KEYS = {"log_history", "global_step", "max_steps", "logging_steps"}


def detect(path: Path, head: bytes) -> bool:
    text = head.lstrip()
    if not text.startswith(b"{"):
        return False
    # A JSONL log has a complete object on its first line; a trainer_state.json is one
    # indented object (or, written compactly, one line with log_history in it).
    try:
        first = json.loads(text.split(b"\n", 1)[0])
    except ValueError:
        return text.split(b"\n", 1)[0].strip() == b"{" or b'"log_history"' in head
    # A compact trainer state that lost its log_history (``{"global_step": 10}``) is still a
    # trainer state: read as one, it is told it has no log_history, not that it is bad JSONL.
    return isinstance(first, dict) and bool(STATE_KEYS & set(first) or path.name == "trainer_state.json")


def _step(raw, path: Path, where: str) -> int:
    value = to_number(raw)
    if value is None or value is TEXT or not np.isfinite(value) or value != int(value) or value < 0:
        shown = "nothing" if value is None else repr(raw)
        raise ConfigError(f"{path}: {where}: 'step' holds {shown}, expected a step number (a whole number >= 0)")
    return int(value)


def read(path: Path) -> Table:
    text = read_text(path, DESCRIPTION)
    try:
        state = json.loads(text)  # Python's json reads NaN, Infinity and -Infinity as HF writes them
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); expected {DESCRIPTION}"
        ) from None
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list):
        keys = listing(state) if isinstance(state, dict) else f"a JSON {type(state).__name__}"
        raise ConfigError(f"{path}: no log_history list (it has {keys}); expected {DESCRIPTION}")
    if not history:
        counters = ", ".join(f"{k} {state[k]}" for k in ("global_step", "logging_steps", "max_steps") if k in state)
        raise ConfigError(
            f"{path}: log_history is empty: the trainer logged nothing"
            f"{f' ({counters})' if counters else ''}; expected {DESCRIPTION}"
        )
    stepless: list[str] = []
    rows, steps, index = [], [], []
    for i, entry in enumerate(history):
        where = f"log_history[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{path}: {where} is not an object; expected {DESCRIPTION}")
        if "train_runtime" in entry:
            continue  # the end-of-training summary: its train_loss is the mean over the whole run
        if entry.get("step") is None:
            # trainer.predict() / evaluate() outside training append rows with no step: they
            # belong to no point of the training curve.
            stepless.append(where)
            continue
        steps.append(_step(entry.get("step"), path, where))
        rows.append({k: v for k, v in entry.items() if k != "step"})
        index.append(i)
    if stepless and not rows:
        raise ConfigError(
            f"{path}: no log_history entry has a step ({stepless[0]} and {len(stepless) - 1} more); expected {DESCRIPTION}"
            if len(stepless) > 1
            else f"{path}: {stepless[0]} has no step, and no other entry does; expected {DESCRIPTION}"
        )
    notes = []
    if stepless:
        notes.append(
            f"{len(stepless)} log_history entr{'ies' if len(stepless) > 1 else 'y'} without a step skipped "
            f"({', '.join(stepless[:3])}{', ...' if len(stepless) > 3 else ''})"
        )
    columns, skipped = columns_of(rows)
    return Table(np.asarray(steps, dtype=np.int64), columns, lambda r: f"log_history[{index[r]}]", notes, skipped=skipped)


READER = Reader("hf-trainer", DESCRIPTION, detect, read, steps_own="trainer_state.json entries carry their own step")
