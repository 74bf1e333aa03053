"""Under xdist each scenario trains once per session: the first worker that needs it trains it
under the run store's lock, the others load it; the summary counts say so and the
verdicts equal -n 0's; each worker writes its report folders and disk-cache entries whole, and a
session on that cache trains nothing. The same sessions carry the CI outputs: JUnit XML
properties per test, GitHub's job summary, the report page, and one progress line per trained
scenario.

Two modules share two scenarios; a third is named ``<script>alert(1)</script>`` and one test fails
on purpose (its scenario's diagnosis goes into the job summary). The model factory appends its
scenario's tag to a file each time it is called: that file counts the trainings."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest

from pytest_spikecheck import NoClip, RareTokenBurst, Scenario
from pytest_spikecheck.report.summary import folder_name

MARKUP = "<script>alert(1)</script>"
#: What each scenario's report folder and disk-cache entry hold.
REPORT_FILES = (
    "loss.png",
    "grad_norm.png",
    "diagnosis.md",
    "summary.json",
    "run/config.yaml",
    "run/metrics.jsonl",
    "run/batches.jsonl",
    "run/events.json",
    "run/run.json",
)
CACHE_FILES = ("config.yaml", "metrics.jsonl", "batches.jsonl", "events.json", "run.json")

COUNTED_MODEL = """
import pathlib

import torch

CALLS = pathlib.Path(__file__).with_name("factory_calls.txt")


def make_model(vocab_size, tag):
    with CALLS.open("a") as f:
        f.write(tag + "\\n")
    return Tiny(vocab_size)


class Tiny(torch.nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab_size, 8)
        self.head = torch.nn.Linear(8, vocab_size)

    def forward(self, idx, targets=None):
        logits = self.head(self.emb(idx))
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss
"""

CONFTEST = '''
from pytest_spikecheck import NoClip, RareTokenBurst, Scenario, spikecheck_scenario


def base(tag):
    return (Scenario.preset("phase-19").replace(steps=16, model_factory="counted:make_model", model_kwargs={"tag": tag})
            .with_breaks(RareTokenBurst(count=3, at_step=12)))


@spikecheck_scenario
def shared():
    """Used by both modules, unclipped."""
    return base("shared").with_breaks(NoClip())


@spikecheck_scenario
def control():
    return base("control")
'''

FIRST = """
import math

from pytest_spikecheck import assert_clip_contains


def test_shared_has_no_clip(shared):
    assert math.isinf(shared.scenario.max_norm)


def test_control_holds(control):
    assert_clip_contains(control, max_norm=1.0)
"""

SECOND = f"""
from conftest import base
from pytest_spikecheck import assert_spike


def test_shared_again(shared):
    assert len(shared) == 16


def test_a_name_that_is_markup(spikecheck):
    assert len(spikecheck.run(base("markup"), name={MARKUP!r})) == 16


def test_control_fails_on_purpose(control):
    assert_spike(control, at=12, min_ratio=1e6)
"""


def base(tag: str) -> Scenario:  # the inner conftest's, for the expected content hashes
    return (
        Scenario.preset("phase-19")
        .replace(steps=16, model_factory="counted:make_model", model_kwargs={"tag": tag})
        .with_breaks(RareTokenBurst(count=3, at_step=12))
    )


HASHES = {
    "shared": base("shared").with_breaks(NoClip()).content_hash(),
    "control": base("control").content_hash(),
    MARKUP: base("markup").content_hash(),
}


def _summary(result) -> list[list[str]]:
    lines = result.stdout.lines
    start = next(i for i, line in enumerate(lines) if re.match(r"=+ spikecheck =+$", line))
    end = next(i for i, line in enumerate(lines) if i > start and (line.startswith("=") or line.startswith("tests (")))
    return [re.split(r"\s{2,}", line.strip()) for line in lines[start + 1 : end] if line.strip()]


def _table(summary: list[list[str]]) -> dict[str, list[str]]:
    return {row[0]: row for row in summary[4:] if not row[0].startswith("report:")}


def _trainings(path: Path) -> Counter[str]:
    calls = path / "factory_calls.txt"
    counts = Counter(calls.read_text().split()) if calls.exists() else Counter()
    calls.unlink(missing_ok=True)  # the next session counts afresh
    return counts


def junit_scenarios(xml: Path) -> dict[str, list[dict[str, str]]]:
    """test name -> the spikecheck properties of each scenario it used (one dict per scenario)."""
    out: dict[str, list[dict[str, str]]] = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        groups: list[dict[str, str]] = []
        for prop in case.iter("property"):
            name, value = prop.get("name"), prop.get("value")
            if name == "spikecheck_scenario":
                groups.append({})
            if name.startswith("spikecheck_") and name != "spikecheck_scenarios" and groups:
                groups[-1][name.removeprefix("spikecheck_")] = value
        out[case.get("name")] = groups
    return out


@pytest.fixture
def suite(pytester):
    pytester.makepyfile(counted=COUNTED_MODEL, test_first=FIRST, test_second=SECOND)
    pytester.makeconftest(CONFTEST)
    return pytester


def test_each_scenario_trains_once_under_xdist_and_ci_gets_its_outputs(suite, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    report, xdist_report, job_summary = suite.path / "report", suite.path / "xdist-report", suite.path / "job-summary.md"
    # The report in this process (matplotlib is imported here already); the xdist session writes one too.
    serial = suite.runpytest("--spikecheck", "-p", "no:randomly", "-p", "no:cacheprovider", f"--spikecheck-report={report}")
    serial.assert_outcomes(passed=4, failed=1)
    assert _trainings(suite.path) == {"shared": 1, "control": 1, "markup": 1}
    serial.stdout.fnmatch_lines(["spikecheck: trained shared: 16 steps in *"])  # a line per trained scenario (no TTY)
    expected = _table(_summary(serial))
    assert sorted(expected) == sorted(HASHES) and expected["control"][-1] == "FAIL" and expected["shared"][-1] == "pass"

    # One xdist session, --dist load: the tests of one module go to both workers, so both need the
    # shared scenario (loadscope, as make test and the CI recipes run, is the downstream example's).
    # Its report and disk cache are its own (-n 0's cache would serve it).
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(job_summary))
    result = suite.runpytest_subprocess(
        "--spikecheck",
        "-n",
        "2",
        "--dist",
        "load",
        "-p",
        "no:randomly",
        "--junitxml=junit.xml",
        f"--spikecheck-report={xdist_report}",
    )
    result.assert_outcomes(passed=4, failed=1)
    assert _trainings(suite.path) == {"shared": 1, "control": 1, "markup": 1}  # each factory ran once
    summary = _summary(result)
    counts = re.fullmatch(
        r"3 scenarios checked \((\d) trained, (\d) loaded from another worker, 0 from the disk "
        r"cache\)\.",
        summary[0][0],
    )
    assert counts and counts[1] == "3" and int(counts[2]) >= 1, summary[0]  # both workers used a shared scenario
    assert summary[1] == ["2 held, 1 failed (see the failures above)."]
    assert _table(summary) == expected  # the verdicts (and every cell) of -n 0
    progress = [line for line in result.stderr.lines if "spikecheck [gw" in line]  # a line per trained scenario
    assert sorted(re.sub(r".*: trained (.*): 16 steps in .*", r"\1", line) for line in progress) == sorted(HASHES)

    # The xdist session's report and disk cache (each worker writes its scenarios' folders and
    # cache entries in a temporary folder and moves them into place; the controller alone writes
    # the index, from every worker's rows): every folder and entry whole, nothing left behind.
    names = sorted(folder_name(name) for name in HASHES)
    assert sorted(p.name for p in xdist_report.iterdir() if not p.name.startswith(".")) == sorted(
        [*names, "index.md", "index.html"]
    )
    for name in names:
        for file in REPORT_FILES:
            assert (xdist_report / name / file).is_file(), (name, file)
        assert len((xdist_report / name / "run" / "metrics.jsonl").read_text().splitlines()) == 16
    index = (xdist_report / "index.md").read_text()
    assert sum(line.startswith("| [") for line in index.splitlines()) == 3
    cache = sorted(p for p in (xdist_report / ".cache").iterdir() if p.name != ".locks")
    assert sorted(entry.name.split("-")[0] for entry in cache) == sorted(HASHES.values())
    for entry in cache:
        for file in CACHE_FILES:
            assert (entry / file).is_file(), (entry.name, file)
    folders = [*xdist_report.iterdir(), *(xdist_report / ".cache").iterdir()]
    assert not [p.name for p in folders if p.name.startswith(".") and p.name not in (".cache", ".locks")]
    # ... and whole: a session on that cache (in this process) trains nothing and agrees.
    monkeypatch.delenv("GITHUB_STEP_SUMMARY")  # the job summary checked below is the xdist session's
    again = suite.runpytest("--spikecheck", "-p", "no:randomly", "-p", "no:cacheprovider", f"--spikecheck-report={xdist_report}")
    again.assert_outcomes(passed=4, failed=1)
    again.stdout.fnmatch_lines(["3 scenarios checked (0 trained, 3 from the disk cache)."])
    assert _trainings(suite.path) == {} and _table(_summary(again)) == expected

    # JUnit XML (from the xdist session): each test's scenarios with their measures and its verdict.
    properties = junit_scenarios(suite.path / "junit.xml")
    assert [p["scenario"] for p in properties["test_shared_again"]] == ["shared"]
    assert [p["scenario"] for p in properties["test_a_name_that_is_markup"]] == [MARKUP]
    for test, groups in properties.items():
        for p in groups:
            row = expected[p["scenario"]]
            assert p["content_hash"] == HASHES[p["scenario"]], test
            assert (p["spike_step"], f"{float(p['spike_ratio']):.1f}×") == (row[2], row[3]), test
            assert p["clip_containment"] == row[4] and p["recovery_steps"] == row[5].removesuffix(" steps"), test
            assert p["verdict"] == ("FAIL" if test == "test_control_fails_on_purpose" else "pass"), test

    # The job summary (from the xdist session): the table, failures first, the failed
    # scenario's diagnosis in <details>, every name escaped.
    markdown = job_summary.read_text()
    assert markdown.startswith("## spikecheck\n") and "| scenario " in markdown
    lines = markdown.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| scenario "))
    body = lines[header + 2 : lines.index("", header)]
    assert [line.split("|")[1].strip() for line in body] == ["control", "&lt;script>alert(1)&lt;/script>", "shared"]
    assert markdown.count("<details>") == 1
    assert (
        "<details><summary><b>test_second.py::test_control_fails_on_purpose</b> (control): FAIL; assert_spike: "
        "expected a grad_norm_pre spike of ≥ 1e+06× at step 12, got"
    ) in markdown
    assert MARKUP not in markdown and "| rung " in markdown

    # The report page (from the -n 0 session): one row per scenario, failures first, panels
    # inlined, the name escaped.
    page = (report / "index.html").read_text()
    summary_table = page[: page.index('id="tests"')]
    assert summary_table.count("<tr class=") == 3 and page.index(">control<") < page.index(">shared<")
    assert MARKUP not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert page.count('src="data:image/png;base64,') == 6 and "http://" not in page and "https://" not in page


def test_the_junit_reader_finds_nothing_without_properties(tmp_path):
    """Sabotage of the XML check: a report whose tests carry no spikecheck properties gives no groups."""
    (tmp_path / "junit.xml").write_text(
        '<testsuites><testsuite><testcase name="test_x"><properties>'
        '<property name="spikecheck_scenarios" value="shared"/></properties>'
        "</testcase></testsuite></testsuites>"
    )
    assert junit_scenarios(tmp_path / "junit.xml") == {"test_x": []}
