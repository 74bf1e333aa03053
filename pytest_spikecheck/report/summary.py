"""A session's summary: one row per scenario (measured from its run), the verdict of the tests
that used it, and the text forms of the table: the terminal's, ``index.md`` and the Markdown of
GitHub's job summary. Rows are JSON-able: xdist workers send them to the controller as they are.
The HTML page (:mod:`pytest_spikecheck.report.page`) renders the same rows and cells."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Mapping
from urllib.parse import quote

import numpy as np

from pytest_spikecheck.judge.analysis import EventSummary, clip_limits, contained, largest_spike, overclipped, recovery_steps
from pytest_spikecheck.judge.defences import QK_CLIP_FACTOR, grad_clip_adaptive, qk_clip_tau
from pytest_spikecheck.judge.diagnosis import diagnosis_markdown
from pytest_spikecheck.judge.escape import markdown_cell, markdown_text
from pytest_spikecheck.judge.sweeps import final_loss, initial_loss
from pytest_spikecheck.judge.text import fmt, table
from pytest_spikecheck.records import as_record
from pytest_spikecheck.report.columns import COLUMNS, SCENARIO_TABLE, logit, table_columns
from pytest_spikecheck.scenario.sections import RecordSpec

#: The headings of the scenario table's columns that every table shows (a metric's columns join
#: them where a row has the metric: :mod:`pytest_spikecheck.report.columns`).
HEADERS = tuple(COLUMNS[k].heading for k in SCENARIO_TABLE if COLUMNS[k].shown is None)
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
    max_attn_logit: float | None = None  # the largest attention logit (None: the model does not report it)
    final_eval_loss: float | None = None
    skipped_steps: list[int] | None = None  # the steps whose update was skipped (None: the run skips none)
    loss_scale_min: float | None = None  # the smallest loss scale (None: no loss scaler)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def containment(run: Any) -> str:
    """The summary's containment cell, one part per defence the run had, each naming its clip:
    ``gradient norm: held (max 1 ≤ 1)``, and where QK-Clip was on ``QK-Clip τ 100: held (max 148 ≤
    2τ)``. The gradient-norm part says whether the post-clip norm stayed under the limit and did
    not scale below it (over-clipped); steps whose update was skipped are left out. The limit is
    the record's (:func:`~pytest_spikecheck.judge.analysis.clip_limits`), judged by the one rule of
    containment (:func:`~pytest_spikecheck.judge.analysis.contained`)."""
    parts = [f"gradient norm: {_grad_containment(run)}"]
    tau = qk_clip_tau(run)
    if tau is not None:
        parts.append(f"QK-Clip τ {tau:g}: {_qk_containment(run, tau)}")
    return "; ".join(parts)


def _qk_containment(run: Any, tau: float) -> str:
    m = run.metrics
    if "attn_logit_max" not in m or "qk_clipped_heads" not in m:
        return "not measured (no attention logits)"
    logits = np.asarray(m["attn_logit_max"], dtype=float)
    clipped = np.asarray(m["qk_clipped_heads"], dtype=float)
    acted = np.flatnonzero((np.nan_to_num(clipped) > 0) | ~(logits <= tau))
    if not acted.size:
        return f"never acted (max {logit(float(np.nanmax(logits)) if logits.size else None)} ≤ τ)"
    later = logits[acted[0] + 1 :]
    worst = float(np.max(np.where(np.isnan(later), np.inf, later))) if later.size else None
    if worst is not None and not worst <= QK_CLIP_FACTOR * tau:
        return f"BROKEN (max {logit(worst)} > {QK_CLIP_FACTOR:g}τ after step {int(m['step'][acted[0]])})"
    return f"held (max {logit(worst)} ≤ {QK_CLIP_FACTOR:g}τ)"


def _grad_containment(run: Any) -> str:
    rec = as_record(run)
    applied = ~np.isin(run.metrics["step"], np.fromiter(run.skipped, dtype=np.int64, count=len(run.skipped)))
    post = np.asarray(run.metrics["grad_norm_post"], dtype=float)[applied]
    pre = np.asarray(run.metrics["grad_norm_pre"], dtype=float)[applied]
    finite = post[np.isfinite(post)]
    worst = fmt(float(finite.max()), ".3g") if finite.size else "—"
    if grad_clip_adaptive(run):
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


@dataclass(frozen=True)
class Measures:
    """A run's numbers, the one typed row of measures that both the plugin's rows
    (:class:`ScenarioRow`, :func:`summarise`) and the sweep's point rows
    (:func:`~pytest_spikecheck.sweep.result.row_for`) are filled from (:func:`measure`)."""

    final_eval_loss: float  # inf when it diverged, as the LR sweeps count it
    initial_loss: float
    max_attn_logit: float | None  # None without the column
    largest_spike_ratio: float | None  # the largest pre-clip grad-norm spike ratio
    spike_step: int | None
    is_spike: bool  # the ratio is at least the run's detector ratio
    recovery: int | None  # steps to recover from the spike (None: not back, or no spike)
    diverged: bool  # stopped on a non-finite value
    seconds: float  # wall time
    skipped_steps: list[int] | None  # None: the run skips none (and has no loss scaler)
    loss_scale_min: float | None  # None without a loss scaler

    def to_json(self) -> dict[str, Any]:
        """The measures by name, in field order (a sweep row's columns)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def measure(run: Any) -> Measures:
    """A run's numbers, as the sweep's point table and the plugin's rows take them: the final
    eval loss (inf when it diverged, as the LR sweeps count it), the loss at initialisation, the
    largest |attention logit| (None without the column), the largest pre-clip grad-norm spike
    ratio and its step, the steps to recover from it when it is a spike (at least the scenario's
    ``record.spike_ratio``, 5× by default; None: not back within the horizon, or no spike),
    whether it stopped on a non-finite value, its wall time, the steps whose update was skipped
    and the smallest loss scale (None without a loss scaler)."""
    metrics = run.metrics
    step, ratio = largest_spike(metrics)
    attn = np.asarray(metrics["attn_logit_max"], dtype=np.float64) if "attn_logit_max" in metrics else None
    has_eval = "eval_loss" in metrics and np.isfinite(np.asarray(metrics["eval_loss"], dtype=np.float64)).any()
    recovery = None
    # recovery from a spike, not from noise: at the ratio the run's own detector used (its facts'
    # spike_ratio), else (unknown: a log, a folder by hand) the engine's default
    said = run.facts.spike_ratio if run.facts is not None else None
    is_spike = step is not None and ratio >= (said if said is not None else RecordSpec().spike_ratio)
    if is_spike:
        recovery = recovery_steps(metrics, step) if has_eval else recovery_steps(metrics, step, name="loss")
    scale = np.asarray(metrics["loss_scale"], dtype=np.float64) if "loss_scale" in metrics else None
    scale = scale[np.isfinite(scale)] if scale is not None else None
    return Measures(
        final_eval_loss=final_loss(run),
        initial_loss=initial_loss(run),
        max_attn_logit=float(np.nanmax(attn)) if attn is not None and np.isfinite(attn).any() else None,
        largest_spike_ratio=ratio if math.isfinite(ratio) else None,
        spike_step=step,
        is_spike=is_spike,
        recovery=recovery,
        diverged=bool(run.stopped_early),
        seconds=float(run.meta.get("seconds", math.nan)),
        skipped_steps=sorted(int(k) for k in run.skipped) if (run.skipped or scale is not None) else None,
        loss_scale_min=float(scale.min()) if scale is not None and scale.size else None,
    )


def summarise(run: Any, cached: bool = False, *, source: str | None = None) -> ScenarioRow:
    """The row of ``run``. ``source`` says where it came from (``cached=True`` is ``"disk"``)."""
    from pytest_spikecheck.judge.diagnosis import diagnose

    bursts = run.declared_events
    s = EventSummary.measure(run.metrics, bursts[0] if bursts else None)
    measured = measure(run)
    recovery = "—" if s.step is None else (f"{s.recovery} steps" if s.recovery is not None else "not back")
    d = diagnose(run)
    return ScenarioRow(
        scenario=run.name,
        steps=len(run),
        spike_step=s.step,
        # a step the loss scaler skipped has the overflow's norm, not the data's: no ratio to show
        spike_ratio=math.nan if str(run.skipped.get(s.step, "")).startswith("overflow") else s.ratio,
        containment=containment(run),
        recovery=recovery,
        source=source or ("disk" if cached else "trained"),
        stopped=run.meta["stop_reason"] if run.stopped_early else None,
        content_hash=run.meta.get("content_hash") or "",
        recovery_steps=s.recovery if s.step is not None else None,
        description=run.describe(),
        reproduce=run.reproduce_command(),
        diagnosis={"step": d.step, "lines": [[str(r), str(f)] for r, f in d.lines], "verdict": d.verdict},
        max_attn_logit=measured.max_attn_logit,
        final_eval_loss=measured.final_eval_loss if math.isfinite(measured.final_eval_loss) else None,
        skipped_steps=measured.skipped_steps,
        loss_scale_min=measured.loss_scale_min,
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


def headers(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """The headings of the table of ``rows``: :data:`HEADERS` and the columns of their metrics."""
    return [c.heading for c in table_columns(list(rows))]


def cells(row: Mapping[str, Any], verdict: str, rows: Iterable[Mapping[str, Any]] | None = None) -> list[str]:
    """The row's cells under the headings of the table of ``rows`` (default: the row alone), as
    every form of the table prints them."""
    full = {**row, "verdict": verdict}
    return [c.text(full) for c in table_columns(list(rows) if rows is not None else [row])]


def summary_table(
    rows: Mapping[str, Mapping[str, Any]], verdicts: Mapping[str, str], markdown: bool = False, order: Iterable[str] | None = None
) -> str:
    """The scenario table (plain or Markdown), each scenario under the columns of every row."""
    names = sorted(rows) if order is None else list(order)
    all_rows = list(rows.values())
    # table() escapes each cell for where it is shown (Markdown or a terminal)
    return table(headers(all_rows), [cells(rows[n], verdicts.get(n, "not run"), all_rows) for n in names], markdown=markdown)


def tests_lines(tests: Iterable[Mapping[str, Any]], verbose: bool = True) -> list[str]:
    """The terminal's lines per test: ``FAIL tests/test_x.py::test_y (scenario s)``, then each
    assertion's verdict, and the reproduce line of a failed test. Not ``verbose``: the tests
    that did not fail are counted, not listed."""
    tests = list(tests)
    counts = Counter(t["outcome"] for t in tests)
    lines = [f"tests ({', '.join(f'{n} {o}' for o, n in sorted(counts.items()))}):"]
    hidden = [t for t in tests if not verbose and t["outcome"] != "failed"]
    for t in tests:
        if t in hidden:
            continue
        outcome = {"failed": "FAIL", "passed": "pass"}.get(t["outcome"], t["outcome"])
        scenarios = f" (scenario {', '.join(t['scenarios'])})" if t["scenarios"] else ""
        lines.append(f"{outcome} {t['nodeid']}{scenarios}")
        for v in t["verdicts"]:
            lines.append(f"    {'pass' if v['passed'] else 'FAIL'} {v['assertion']}: {v['reason']}")
        if t["outcome"] == "failed" and not any(not v["passed"] for v in t["verdicts"]) and t.get("failure"):
            lines.append(f"    FAIL {t['failure']}")
        if t["outcome"] == "failed":
            lines.append(f"    reproduce: {t['reproduce']}")
    if hidden and len(hidden) == len(tests):  # nothing to list: the count says it
        return [lines[0].removesuffix(":") + " (-v lists each with its assertions' verdicts)"]
    if hidden:
        lines.append(f"({len(hidden)} more that did not fail: -v lists each with its assertions' verdicts)")
    return lines


def counts_sentences(
    rows: Mapping[str, Any], counts: Mapping[str, int], verdicts: Mapping[str, str], *, workers: bool, terminal: bool = True
) -> list[str]:
    """``5 scenarios checked (5 trained, 0 from the disk cache).`` and ``4 held, 1 failed.``: how
    each worker got its runs (with ``workers``, the runs loaded from another xdist worker too).
    On the ``terminal``, failures point up at pytest's failure reports."""
    n = len(rows)
    shown = [key for key in SOURCES if key != "worker" or workers]
    sources = ", ".join(f"{counts.get(key, 0)} {SOURCES[key]}" for key in shown)
    held, failed = list(verdicts.values()).count("pass"), list(verdicts.values()).count("FAIL")
    return [
        f"{n} scenario{'s' if n != 1 else ''} checked ({sources}).",
        f"{held} held, {failed} failed{' (see the failures above)' if failed and terminal else ''}.",
    ]


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
    heads = headers(rows.values())
    lines = ["# spikecheck report", "", "| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for name in sorted(rows):
        first, *rest = [markdown_cell(c) for c in cells(rows[name], verdicts.get(name, "not run"), rows.values())]
        lines.append(f"| [{first}]({href(name, 'diagnosis.md')}) | " + " | ".join(rest) + " |")
    lines.append("")
    for name in sorted(rows):
        lines += [
            f"## {markdown_text(name)}",
            "",
            f"![loss]({href(name, 'loss.png')})",
            "",
            f"![grad norm]({href(name, 'grad_norm.png')})",
            "",
            *([f"![attention logits]({href(name, 'logits.png')})", ""] if rows[name].get("max_attn_logit") is not None else []),
            f"[diagnosis]({href(name, 'diagnosis.md')}) · [metrics]({href(name, 'run', 'metrics.jsonl')}) · "
            f"[summary]({href(name, 'summary.json')})",
            "",
        ]
    return "\n".join(lines)


def failed_verdict(test: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The first failed assertion verdict of a test result, None when none failed."""
    return next((v for v in test.get("verdicts", ()) if not v["passed"]), None)


def test_headline(test: Mapping[str, Any]) -> str:
    """A failed test in one line: its failed assertion and reason, else its error's first line."""
    v = failed_verdict(test)
    if v is not None:
        return f"{v['assertion']}: {v['reason']}"
    return test.get("failure") or test.get("outcome", "")


def tests_markdown(tests: Iterable[Mapping[str, Any]]) -> str:
    """The job summary's table of tests: each test, its scenarios, outcome and assertions."""
    rows = []
    for t in tests:
        outcome = {"failed": "FAIL", "passed": "pass"}.get(t["outcome"], t["outcome"])
        said = "; ".join(f"{'pass' if v['passed'] else 'FAIL'} {v['assertion']}: {v['reason']}" for v in t["verdicts"])
        rows.append([t["nodeid"], ", ".join(t["scenarios"]), outcome, said or (t.get("failure") or "")])  # table() escapes
    return table(["test", "scenario", "verdict", "assertions"], rows, markdown=True)


def job_summary_markdown(
    rows: Mapping[str, Mapping[str, Any]],
    verdicts: Mapping[str, str],
    sentences: Iterable[str],
    tests: Iterable[Mapping[str, Any]] = (),
) -> str:
    """The Markdown a GitHub Actions job summary (``$GITHUB_STEP_SUMMARY``) gets: the counts, the
    table (failures first), the tests with their assertions' verdicts, and a ``<details>`` block
    per failed test (its headline is the failed assertion's reason; the diagnosis is at the step
    that assertion names) or, for a failed scenario no test result names, per scenario."""
    tests = list(tests)
    names = failures_first(rows, verdicts)
    out = ["## spikecheck", ""]
    if rows:
        out += [*(f"{s}  " for s in sentences), "", summary_table(rows, verdicts, True, names), ""]
    if tests:
        out += [tests_markdown(tests), ""]
    explained: set[str] = set()
    for t in tests:
        if t["outcome"] != "failed":
            continue
        v = failed_verdict(t)
        scenario = (v or {}).get("scenario") or (t["scenarios"][0] if t["scenarios"] else None)
        row = rows.get(scenario, {}) if scenario is not None else {}
        explained.update(t["scenarios"])
        diagnosis = (v or {}).get("diagnosis") or row.get("diagnosis")
        about = f" ({markdown_text(', '.join(t['scenarios']))})" if t["scenarios"] else ""
        out += [
            f"<details><summary><b>{markdown_text(t['nodeid'])}</b>{about}: FAIL; {markdown_text(test_headline(t))}</summary>",
            "",
            markdown_text(row.get("description", "")),
            "",
            diagnosis_markdown(diagnosis),
            f"Reproduce: <code>{markdown_text(t['reproduce'])}</code>",
            "",
            "</details>",
            "",
        ]
    for name in names:
        if verdicts.get(name) != "FAIL" or name in explained:
            continue
        row = rows[name]
        verdict = (row.get("diagnosis") or {}).get("verdict") or "no spike found"
        out += [
            f"<details><summary><b>{markdown_text(name)}</b>: FAIL; {markdown_text(verdict)}</summary>",
            "",
            markdown_text(row.get("description", "")),
            "",
            diagnosis_markdown(row.get("diagnosis")),
            f"Reproduce: <code>{markdown_text(row.get('reproduce', ''))}</code>",
            "",
            "</details>",
            "",
        ]
    return "\n".join(out)
