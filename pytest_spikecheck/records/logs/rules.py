"""The rules every format follows, in one place: a reader's :class:`~.base.Table` becomes one
:class:`~pytest_spikecheck.records.Record` per run (``docs/logs.md`` explains each rule):

- **Steps are the log's own.** A series is indexed by the step numbers the log wrote (a log
  with no step column is numbered 1, 2, 3, ...).
- **A step counter that starts again** (back to the run's first step or below) begins a new
  run or phase: several seeds or stages in one file, each judged on its own. When a column
  named ``epoch`` rises at every such point, the counter counts within an epoch: one run,
  its steps continued across the epochs (the log's own step kept as ``step_in_epoch``).
- **A step that goes back into the run** is a restart from a checkpoint: every step logged at
  or after it before the restart is discarded (the resumed run recomputed them).
- **One step, several rows** merge; a metric logged twice at one step keeps the later value.
- **Missing is not NaN**: an empty cell, a JSON null or an absent key is "not logged"; NaN and
  ±inf are values.
- **Names** (:mod:`.names`) and **skipped steps** (:mod:`.skips`).

numpy only; every pass over the rows is vectorised, so a million-row log assembles in well
under a second.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Mapping

import numpy as np

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.records.logs import names, skips
from pytest_spikecheck.records.logs.base import Column, Table
from pytest_spikecheck.records.facts import RunFacts
from pytest_spikecheck.records.series import Record


def assemble(path: Path, fmt: str, expected: str, table: Table, mapping: Mapping[str, str]) -> list[Record]:
    """The runs of a log, each as a Record (a log with one run gives one)."""
    mapping = dict(mapping)
    step_mapped = mapping.pop("step", None)
    steps, columns, table = _steps(path, fmt, expected, table, step_mapped)
    if steps.size == 0:
        raise ConfigError(f"{path}: no logged steps; expected {expected}")
    skip_rows = dict(table.skipped)
    runs, epoch_note = _runs(steps, columns, table)
    if epoch_note is not None:
        steps, columns["step_in_epoch"] = epoch_note[0], Column(steps.astype(np.float64), np.zeros(steps.size, bool))
    records = []
    for k, (start, stop) in enumerate(runs):
        notes = list(table.notes)
        if epoch_note is not None:
            notes.append(epoch_note[1])
        if len(runs) > 1:
            notes.append(_runs_note(table, steps, runs, k))
        rows = slice(start, stop)
        run_columns = {n: c.take(rows) for n, c in columns.items()}  # rows of the table: offset 0
        source = str(path) if len(runs) == 1 else f"{path} (run {k + 1} of {len(runs)})"
        records.append(
            _one_run(
                path,
                fmt,
                expected,
                source,
                steps[rows],
                run_columns,
                start,
                table,
                mapping,
                notes,
                {r - start: why for r, why in skip_rows.items() if start <= r < stop},
            )
        )
    return records


# -- steps -------------------------------------------------------------------------------------


def _steps(
    path: Path, fmt: str, expected: str, table: Table, step_mapped: str | None
) -> tuple[np.ndarray, dict[str, Column], Table]:
    columns = dict(table.columns)
    if table.steps is not None:
        return np.asarray(table.steps, dtype=np.int64), columns, table
    chosen = step_mapped or table.default_step_column
    if chosen is not None and chosen not in columns:
        what = expected if step_mapped is None else "a step column"
        raise ConfigError(f"{path}: no {chosen!r} column; expected {what} (it has {names.listing(columns)})")
    chosen = chosen or names.step_column(columns)
    if chosen is None:
        table.notes.append("no step column: rows are numbered 1, 2, 3, ... (name one with --map step=COLUMN)")
        return np.arange(1, table.size + 1, dtype=np.int64), columns, table
    column = columns.pop(chosen)
    if column.first_text is None and column.missing.any() and not column.missing.all():
        # Rows that log no step (a JSONL's first line holding the run's config, a CSV's rows with an
        # empty global_step cell) are no training step: left out, the rest read as they are.
        table, columns, column = _without_stepless_rows(table, columns, column, chosen)
    v = column.values
    bad = np.flatnonzero(column.missing | ~np.isfinite(v) | (v < 0) | (v != np.floor(v)))
    if bad.size:
        i = int(bad[0])
        text = column.first_text
        shown = repr(text[1]) if text is not None and text[0] == i else "nothing" if column.missing[i] else column.shown(i)
        raise ConfigError(f"{path}: {table.where(i)}: {chosen!r} holds {shown}, expected a step number (a whole number >= 0)")
    return v.astype(np.int64), columns, table


def _without_stepless_rows(
    table: Table, columns: dict[str, Column], column: Column, name: str
) -> tuple[Table, dict[str, Column], Column]:
    keep = ~column.missing
    rows = np.flatnonzero(keep)
    dropped = np.flatnonzero(~keep)
    where = table.where
    first = where(int(dropped[0]))
    kept_where = lambda i: where(int(rows[i]))  # noqa: E731 - the kept rows keep their own line numbers
    position = {int(r): i for i, r in enumerate(rows.tolist())}
    note = (
        f"{dropped.size} row{'s' if dropped.size != 1 else ''} with no {name!r} (first at {first}) left out: "
        f"a row that logs no step is no training step (a config line, an evaluation row)"
    )

    # A column only those rows hold (a config line's model, seed, ...; an epoch summary's eval_loss) has
    # no value left: it goes with them, said so, rather than stay a series of nothing. A column no row
    # holds (null at every step) is the training rows' own unknown, and stays.
    def held_there(c: Column) -> bool:  # a number or a text cell on a row left out
        return bool((~c.missing[~keep]).any()) or (c.first_text is not None and not keep[c.first_text[0]])

    only_there = [n for n, c in columns.items() if c.missing[keep].all() and held_there(c)]
    if only_there:
        columns = {n: c for n, c in columns.items() if n not in only_there}
        note += f"; so are the columns only they hold ({names.listing(only_there)})"
    new = replace(
        table,
        where=kept_where,
        notes=[*table.notes, note],
        skipped={position[r]: why for r, why in table.skipped.items() if r in position},
        rows=int(rows.size),
    )

    def kept(c: Column) -> Column:
        out = c.take(keep)
        if out.first_text is not None:  # named by its row among the kept ones, as `where` reads them
            out.first_text = (position[out.first_text[0]], out.first_text[1])
        return out

    return new, {n: kept(c) for n, c in columns.items()}, kept(column)


def _runs(
    steps: np.ndarray, columns: dict[str, Column], table: Table
) -> tuple[list[tuple[int, int]], tuple[np.ndarray, str] | None]:
    """Row ranges of the runs, and (continued steps, note) when the counter counts within epochs."""
    back = np.flatnonzero(steps[1:] < steps[:-1]) + 1  # rows whose step is below the previous row's
    starts = [0]
    for r in back:
        # Back to the run's first step or below, or, after 10 rows or more, to within one logged
        # interval of it (nanochat's mid-training counts from 1 after its base training counted from
        # 0): a new run or phase. A resume goes back to a checkpoint, not to the run's first step.
        gaps = np.diff(steps[starts[-1] : r])
        near = int(np.median(gaps)) if gaps.size >= 9 else 0
        if steps[r] <= steps[starts[-1]] + near:
            starts.append(int(r))
    if len(starts) == 1:
        return [(0, steps.size)], None
    epoch_name = next((n for n in columns if names.key(n) == "epoch"), None)
    if epoch_name is not None:
        epoch = columns[epoch_name]
        before = [_last_logged(epoch, s) for s in starts[1:]]
        after = [_first_logged(epoch, s) for s in starts[1:]]
        if all(b is not None and a is not None and a > b for b, a in zip(before, after)):
            continued = steps.copy()
            bounds = starts + [steps.size]
            for a, b in zip(bounds[1:-1], bounds[2:]):
                continued[a:b] += continued[a - 1] + 1 - steps[a]
            note = (
                f"the step counter starts again at each of {len(starts) - 1} epoch boundar"
                f"{'ies' if len(starts) > 2 else 'y'} (first at {table.where(starts[1])}, epoch "
                f"{_fmt(before[0])} -> {_fmt(after[0])}): read as one run, steps continued across epochs "
                f"(the log's own in step_in_epoch)"
            )
            return [(0, steps.size)], (continued, note)
    return list(zip(starts, starts[1:] + [steps.size])), None


def _last_logged(column: Column, before: int) -> float | None:
    logged = np.flatnonzero(~column.missing[:before])
    return float(column.values[logged[-1]]) if logged.size else None


def _first_logged(column: Column, start: int) -> float | None:
    logged = np.flatnonzero(~column.missing[start:])
    return float(column.values[start + logged[0]]) if logged.size else None


def _fmt(x: float | None) -> str:
    return "?" if x is None else (str(int(x)) if x == int(x) else f"{x:g}")


def _runs_note(table: Table, steps: np.ndarray, runs: list[tuple[int, int]], k: int) -> str:
    start, stop = runs[k]
    restarts = ", ".join(f"{table.where(a)} (step {int(steps[a - 1])} -> {int(steps[a])})" for a, _ in runs[1:4])
    more = ", ..." if len(runs) > 4 else ""
    return (
        f"the step counter starts again {len(runs) - 1} time{'s' if len(runs) > 2 else ''} ({restarts}{more}): "
        f"{len(runs)} runs or phases in one file (seeds, stages), each judged on its own, not restarts from a "
        f"checkpoint; this is run {k + 1} of {len(runs)} ({table.where(start)} to {table.where(stop - 1)}, "
        f"steps {int(steps[start])}–{int(steps[stop - 1])})"
    )


def _checkpoint_restarts(steps: np.ndarray, where, offset: int) -> tuple[np.ndarray, list[str]]:
    """Rows that survive the run's restarts from a checkpoint, and a note per restart. A row is
    replaced by the first later restart that goes back to its step or below."""
    back = np.flatnonzero(steps[1:] < steps[:-1]) + 1
    if back.size == 0:
        return np.ones(steps.size, dtype=bool), []
    # the lowest step any later restart goes back to, for every row
    restart_step = np.full(steps.size, np.iinfo(np.int64).max)
    restart_step[back] = steps[back]
    later_min = np.minimum.accumulate(restart_step[::-1])[::-1]
    later_min = np.concatenate([later_min[1:], [np.iinfo(np.int64).max]])
    keep = steps < later_min
    notes = []
    alive = np.unique(steps[: back[0]])
    bounds = list(back) + [steps.size]
    for r, end in zip(back, bounds[1:]):
        s = int(steps[r])
        replaced = int(alive.size - np.searchsorted(alive, s))
        notes.append(
            f"steps go back from {int(steps[r - 1])} to {s} at {where(offset + r)}: read as a restart from a "
            f"checkpoint ({replaced} earlier logged step{'s' if replaced != 1 else ''} from {s} on replaced)"
        )
        alive = np.union1d(alive[alive < s], steps[r:end])
    return keep, notes


# -- one run -----------------------------------------------------------------------------------


def _one_run(
    path: Path,
    fmt: str,
    expected: str,
    source: str,
    steps: np.ndarray,
    columns: dict[str, Column],
    offset: int,
    table: Table,
    mapping: Mapping[str, str],
    notes: list[str],
    skip_rows: dict[int, str],
) -> Record:
    echoed = _echoes(steps, columns)
    if echoed.any():
        # A log that prints its last lines again (a summary at the end of a seed's block) goes back
        # in steps with the very rows it had: read once, not as a restart from a checkpoint.
        first = int(np.flatnonzero(echoed)[0])
        notes.append(
            f"{int(echoed.sum())} row{'s' if echoed.sum() != 1 else ''} repeat earlier rows exactly (first at "
            f"{table.where(offset + first)}, step {int(steps[first])}): an echo of lines already read, read once"
        )
        kept_rows = np.flatnonzero(~echoed)
        skip_rows = {int(np.searchsorted(kept_rows, r)): why for r, why in skip_rows.items() if not echoed[r]}
        steps = steps[~echoed]
        where_kept = table.where
        columns = {n: c.take(~echoed, offset) for n, c in columns.items()}
        for c in columns.values():
            if c.first_text is not None:  # named by its place among the kept rows, as `where` now reads
                c.first_text = (offset + int(np.searchsorted(kept_rows, c.first_text[0] - offset)), c.first_text[1])
        table = replace(table, where=lambda i: where_kept(offset + int(kept_rows[i - offset])) if i >= offset else where_kept(i))
    keep, restart_notes = _checkpoint_restarts(steps, table.where, offset)
    notes += restart_notes
    if not keep.all():
        steps = steps[keep]
        columns = {n: c.take(keep, offset) for n, c in columns.items()}
        rows = np.flatnonzero(keep)
        skip_rows = {int(np.searchsorted(rows, r)): why for r, why in skip_rows.items() if keep[r]}
    # Kept rows ascend (a row before a lower step is replaced), so equal steps are neighbours.
    new_step = np.concatenate([[True], steps[1:] != steps[:-1]])
    unique = steps[new_step]
    group = np.cumsum(new_step) - 1
    for name, column in columns.items():
        if column.first_text is not None and not column.missing.all():
            i, raw = column.first_text
            raise ConfigError(f"{path}: {table.where(i)}: {name!r} holds {raw!r}, not a number (the column is numeric elsewhere)")
    # A column of text (a run name, a tag) is no metric; one that is only empty stays, all missing.
    kept_names = [c for c in columns if columns[c].first_text is None and not names.is_bookkeeping(c)]
    renamed = names.rename(path, kept_names, mapping)
    if not renamed:
        raise ConfigError(f"{path}: no numeric columns besides the step; expected {expected}")
    metrics: dict[str, np.ndarray] = {"step": unique}
    missing: dict[str, np.ndarray] = {}
    for source_name, name in renamed.items():
        values, absent = _last_per_step(columns[source_name], group, unique.size)
        metrics[name] = values
        if absent.any():
            missing[name] = absent
    skipped = {int(steps[r]): why for r, why in sorted(skip_rows.items())}
    skipped, skip_notes = skips.infer(metrics, missing, skipped, table.fp16)
    notes += skip_notes
    facts = RunFacts(source="log", **table.facts) if table.facts else None
    return Record(metrics, None, source, missing=missing, log_format=fmt, notes=tuple(notes), skipped=skipped, facts=facts)


def _echoes(steps: np.ndarray, columns: dict[str, Column]) -> np.ndarray:
    """The run's last rows when they go back in steps (at or below an earlier row's step) and each
    equal an earlier row in its step and every value (missing and NaN alike): a log that prints its
    last lines again. Only that tail is compared, against the earlier rows of its steps."""
    n = steps.size
    echo = np.zeros(n, dtype=bool)
    back = steps <= np.concatenate([[np.iinfo(np.int64).min], np.maximum.accumulate(steps)[:-1]])
    if n == 0 or not back[-1]:
        return echo
    start = n - int(np.argmin(back[::-1])) if not back.all() else 1  # the suffix of rows that go back
    cells = [steps.astype(np.float64)] + [
        np.where(c.missing, -np.inf, np.where(np.isnan(c.values), np.inf, c.values)) for c in columns.values()
    ]
    rows = np.stack(cells, axis=1)
    earlier = np.flatnonzero(np.isin(steps[:start], steps[start:]))
    seen = {rows[i].tobytes() for i in earlier.tolist()}
    tail = np.array([rows[i].tobytes() in seen for i in range(start, n)], dtype=bool)
    if tail.all():  # every row of the tail repeats an earlier one: an echo (any other row: a restart)
        echo[start:] = True
    return echo


def _last_per_step(column: Column, group: np.ndarray, groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Per step, the value of the last row that logged one (NaN and True where none did)."""
    if groups == group.size:  # one row a step: nothing to merge
        return np.where(column.missing, np.nan, column.values), column.missing.copy()
    values = np.full(groups, np.nan)
    absent = np.ones(groups, dtype=bool)
    logged = np.flatnonzero(~column.missing)
    if logged.size:
        g = group[logged]  # non-decreasing: rows ascend by step
        last = logged[np.concatenate([np.flatnonzero(g[1:] != g[:-1]), [g.size - 1]])]
        values[group[last]] = column.values[last]
        absent[group[last]] = False
    return values, absent
