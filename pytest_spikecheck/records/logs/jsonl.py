"""JSONL: one JSON object per line (our own ``metrics.jsonl``, a W&B ``history.jsonl``,
LLaMA-Factory's ``trainer_log.jsonl``). Read in chunks of lines, each parsed by one
``json.loads`` call and turned into columns at once, so a million-line log needs neither a
Python loop per value nor a million dicts alive at the same time."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.records.logs.base import MAX_LINE, Column, Reader, Table, columns_of, line_where, read_text

DESCRIPTION = "a JSONL log (one JSON object per line)"
_CHUNK = 100_000  # lines per json.loads call


def detect(path: Path, head: bytes) -> bool:
    first = head.lstrip().split(b"\n", 1)[0]
    try:
        return isinstance(json.loads(first), dict)
    except ValueError:
        return False


def _parse(path: Path, lines: list[str], numbers: list[int]) -> list[dict]:
    try:
        rows = json.loads("[" + ",".join(lines) + "]")
    except json.JSONDecodeError:
        rows = None  # find the bad line, one at a time
    if rows is None or len(rows) != len(lines):
        rows = []
        for n, line in zip(numbers, lines):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}: line {n} is not valid JSON ({exc.msg}); expected {DESCRIPTION}") from None
    for n, row in zip(numbers, rows):
        if type(row) is not dict:
            raise ConfigError(f"{path}: line {n} is a JSON {type(row).__name__}, not an object; expected {DESCRIPTION}")
    return rows


def read(path: Path) -> Table:
    lines = read_text(path, DESCRIPTION, max_line=MAX_LINE).splitlines()
    blank = np.fromiter(map(len, map(str.strip, lines)), dtype=np.int64, count=len(lines)) == 0
    if blank.any():  # blank lines are skipped; rows keep their line numbers
        kept = np.flatnonzero(~blank)
        lines = [lines[i] for i in kept.tolist()]
        line_numbers = kept + 1
    else:
        line_numbers = np.arange(1, len(lines) + 1)
    chunks: list[dict[str, Column]] = []
    skipped: dict[int, str] = {}
    for start in range(0, len(lines), _CHUNK):
        part = lines[start : start + _CHUNK]
        rows = _parse(path, part, line_numbers[start : start + len(part)].tolist())
        columns, skips = columns_of(rows, start)
        del rows
        chunks.append(columns)
        skipped.update(skips)
    sizes = [min(_CHUNK, len(lines) - i * _CHUNK) for i in range(len(chunks))]
    del lines
    names = dict.fromkeys(k for c in chunks for k in c)
    columns = {name: Column.concat([c.get(name) or Column.absent(n) for c, n in zip(chunks, sizes)]) for name in names}
    return Table(None, columns, line_where(line_numbers), skipped=skipped, rows=int(line_numbers.size))


READER = Reader("jsonl", DESCRIPTION, detect, read)
