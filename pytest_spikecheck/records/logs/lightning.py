"""Lightning's ``CSVLogger`` ``metrics.csv``: sparse columns, the ``step`` (optimizer steps done
before the row) and ``epoch`` columns; read as a CSV whose step column is ``step``."""

from __future__ import annotations

from pathlib import Path

from pytest_spikecheck.records.logs import csv_log
from pytest_spikecheck.records.logs.base import Reader, Table

DESCRIPTION = "a Lightning metrics.csv (a CSV with step and epoch columns)"


def detect(path: Path, head: bytes) -> bool:
    found = csv_log.header_and_row(head)
    return found is not None and {"step", "epoch"} <= set(found[0])


def read(path: Path) -> Table:
    table = csv_log.read_table(path, DESCRIPTION)
    table.default_step_column = "step"
    return table


READER = Reader("lightning", DESCRIPTION, detect, read)
