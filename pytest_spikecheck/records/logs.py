"""Read the training logs teams already have into the :class:`~pytest_spikecheck.records.Record`
that every assertion and detector takes.

========== ===================================================================================
format      what it is
========== ===================================================================================
hf-trainer  a Hugging Face ``trainer_state.json``: ``log_history`` entries with ``step``,
            ``loss``, ``grad_norm``, ``learning_rate``, ``epoch``; ``eval_*`` entries mixed in
lightning   a Lightning ``CSVLogger`` ``metrics.csv``: sparse columns, ``step`` and ``epoch``
tensorboard TensorBoard event files (a file, or a folder holding them): scalar summaries, old
            (``simple_value``) and new (tensor) style. Needs the ``tensorboard`` extra
csv         any CSV with a header row (a W&B history export, a team's own logger)
jsonl       one JSON object per line (our own ``metrics.jsonl``, a W&B ``history.jsonl``)
========== ===================================================================================

The format is detected from the content, not the file name. The rules every format follows
(``docs/logs.md`` explains them with examples):

- **Steps are the log's own.** A series is indexed by the step numbers the log wrote, so a
  log written every k steps, with gaps, or counting from 0 keeps its axis; detectors measure
  their windows in steps. A log with no step column is numbered 1, 2, 3, ...
- **A step that goes back is a restart from a checkpoint.** Everything logged at or after
  that step before the restart is discarded, because the resumed run recomputed those
  steps: the log then reads as what the model went through.
- **One step, several rows** (a train row and an eval row) merge; a metric logged twice at
  the same step keeps the later value.
- **Missing is not NaN.** An empty CSV cell, a JSON ``null`` or an absent key means "not
  logged" (``Record.missing``); ``NaN``, ``Infinity`` and ``-Infinity`` are real values.
- **Names.** Columns keep their names, except that the well-known names of other tools are
  read as ours (:data:`KNOWN_NAMES`) and a mapping (``{"loss": "train/loss"}``) renames
  explicitly. Wall-clock, throughput and FLOP counters are left out.

numpy only at import; ``tensorboard`` is imported when an event file is read.
"""

from __future__ import annotations

import csv
import io
import json
import math
import struct
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import numpy as np

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.records.series import Record

#: format name -> what a file of that format is (the words of every "expected ..." error)
FORMATS: dict[str, str] = {
    "hf-trainer": "a Hugging Face trainer_state.json (an object with a log_history list)",
    "lightning": "a Lightning metrics.csv (a CSV with step and epoch columns)",
    "tensorboard": "a TensorBoard event file (events.out.tfevents.*)",
    "csv": "a CSV log with a header row",
    "jsonl": "a JSONL log (one JSON object per line)",
}
_ANY_FORMAT = "a trainer_state.json, a metrics.csv, TensorBoard event files, or a CSV/JSONL log"

TENSORBOARD_EXTRA = "pip install 'pytest-spikecheck[tensorboard]'"

#: Our metric name -> the names other tools give it, most specific first. The first one
#: present is read under our name, unless the log already has a column with our name.
#: ``grad_norm`` (HF's pre-clip norm) is kept as it is: the assertions accept it wherever
#: the pre-clip norm is asked for.
KNOWN_NAMES: dict[str, tuple[str, ...]] = {
    "loss": ("train/loss", "train_loss_step", "train_loss"),  # HF via TB/W&B; Lightning
    "eval_loss": ("eval/loss", "val_loss", "val/loss"),
    "lr": ("learning_rate", "train/learning_rate", "lr-AdamW", "lr-Adam", "lr-SGD"),  # HF; Lightning's LearningRateMonitor
    "grad_norm": ("train/grad_norm", "grad_2.0_norm_total"),  # HF via TB/W&B; Lightning's grad_norm()
}

#: Columns that can hold the training step, most trustworthy first. W&B's ``_step`` counts
#: ``wandb.log`` calls (a train row and an eval row are two), so a real step column wins.
#: ``current_steps`` is LLaMA-Factory's ``trainer_log.jsonl``.
STEP_COLUMNS = ("step", "global_step", "train/global_step", "trainer/global_step", "current_steps", "_step")

# One row of a log as the readers yield it: (step, {column: raw value}, where it is in the file).
_Entry = tuple[int, dict[str, Any], str]

_TEXT = object()  # a value that is not a number (a run name, a flag): its column is no metric

#: The first line of every Git LFS pointer file (the public spec, v1): a repository cloned
#: without ``git lfs pull`` holds these ~130-byte stand-ins in place of its large files.
LFS_POINTER = b"version https://git-lfs.github.com/spec/v1"


def _lfs_pointer_error(path: Path) -> ConfigError:
    return ConfigError(f"{path}: a Git LFS pointer, not the log: run `git lfs pull` (in the repository that holds it)")


def read_log(path: str | Path, format: str | None = None, mapping: Mapping[str, str] | None = None) -> Record:
    """Read a training log into a :class:`Record` (format detected unless ``format`` is given).

    ``mapping`` renames columns, ours -> theirs: ``{"loss": "train/loss", "step": "_step"}``.
    A wrong, corrupt or empty file raises a one-line :class:`ConfigError` naming the file
    and what was expected.
    """
    path = Path(path)
    mapping = dict(mapping or {})
    if path.is_dir():
        found, path = _log_in_folder(path)
        if format is not None and (found == "tensorboard") != (format == "tensorboard"):
            raise ConfigError(f"{path}: holds {FORMATS[found]}, not {FORMATS.get(format, repr(format))}")
        fmt = format or found
    elif not path.is_file():
        raise ConfigError(f"no such log file or folder: {path}")
    else:
        fmt = format or detect_format(path)
    if fmt not in FORMATS:
        raise ConfigError(f"unknown log format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if fmt == "tensorboard":
        if "step" in mapping:
            raise ConfigError(f"{path}: a TensorBoard event carries its own step; mapping step= applies to CSV and JSONL logs")
        entries, notes = _read_tensorboard(path)
    elif fmt == "hf-trainer":
        if "step" in mapping:
            raise ConfigError(f"{path}: trainer_state.json entries carry their own step; mapping step= applies to CSV and JSONL logs")
        notes = []
        # A list, not a generator: the notes about skipped rows exist once every row was read.
        entries = list(_read_hf_trainer(path, _text(path, fmt), notes))
    elif fmt == "jsonl":
        entries, notes = _rows_with_steps(path, fmt, _jsonl_rows(path, _text(path, fmt)), mapping.pop("step", None))
    else:
        rows = _csv_rows(path, _text(path, fmt))
        step_column = mapping.pop("step", None) or ("step" if fmt == "lightning" else None)
        entries, notes = _rows_with_steps(path, fmt, rows, step_column)
    return _assemble(path, fmt, entries, mapping, notes)


def detect_format(path: str | Path) -> str:
    """The format of a log file, from its first bytes (names in :data:`FORMATS`)."""
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(65536)
    if not head.strip():
        raise ConfigError(f"{path}: empty file; expected {_ANY_FORMAT}")
    if head.startswith(LFS_POINTER):
        raise _lfs_pointer_error(path)
    if _is_event_file(head):
        return "tensorboard"
    if b"\0" in head:
        raise ConfigError(f"{path}: a binary file that is not a TensorBoard event file; expected {_ANY_FORMAT}")
    text = head.removeprefix(b"\xef\xbb\xbf").lstrip()  # a BOM, as Excel writes CSV
    if text.startswith(b"{"):
        # A JSONL log has a complete object on its first line; a trainer_state.json is one
        # indented object (or, written compactly, one line with log_history in it).
        first_line = text.split(b"\n", 1)[0]
        try:
            first = json.loads(first_line)
        except ValueError:
            return "hf-trainer"
        # A compact trainer state that lost its log_history (``{"global_step": 10}``) is still a
        # trainer state: read as one, it is told it has no log_history, not that it is bad JSONL.
        state_keys = {"log_history", "global_step", "max_steps", "logging_steps"}
        return "hf-trainer" if isinstance(first, dict) and (state_keys & set(first) or path.name == "trainer_state.json") else "jsonl"
    header = next(csv.reader([head.split(b"\n", 1)[0].decode("utf-8", "replace").strip("\r\ufeff")]), [])
    return "lightning" if {"step", "epoch"} <= set(header) else "csv"


# -- the one place a log becomes a Record ------------------------------------------------------

def _assemble(path: Path, fmt: str, entries: Iterable[_Entry], mapping: Mapping[str, str], notes: list[str]) -> Record:
    rows: dict[int, dict[str, float]] = {}
    columns: dict[str, None] = {}  # every column, in first-seen order
    numeric: set[str] = set()  # columns holding at least one number
    text_at: dict[str, tuple[str, Any]] = {}  # column -> (where, value) of its first non-number
    skipped: dict[int, str] = {}  # the ``skipped`` column (our metrics.jsonl): step -> why its update was not applied
    previous: int | None = None
    for step, values, where in entries:
        if previous is not None and step < previous:
            # The run restarted from a checkpoint and recomputed these steps: the older values
            # describe a trajectory the model no longer has.
            replaced = [s for s in rows if s >= step]
            for s in replaced:
                del rows[s]
                skipped.pop(s, None)
            notes.append(f"steps go back from {previous} to {step} at {where}: read as a restart from a checkpoint "
                         f"({len(replaced)} earlier logged step{'s' if len(replaced) != 1 else ''} from {step} on replaced)")
        previous = step
        row = rows.setdefault(step, {})
        for name, raw in values.items():
            columns.setdefault(name)
            value = _number(raw)
            if value is _TEXT:
                text_at.setdefault(name, (where, raw))
                if name == "skipped" and isinstance(raw, str):
                    skipped[step] = raw
                continue
            if value is not None:
                row[name] = value  # the later of two values at one step wins
                numeric.add(name)
    if not rows:
        raise ConfigError(f"{path}: no logged steps; expected {FORMATS[fmt]}")
    for name, (where, raw) in text_at.items():
        if name in numeric:
            raise ConfigError(f"{path}: {where}: {name!r} holds {raw!r}, not a number (the column is numeric elsewhere)")
    # A column of text (a run name, a tag) is no metric; one that is only empty stays, all missing.
    names = _rename(path, [c for c in columns if c not in text_at and not _is_bookkeeping(c)], mapping)
    if not names:
        raise ConfigError(f"{path}: no numeric columns besides the step; expected {FORMATS[fmt]}")
    steps = np.fromiter(sorted(rows), dtype=np.int64, count=len(rows))
    metrics: dict[str, np.ndarray] = {"step": steps}
    missing: dict[str, np.ndarray] = {}
    for source, name in names.items():
        logged = np.fromiter((source in rows[int(s)] for s in steps), dtype=bool, count=steps.size)
        metrics[name] = np.fromiter((rows[int(s)].get(source, math.nan) for s in steps), dtype=np.float64, count=steps.size)
        if not logged.all():
            missing[name] = ~logged
    return Record(metrics, None, str(path), missing=missing, log_format=fmt, notes=tuple(notes), skipped=skipped)


def _number(raw: Any) -> float | None | object:
    """A cell as a float; None where nothing was logged; _TEXT where it holds no number.
    ``float`` reads 'NaN', 'inf', 'Infinity' and '-Infinity' as the writers spell them."""
    if raw is None or raw == "":
        return None
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        return _TEXT
    try:
        return float(raw)
    except ValueError:
        return _TEXT


def _is_bookkeeping(name: str) -> bool:
    # Wall-clock, throughput, FLOP and progress counters (HF's eval_runtime, *_samples_per_second,
    # total_flos; W&B's _runtime, _timestamp) and the step columns themselves: no training
    # signal, and they would crowd every listing and error message.
    return (name in STEP_COLUMNS or name.startswith("_") or name.endswith(("_runtime", "_per_second"))
            or name in ("total_flos", "total_steps", "percentage"))  # the last two: LLaMA-Factory's progress


def _rename(path: Path, columns: list[str], mapping: Mapping[str, str]) -> dict[str, str]:
    """source column -> the name it is read under: explicit mapping first, then KNOWN_NAMES."""
    present = set(columns)
    for ours, theirs in mapping.items():
        if theirs not in present:
            raise ConfigError(f"{path}: cannot map {ours}={theirs}: the log has no {theirs!r} column "
                              f"(it has {_listing(columns)})")
    sources = list(mapping.values())
    twice = next((s for s in sources if sources.count(s) > 1), None)
    if twice is not None:
        raise ConfigError(f"{path}: column {twice!r} is mapped twice")
    explicit = {theirs: ours for ours, theirs in mapping.items()}
    # A mapped column replaces a column that already has the name it is mapped to.
    out = {c: explicit.get(c, c) for c in columns if c in explicit or c not in mapping}
    taken = set(out.values())
    for ours, aliases in KNOWN_NAMES.items():
        if ours in taken:
            continue
        alias = next((a for a in aliases if a in out and out[a] == a), None)
        if alias is not None:
            out[alias] = ours
            taken.add(ours)
    return out


def _rows_with_steps(path: Path, fmt: str, rows: list[tuple[dict[str, Any], str]],
                     step_column: str | None) -> tuple[list[_Entry], list[str]]:
    """Attach each row's step: the named step column, else the first of STEP_COLUMNS the
    log has, else the row number."""
    names: dict[str, None] = {}
    for values, _ in rows:
        names.update(dict.fromkeys(values))
    if step_column is None:
        step_column = next((c for c in STEP_COLUMNS if c in names), None)
    elif step_column not in names:
        what = FORMATS[fmt] if fmt == "lightning" else "a step column"
        raise ConfigError(f"{path}: no {step_column!r} column; expected {what} (it has {_listing(names)})")
    if step_column is None:
        return [(n, values, where) for n, (values, where) in enumerate(rows, 1)], [
            "no step column: rows are numbered 1, 2, 3, ... (name one with --map step=COLUMN)"]
    return [(_step(values.get(step_column), path, where, step_column),
             {k: v for k, v in values.items() if k != step_column}, where) for values, where in rows], []


def _listing(names: Iterable[str], limit: int = 12) -> str:
    """Column names for an error message, capped: a W&B export can have hundreds."""
    names = list(names)
    more = f", ... ({len(names) - limit} more)" if len(names) > limit else ""
    return (", ".join(names[:limit]) or "no columns") + more


def _step(raw: Any, path: Path, where: str, column: str = "step") -> int:
    value = _number(raw)
    if value is None or value is _TEXT or not math.isfinite(value) or value != int(value) or value < 0:
        shown = "nothing" if value is None else repr(raw)
        raise ConfigError(f"{path}: {where}: {column!r} holds {shown}, expected a step number (a whole number >= 0)")
    return int(value)


def _text(path: Path, fmt: str) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text; expected {FORMATS[fmt]}") from None


# -- Hugging Face trainer_state.json -----------------------------------------------------------

def _read_hf_trainer(path: Path, text: str, notes: list[str]) -> Iterator[_Entry]:
    expected = FORMATS["hf-trainer"]
    try:
        state = json.loads(text)  # Python's json reads NaN, Infinity and -Infinity as HF writes them
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
                          f"expected {expected}") from None
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list):
        keys = _listing(state) if isinstance(state, dict) else f"a JSON {type(state).__name__}"
        raise ConfigError(f"{path}: no log_history list (it has {keys}); expected {expected}")
    if not history:
        counters = ", ".join(f"{k} {state[k]}" for k in ("global_step", "logging_steps", "max_steps") if k in state)
        raise ConfigError(f"{path}: log_history is empty: the trainer logged nothing"
                          f"{f' ({counters})' if counters else ''}; expected {expected}")
    stepless: list[str] = []
    read = 0
    for i, entry in enumerate(history):
        where = f"log_history[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{path}: {where} is not an object; expected {expected}")
        if "train_runtime" in entry:
            continue  # the end-of-training summary: its train_loss is the mean over the whole run
        if entry.get("step") is None:
            # trainer.predict() / evaluate() outside training append rows with no step: they
            # belong to no point of the training curve.
            stepless.append(where)
            continue
        read += 1
        yield _step(entry.get("step"), path, where), {k: v for k, v in entry.items() if k != "step"}, where
    if stepless and not read:
        raise ConfigError(f"{path}: no log_history entry has a step ({stepless[0]} and {len(stepless) - 1} more); "
                          f"expected {expected}" if len(stepless) > 1 else
                          f"{path}: {stepless[0]} has no step, and no other entry does; expected {expected}")
    if stepless:
        notes.append(f"{len(stepless)} log_history entr{'ies' if len(stepless) > 1 else 'y'} without a step skipped "
                     f"({', '.join(stepless[:3])}{', ...' if len(stepless) > 3 else ''})")


# -- CSV (Lightning, W&B exports, anything with a header) and JSONL -----------------------------

def _csv_rows(path: Path, text: str) -> list[tuple[dict[str, Any], str]]:
    reader = csv.reader(io.StringIO(text, newline=""))  # quoted cells may hold newlines
    header = next(reader, [])
    if len(set(header)) != len(header) or not all(h.strip() for h in header):
        raise ConfigError(f"{path}: line 1 is not a header row (empty or repeated names); expected {FORMATS['csv']}")
    rows = []
    for cells in reader:
        if not any(c.strip() for c in cells):
            continue
        where = f"line {reader.line_num}"
        if len(cells) != len(header):
            raise ConfigError(f"{path}: {where} has {len(cells)} cells but the header has {len(header)}; "
                              f"expected {FORMATS['csv']}")
        rows.append(({h: c.strip() for h, c in zip(header, cells)}, where))
    return rows


def _jsonl_rows(path: Path, text: str) -> list[tuple[dict[str, Any], str]]:
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: line {n} is not valid JSON ({exc.msg}); expected {FORMATS['jsonl']}") from None
        if not isinstance(row, dict):
            raise ConfigError(f"{path}: line {n} is a JSON {type(row).__name__}, not an object; expected {FORMATS['jsonl']}")
        rows.append((row, f"line {n}"))
    return rows


# -- TensorBoard ---------------------------------------------------------------------------------

def _is_event_file(head: bytes) -> bool:
    """A TFRecord whose first record is an Event naming the file version ("brain.Event:2"):
    every TensorBoard writer (TF, torch, tensorboardX) starts a file so."""
    if len(head) < 12:
        return False
    (length,) = struct.unpack("<Q", head[:8])
    return 0 < length < 1024 and b"brain.Event:" in head[12:12 + length]


def _event_files(path: Path) -> list[Path]:
    if path.is_dir():
        # Names start "events.out.tfevents.<unix time>", so name order is write order: a
        # run resumed into the same folder continues in a later file.
        return sorted(p for p in path.iterdir() if p.is_file() and "tfevents" in p.name)
    return [path]


def _complete_records(file: Path, data: bytes, masked_crc32c: Any) -> tuple[int, bool]:
    """(number of complete TFRecord frames, whether they end exactly at the end of the file).
    A length whose checksum fails is corruption, not a file cut short."""
    offset = count = 0
    while offset + 12 <= len(data):
        header = data[offset:offset + 8]
        if struct.unpack_from("<I", data, offset + 8)[0] != masked_crc32c(header):
            raise ConfigError(f"{file}: record {count + 1} is corrupt (length checksum mismatch); "
                              f"expected {FORMATS['tensorboard']}")
        end = offset + 12 + struct.unpack("<Q", header)[0] + 4  # length, its CRC, the event, its CRC
        if end > len(data):
            break
        offset, count = end, count + 1
    return count, offset == len(data)


def _read_tensorboard(path: Path) -> tuple[list[_Entry], list[str]]:
    files = _event_files(path)
    contents = {file: file.read_bytes() for file in files}
    for file, data in contents.items():
        if data.startswith(LFS_POINTER):
            raise _lfs_pointer_error(file)
        if not _is_event_file(data[:2048]):
            raise ConfigError(f"{file}: not a TensorBoard event file; expected {FORMATS['tensorboard']}")
    try:
        from tensorboard import data_compat
        from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
        from tensorboard.compat.proto import event_pb2
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
        from tensorboard.util import tensor_util
    except ImportError:
        raise ConfigError(f"{path}: reading TensorBoard event files needs the tensorboard package: {TENSORBOARD_EXTRA}") from None

    entries: list[_Entry] = []
    notes: list[str] = []
    scalar_tags: set[str] = set()
    for file, data in contents.items():
        complete, ends_cleanly = _complete_records(file, data, masked_crc32c)
        # The loader checks every record's CRC and stops quietly at the first bad one, as
        # TensorBoard does for a file still being written; counting frames tells us where.
        read = 0
        for read, raw in enumerate(RawEventFileLoader(str(file)).Load(), 1):
            # migrate_event turns old-style simple_value scalars into the tensor form.
            event = data_compat.migrate_event(event_pb2.Event.FromString(raw))
            values = {}
            for value in event.summary.value:
                plugin = value.metadata.plugin_data.plugin_name
                # Writers may attach the metadata only to a tag's first value.
                if plugin == "scalars":
                    scalar_tags.add(value.tag)
                elif plugin or value.tag not in scalar_tags:
                    continue
                array = tensor_util.make_ndarray(value.tensor)
                if array.size == 1 and array.dtype.kind in "fiu":
                    values[value.tag] = float(array.reshape(-1)[0])
            if values:
                entries.append((int(event.step), values, f"{file.name} record {read}"))
        if read < complete:
            raise ConfigError(f"{file}: record {read + 1} of {complete} is corrupt (event checksum mismatch); "
                              f"expected {FORMATS['tensorboard']}")
        if not ends_cleanly:
            notes.append(f"{file.name} ends in a partly written record (the writer stopped mid-write); "
                         f"the {complete} complete records before it were read")
    if not entries:
        raise ConfigError(f"{path}: no scalar summaries in {len(files)} event file{'s' if len(files) != 1 else ''}; "
                          f"expected {FORMATS['tensorboard']} with logged scalars")
    return entries, notes


# -- folders -------------------------------------------------------------------------------------

_FOLDER_LOGS = (("trainer_state.json", "hf-trainer"), ("metrics.csv", "lightning"), ("metrics.jsonl", "jsonl"))


def _logs_here(folder: Path) -> list[tuple[str, Path]]:
    found = [("tensorboard", folder)] if any("tfevents" in p.name for p in folder.iterdir() if p.is_file()) else []
    return found + [(fmt, folder / name) for name, fmt in _FOLDER_LOGS if (folder / name).is_file()]


def _checkpoint_number(folder: Path) -> int | None:
    number = folder.name.removeprefix("checkpoint-")
    return int(number) if folder.name.startswith("checkpoint-") and number.isdigit() else None


def find_logs(folder: str | Path) -> list[Path]:
    """The logs a folder holds: its own (TensorBoard event files, read together; a
    trainer_state.json; a metrics.csv; a metrics.jsonl), else those one level down in the
    usual layouts: an HF ``output_dir``'s latest ``checkpoint-N/trainer_state.json`` (each
    checkpoint's state holds the whole history up to it), every ``lightning_logs/version_*``
    and every ``runs/*`` run. A path per log (a folder for TensorBoard event files)."""
    folder = Path(folder)
    here = _logs_here(folder)
    if here:
        if len(here) > 1:
            raise ConfigError(f"{folder}: holds several logs ({', '.join(f'{fmt}: {p.name}' for fmt, p in here)}); name the file")
        return [here[0][1]]
    subfolders = sorted((p for p in folder.iterdir() if p.is_dir()), key=lambda p: p.name)
    checkpoints = [p for p in subfolders if _checkpoint_number(p) is not None and (p / "trainer_state.json").is_file()]
    found = [max(checkpoints, key=_checkpoint_number) / "trainer_state.json"] if checkpoints else []
    for sub in subfolders:
        if _checkpoint_number(sub) is None:
            logs = _logs_here(sub)
            if len(logs) == 1:
                found.append(logs[0][1])
    if not found:
        raise ConfigError(f"{folder}: a folder with no training log; expected TensorBoard event files, "
                          f"trainer_state.json, metrics.csv or metrics.jsonl in it or one level down "
                          f"(checkpoint-*/, version_*/, runs/*/)")
    return found


def _log_in_folder(folder: Path) -> tuple[str, Path]:
    """The one log a folder holds (:func:`find_logs`); several: name one."""
    logs = find_logs(folder)
    if len(logs) > 1:
        shown = ", ".join(str(p.relative_to(folder)) for p in logs[:6]) + (", ..." if len(logs) > 6 else "")
        raise ConfigError(f"{folder}: holds {len(logs)} logs ({shown}); name one (`spikecheck check` checks each)")
    log = logs[0]
    if log.is_dir():
        return "tensorboard", log
    fmt = dict((name, fmt) for name, fmt in _FOLDER_LOGS)[log.name]
    return ("csv" if fmt == "lightning" and detect_format(log) == "csv" else fmt), log
