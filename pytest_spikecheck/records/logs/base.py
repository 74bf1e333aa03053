"""What a reader hands the shared rules: a :class:`Table` (the log's rows in file order,
column by column), and the :class:`Reader` contract every format module fills in.

A reader only *reads*: it finds the rows and their values. Steps, restarts, merges, names,
missing vs NaN and skipped steps are decided once, by :mod:`.rules`, for every format.
"""

from __future__ import annotations

import itertools
import math
import operator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from pytest_spikecheck.errors import ConfigError

#: The first line of every Git LFS pointer file (the public spec, v1): a repository cloned
#: without ``git lfs pull`` holds these ~130-byte stand-ins in place of its large files.
LFS_POINTER = b"version https://git-lfs.github.com/spec/v1"


def lfs_pointer_error(path: Path) -> ConfigError:
    return ConfigError(f"{path}: a Git LFS pointer, not the log: run `git lfs pull` (in the repository that holds it)")


@dataclass
class Column:
    """One column's values, one per row: float64 (NaN where missing), a mask of the rows where
    nothing was logged, and the first value that is not a number (row, raw), if any."""

    values: np.ndarray
    missing: np.ndarray
    first_text: tuple[int, Any] | None = None
    strings: bool = False  # every cell was text ("1.5" in a CSV): messages quote a value as the file wrote it

    def shown(self, i: int) -> str:
        """Row i's value as the file wrote it, for a message ('1.5' from a CSV, 1.5 from JSON)."""
        v = float(self.values[i])
        text = str(int(v)) if math.isfinite(v) and v == int(v) else str(v)
        return repr(text) if self.strings else text

    def take(self, rows: np.ndarray | slice, offset: int = 0) -> Column:
        """The rows ``rows`` (a slice, a boolean mask or indices) of a column whose first row is
        the table's row ``offset``; the first text cell stays named by its table row, if kept."""
        text = self.first_text
        if text is not None:
            kept = np.arange(offset, offset + self.values.size)[rows]
            text = text if np.any(kept == text[0]) else None
        return Column(self.values[rows], self.missing[rows], text, self.strings)

    @classmethod
    def of(cls, raw: Sequence[Any], offset: int = 0) -> Column:
        """From raw cells: None or "" is missing; ints, floats and number strings ('3.4',
        '1.264354E+01', 'NaN', 'Infinity') are numbers; anything else (a name, a flag, True) is text."""
        kinds = set(map(type, raw))
        if kinds <= {float, int}:
            return cls(np.asarray(raw, dtype=np.float64).reshape(-1), np.zeros(len(raw), dtype=bool))
        n = len(raw)
        if kinds == {str}:  # a CSV column: numpy parses number strings ('1e-3', 'nan', 'Infinity') itself
            try:
                return cls(np.array(raw, dtype=np.float64).reshape(-1), np.zeros(n, dtype=bool), None, True)
            except ValueError:
                pass  # an empty cell or a word: cell by cell below
        if kinds <= {float, int, type(None)}:  # JSON's null: the fast path stays vectorised
            missing = np.fromiter((v is None for v in raw), dtype=bool, count=n)
            return cls(np.asarray([math.nan if v is None else v for v in raw], dtype=np.float64).reshape(-1), missing)
        values = np.full(n, np.nan)
        missing = np.zeros(n, dtype=bool)
        first_text = None
        strings = kinds == {str}
        for i, cell in enumerate(raw):
            number = to_number(cell)
            if number is None:
                missing[i] = True
            elif number is TEXT:
                missing[i] = True
                if first_text is None:
                    first_text = (offset + i, cell)
            else:
                values[i] = number
        return cls(values, missing, first_text, strings)

    @classmethod
    def concat(cls, parts: Sequence[Column]) -> Column:
        text = next((p.first_text for p in parts if p.first_text is not None), None)
        return cls(
            np.concatenate([p.values for p in parts]),
            np.concatenate([p.missing for p in parts]),
            text,
            all(p.strings for p in parts),
        )

    @classmethod
    def absent(cls, n: int) -> Column:
        return cls(np.full(n, np.nan), np.ones(n, dtype=bool))


TEXT = object()  # a value that is not a number (a run name, a flag): its column is no metric


def to_number(raw: Any) -> float | None | object:
    """A cell as a float; None where nothing was logged; TEXT where it holds no number.
    ``float`` reads 'NaN', 'inf', 'Infinity' and '-Infinity' as the writers spell them."""
    if raw is None or raw == "":
        return None
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        return TEXT
    try:
        return float(raw)
    except (ValueError, OverflowError):
        return TEXT


#: The column a log writes its skip reason in (our metrics.jsonl: "overflow" or null; a CSV: 1/0).
SKIP_COLUMN = "skipped"
_NOT_SKIPPED = ("", "0", "0.0", "false", "none", "null", "no")


def columns_of(rows: Sequence[Mapping[str, Any]], offset: int = 0) -> tuple[dict[str, Column], dict[int, str]]:
    """Columns of a list of row dicts (JSONL objects, CSV rows), a key absent from a row
    being missing there; and the rows whose ``skipped`` cell says the step was skipped
    (a reason such as "overflow", or a true value), by row number from ``offset``."""
    cells = _cells(rows)
    skipped: dict[int, str] = {}
    for i, cell in enumerate(cells.pop(SKIP_COLUMN, ())):
        if cell is None or cell is False or str(cell).strip().lower() in _NOT_SKIPPED:
            continue
        skipped[offset + i] = (
            cell.strip()
            if isinstance(cell, str) and to_number(cell) is TEXT and cell.strip().lower() != "true"
            else "skipped (the log's skip column)"
        )
    return {name: Column.of(raw, offset) for name, raw in cells.items()}, skipped


def _cells(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Every key's cells, first seen first. Most logs write the same keys on every row: when each
    row holds as many keys as the first and all of the first's, the columns are read at C speed."""
    if not rows:
        return {}
    first = list(rows[0])
    if sum(map(len, rows)) == len(rows) * len(first):
        try:
            return {name: list(map(operator.itemgetter(name), rows)) for name in first}
        except KeyError:
            pass  # a row lacks one of the first row's keys (and has another): the slow way
    names = dict.fromkeys(itertools.chain.from_iterable(rows))
    return {name: [r.get(name) for r in rows] for name in names}


@dataclass
class Table:
    """A log as its reader found it, rows in file order.

    ``steps`` holds each row's step, or is None when the step is one of the columns (CSV,
    JSONL: the rules pick it, or the mapping names it) or the log has none. ``where(i)``
    names row ``i`` for messages ("line 12", "log_history[3]"). ``fp16`` is what the log says
    of its precision (an argument dump, a logged parameter), None when it says nothing.
    ``skipped`` maps a row to why the log says its step's update was skipped.
    """

    steps: np.ndarray | None
    columns: dict[str, Column]
    where: Callable[[int], str]
    notes: list[str] = field(default_factory=list)
    fp16: bool | None = None
    skipped: dict[int, str] = field(default_factory=dict)
    #: the rules' own step column choice is overridden by the reader (Lightning's "step")
    default_step_column: str | None = None
    rows: int | None = None  # the number of rows, where neither steps nor a column tells it
    #: What the log states about how the run was trained, as RunFacts fields (an argument dump,
    #: logged parameters): the record's facts, source "log". Empty: it says nothing.
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def size(self) -> int:
        if self.steps is not None:
            return int(self.steps.size)
        if self.rows is not None:
            return self.rows
        return next((c.values.size for c in self.columns.values()), 0)


def line_where(lines: np.ndarray | Sequence[int]) -> Callable[[int], str]:
    """``where`` for a text format: row i sits on line ``lines[i]`` (1-based)."""
    return lambda i: f"line {int(lines[i])}"


@dataclass(frozen=True)
class Reader:
    """A log format: how to recognise it and how to read it into a :class:`Table`.

    ``detect(path, head)`` sees the path and the first 64 KiB (bytes, BOM removed) and says
    whether the file is of this format; readers are asked in registry order, so a more
    specific format comes first. ``read(path)`` returns the Table; it raises ConfigError
    naming the file for anything it cannot read. ``steps_own`` says, where the format carries
    its own step, why a ``--map step=`` is refused ("a TensorBoard event carries its own step").
    ``folder`` reads a folder (TensorBoard event files, an MLflow run) rather than a file.
    """

    name: str
    description: str  # "a Hugging Face trainer_state.json (...)": the words of every "expected ..." error
    detect: Callable[[Path, bytes], bool]
    read: Callable[[Path], Table]
    steps_own: str | None = None
    folder: bool = False


#: The byte-order marks of UTF-16 text: Windows PowerShell's ``>`` and ``Tee-Object`` write a
#: training run's stdout as UTF-16 LE with CRLF line ends, which has a NUL in every other byte.
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
#: The longest line a line-based log (JSONL, CSV, text) may hold: a row of metrics is far shorter,
#: and a 200 MB line took 47 s and 4.68 GB to parse before.
MAX_LINE = 1 << 20
_READ_CHUNK = 1 << 23


def text_encoding(head: bytes) -> str:
    """The encoding a text log is read in: UTF-16 where it starts with its BOM, else UTF-8 (a
    UTF-8 BOM dropped)."""
    return "utf-16" if head.startswith(UTF16_BOMS) else "utf-8-sig"


def read_text(path: Path, expected: str, keep_carriage_returns: bool = False, max_line: int | None = None) -> str:
    """The file's text (a BOM dropped; UTF-16 where a BOM says so). ``keep_carriage_returns``: a
    lone ``\r`` (tqdm redrawing a bar) stays a ``\r`` instead of becoming a line break, so line
    numbers are the file's own; a Windows ``\r\n`` is one line end either way. ``max_line``: a
    line longer than this many bytes is one line of refusal, said as soon as it is read past (the
    file is read in chunks), before anything parses it."""
    try:
        if max_line is None:
            with open(path, "rb") as f:
                data = f.read()
        else:
            data = _bounded_bytes(path, expected, max_line)
        text = data.decode(text_encoding(data[:2]))
    except UnicodeError:
        raise ConfigError(f"{path}: not UTF-8 text; expected {expected}") from None
    text = text.replace("\r\n", "\n") if "\r\n" in text else text
    return text if keep_carriage_returns else text.replace("\r", "\n")


def _bounded_bytes(path: Path, expected: str, max_line: int) -> bytes:
    """The file's bytes, read in chunks of whole windows of ``max_line`` bytes; a window without
    a line break (\n or \r) is a line at least that long, refused as soon as it is read (so no
    line longer than twice ``max_line`` gets through, and checking costs a memchr per window)."""
    parts: list[bytes] = []
    step = max(1, _READ_CHUNK // max_line) * max_line
    with open(path, "rb") as f:
        while chunk := f.read(step):
            for start in range(0, len(chunk) - max_line + 1, max_line):
                window = chunk[start : start + max_line]
                if b"\n" not in window and b"\r" not in window:
                    lines = sum(p.count(b"\n") for p in parts) + chunk.count(b"\n", 0, start)
                    raise ConfigError(f"{path}: line {lines + 1} is longer than {max_line:,} bytes; expected {expected}")
            parts.append(chunk)
    return b"".join(parts)
