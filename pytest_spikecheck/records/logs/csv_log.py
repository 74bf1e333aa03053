"""CSV with a header row: a W&B history export, a team's own logger, ``Step,Loss`` tables.
Column names may repeat (a logger writing one name twice): the repeats are read as
``name.1``, ``name.2`` (as pandas reads them), with a note."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import numpy as np

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.records.logs.base import MAX_LINE, Column, Reader, SKIP_COLUMN, Table, columns_of, line_where, read_text

DESCRIPTION = "a CSV log with a header row"
_NAME = re.compile(r"^[^\s:=][^:=]{0,127}$")  # a header cell: no "key: value" or "key=value" text
_NUMBER_OR_EMPTY = re.compile(r"^\s*([-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|[-+]?(nan|inf|infinity)|)\s*$", re.I)


def _first_rows(head: bytes) -> list[list[str]]:
    """The first two non-blank records (a quoted cell may hold a newline)."""
    reader = csv.reader(io.StringIO(head.decode("utf-8", "replace"), newline=""))
    rows = []
    try:
        for cells in reader:
            if any(c.strip() for c in cells):
                rows.append(cells)
            if len(rows) == 2:
                break
    except csv.Error:
        pass  # a cut-off quoted cell at the end of the head: what came before is enough
    return rows


def header_and_row(head: bytes) -> tuple[list[str], list[str]] | None:
    """The header and first data row when the file looks like a CSV table: every header cell a
    name, and a first data row of the same width with a number in it (empty cells are no evidence:
    a stdout log whose first line has a comma over a line ending in one, a printed dict's
    ``{   'batch_size': 64,``, is two cells of text over a text cell and an empty one)."""
    rows = _first_rows(head)
    if not rows:
        return None
    header = [h.strip().strip("\ufeff") for h in rows[0]]
    if not header or not all(_NAME.match(h) for h in header):
        return None
    if len(rows) == 1:
        return (header, []) if len(header) > 1 else None
    row = rows[1]
    if len(row) != len(header) or not any(c.strip() and _NUMBER_OR_EMPTY.match(c) for c in row):
        return None
    if len(header) == 1 and (len(header[0].split()) > 3 or not _NUMBER_OR_EMPTY.match(row[0])):
        return None  # one column: a name over numbers, not a sentence over a sentence
    return header, row


def detect(path: Path, head: bytes) -> bool:
    return header_and_row(head) is not None


def unique_header(header: list[str]) -> tuple[list[str], list[str]]:
    """The header with repeated names suffixed ``.1``, ``.2`` (pandas' way), and a note per name."""
    seen: dict[str, int] = {}
    out, notes = [], []
    for column, name in enumerate(header, 1):
        if name in seen:
            seen[name] += 1
            renamed = f"{name}.{seen[name]}"
            notes.append(f"column {column} repeats the name {name!r} (column {header.index(name) + 1}): read as {renamed!r}")
            out.append(renamed)
        else:
            seen[name] = 0
            out.append(name)
    return out, notes


def read_table(path: Path, expected: str) -> Table:
    text = read_text(path, expected, max_line=MAX_LINE)
    reader = csv.reader(io.StringIO(text, newline=""))  # quoted cells may hold newlines
    header = [h.strip() for h in next(reader, [])]
    if not all(header):
        raise ConfigError(f"{path}: line 1 is not a header row (empty names); expected {expected}")
    header, notes = unique_header(header)
    rows, lines = [], []
    for cells in reader:
        if not any(c.strip() for c in cells):
            continue
        if len(cells) != len(header):
            raise ConfigError(
                f"{path}: line {reader.line_num} has {len(cells)} cells but the header has {len(header)}; expected {expected}"
            )
        rows.append(cells)
        lines.append(reader.line_num)
    width = len(header)
    cells_by_column = list(zip(*rows)) if rows else [()] * width
    columns: dict[str, Column] = {}
    skipped: dict[int, str] = {}
    for name, cells in zip(header, cells_by_column):
        if name == SKIP_COLUMN:
            skipped = columns_of([{SKIP_COLUMN: c} for c in cells])[1]
            continue
        columns[name] = Column.of([c.strip() for c in cells])
    return Table(None, columns, line_where(np.asarray(lines, dtype=np.int64)), notes, skipped=skipped, rows=len(rows))


def read(path: Path) -> Table:
    return read_table(path, DESCRIPTION)


READER = Reader("csv", DESCRIPTION, detect, read)
