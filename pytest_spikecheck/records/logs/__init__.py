"""Read the training logs teams already have into the :class:`~pytest_spikecheck.records.Record`
that every assertion and detector takes.

=========== ==================================================================================
format       what it is (one module each, behind :mod:`.registry`)
=========== ==================================================================================
hf-trainer   a Hugging Face ``trainer_state.json``: ``log_history`` entries (:mod:`.hf_trainer`)
lightning    a Lightning ``CSVLogger`` ``metrics.csv``: sparse columns, ``step`` and ``epoch``
tensorboard  TensorBoard event files (a file, or a folder holding them); needs the extra
mlflow       an MLflow file-store run (``mlruns/<experiment>/<run>/metrics/<name>``)
csv          any CSV with a header row (a W&B history export, ``Step,Loss``, a team's logger)
jsonl        one JSON object per line (our ``metrics.jsonl``, a W&B ``history.jsonl``)
text         a training log printed to stdout: Megatron-LM, torchtitan, nanoGPT, llm.c, OLMo,
             HF Trainer dicts, Lightning progress bars, ``key=value`` / ``key: value`` lines
=========== ==================================================================================

The format is detected from the content, not the file name. Steps, restarts, runs in one
file, merges, missing vs NaN, names and skipped steps follow one set of rules for every
format (:mod:`.rules`; ``docs/logs.md`` explains them with examples). numpy only at import;
``tensorboard`` is imported when an event file is read.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Mapping

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.records.logs import registry
from pytest_spikecheck.records.logs.base import LFS_POINTER
from pytest_spikecheck.records.logs.folders import find_logs, log_in_folder
from pytest_spikecheck.records.logs.names import KNOWN_NAMES, STEP_COLUMNS
from pytest_spikecheck.records.logs.registry import FORMATS
from pytest_spikecheck.records.logs.tensorboard import TENSORBOARD_EXTRA
from pytest_spikecheck.records.series import Record

__all__ = [
    "FORMATS",
    "KNOWN_NAMES",
    "LFS_POINTER",
    "STEP_COLUMNS",
    "TENSORBOARD_EXTRA",
    "detect_format",
    "find_logs",
    "read_log",
    "read_runs",
]


def _resolve(path: Path, format: str | None) -> tuple[Path, str]:
    if path.is_dir():
        found, path = log_in_folder(path)
        if (
            format is not None
            and format in registry.BY_NAME
            and registry.BY_NAME[format].folder != registry.BY_NAME[found].folder
        ):
            raise ConfigError(f"{path}: holds {FORMATS[found]}, not {FORMATS[format]}")
        _check_run_folder(path)
        return path, format or found
    if not path.is_file():
        if path.exists():  # a FIFO, a socket, a device: reading it could block for ever
            raise ConfigError(f"{path} is not a regular file or folder; give the log file itself")
        raise ConfigError(f"no such log file or folder: {path}")
    _check_run_folder(path)
    return path, format or registry.detect(path)


def _check_run_folder(path: Path) -> None:
    """A run folder's metrics.jsonl is read only if the folder's manifest (when it has one) proves
    it whole: a cut or half-written run is one line, not a verdict on part of a run."""
    from pytest_spikecheck.records import integrity

    if path.name == "metrics.jsonl" and (path.parent / "run.json").is_file():
        try:
            meta = json.loads((path.parent / "run.json").read_text())
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            raise integrity.refuse(path.parent, f"run.json is not valid JSON ({exc})") from None
        why = integrity.problem(path.parent, meta, required=False) if isinstance(meta, dict) else None
        if why is not None:
            raise integrity.refuse(path.parent, why)


def read_runs(path: str | Path, format: str | None = None, mapping: Mapping[str, str] | None = None) -> list[Record]:
    """Every run a training log holds, one :class:`Record` each: one for most logs, several
    where the step counter starts again (seeds or stages concatenated in one file).

    ``mapping`` renames columns, ours -> theirs: ``{"loss": "train/loss", "step": "_step"}``.
    A wrong, corrupt or empty file raises a one-line :class:`ConfigError` naming the file
    and what was expected.
    """
    path, fmt = _resolve(Path(path), format)
    records = registry.read(path, fmt, dict(mapping or {}))
    facts = _run_folder_facts(path)
    return [dataclasses.replace(r, facts=facts) for r in records] if facts is not None else records


def _run_folder_facts(path: Path):
    """How a run folder's run was trained (its run.json ``facts``: QK-Clip's tau, the clip limit,
    the optimizer), read beside its metrics.jsonl: the record is the contract, so a run judged
    from its folder is judged on what its writer stated, not on what a bare JSONL can say."""
    if path.name != "metrics.jsonl" or not (path.parent / "run.json").is_file():
        return None
    from pytest_spikecheck.records.run_json import read_run_facts

    return read_run_facts(path.parent)


def read_log(
    path: str | Path, format: str | None = None, mapping: Mapping[str, str] | None = None, run: int | None = None
) -> Record:
    """Read a training log into a :class:`Record` (format detected unless ``format`` is given).

    A log holding several runs (:func:`read_runs`) gives its last, or run number ``run``
    (from 1); the Record's notes say which. ``spikecheck check`` judges every run.
    """
    runs = read_runs(path, format, mapping)
    if run is None:
        return runs[-1]
    if not 1 <= run <= len(runs):
        raise ConfigError(f"{path}: no run {run}: the log holds {len(runs)} run{'s' if len(runs) != 1 else ''}")
    return runs[run - 1]


def detect_format(path: str | Path) -> str:
    """The format of a log file, from its first bytes (names in :data:`FORMATS`)."""
    return registry.detect(Path(path))
