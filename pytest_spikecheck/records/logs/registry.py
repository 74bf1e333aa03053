"""The formats, in the order they are recognised (the most specific first), and the two entry
points every caller goes through: :func:`detect` and :func:`read`.

Adding a format: a module with a ``READER`` (:class:`~.base.Reader`: ``detect`` and ``read``
into a :class:`~.base.Table`), its place in :data:`READERS`, and a test file.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.records.logs import csv_log, golden_values, hf_trainer, jsonl, lightning, mlflow, rules, tensorboard, text
from pytest_spikecheck.records.logs.base import LFS_POINTER, UTF16_BOMS, Reader, lfs_pointer_error
from pytest_spikecheck.records.series import Record

#: Every format, in recognition order: binary first, text (anything else readable) last.
READERS: tuple[Reader, ...] = (
    tensorboard.READER,
    mlflow.READER,
    golden_values.READER,
    hf_trainer.READER,
    jsonl.READER,
    lightning.READER,
    csv_log.READER,
    text.READER,
)
BY_NAME: dict[str, Reader] = {r.name: r for r in READERS}
#: format name -> what a file of that format is (the words of every "expected ..." error)
FORMATS: dict[str, str] = {r.name: r.description for r in READERS}
ANY_FORMAT = (
    "a trainer_state.json, a metrics.csv, TensorBoard event files, an MLflow run, a CSV/JSONL log "
    "or a training log printed to stdout"
)


def _head(path: Path) -> bytes:
    with open(path, "rb") as f:
        head = f.read(65536)
    if not head.strip():
        raise ConfigError(f"{path}: empty file; expected {ANY_FORMAT}")
    if head.startswith(LFS_POINTER):
        raise lfs_pointer_error(path)
    return head


def detect(path: str | Path) -> str:
    """The format of a log file (or of an MLflow run or TensorBoard folder), from its content."""
    path = Path(path)
    if path.is_dir():
        return "mlflow" if mlflow.is_run(path) else "tensorboard"
    head = _head(path)
    if tensorboard.is_event_file(head):
        return "tensorboard"
    if head.startswith(UTF16_BOMS):  # PowerShell's redirected stdout: the text, in UTF-16
        head = head[: len(head) // 2 * 2].decode("utf-16", errors="ignore").encode("utf-8")
    if re.match(rb"\s*\[\s*\{", head):  # "[{": a JSON array of objects (a text log's "[2024-..." is not)
        raise ConfigError(
            f"{path}: a JSON array, not one JSON object per line; write one object per line "
            f"(JSONL), or give a trainer_state.json (expected {ANY_FORMAT})"
        )
    if b"\0" in head:
        raise ConfigError(f"{path}: a binary file that is not a TensorBoard event file; expected {ANY_FORMAT}")
    text_head = head.removeprefix(b"\xef\xbb\xbf")  # a BOM, as Excel writes CSV
    return next(r.name for r in READERS if r.detect(path, text_head))


def read(path: Path, fmt: str, mapping: Mapping[str, str]) -> list[Record]:
    """The runs of the log at ``path`` read as format ``fmt``, through the shared rules."""
    reader = BY_NAME.get(fmt)
    if reader is None:
        raise ConfigError(f"unknown log format {fmt!r}; choose one of {', '.join(BY_NAME)}")
    if "step" in mapping and reader.steps_own:
        raise ConfigError(f"{path}: {reader.steps_own}; mapping step= applies to CSV and JSONL logs")
    table = reader.read(path)
    return rules.assemble(path, fmt, reader.description, table, mapping)
