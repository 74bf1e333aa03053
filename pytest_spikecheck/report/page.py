"""``index.html``: one self-contained page to open from a CI artifact. The panels are inlined
as data URIs, the style and the table-sorting script are inline and pinned by the page's
Content-Security-Policy (their sha256), so the page loads nothing from anywhere and no other
script can run in it. Every string that comes from a scenario or a log (names, descriptions,
diagnosis findings with their token strings, reproduce commands) goes through :func:`esc`.

:func:`scenario_page` is the plugin's report (``--spikecheck-report DIR``): the summary table,
sortable by clicking a header, then one section per scenario, failures first, with its panels,
diagnosis, verdict and reproduce command. ``spikecheck compare`` builds its page from the same
parts (:func:`document`, :func:`sortable_table`, :func:`panel`, :func:`diagnosis_block`)."""

from __future__ import annotations

import base64
import hashlib
import html
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from pytest_spikecheck import __version__
from pytest_spikecheck.report.columns import table_columns
from pytest_spikecheck.report.summary import VERDICT_ORDER, failed_verdict, failures_first, folder_name, href, test_headline

PAGE = "index.html"

_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1280px; padding: 0 1em; color: #1b1b1b; }
h1 { font-size: 1.6em; margin-bottom: .2em; }
h2 { font-size: 1.25em; margin: 0 0 .4em; overflow-wrap: anywhere; }
h3 { font-size: 1em; margin: 1em 0 .3em; }
table { border-collapse: collapse; margin: .6em 0; }
th, td { border: 1px solid #d0d0d0; padding: .3em .6em; text-align: left; vertical-align: top; }
table.sortable th { background: #f0f2f5; cursor: pointer; user-select: none; white-space: nowrap; }
table.sortable th::after { content: " \\2195"; color: #999; }
table.sortable th[aria-sort="ascending"]::after { content: " \\2191"; color: #000; }
table.sortable th[aria-sort="descending"]::after { content: " \\2193"; color: #000; }
tr.FAIL td { background: #fff1f0; }
.verdict { display: inline-block; padding: 0 .5em; border-radius: 3px; font-weight: 600; }
.verdict.FAIL { background: #cf222e; color: #fff; }
.verdict.pass { background: #1a7f37; color: #fff; }
.verdict.skipped, .verdict.not-run { background: #6e7781; color: #fff; }
section.scenario { border-top: 2px solid #d0d0d0; margin-top: 2em; padding-top: 1em; }
.panels { display: flex; flex-wrap: wrap; gap: 1em; }
.panels img { box-sizing: border-box; width: calc(50% - .5em); min-width: 420px; max-width: 100%; height: auto; border: 1px solid #e0e0e0; }
pre { background: #f6f8fa; padding: .6em; overflow-x: auto; white-space: pre-wrap; overflow-wrap: anywhere; }
.muted { color: #57606a; }
.missing { color: #cf222e; }
"""

# Sorts a table.sortable by the clicked header's column: by each cell's data-sort when it has
# one (numbers compare as numbers), else by its text; empty values last in either direction.
_SCRIPT = """
(function () {
  function key(row, column) {
    var cell = row.cells[column];
    var value = cell.getAttribute("data-sort");
    return value === null ? cell.textContent.trim() : value;
  }
  function compare(a, b) {
    var x = Number(a), y = Number(b);
    if (!isNaN(x) && !isNaN(y)) { return x < y ? -1 : (x > y ? 1 : 0); }
    return a.localeCompare(b);
  }
  document.querySelectorAll("table.sortable").forEach(function (table) {
    var headers = table.tHead.rows[0].cells;
    Array.prototype.forEach.call(headers, function (th, column) {
      function sort() {
        var ascending = th.getAttribute("aria-sort") !== "ascending";
        Array.prototype.forEach.call(headers, function (other) { other.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (r, s) {
          var a = key(r, column), b = key(s, column);
          if (a === "" || b === "") { return (a === "") - (b === ""); }
          return ascending ? compare(a, b) : compare(b, a);
        });
        rows.forEach(function (row) { body.appendChild(row); });
      }
      th.addEventListener("click", sort);
      th.addEventListener("keydown", function (event) { if (event.key === "Enter" || event.key === " ") { event.preventDefault(); sort(); } });
    });
  });
})();
"""


def esc(text: Any) -> str:
    """HTML-escaped text (``& < > " '``): for element content and quoted attribute values."""
    return html.escape(str(text), quote=True)


def _csp_hash(source: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(source.encode()).digest()).decode() + "'"


def document(title: str, body: str) -> str:
    """A whole page: ``body`` (already HTML) under ``title``, with the style and the sorting
    script, and a policy that allows nothing else (no network, no other script)."""
    policy = (
        f"default-src 'none'; img-src data:; style-src {_csp_hash(_STYLE)}; script-src {_csp_hash(_SCRIPT)}; "
        f"base-uri 'none'; form-action 'none'"
    )
    return (
        f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{esc(policy)}">\n'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{esc(title)}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n{body}\n"
        f"<script>{_SCRIPT}</script>\n</body>\n</html>\n"
    )


@dataclass(frozen=True)
class Cell:
    """A table cell: its text, the value it sorts by (None: its text) and a link target."""

    text: str
    sort: float | int | str | None = None
    link: str | None = None

    def html(self) -> str:
        sort = ""
        if self.sort is not None:
            value = self.sort
            if isinstance(value, float) and not math.isfinite(value):
                value = "" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
            sort = f' data-sort="{esc(value)}"'
        text = esc(self.text)
        return f"<td{sort}>" + (f'<a href="{esc(self.link)}">{text}</a>' if self.link else text) + "</td>"


def sortable_table(
    headers: Sequence[str], rows: Iterable[Sequence[Cell]], row_classes: Iterable[str] = (), table_id: str = "summary"
) -> str:
    """A table whose rows sort by the column of a clicked header (or Enter on a focused one)."""
    head = "".join(f'<th scope="col" tabindex="0">{esc(h)}</th>' for h in headers)
    classes = list(row_classes)
    body = "\n".join(
        f'<tr class="{esc(classes[i]) if i < len(classes) else ""}">' + "".join(c.html() for c in row) + "</tr>"
        for i, row in enumerate(rows)
    )
    return f'<table class="sortable" id="{esc(table_id)}">\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody>\n</table>'


def panel(path: Path, alt: str) -> str:
    """The PNG at ``path`` inlined as an image, or a line saying it is missing."""
    try:
        data = base64.b64encode(path.read_bytes()).decode("ascii")
    except OSError:
        return f'<p class="missing">panel missing: {esc(path.name)}</p>'
    return f'<img alt="{esc(alt)}" src="data:image/png;base64,{data}">'


def diagnosis_block(diagnosis: Mapping[str, Any] | None) -> str:
    """The diagnosis ladder as a table of rungs and findings, and its verdict."""
    if not diagnosis or diagnosis.get("step") is None:
        return '<p class="muted">No spike found in this record.</p>'
    rows = "\n".join(
        f'<tr><th scope="row">{esc(rung)}</th><td>{esc(finding)}</td></tr>' for rung, finding in diagnosis.get("lines", [])
    )
    return (
        f'<p>At step {esc(diagnosis["step"])}:</p>\n<table class="diagnosis">\n<tbody>\n{rows}\n</tbody>\n</table>\n'
        f"<p><b>Verdict:</b> {esc(diagnosis.get('verdict', ''))}</p>"
    )


def verdict_badge(verdict: str) -> str:
    return f'<span class="verdict {esc(verdict.replace(" ", "-"))}">{esc(verdict)}</span>'


def _outcome(test: Mapping[str, Any]) -> str:
    return {"failed": "FAIL", "passed": "pass"}.get(test["outcome"], test["outcome"])


def _verdict_rows(test: Mapping[str, Any]) -> str:
    """A test's assertions, one row each: outcome, assertion, what it measured, the reason."""
    from pytest_spikecheck.judge.verdict import Verdict

    rows = []
    for data in test.get("verdicts", ()):
        v = Verdict.from_json(data)
        rows.append(
            f"<tr><td>{verdict_badge(v.outcome)}</td><td><code>{esc(v.assertion)}</code></td>"
            f"<td>{esc(v.figures())}</td><td>{esc(v.reason)}</td></tr>"
        )
    if not rows and test.get("failure"):
        rows.append(f"<tr><td>{verdict_badge(_outcome(test))}</td><td></td><td></td><td>{esc(test['failure'])}</td></tr>")
    return "\n".join(rows)


def tests_block(tests: Sequence[Mapping[str, Any]]) -> str:
    """Each test (its id), its outcome and its assertions' verdicts, and the line that reruns it."""
    parts = []
    for t in tests:
        anchor = "test-" + hashlib.sha256(t["nodeid"].encode()).hexdigest()[:12]
        parts.append(
            f'<div class="test" id="{anchor}">\n<h4>{verdict_badge(_outcome(t))} <code class="nodeid">'
            f'{esc(t["nodeid"])}</code></h4>\n<table class="verdicts">\n<tbody>\n{_verdict_rows(t)}\n</tbody>\n'
            f'</table>\n<pre><code class="reproduce">{esc(t["reproduce"])}</code></pre>\n</div>'
        )
    return "\n".join(parts)


def scenario_page(
    rows: Mapping[str, Mapping[str, Any]],
    verdicts: Mapping[str, str],
    report_dir: Path,
    sentences: Sequence[str] = (),
    title: str = "spikecheck report",
    tests: Sequence[Mapping[str, Any]] = (),
) -> str:
    """The plugin's report page over the report folder ``report_dir`` (whose ``<scenario>/``
    folders hold the panels): the sortable summary table, the tests with their headlines, then a
    section per scenario (its tests' verdicts and reproduce lines, panels, diagnosis)."""
    names = failures_first(rows, verdicts)
    anchors = {name: f"scenario-{i}" for i, name in enumerate(names)}
    columns = table_columns(list(rows.values()))
    table_rows, classes = [], []
    for name in names:
        verdict = verdicts.get(name, "not run")
        full = {**rows[name], "verdict": verdict}
        sort = {"verdict": VERDICT_ORDER.index(verdict) if verdict in VERDICT_ORDER else 1}
        table_rows.append(
            [
                Cell(c.text(full), link=f"#{anchors[name]}")
                if c.key == "scenario"
                else Cell(c.text(full), sort.get(c.key, c.sort(full) if c.sort else None))
                for c in columns
            ]
        )
        classes.append(verdict)
    parts = [
        f"<h1>{esc(title)}</h1>",
        *(f"<p>{esc(s)}</p>" for s in sentences),
        f'<p class="muted">Click a column header to sort. Generated by pytest-spikecheck {esc(__version__)}.</p>',
        sortable_table([c.heading for c in columns], table_rows, classes),
    ]
    if tests:
        test_rows = [
            [
                Cell(t["nodeid"]),
                Cell(
                    ", ".join(t["scenarios"]),
                    link=f"#{anchors[t['scenarios'][0]]}" if t["scenarios"] and t["scenarios"][0] in anchors else None,
                ),
                Cell(_outcome(t)),
                Cell(test_headline(t) if t["outcome"] == "failed" else "; ".join(v["reason"] for v in t["verdicts"])),
            ]
            for t in tests
        ]
        parts += [
            "<h2>Tests</h2>",
            sortable_table(
                ["test", "scenario", "verdict", "what it found"], test_rows, [_outcome(t) for t in tests], table_id="tests"
            ),
        ]
    for name in names:
        used = [t for t in tests if name in t["scenarios"]]
        parts.append(_scenario_section(name, rows[name], verdicts.get(name, "not run"), anchors[name], report_dir, used))
    return document(title, "\n".join(parts))


def _scenario_section(
    name: str, row: Mapping[str, Any], verdict: str, anchor: str, report_dir: Path, tests: Sequence[Mapping[str, Any]] = ()
) -> str:
    folder = report_dir / folder_name(name)
    full = {**row, "verdict": verdict}
    facts = ", ".join(f"{c.heading} {c.text(full)}" for c in table_columns([row]) if c.key not in ("scenario", "verdict"))
    panels = [
        panel(folder / f"{stem}.png", f"{label} of {name}")
        for stem, label in (("loss", "loss"), ("grad_norm", "gradient norm"), ("logits", "logits"))
        if stem != "logits" or (folder / "logits.png").is_file()
    ]
    files = " · ".join(
        f'<a href="{esc(href(name, *path))}">{esc(label)}</a>'
        for label, path in (
            ("diagnosis.md", ("diagnosis.md",)),
            ("metrics.jsonl", ("run", "metrics.jsonl")),
            ("summary.json", ("summary.json",)),
        )
    )
    failed = next((failed_verdict(t) for t in tests if failed_verdict(t) is not None), None)
    diagnosis = (failed or {}).get("diagnosis") or row.get("diagnosis")
    tests_html = f"<h3>Tests</h3>\n{tests_block(tests)}\n" if tests else ""
    return (
        f'<section class="scenario" id="{anchor}">\n<h2><span class="name">{esc(name)}</span> {verdict_badge(verdict)}</h2>\n'
        f'<p>{esc(row.get("description", ""))}</p>\n<p class="muted">{esc(facts)}; content hash '
        f'{esc(row.get("content_hash", ""))}</p>\n{tests_html}<div class="panels">{"".join(panels)}</div>\n'
        f"<h3>Diagnosis</h3>\n{diagnosis_block(diagnosis)}\n"
        f"<h3>Reproduce</h3>\n<pre><code>{esc(row.get('reproduce', ''))}</code></pre>\n"
        f'<p class="muted">Files: {files}</p>\n</section>'
    )


def write_scenario_page(
    report_dir: Path,
    rows: Mapping[str, Mapping[str, Any]],
    verdicts: Mapping[str, str],
    sentences: Sequence[str] = (),
    tests: Sequence[Mapping[str, Any]] = (),
) -> Path:
    path = Path(report_dir) / PAGE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(scenario_page(rows, verdicts, Path(report_dir), sentences, tests=tests), encoding="utf-8")
    return path
