"""The preflight's index.html in headless Chromium: self-contained (no script, nothing fetched),
no console error, one inline SVG panel per corpus and defence with one line per width, the
verdict as a list; built from study rows (no training)."""

from __future__ import annotations


from chromium import Chromium, require_chromium
from pytest_spikecheck.preflight.result import PreflightResult
from pytest_spikecheck.preflight.verdict import verdict


def _rows() -> list[dict]:
    rows = []
    for defence, first in (("as-given", {64: 8e-3, 128: 4e-3}), ("qk-norm <b>", {64: None, 128: None})):
        for width in (64, 128):
            for lr in (1e-3, 2e-3, 4e-3, 8e-3):
                bad = first[width] is not None and lr >= first[width]
                rows.append(
                    {
                        "corpus": "induction",
                        "defence": defence,
                        "width": width,
                        "seed": 0,
                        "lr": lr,
                        "status": "done",
                        "final_eval_loss": float("inf") if bad else 2.0 + lr * 10,
                        "initial_loss": 5.0,
                        "max_attn_logit": 30.0,
                        "diverged": bad,
                    }
                )
    return rows


def test_the_preflight_page_in_a_browser(tmp_path):
    rows = _rows()
    result = PreflightResult(
        "config.json",
        "adamw lr 0.001",
        1e-3,
        2048,
        ["a plan line"],
        rows,
        verdict(rows, user_lr=1e-3, target_width=2048),
        1.0,
        "16 done",
    )
    page = result.write(tmp_path)[2]
    html = page.read_text()
    assert "<script" not in html and "src=" not in html and "qk-norm &lt;b&gt;" in html
    browser = Chromium(require_chromium())
    try:
        loaded = browser.open(page)
        assert loaded.errors == [] and loaded.dialogs == []
        assert browser.evaluate("document.querySelectorAll('#verdict li').length") == 2
        assert browser.evaluate("document.querySelectorAll('svg').length") == 2
        assert browser.evaluate(
            "Array.from(document.querySelectorAll('svg')).map(s => s.querySelectorAll('polyline').length)"
        ) == [2, 2]
        assert browser.evaluate("document.querySelector('svg').getBoundingClientRect().width") > 300
        assert "qk-norm <b>" in browser.evaluate("document.body.textContent")
    finally:
        browser.close()
