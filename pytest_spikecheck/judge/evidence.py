"""The evidence every assertion's failure carries, and the verdict it makes: a capped table of
the steps around the event (the metric asked about first), a sparkline of that metric, the
diagnosis at the step the failure names, and the command that reproduces the run. numpy only."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from pytest_spikecheck.errors import SpikeCheckError
from pytest_spikecheck.judge.analysis import column
from pytest_spikecheck.judge.text import MISSING, fmt, sparkline, table
from pytest_spikecheck.judge.verdict import Verdict, current_reproduce, emit
from pytest_spikecheck.records import Record

#: The columns a failure's table shows after the metric asked about (those the record has).
TABLE_COLUMNS = ("loss", "eval_loss", "grad_norm_pre", "grad_norm_post", "clip_factor", "grad_norm")
MAX_ROWS = 11


def _diagnosis(rec: Record, step: int, max_norm: float | None) -> tuple[str, dict[str, Any] | None]:
    from pytest_spikecheck.judge.diagnosis import diagnose

    try:
        d = diagnose(rec, step, max_norm=max_norm)
    except Exception as exc:  # the evidence must never hide the assertion itself
        return f"(diagnosis unavailable: {type(exc).__name__}: {exc})", None
    return d.text(), {"step": d.step, "lines": [[str(r), str(f)] for r, f in d.lines], "verdict": d.verdict}


def context(
    rec: Record,
    step: int | None,
    metric: str,
    *,
    diagnose_step: bool = True,
    max_norm: float | None = None,
    columns: Sequence[str] = (),
) -> tuple[str, dict[str, Any] | None]:
    """The evidence appended to a failure (table around ``step``, sparkline of ``metric``, diagnosis,
    reproduce command, the record's source) and the diagnosis as data (None without one)."""
    m = rec.metrics
    parts, diagnosis = [], None
    if step is not None and len(m["step"]):
        steps = np.asarray(m["step"])
        centre = int(np.searchsorted(steps, step))
        lo = max(0, centre - MAX_ROWS // 2)
        idx = range(lo, min(len(steps), lo + MAX_ROWS))
        cols = [c for c in dict.fromkeys((metric, *columns, *TABLE_COLUMNS)) if c in m and c != "step"]
        rows = [
            [("→ " if int(steps[i]) == step else "  ") + str(int(steps[i]))]
            + [MISSING if c in rec.missing and rec.missing[c][i] else fmt(float(m[c][i]), ".4g") for c in cols]
            for i in idx
        ]
        parts.append(table(["step", *cols], rows))
    if metric in m:
        _, values = column(m, metric) if np.isfinite(np.asarray(m[metric], dtype=float)).any() else (None, m[metric])
        parts.append(f"{metric}: {sparkline(values)}")
    if diagnose_step and step is not None:
        text, diagnosis = _diagnosis(rec, step, max_norm)
        parts.append(text)
    cmd = current_reproduce() or rec.reproduce_command()
    if cmd:
        parts.append(f"reproduce: {cmd}")
    parts.append(f"record: {rec.source}")
    return "\n\n".join(parts), diagnosis


def _scenario(rec: Record) -> str | None:
    return getattr(rec.run, "name", None) if rec.run is not None else None


def fail(
    assertion: str,
    headline: str,
    rec: Record,
    step: int | None,
    metric: str,
    *,
    measured: float | None = None,
    limit: float | None = None,
    evidence: bool = True,
    **kwargs: Any,
) -> None:
    """Raise the failure of ``assertion``: ``headline`` (its first line is the verdict's reason),
    then the evidence; the error carries the :class:`Verdict`, which is also emitted."""
    __tracebackhide__ = True
    text, diagnosis = context(rec, step, metric, **kwargs) if evidence else (f"record: {rec.source}", None)
    verdict = emit(
        Verdict(
            assertion,
            False,
            headline.splitlines()[0],
            metric=metric,
            measured=_float(measured),
            limit=_float(limit),
            step=step,
            scenario=_scenario(rec),
            diagnosis=diagnosis,
        )
    )
    raise SpikeCheckError(f"{headline}\n\n{text}", verdict=verdict)


def passed(
    assertion: str,
    reason: str,
    rec: Record,
    metric: str | None,
    *,
    measured: float | None = None,
    limit: float | None = None,
    step: int | None = None,
) -> Verdict:
    """The verdict of an assertion that held (emitted, and returned)."""
    return emit(
        Verdict(
            assertion,
            True,
            reason,
            metric=metric,
            measured=_float(measured),
            limit=_float(limit),
            step=None if step is None else int(step),
            scenario=_scenario(rec),
        )
    )


def _float(value: Any) -> float | None:
    return None if value is None else float(value)
