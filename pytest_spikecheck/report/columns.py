"""The one column registry of the summary tables: the plugin's scenario table (terminal,
``index.md``, the job summary, ``index.html``) and the sweep's point table read their columns
from here. A column is its heading, how a row's cell reads, what it sorts by on the page, and
whether a table shows it at all: the columns of a metric (the largest attention logit, the loss
scaler's skipped steps and scale) appear only when a row has that metric, so a QK-Clip run gets
its logit column and a float32 run no loss-scale one."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from pytest_spikecheck.judge.text import MISSING, fmt, fmt_measure, fmt_scale

Row = Mapping[str, Any]


def logit(value: float | None) -> str:
    """An attention logit: 3 significant digits below 1,000, whole numbers with commas above."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def ratio_text(value: float | None) -> str:
    text = fmt_measure(value, ".1f")
    return text if text == MISSING else f"{text}×"


def _number(value: Any) -> float | int | str:
    """A sort key: the number, "" (sorts last) where there is none."""
    if isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value)):
        return value
    return ""


@dataclass(frozen=True)
class Column:
    key: str
    heading: str
    text: Callable[[Row], str]
    sort: Callable[[Row], Any] | None = None  # None: by its text
    #: whether a table of these rows shows the column (default: always)
    shown: Callable[[Sequence[Row]], bool] | None = None

    def applies(self, rows: Sequence[Row]) -> bool:
        return True if self.shown is None else self.shown(rows)


def _has(key: str) -> Callable[[Sequence[Row]], bool]:
    return lambda rows: any(r.get(key) is not None for r in rows)


def _steps(row: Row) -> str:
    return str(row["steps"]) + (f" (stopped: {row['stopped']})" if row.get("stopped") else "")


def _recovery_sort(row: Row) -> Any:
    recovery = row.get("recovery_steps")
    if recovery is None and row.get("spike_step") is not None:
        return math.inf  # a spike that never came back sorts after every recovery
    return "" if recovery is None else recovery


def _skipped(row: Row) -> str:
    steps = row.get("skipped_steps")
    if steps is None:
        return MISSING
    shown = ", ".join(map(str, steps[:5])) + ("…" if len(steps) > 5 else "")
    return f"{len(steps)}" + (f" ({shown})" if steps else "")


#: Every column a summary table can have, by key.
COLUMNS: dict[str, Column] = {
    c.key: c
    for c in (
        Column("scenario", "scenario", lambda r: r["scenario"]),
        Column("steps", "steps", _steps, lambda r: r["steps"]),
        Column("spike_step", "spike step", lambda r: fmt(r.get("spike_step")), lambda r: _number(r.get("spike_step"))),
        Column("spike_ratio", "spike ratio", lambda r: ratio_text(r.get("spike_ratio")), lambda r: _number(r.get("spike_ratio"))),
        Column("containment", "clip containment", lambda r: r.get("containment", MISSING)),
        Column(
            "max_attn_logit",
            "max attention logit",
            lambda r: logit(r.get("max_attn_logit")),
            lambda r: _number(r.get("max_attn_logit")),
            _has("max_attn_logit"),
        ),
        Column(
            "skipped_steps",
            "skipped steps",
            _skipped,
            lambda r: len(r.get("skipped_steps") or ()),
            lambda rows: any(r.get("skipped_steps") or r.get("loss_scale_min") is not None for r in rows),
        ),
        Column(
            "loss_scale_min",
            "min loss scale",
            lambda r: fmt_scale(r.get("loss_scale_min")),
            lambda r: _number(r.get("loss_scale_min")),
            _has("loss_scale_min"),
        ),
        Column("recovery", "recovery", lambda r: r.get("recovery", MISSING), _recovery_sort),
        Column("verdict", "verdict", lambda r: r.get("verdict", "not run")),
        # the sweep's point table
        Column(
            "final_eval_loss",
            "final eval loss",
            lambda r: fmt(r.get("final_eval_loss"), ".3f"),
            lambda r: _number(r.get("final_eval_loss")),
        ),
        Column(
            "largest_spike_ratio",
            "largest spike ratio",
            lambda r: fmt(r.get("largest_spike_ratio"), ".1f"),
            lambda r: _number(r.get("largest_spike_ratio")),
        ),
    )
}

#: The plugin's scenario table, in order (each shown where :meth:`Column.applies`).
SCENARIO_TABLE = (
    "scenario",
    "steps",
    "spike_step",
    "spike_ratio",
    "containment",
    "max_attn_logit",
    "skipped_steps",
    "loss_scale_min",
    "recovery",
    "verdict",
)


def table_columns(rows: Sequence[Row], keys: Sequence[str] = SCENARIO_TABLE) -> list[Column]:
    """The columns of ``keys`` that a table of ``rows`` shows."""
    return [COLUMNS[k] for k in keys if COLUMNS[k].applies(rows)]
