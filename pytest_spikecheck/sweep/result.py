"""A finished (or interrupted) sweep: its points, their runs, the table and the summaries, and
the files ``spikecheck sweep`` writes (sweep.csv, sweep.json, sweep.md, the panels)."""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.judge.text import fmt, table
from pytest_spikecheck.sweep.spec import Point
from pytest_spikecheck.report.columns import COLUMNS
from pytest_spikecheck.report.summary import Measures
from pytest_spikecheck.sweep.summary import LR, MEASURES, lr_sensitivities, summaries

#: Row statuses: trained now, taken from the run store, raised (or its worker kept dying), not
#: reached before the sweep was stopped.
STATUSES = ("done", "cached", "failed", "not run")
#: Column headings of the point table (the CSV and JSON keep the field names).
_HEADINGS = {
    **{key: COLUMNS[key].heading for key in ("final_eval_loss", "max_attn_logit", "largest_spike_ratio")},
    "recovery": "recovery",
    "status": "status",
    "seconds": "seconds",
}


@dataclass
class SweepResult:
    """The outcome of :func:`~pytest_spikecheck.sweep.sweep`: ``rows`` (one :class:`PointRow` per
    point: its name, the axis values, then :data:`~pytest_spikecheck.sweep.summary.MEASURES`), ``runs``
    (the :class:`~pytest_spikecheck.records.Run` of each point, None where it failed or did not
    run), and the summaries over seeds (:meth:`summaries`, :meth:`lr_sensitivities`)."""

    name: str
    #: The swept fields (``optimizer.lr``, ``seed``, ...), in the grid's order.
    axes: tuple[str, ...]
    #: One :class:`~pytest_spikecheck.sweep.spec.Point` per grid point: its scenario and values.
    points: list[Point]
    rows: list[PointRow]
    runs: list[Any] = field(repr=False)
    #: Which executor ran it (``local``, ``ray``).
    executor: str = ""
    #: Measured, from the plan to the last row.
    wall_seconds: float = math.nan
    #: True when Ctrl-C stopped it: the rows not reached are ``not run``.
    interrupted: bool = False

    @property
    def counts(self) -> Counter[str]:
        """How many points are in each status (done, cached, failed, not run)."""
        return Counter(row["status"] for row in self.rows)

    @property
    def failed(self) -> list[PointRow]:
        return [row for row in self.rows if row["status"] == "failed"]

    def counts_text(self) -> str:
        counts = self.counts
        return ", ".join(f"{counts[s]} {s}" for s in STATUSES if counts[s])

    def summaries(self) -> list[dict[str, Any]]:
        return summaries(self.rows, self.axes)

    def lr_sensitivities(self) -> list[dict[str, Any]]:
        return lr_sensitivities(self.rows, self.axes)

    # -- text ---------------------------------------------------------------------------------
    def table(self, markdown: bool = False) -> str:
        """One row per point: its axis values, final eval loss, max attention logit, largest
        spike ratio, recovery, status, seconds (and the error of a failed point)."""
        headers = ["point", *self.axes, *(_HEADINGS[m] for m in _HEADINGS)]
        errors = any(row["error"] for row in self.rows)
        rows = []
        for row in self.rows:
            cells = [
                row["point"],
                *(_cell(row.get(a)) for a in self.axes),
                *(COLUMNS[key].text(row) for key in ("final_eval_loss", "max_attn_logit", "largest_spike_ratio")),
                _recovery(row),
                row["status"],
                fmt(row["seconds"], ".1f"),
            ]
            rows.append(cells + ([row["error"] or ""] if errors else []))
        return table(headers + (["error"] if errors else []), rows, markdown=markdown)

    def summary_table(self, markdown: bool = False) -> str:
        """Each combination of the axes but ``seed``: the measures as median [min–max] over seeds."""
        found = self.summaries()
        keep = [a for a in self.axes if a != "seed"]
        headers = [
            *keep,
            "points",
            "failed",
            "final eval loss",
            "max attention logit",
            "largest spike ratio",
            "recovery",
            "diverged",
        ]
        rows = [
            [
                *(_cell(s[a]) for a in keep),
                str(s["points"]),
                str(s["failed"]),
                s["final_eval_loss"],
                s["max_attn_logit"],
                s["largest_spike_ratio"],
                s["recovery"],
                s["diverged"],
            ]
            for s in found
        ]
        return table(headers, rows, markdown=markdown)

    def lr_sensitivity_table(self, markdown: bool = False) -> str:
        found = self.lr_sensitivities()
        if not found:
            return ""
        keep = [a for a in self.axes if a not in ("seed", LR)]
        headers = [*keep, "seeds", "LR sensitivity (nats)", "best final eval loss"]
        rows = [
            [
                *(_cell(s[a]) for a in keep),
                str(s["seeds"]) + (f" ({s['incomplete']} incomplete)" if s["incomplete"] else ""),
                s["lr_sensitivity"],
                s["best_final_eval_loss"],
            ]
            for s in found
        ]
        return table(headers, rows, markdown=markdown)

    def markdown(self, panels: Sequence[str] = ()) -> str:
        lrs = self.lr_sensitivity_table(markdown=True)
        parts = [
            f"# Sweep {self.name}",
            "",
            f"{len(self.rows)} points ({self.counts_text()}); executor {self.executor}; wall time "
            f"{fmt(self.wall_seconds, '.0f')} s"
            + (" (interrupted: the points not run are marked)" if self.interrupted else "")
            + ".",
            "",
            "## Summary over seeds (median [min–max])",
            "",
            self.summary_table(markdown=True),
        ]
        if lrs:
            parts += [
                "",
                "## LR sensitivity (Wortsman et al. 2023), median [min–max] over seeds",
                "",
                "The mean over the sweep's learning rates of min(final loss, initial loss) minus the best final loss, per seed.",
                "",
                lrs,
            ]
        parts += [""] + [f"![{Path(p).stem}]({Path(p).name})" for p in panels]
        parts += ["", "## Points", "", self.table(markdown=True), ""]
        return "\n".join(parts)

    # -- files --------------------------------------------------------------------------------
    def json_data(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "executor": self.executor,
            "wall_seconds": _json(self.wall_seconds),
            "interrupted": self.interrupted,
            "axes": list(self.axes),
            "counts": dict(self.counts),
            "rows": [{k: _json(v) for k, v in row.items()} for row in self.rows],
            "summaries": self.summaries(),
            "lr_sensitivity": [
                {k: _json(v) if not isinstance(v, list) else [_json(x) for x in v] for k, v in s.items()}
                for s in self.lr_sensitivities()
            ],
        }

    def write(self, out: str | Path) -> list[Path]:
        """Write sweep.csv, sweep.json, the panels and sweep.md into ``out``; return the paths."""
        from pytest_spikecheck.sweep.panels import draw_panels

        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "sweep.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["point", *self.axes, *MEASURES, "content_hash", "where", "run"])
            writer.writeheader()
            for row in self.rows:
                writer.writerow({k: "" if v is None else v for k, v in row.items()})
        (out / "sweep.json").write_text(json.dumps(self.json_data(), indent=1, ensure_ascii=False))
        panels = draw_panels(self, out)
        (out / "sweep.md").write_text(self.markdown([p.name for p in panels]))
        return [out / "sweep.csv", out / "sweep.json", out / "sweep.md", *panels]


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return format(value, "g")
    return "—" if value is None else str(value)


def _recovery(row: dict[str, Any]) -> str:
    if row["status"] not in ("done", "cached") or not row["is_spike"]:
        return "—"
    return "not back" if row["recovery"] is None else f"{row['recovery']} steps"


def _json(value: Any) -> Any:
    """JSON has no inf or NaN: a diverged run's final loss is null beside ``diverged: true``."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


#: The columns of a row after its measures (MEASURES): the point's content, where it trained,
#: its run's folder under the output folder (None until written).
_TAIL = ("content_hash", "where", "run")


@dataclass(frozen=True)
class PointRow(Mapping[str, Any]):
    """One point of a sweep's table, typed: the point's name, its recipe and axis values, its
    status, and its :class:`~pytest_spikecheck.report.summary.Measures` (the plugin's rows' type,
    filled by the one :func:`~pytest_spikecheck.report.summary.measure`; None where the point was
    not measured: failed or not run). Read as a mapping it is the flat row the files write
    (column -> value in file order: ``point``, the axes, :data:`MEASURES`, ``content_hash``,
    ``where``, ``run``), so ``row["status"]`` and ``row["optimizer.lr"]`` read as they did."""

    point: str
    axis_values: tuple[tuple[str, Any], ...]  # (column, value): the recipe and the axis values
    status: str
    measures: Measures | None = None
    seconds: float | None = None  # a point not measured: its worker's wall time (None: none)
    error: str | None = None
    content_hash: str = ""
    where: str = ""
    run: str | None = None

    @cached_property
    def _columns(self) -> dict[str, Any]:
        return self.columns()

    def columns(self) -> dict[str, Any]:
        """The flat row: column -> value, in the files' order (a new dict)."""
        measured = self.measures.to_json() if self.measures is not None else {}
        row = {"point": self.point, **dict(self.axis_values), **{m: measured.get(m) for m in MEASURES}}
        if self.seconds is not None:
            row["seconds"] = self.seconds
        row.update(
            {"status": self.status, "error": self.error, "content_hash": self.content_hash, "where": self.where, "run": self.run}
        )
        return row

    def __getitem__(self, key: str) -> Any:
        return self._columns[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._columns)

    def __len__(self) -> int:
        return len(self._columns)

    def with_axes(self, axes: Sequence[str], value_of: Any) -> PointRow:
        """This row naming every axis in ``axes``' order; an axis it does not set takes
        ``value_of(axis)`` (its scenario's value)."""
        mine = dict(self.axis_values)
        return replace(self, axis_values=tuple((a, mine[a] if a in mine else value_of(a)) for a in axes))

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> PointRow:
        """A row of sweep.json (or of sweep.csv read as JSON values) back as a typed row: the
        columns between ``point`` and the measures are its axis values; a measured point's
        measures are re-made from their columns (those a sweep row does not keep,
        ``skipped_steps`` and ``loss_scale_min``, are None). A row without ``point`` or
        ``status`` is one line naming what it lacks."""
        missing = [k for k in ("point", "status") if k not in raw]
        if missing:
            raise ConfigError(f"a sweep row needs {' and '.join(missing)}; it has {', '.join(raw) or 'nothing'}")
        known = {"point", *MEASURES, *_TAIL}
        measured = raw["status"] in ("done", "cached")
        measures = Measures(**{f.name: raw.get(f.name) for f in fields(Measures)}) if measured else None
        return cls(
            point=str(raw["point"]),
            axis_values=tuple((k, v) for k, v in raw.items() if k not in known),
            status=str(raw["status"]),
            measures=measures,
            seconds=None if measured else raw.get("seconds"),
            error=raw.get("error"),
            content_hash=str(raw.get("content_hash") or ""),
            where=str(raw.get("where") or ""),
            run=raw.get("run"),
        )


def row_for(
    point: Point,
    status: str,
    measured: Measures | None = None,
    error: str | None = None,
    where: str = "",
    *,
    seconds: float | None = None,
) -> PointRow:
    """A point's typed row: its name, recipe and axis values, its status and measures (None where
    not measured: a failed point has only its ``seconds``)."""
    values = ((("recipe", point.recipe),) if point.recipe is not None else ()) + tuple(point.values)
    return PointRow(
        point.name,
        values,
        status,
        measured,
        seconds=seconds,
        error=error,
        content_hash=point.scenario.content_hash(),
        where=where,
    )
