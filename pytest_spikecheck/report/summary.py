"""A session's summary: one row per scenario (measured from its run), the verdict of the tests
that used it, and the text forms of the table: the terminal's, ``index.md`` and the Markdown of
GitHub's job summary. Rows are JSON-able: xdist workers send them to the controller as they are.
The HTML page (:mod:`pytest_spikecheck.report.page`) renders the same rows and cells."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping
from urllib.parse import quote

import numpy as np

from pytest_spikecheck.judge.analysis import EventSummary, clip_limits, contained, overclipped
from pytest_spikecheck.judge.diagnosis import diagnosis_markdown
from pytest_spikecheck.judge.escape import markdown_cell, markdown_text
from pytest_spikecheck.judge.text import MISSING, fmt, fmt_measure, table
from pytest_spikecheck.records import as_record

HEADERS = ("scenario", "steps", "spike step", "spike ratio", "clip containment", "recovery", "verdict")
#: Where a worker got a scenario's run, and how the counts sentence says it.
SOURCES = {"trained": "trained", "worker": "loaded from another worker", "disk": "from the disk cache"}
#: Verdicts in the order failures-first pages list them.
VERDICT_ORDER = ("FAIL", "not run", "skipped", "pass")


@dataclass
class ScenarioRow:
    """One scenario of the summary: its measures, where its run came from, and what a reader
    needs to act on it (its description, diagnosis and the command that reproduces it)."""

    scenario: str
    steps: int
    spike_step: int | None
    spike_ratio: float
    containment: str
    recovery: str
    source: str = "trained"  # a key of SOURCES
    stopped: str | None = None
    not_cached_because: str | None = None  # why a run of this scenario is never cached on disk
    content_hash: str = ""
    recovery_steps: int | None = None  # steps back within 1.10x of the pre-spike loss (None: no spike or not back)
    description: str = ""
    reproduce: str = ""
    #: the diagnosis ladder at the largest event: {"step": int | None, "lines": [[rung, finding]], "verdict": str}
    diagnosis: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def containment(run: Any) -> str:
    """The summary's clip-containment cell: did the post-clip norm stay under the limit, and
    not scale below it (over-clipped)? Steps whose update was skipped are left out. The limit
    is the record's (:func:`~pytest_spikecheck.judge.analysis.clip_limits`), judged by the one
    rule of containment (:func:`~pytest_spikecheck.judge.analysis.contained`)."""
    rec = as_record(run)
    applied = ~np.isin(run.metrics["step"], np.fromiter(run.skipped, dtype=np.int64, count=len(run.skipped)))
    post = np.asarray(run.metrics["grad_norm_post"], dtype=float)[applied]
    pre = np.asarray(run.metrics["grad_norm_pre"], dtype=float)[applied]
    finite = post[np.isfinite(post)]
    worst = fmt(float(finite.max()), ".3g") if finite.size else "—"
    clip = run.facts.clip if run.facts is not None else None
    if clip is not None and clip.kind == "adaptive":
        return f"adaptive (max {worst})"
    limits = clip_limits(rec)
    if limits is None:
        return "clip not recorded"
    limits = limits[applied]
    if not np.isfinite(limits).any():
        return "no clip"
    max_norm = float(np.max(limits[np.isfinite(limits)]))
    if run.stopped_early and finite.size < post.size:
        return f"n/a (non-finite at step {run.meta['stopped_at']})"
    if not bool(np.all(contained(post, limits))):
        return f"BROKEN (max {worst} > {max_norm:g})"
    under = overclipped(pre, post, limits)
    if under.any():
        return f"OVER-CLIPPED (min {fmt(float(post[under].min()), '.2g')} for max_norm {max_norm:g})"
    return f"held (max {worst} ≤ {max_norm:g})"


def summarise(run: Any, cached: bool = False, *, source: str | None = None) -> ScenarioRow:
    """The row of ``run``. ``source`` says where it came from (``cached=True`` is ``"disk"``)."""
    from pytest_spikecheck.judge.diagnosis import diagnose

    bursts = run.declared_events
    s = EventSummary.measure(run.metrics, bursts[0] if bursts else None)
    recovery = "—" if s.step is None else (f"{s.recovery} steps" if s.recovery is not None else "not back")
    d = diagnose(run)
    return ScenarioRow(
        scenario=run.name, steps=len(run), spike_step=s.step,
        # a step the loss scaler skipped has the overflow's norm, not the data's: no ratio to show
        spike_ratio=math.nan if str(run.skipped.get(s.step, "")).startswith("overflow") else s.ratio,
        containment=containment(run), recovery=recovery, source=source or ("disk" if cached else "trained"),
        stopped=run.meta["stop_reason"] if run.stopped_early else None,
        content_hash=run.meta.get("content_hash") or "",
        recovery_steps=s.recovery if s.step is not None else None,
        description=run.describe(), reproduce=run.reproduce_command(),
        diagnosis={"step": d.step, "lines": [[str(r), str(f)] for r, f in d.lines], "verdict": d.verdict},
    )


def verdict_of(outcomes: Iterable[str]) -> str:
    """A scenario's verdict from the outcomes (passed, failed, skipped) of the tests that used it."""
    outcomes = list(outcomes)
    if not outcomes:
        return "not run"
    if "failed" in outcomes:
        return "FAIL"
    if all(o == "skipped" for o in outcomes):
        return "skipped"
    return "pass"


def failures_first(rows: Mapping[str, Mapping[str, Any]], verdicts: Mapping[str, str]) -> list[str]:
    """Scenario names, failures first (then not run, skipped, passed), by name within each."""
    rank = {v: i for i, v in enumerate(VERDICT_ORDER)}
    return sorted(rows, key=lambda name: (rank.get(verdicts.get(name, "not run"), 1), name))


def ratio_text(value: float | None) -> str:
    text = fmt_measure(value, ".1f")
    return text if text == MISSING else f"{text}×"


def cells(row: Mapping[str, Any], verdict: str) -> list[str]:
    """The row's cells under :data:`HEADERS`, as every form of the table prints them."""
    steps = str(row["steps"]) + (f" (stopped: {row['stopped']})" if row.get("stopped") else "")
    return [row["scenario"], steps, fmt(row["spike_step"]), ratio_text(row["spike_ratio"]), row["containment"],
            row["recovery"], verdict]


def counts_sentences(rows: Mapping[str, Any], counts: Mapping[str, int], verdicts: Mapping[str, str], *,
                     workers: bool, terminal: bool = True) -> list[str]:
    """``5 scenarios checked (5 trained, 0 from the disk cache).`` and ``4 held, 1 failed.``: how
    each worker got its runs (with ``workers``, the runs loaded from another xdist worker too).
    On the ``terminal``, failures point up at pytest's failure reports."""
    n = len(rows)
    shown = [key for key in SOURCES if key != "worker" or workers]
    sources = ", ".join(f"{counts.get(key, 0)} {SOURCES[key]}" for key in shown)
    held, failed = list(verdicts.values()).count("pass"), list(verdicts.values()).count("FAIL")
    return [f"{n} scenario{'s' if n != 1 else ''} checked ({sources}).",
            f"{held} held, {failed} failed{' (see the failures above)' if failed and terminal else ''}."]


#: Names in a report folder that are the report's own files, never a scenario's folder.
RESERVED_NAMES = ("index.html", "index.md")


def folder_name(name: str) -> str:
    """A scenario's report folder: its name, unless the name holds a character that is unsafe in a
    path on some system (``/ \\ : * ? " < > |``, control characters, a leading dot), is empty, or
    is one of the report's own files (:data:`RESERVED_NAMES`); such a name gets them replaced by
    ``_`` and 8 hex digits of its sha256 (so two names never share one, and none is the report's
    root or its page)."""
    safe = re.sub(r'[\x00-\x1f\x7f/\\:*?"<>|]', "_", name)
    safe = "_" + safe[1:] if safe.startswith(".") else safe
    if safe == name and 0 < len(name) <= 150 and name.lower() not in RESERVED_NAMES:
        return name
    return f"{safe[:150]}~{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def href(name: str, *parts: str) -> str:
    """A relative link into a scenario's report folder (percent-encoded)."""
    return "/".join(quote(p) for p in (folder_name(name), *parts))




def index_markdown(rows: Mapping[str, Mapping[str, Any]], verdicts: Mapping[str, str]) -> str:
    """``index.md`` of a report folder: the table (each name linking to its diagnosis), then each
    scenario's panels and files."""
    lines = ["# spikecheck report", "", "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for name in sorted(rows):
        first, *rest = [markdown_cell(c) for c in cells(rows[name], verdicts.get(name, "not run"))]
        lines.append(f"| [{first}]({href(name, 'diagnosis.md')}) | " + " | ".join(rest) + " |")
    lines.append("")
    for name in sorted(rows):
        lines += [f"## {markdown_text(name)}", "", f"![loss]({href(name, 'loss.png')})", "",
                  f"![grad norm]({href(name, 'grad_norm.png')})", "",
                  f"[diagnosis]({href(name, 'diagnosis.md')}) · [metrics]({href(name, 'run', 'metrics.jsonl')}) · "
                  f"[summary]({href(name, 'summary.json')})", ""]
    return "\n".join(lines)


def job_summary_markdown(rows: Mapping[str, Mapping[str, Any]], verdicts: Mapping[str, str],
                         sentences: Iterable[str]) -> str:
    """The Markdown a GitHub Actions job summary (``$GITHUB_STEP_SUMMARY``) gets: the counts, the
    table (failures first), and each failed scenario's diagnosis in a ``<details>`` block."""
    names = failures_first(rows, verdicts)
    body = table(HEADERS, [cells(rows[n], verdicts.get(n, "not run")) for n in names], markdown=True)
    out = ["## spikecheck", "", *(f"{s}  " for s in sentences), "", body, ""]
    for name in names:
        if verdicts.get(name) != "FAIL":
            continue
        row = rows[name]
        verdict = (row.get("diagnosis") or {}).get("verdict") or "no spike found"
        out += [f"<details><summary><b>{markdown_text(name)}</b>: FAIL; {markdown_text(verdict)}</summary>", "",
                markdown_text(row.get("description", "")), "", diagnosis_markdown(row.get("diagnosis")),
                f"Reproduce: <code>{markdown_text(row.get('reproduce', ''))}</code>", "", "</details>", ""]
    return "\n".join(out)
