"""Two runs side by side: the comparison table (spike, jump, recovery, final gap), its panels,
``comparison.md`` and the ``index.html`` page (``spikecheck compare``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from pytest_spikecheck.judge.analysis import EventSummary
from pytest_spikecheck.judge.escape import markdown_text
from pytest_spikecheck.judge.text import fmt, fmt_measure, table
from pytest_spikecheck.records.run import Run
from pytest_spikecheck.report.panels import plot_grad_norm, plot_logits, plot_loss


@dataclass(frozen=True)
class Comparison:
    names: tuple[str, str]
    step: int | None
    summaries: tuple[EventSummary, EventSummary]
    final_gap: float  # final eval loss of B minus A

    def rows(self) -> list[list[str]]:
        out = []
        for name, s in zip(self.names, self.summaries):
            out.append(
                [
                    name,
                    fmt(s.step),
                    f"{fmt_measure(s.ratio, '.1f')}×",
                    fmt(s.post_clip_at_step, ".3g"),
                    fmt_measure(s.loss_jump, "+.3f"),
                    fmt(s.recovery) + (" steps" if s.recovery is not None else " (not back)"),
                    fmt_measure(s.final_eval, ".3f") if s.evaluated else "not evaluated",
                ]
            )
        return out

    HEADERS = ("run", "spike step", "ratio", "post-clip norm", "loss jump", "recovery", "final eval loss")

    def text(self, markdown: bool = False) -> str:
        """The table and the final gap; ``markdown``: as Markdown, every name escaped."""
        body = table(self.HEADERS, self.rows(), markdown=markdown)
        return f"{body}\n\n{markdown_text(self.gap_text()) if markdown else self.gap_text()}"

    def gap_text(self) -> str:
        """The final-gap sentence; a run that was never evaluated has no eval loss to compare."""
        if not all(s.evaluated for s in self.summaries):
            unevaluated = " and ".join(n for n, s in zip(self.names, self.summaries) if not s.evaluated)
            return f"final gap: not measured ({unevaluated} not evaluated; the loss jump and recovery are the train loss's)"
        return f"final gap ({self.names[1]} − {self.names[0]}): {fmt_measure(self.final_gap, '+.3f')} nats"


def compare(run_a: Run, run_b: Run, step: int | None = None) -> Comparison:
    """Measure both runs at the same event step: the declared burst, else B's largest spike."""
    if step is None:
        bursts = sorted(set(run_a.declared_events) | set(run_b.declared_events))
        step = bursts[0] if bursts else EventSummary.measure(run_b.metrics, None).step
    a, b = EventSummary.measure(run_a.metrics, step), EventSummary.measure(run_b.metrics, step)
    gap = b.final_eval - a.final_eval if a.evaluated and b.evaluated else math.nan
    return Comparison(_labels(run_a, run_b), step, (a, b), gap)


def _labels(run_a: Run, run_b: Run) -> tuple[str, str]:
    """The two rows' names; two runs under one name are told apart by their folders' names
    (``hf/ga4/run`` vs ``hf/ga1/run``: ``ga4``, ``ga1``), else as A and B."""
    if run_a.name != run_b.name:
        return run_a.name, run_b.name
    folders = [_folder_label(r) for r in (run_a, run_b)]
    if folders[0] and folders[1] and folders[0] != folders[1]:
        return folders[0], folders[1]
    return f"A: {run_a.name}", f"B: {run_b.name}"


def _folder_label(run: Run) -> str | None:
    """The name of the folder a run was loaded from (its parent's when the folder is an experiment's ``run/``)."""
    folder = getattr(run, "folder", None)
    if folder is None:
        return None
    folder = Path(folder).resolve()
    return folder.parent.name if folder.name == "run" else folder.name


def write_comparison(run_a: Run, run_b: Run, out: str | Path, step: int | None = None) -> tuple[Comparison, list[Path]]:
    """Write loss.png, grad_norm.png (and logits.png where a run has the model's stats),
    comparison.md and index.html into ``out``; return what was measured and the files."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result = compare(run_a, run_b, step)
    marks = [result.step] if result.step is not None else []
    clips = [r.facts.max_norm for r in (run_a, run_b) if r.facts is not None and r.facts.max_norm is not None]
    files = [
        plot_loss([run_a, run_b], out / "loss.png", marks, title=f"Loss: {run_a.name} vs {run_b.name}"),
        plot_grad_norm([run_a, run_b], out / "grad_norm.png", marks, max_norm=min(clips) if clips else None),
    ]
    logits = ""
    if any("attn_logit_max" in r.metrics for r in (run_a, run_b)):
        files.append(plot_logits([run_a, run_b], out / "logits.png"))
        logits = "\n![logits](logits.png)\n"
    md = out / "comparison.md"
    md.write_text(
        f"# {markdown_text(result.names[0])} vs {markdown_text(result.names[1])}\n\n{result.text(markdown=True)}\n\n"
        f"![loss](loss.png)\n\n![grad norm](grad_norm.png)\n{logits}"
    )
    files.append(md)
    page = out / "index.html"
    page.write_text(comparison_page(result, (run_a, run_b), out), encoding="utf-8")
    files.append(page)
    return result, files


def comparison_page(result: Comparison, runs: tuple[Run, Run], out: Path) -> str:
    """The comparison as a self-contained page: the sortable table, the final gap, the panels in
    ``out``, and each run's description, diagnosis at the compared step and reproduce command."""
    from pytest_spikecheck.judge.diagnosis import diagnose
    from pytest_spikecheck.report.page import Cell, diagnosis_block, document, esc, panel, sortable_table

    rows = []
    for texts, s in zip(result.rows(), result.summaries):
        keys = [None, s.step, s.ratio, s.post_clip_at_step, s.loss_jump, s.recovery, s.final_eval]
        rows.append(
            [Cell(texts[0], link=f"#run-{len(rows)}")] + [Cell(t, "" if k is None else k) for t, k in zip(texts[1:], keys[1:])]
        )
    title = f"{result.names[0]} vs {result.names[1]}"
    panels = [
        panel(out / f"{stem}.png", label)
        for stem, label in (("loss", "loss"), ("grad_norm", "gradient norm"), ("logits", "logits"))
        if (out / f"{stem}.png").is_file()
    ]
    parts = [
        f"<h1>{esc(title)}</h1>",
        '<p class="muted">Click a column header to sort.</p>',
        sortable_table(Comparison.HEADERS, rows, table_id="comparison"),
        f"<p>{esc(result.gap_text())}</p>",
        f'<div class="panels">{"".join(panels)}</div>',
    ]
    for i, (label, run) in enumerate(zip(result.names, runs)):
        d = diagnose(run, result.step) if result.step is not None else diagnose(run)
        parts.append(
            f'<section class="scenario" id="run-{i}">\n<h2><span class="name">{esc(label)}</span></h2>\n'
            f"<p>{esc(run.describe())}</p>\n<h3>Diagnosis</h3>\n"
            f"{diagnosis_block({'step': d.step, 'lines': d.lines, 'verdict': d.verdict})}\n"
            f"<h3>Reproduce</h3>\n<pre><code>{esc(run.reproduce_command())}</code></pre>\n</section>"
        )
    return document(title, "\n".join(parts))
