"""Escaped outputs (issue 37): names, log keys and token strings are data. In Markdown they open
no tag, link or image and start no block (a newline split the job summary's table into eight and
injected an image); in comparison.md as on the page; on a terminal no control character acts (a
log key's escape sequence cleared the screen and painted a fake green OK). Pure text: nothing
trains."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from pytest_spikecheck import Scenario
from pytest_spikecheck.cli import main
from pytest_spikecheck.judge.diagnosis import Diagnosis, diagnosis_markdown
from pytest_spikecheck.judge.escape import markdown_cell, markdown_text, terminal_text
from pytest_spikecheck.records.run import Run
from pytest_spikecheck.report.summary import ScenarioRow, index_markdown, job_summary_markdown

INJECTED = "ok\n\n![x](https://evil.example/x.png)\n[click](https://evil.example)\n| a | b |\n<img src=x onerror=alert(1)>"
ESCAPES = "\x1b[2J\x1b[32mOK: no spike\x1b[0m\r"


def _row(name: str) -> dict:
    return ScenarioRow(
        scenario=name,
        steps=10,
        spike_step=3,
        spike_ratio=4.0,
        containment="no clip",
        recovery="2 steps",
        description=f"{name}: 10 steps",
        reproduce=f"pytest --spikecheck  # scenario {name}",
        diagnosis={"step": 3, "lines": [["4 token losses", f"worst: {INJECTED!s}"]], "verdict": "x"},
    ).to_json()


def _no_injection(markdown: str) -> None:
    assert not re.search(r"(?<!&lt;)<img|(?<!\\)\]\(https://evil|\n!\[x\]|\n\| a \| b \|", markdown), markdown


def test_markdown_writers_keep_a_name_with_newlines_on_its_row():
    rows = {INJECTED: _row(INJECTED), "plain": _row("plain")}
    verdicts = {INJECTED: "FAIL", "plain": "pass"}
    summary = job_summary_markdown(rows, verdicts, ["2 scenarios checked."])
    index = index_markdown(rows, verdicts)
    for markdown in (summary, index):
        _no_injection(markdown)
        lines = markdown.splitlines()
        header = next(i for i, line in enumerate(lines) if line.startswith("| scenario"))
        assert len(lines[header + 2 : lines.index("", header)]) == 2  # two rows, not eight
    _no_injection(diagnosis_markdown(rows[INJECTED]["diagnosis"]))


def test_diagnosis_has_one_markdown_renderer_and_it_escapes_the_bar():
    d = Diagnosis(step=81, lines=[("6 Adam v", "1.2% of weights have |g|/√v̂ > 8")], verdict="v")
    assert d.markdown() == diagnosis_markdown({"step": 81, "lines": d.lines, "verdict": "v"})
    row = next(line for line in d.markdown().splitlines() if line.startswith("| 6 Adam v"))
    assert row.count("|") - row.count("\\|") == 3 and "\\|g\\|/√v̂" in row  # two cells, the bars escaped


def test_comparison_md_escapes_names_like_the_page(tmp_path, monkeypatch):
    from pytest_spikecheck.report import comparison

    for panel in ("plot_loss", "plot_grad_norm"):  # the Markdown is tested, not matplotlib
        monkeypatch.setattr(comparison, panel, lambda runs, path, *a, **k: Path(path).write_bytes(b"png") or Path(path))
    steps = np.arange(1, 31)
    runs = []
    for name in ("<title>pwn</title>", "<img src=x onerror=alert(1)>\n# heading"):
        run = Run(
            scenario=Scenario.preset("phase-19").replace(name=name, steps=30),
            metrics={
                "step": steps,
                "loss": np.linspace(3, 1, 30),
                "grad_norm_pre": np.ones(30),
                "grad_norm_post": np.ones(30),
                "eval_loss": np.full(30, np.nan),
            },
        )
        runs.append(run.save(tmp_path / f"r{len(runs)}"))
    assert main(["compare", str(runs[0]), str(runs[1]), "--out", str(tmp_path / "cmp")]) == 0
    md = (tmp_path / "cmp" / "comparison.md").read_text()
    assert "<title>" not in md and "<img" not in md and "\n# heading" not in md and "&lt;title>" in md


def test_check_never_prints_a_control_character_from_a_log(tmp_path, capsys):
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps({"step": i, "loss" + ESCAPES: 1.0, ESCAPES: 1.0}) + "\n" for i in range(1, 40)))
    assert main(["check", str(log)]) == 2  # no loss series: the message lists the log's columns
    out = capsys.readouterr()
    assert "\\x1b[2J" in out.err and "\x1b" not in out.out + out.err and "\r" not in out.out + out.err


def test_the_helpers():
    assert terminal_text(ESCAPES) == "\\x1b[2J\\x1b[32mOK: no spike\\x1b[0m\\x0d"
    assert terminal_text("a\nb\tc\x1b", lines=True) == "a\nb\tc\\x1b" and terminal_text("\u202egnp.exe") == "\\u202egnp.exe"
    assert markdown_text("a\n\nb [x](y) <i> & \\") == "a  b \\[x\\](y) &lt;i> &amp; \\\\"
    assert markdown_cell("|g|/√v̂ > 10") == "\\|g\\|/√v̂ > 10"
