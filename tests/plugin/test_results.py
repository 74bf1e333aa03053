"""What a session's results say about each test (issue 33's Done-when): a pytester session with a
failing QK-Clip test and a passing gradient-clip test. The terminal names each test and its
assertions' verdicts (the failed one with its reproduce line), JUnit XML carries one property
per assertion, the job summary's ``<details>`` headline is the failed assertion's reason (the
diagnosis at the step it names), and index.html, opened in headless Chromium, shows the test
ids, the attention-logit column and the logits panel, and the containment cell naming QK-Clip."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest
from chromium import Chromium, require_chromium

SCENARIOS = '''
from pytest_spikecheck import QKClip, RareTokenBurst, Scenario, spikecheck_scenario


@spikecheck_scenario
def muon_qk():
    """Phase-19's GPT under Muon at lr 0.4 with QK-Clip at tau 30: it first clips at step 20."""
    return (Scenario.preset("phase-19").replace(steps=24, optimizer__name="muon", optimizer__lr=0.4,
                                                optimizer__weight_decay=0.0).with_breaks(QKClip(tau=30)))


@spikecheck_scenario
def clipped():
    return Scenario.preset("phase-19").replace(steps=16).with_breaks(RareTokenBurst(count=3, at_step=12))
'''

TESTS = """
from pytest_spikecheck import assert_clip_contains, assert_qk_clip_contains


def test_qk_clip_holds_at_one_tau(muon_qk):
    assert_clip_contains(muon_qk, max_norm=1.0)
    assert_qk_clip_contains(muon_qk, factor=1.0)  # too strict: the logits pass tau after each clip


def test_the_gradient_clip_holds(clipped):
    assert_clip_contains(clipped, max_norm=1.0)
"""

FAILED_ID = "test_results_session.py::test_qk_clip_holds_at_one_tau"
PASSED_ID = "test_results_session.py::test_the_gradient_clip_holds"


@pytest.fixture
def results(pytester, monkeypatch):
    pytester.makeconftest(SCENARIOS)
    pytester.makepyfile(test_results_session=TESTS)
    summary = pytester.path / "job-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = pytester.runpytest(
        "--spikecheck", "-v", "-p", "no:randomly", "--junitxml=junit.xml", f"--spikecheck-report={pytester.path / 'report'}"
    )
    result.assert_outcomes(passed=1, failed=1)
    return result, pytester.path


def test_every_output_says_which_test_and_which_assertion(results):
    result, root = results
    out = result.stdout.str()
    # The failure itself: the table of the metric asked about, a sparkline, the test's reproduce line.
    assert re.search(r"step\s+attn_logit_max\s+qk_clipped_heads", out)
    assert "attn_logit_max: " in out and f"reproduce: pytest '{FAILED_ID}' --spikecheck" in out

    # The terminal: each test, its verdicts, the failed one's reproduce line.
    result.stdout.fnmatch_lines(
        [
            "tests (1 failed, 1 passed):",
            f"FAIL {FAILED_ID} (scenario muon_qk)",
            "    pass assert_clip_contains: the gradient-norm clip held: post-clip norm ≤ 1 at every step*",
            "    FAIL assert_qk_clip_contains: QK-Clip (tau 30) first clipped at step *, yet the largest attention logit is "
            "* > 1 x tau at step *",
            f"    reproduce: pytest '{FAILED_ID}' --spikecheck",
            f"pass {PASSED_ID} (scenario clipped)",
            "    pass assert_clip_contains: *",
        ]
    )
    # ... and the table: the logit column, the containment cell naming each clip.
    result.stdout.fnmatch_lines(
        [
            "scenario*clip containment*max attention logit*recovery*verdict",
            "clipped*gradient norm: held (max * ≤ 1)*pass",
            "muon_qk*gradient norm: held (max 1 ≤ 1); QK-Clip τ 30: held (max * ≤ 2τ)*FAIL",
        ]
    )

    # JUnit: one property per assertion, beside the scenario's.
    cases = {
        c.get("name"): [(p.get("name"), p.get("value")) for p in c.iter("property")]
        for c in ET.parse(root / "junit.xml").getroot().iter("testcase")
    }
    failed = dict(cases["test_qk_clip_holds_at_one_tau"])
    assert failed["spikecheck_assert_qk_clip_contains"].startswith("FAIL: QK-Clip (tau 30) first clipped at step ")
    assert re.search(r"\[attn_logit_max [\d.]+ \(limit 30\) at step \d+\]$", failed["spikecheck_assert_qk_clip_contains"])
    assert failed["spikecheck_assert_clip_contains"].startswith("pass: the gradient-norm clip held")
    assert failed["spikecheck_scenario"] == "muon_qk" and failed["spikecheck_verdict"] == "FAIL"
    assert dict(cases["test_the_gradient_clip_holds"])["spikecheck_assert_clip_contains"].startswith("pass: ")

    # The job summary: the tests table, and the failed test's details headed by its assertion.
    markdown = (root / "job-summary.md").read_text()
    assert "| test " in markdown and f"| {FAILED_ID} " in markdown and f"| {PASSED_ID} " in markdown
    details = re.search(r"<details><summary><b>(.*?)</b> \((.*?)\): FAIL; (.*?)</summary>(.*?)</details>", markdown, re.S)
    assert details and details[1] == FAILED_ID and details[2] == "muon_qk", markdown
    assert details[3].startswith("assert_qk_clip_contains: QK-Clip (tau 30) first clipped at step")
    named = int(re.search(r"> 1 x tau at step (\d+)", details[3])[1])
    assert f"**Diagnosis at step {named}**" in details[4] and "QK-Clip (τ 30) active" in details[4]
    assert f"<code>pytest '{FAILED_ID}' --spikecheck</code>" in details[4]
    assert markdown.count("<details>") == 1

    # The page, in a real browser.
    browser = Chromium(require_chromium())
    try:
        loaded = browser.open(root / "report" / "index.html")
        assert loaded.errors == [] and loaded.dialogs == []
        headers = browser.evaluate("Array.from(document.querySelectorAll('#summary th')).map(h => h.textContent)")
        assert "max attention logit" in headers
        logit = headers.index("max attention logit")
        cells = browser.evaluate(
            f"Array.from(document.querySelectorAll('#summary tbody tr')).map(r => "
            f"[r.cells[0].textContent, r.cells[{logit}].textContent])"
        )
        assert [name for name, _ in cells] == ["muon_qk", "clipped"] and all(re.fullmatch(r"[\d.,]+", v) for _, v in cells)
        tests = browser.evaluate(
            "Array.from(document.querySelectorAll('#tests tbody tr')).map(r => Array.from(r.cells).map(c => c.textContent))"
        )
        assert [t[0] for t in tests] == [FAILED_ID, PASSED_ID] and [t[2] for t in tests] == ["FAIL", "pass"]
        assert tests[0][3].startswith("assert_qk_clip_contains: QK-Clip (tau 30)")
        ids = browser.evaluate("Array.from(document.querySelectorAll('section.scenario .nodeid')).map(e => e.textContent)")
        assert ids == [FAILED_ID, PASSED_ID]
        reproduce = browser.evaluate("document.querySelector('section.scenario code.reproduce').textContent")
        assert reproduce == f"pytest '{FAILED_ID}' --spikecheck"
        panels = browser.evaluate("Array.from(document.images).map(i => [i.alt, i.complete ? i.naturalWidth : -1])")
        assert any(alt == "logits of muon_qk" and width > 0 for alt, width in panels), panels
    finally:
        browser.close()
