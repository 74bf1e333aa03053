"""The pieces the plugin hands to CI, without a session: the summary's counts sentences, the job
summary's Markdown, index.md, JUnit properties, report folder names, and progress (a bar on a
terminal, a line per finished task elsewhere, nothing when quiet). The sessions that produce
them are tested in tests/plugin/test_xdist_once.py."""

from __future__ import annotations

import io
import re

import pytest

from pytest_spikecheck.plugin.outputs import append_job_summary, junit_properties
from pytest_spikecheck.progress import Progress
from pytest_spikecheck.report.summary import (
    ScenarioRow,
    counts_sentences,
    folder_name,
    href,
    index_markdown,
    job_summary_markdown,
    markdown_text,
)

MARKUP = "<script>alert(1)</script>"


def _row(name: str, **changes) -> dict:
    row = ScenarioRow(
        scenario=name,
        steps=500,
        spike_step=312,
        spike_ratio=45.71,
        containment="no clip",
        recovery="14 steps",
        recovery_steps=14,
        content_hash="0123456789abcdef",
        description=f"{name}: 500 steps",
        reproduce=f"pytest --spikecheck  # scenario {name}",
        diagnosis={
            "step": 312,
            "lines": [["6 Adam v", "30% of weights have |g|/√v̂ > 10"], ["4 token losses", "worst: '&<>\"' 21.5"]],
            "verdict": "rare tokens + no clip = one-step destabilisation",
        },
    )
    return {**row.to_json(), **changes}


def test_the_counts_name_loads_from_another_worker_only_under_xdist():
    rows = {"a": _row("a"), "b": _row("b")}
    counts = {"trained": 2, "worker": 1}
    assert counts_sentences(rows, counts, {"a": "pass", "b": "FAIL"}, workers=True) == [
        "2 scenarios checked (2 trained, 1 loaded from another worker, 0 from the disk cache).",
        "1 held, 1 failed (see the failures above).",
    ]
    assert counts_sentences(rows, counts, {"a": "pass", "b": "FAIL"}, workers=True, terminal=False)[1] == "1 held, 1 failed."
    assert counts_sentences({"a": rows["a"]}, {"disk": 1}, {"a": "pass"}, workers=False) == [
        "1 scenario checked (0 trained, 1 from the disk cache).",
        "1 held, 0 failed.",
    ]


def test_the_job_summary_has_the_table_failures_first_and_their_diagnoses():
    rows = {"zz_fails": _row("zz_fails"), "aa_holds": _row("aa_holds"), MARKUP: _row(MARKUP)}
    verdicts = {"zz_fails": "FAIL", "aa_holds": "pass", MARKUP: "FAIL"}
    markdown = job_summary_markdown(rows, verdicts, ["3 scenarios checked.", "1 held, 2 failed."])
    lines = markdown.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| scenario "))
    table = lines[header + 2 : lines.index("", header)]
    assert [row.split("|")[1].strip() for row in table] == ["&lt;script>alert(1)&lt;/script>", "zz_fails", "aa_holds"]
    assert [cell.strip() for cell in table[0].split("|")[2:-1]] == ["500", "312", "45.7×", "no clip", "14 steps", "FAIL"]
    assert markdown.count("<details>") == 2 and markdown.count("</details>") == 2
    assert "<summary><b>zz_fails</b>: FAIL; rare tokens + no clip = one-step destabilisation</summary>" in markdown
    assert "\\|g\\|/√v̂ > 10" in markdown  # a "|" in a cell is escaped, ">" stays readable
    assert MARKUP not in markdown and "'&amp;&lt;>\"'" in markdown
    assert "<details>" not in job_summary_markdown({"aa_holds": rows["aa_holds"]}, {"aa_holds": "pass"}, [])


def test_the_job_summary_goes_where_the_variable_says_and_nowhere_without_it(tmp_path):
    target = tmp_path / "summary.md"
    target.write_text("earlier step\n")
    assert append_job_summary("## spikecheck", {"GITHUB_STEP_SUMMARY": str(target)}) == target
    assert target.read_text() == "earlier step\n## spikecheck\n"  # appended: other steps' summaries stay
    assert append_job_summary("## spikecheck", {}) is None
    assert append_job_summary("## spikecheck", {"GITHUB_STEP_SUMMARY": ""}) is None


def test_index_md_links_into_safe_folders_and_escapes_names():
    index = index_markdown({MARKUP: _row(MARKUP), "clipped[0.5]": _row("clipped[0.5]")}, {MARKUP: "pass", "clipped[0.5]": "pass"})
    assert "| [clipped\\[0.5\\]](clipped%5B0.5%5D/diagnosis.md) |" in index  # brackets escaped: no link inside a link
    assert MARKUP not in index and f"]({href(MARKUP, 'diagnosis.md')})" in index


def test_report_folders_are_the_names_unless_a_name_is_unsafe_in_a_path():
    for name in ("phase19_break", "clipped[0.25]", "phase-19+steps=60+model=tin…)+burst(8×greek@40)+clip(2)~c55a5079"):
        assert folder_name(name) == name
    unsafe = {MARKUP, "a/b", "a_b/", ".hidden", 'x:y*z?"|', "a" * 200}
    folders = {folder_name(name) for name in unsafe}
    assert len(folders) == len(unsafe)  # never two names in one folder
    assert all(not set('/\\:*?"<>|') & set(f) and not f.startswith(".") and len(f) < 170 for f in folders)
    assert folder_name("a/b") != folder_name("a_b")


def test_junit_properties_of_a_scenario_and_of_one_that_did_not_train():
    props = junit_properties("phase19_break", _row("phase19_break"), "pass")
    assert props == [
        ("spikecheck_scenario", "phase19_break"),
        ("spikecheck_content_hash", "0123456789abcdef"),
        ("spikecheck_spike_step", "312"),
        ("spikecheck_spike_ratio", "45.71"),
        ("spikecheck_clip_containment", "no clip"),
        ("spikecheck_recovery_steps", "14"),
        ("spikecheck_verdict", "pass"),
    ]
    quiet = dict(junit_properties("flat", _row("flat", spike_step=None, spike_ratio=float("nan"), recovery_steps=None), "pass"))
    assert quiet["spikecheck_spike_step"] == quiet["spikecheck_spike_ratio"] == quiet["spikecheck_recovery_steps"] == ""
    assert junit_properties("broken", None, "FAIL") == [("spikecheck_scenario", "broken"), ("spikecheck_verdict", "FAIL")]


def test_markdown_text_leaves_no_tag_open():
    assert markdown_text(MARKUP) == "&lt;script>alert(1)&lt;/script>"
    assert markdown_text("a & b") == "a &amp; b"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _step(loss: float):
    return type("Ctx", (), {"row": {"loss": loss, "grad_norm_pre": 0.5}})()


def test_progress_draws_a_bar_on_a_terminal():
    terminal = _Terminal()
    progress = Progress(terminal, prefix="spikecheck: ")
    assert progress.mode == "bar"
    with progress.task("phase19_break", total=4) as task:
        on_step = task.step_callback()
        for _ in range(4):
            on_step(_step(2.5))
        task.finish("trained phase19_break")
    out = terminal.getvalue()
    assert "spikecheck: phase19_break" in out and "4/4" in out and "loss=2.500" in out
    assert "trained phase19_break" not in out  # the bar is the record on a terminal


def test_progress_writes_a_line_per_finished_task_elsewhere_and_nothing_when_quiet():
    log = io.StringIO()
    progress = Progress(log, prefix="spikecheck [gw1]: ")
    assert progress.mode == "lines"
    with progress.task("sweep", total=3, unit="point") as task:
        for outcome in ("done", "cached", "done"):
            task.update(outcome=outcome)
            task.line(f"point: {outcome}")
        task.finish(f"3 points: {task.counts_text()}")
    assert log.getvalue().splitlines() == [
        "spikecheck [gw1]: point: done",
        "spikecheck [gw1]: point: cached",
        "spikecheck [gw1]: point: done",
        "spikecheck [gw1]: 3 points: 2 done, 1 cached",
    ]
    quiet = io.StringIO()
    with Progress(quiet, mode="quiet").task("x", total=1) as task:
        task.step_callback()(_step(1.0))
        task.finish("trained x")
    assert quiet.getvalue() == "" and task.done == 1
    with pytest.raises(ValueError, match="progress mode must be one of auto, bar, lines, quiet, was 'loud'"):
        Progress(mode="loud")


class _Config:
    """What the plugin's progress reads of a pytest config: the verbosity, workerinput on an xdist
    worker, and the plugins (here no terminal reporter: not a terminal)."""

    def __init__(self, verbosity: int, worker: str | None) -> None:
        self.verbosity = verbosity
        self.pluginmanager = type("NoPlugins", (), {"get_plugin": staticmethod(lambda name: None)})()
        if worker:
            self.workerinput = {"workerid": worker}

    def get_verbosity(self) -> int:
        return self.verbosity


@pytest.mark.parametrize("isatty", [True, lambda: True], ids=["pytest-before-8.4.1-bool", "method"])
def test_the_terminal_stream_reads_the_reporters_isatty_as_either_pytest_spells_it(isatty):
    from pytest_spikecheck.plugin.outputs import TerminalStream

    reporter = type("Reporter", (), {"isatty": staticmethod(isatty) if callable(isatty) else isatty})()
    config = _Config(0, None)
    config.pluginmanager = type("Plugins", (), {"get_plugin": staticmethod(lambda name: reporter)})()
    assert TerminalStream(config).isatty() is True


@pytest.mark.parametrize(
    "verbosity, worker, mode, prefix",
    [
        (0, None, "lines", "spikecheck: "),
        (0, "gw1", "lines", "spikecheck [gw1]: "),
        (-1, None, "quiet", "spikecheck: "),
        (-1, "gw1", "quiet", "spikecheck [gw1]: "),
    ],
)
def test_the_plugins_progress_is_a_line_per_scenario_on_workers_and_nothing_with_q(verbosity, worker, mode, prefix):
    from pytest_spikecheck.plugin import _progress

    progress = _progress(_Config(verbosity, worker))
    assert (progress.mode, progress.prefix) == (mode, prefix)


def test_spikecheck_train_draws_its_bar_on_a_terminal_only(tmp_path, monkeypatch, capsys):
    from pytest_spikecheck.cli import main

    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "config.yaml").write_text("preset: phase-19\nsteps: 5\n")
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    assert main(["train", str(exp), "--out", str(tmp_path / "bar")]) == 0
    # the bar of 5 steps was drawn (tqdm redraws at most every 0.1 s: a fast run may never show 5/5)
    assert re.search(r"exp: .*\| [0-5]/5 \[", terminal.getvalue()), terminal.getvalue()
    for quiet in ([], ["--quiet"]):  # a log: the result line alone; quiet on a terminal: no bar
        terminal.seek(0), terminal.truncate()
        monkeypatch.setattr("sys.stderr", terminal if quiet else io.StringIO())
        assert main(["train", str(exp), "--out", str(tmp_path / "line"), *quiet]) == 0
        assert terminal.getvalue() == ""
    assert capsys.readouterr().out.count(": 5 steps in ") == 3


def test_the_terminal_lists_failed_tests_with_their_verdicts_and_counts_the_rest():
    from pytest_spikecheck.report.summary import tests_lines

    failed = {
        "nodeid": "tests/test_a.py::test_qk",
        "scenarios": ["muon"],
        "outcome": "failed",
        "reproduce": "pytest 'tests/test_a.py::test_qk' --spikecheck",
        "failure": "SpikeCheckError: ...",
        "verdicts": [{"assertion": "assert_qk_clip_contains", "passed": False, "reason": "QK-Clip (tau 30) ..."}],
    }
    passed = {
        "nodeid": "tests/test_a.py::test_clip",
        "scenarios": ["control"],
        "outcome": "passed",
        "reproduce": "",
        "failure": None,
        "verdicts": [{"assertion": "assert_clip_contains", "passed": True, "reason": "held"}],
    }
    assert tests_lines([failed, passed], verbose=False) == [
        "tests (1 failed, 1 passed):",
        "FAIL tests/test_a.py::test_qk (scenario muon)",
        "    FAIL assert_qk_clip_contains: QK-Clip (tau 30) ...",
        "    reproduce: pytest 'tests/test_a.py::test_qk' --spikecheck",
        "(1 more that did not fail: -v lists each with its assertions' verdicts)",
    ]
    assert tests_lines([failed, passed])[-2:] == [
        "pass tests/test_a.py::test_clip (scenario control)",
        "    pass assert_clip_contains: held",
    ]
    # nothing failed, nothing listed: one line, not a header over a note that lists nothing
    assert tests_lines([passed], verbose=False) == ["tests (1 passed) (-v lists each with its assertions' verdicts)"]
