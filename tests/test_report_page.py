"""index.html, the report page of ``--spikecheck-report DIR`` and of ``spikecheck compare --out DIR``:
one self-contained file (panels inlined, nothing loaded from anywhere), every string from a
scenario or a log escaped (a scenario named ``<script>alert(1)</script>``, a token string
``&<>"``), failures first, the table sorted by a click on a header.

The structure is checked with Python's HTML parser everywhere; the page is also opened in a real
headless Chromium (one launch for the module): one row per scenario, every image decoded, no
console error, no dialog, a header click sorts. Without a browser those tests skip with the
reason (``make test`` installs Debian's chromium where it can; under CI they fail instead)."""

from __future__ import annotations

import base64
import hashlib
import re
import struct
import zlib
from html.parser import HTMLParser
from pathlib import Path

import pytest
from chromium import Chromium, require_chromium

from pytest_spikecheck import NoClip, RareTokenBurst, Scenario
from pytest_spikecheck.cli import main
from pytest_spikecheck.plugin.outputs import write_index
from pytest_spikecheck.plugin.session import Settings, SpikecheckSession
from pytest_spikecheck.records.run import Run
from pytest_spikecheck.report import page as page_module
from pytest_spikecheck.report.page import scenario_page
from pytest_spikecheck.report.summary import ScenarioRow, folder_name

MARKUP = "<script>alert(1)</script>"
TOKEN = '&<>"'


def tiny_png(width: int = 3, height: int = 2) -> bytes:
    """A valid RGB PNG, grey, of the given size."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"".join(b"\0" + b"\x80" * 3 * width for _ in range(height))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


class Facts(HTMLParser):
    """What a page holds, as the HTML parser sees it: its script elements, image sources, links,
    policy, inline style and script, the scenario names of its section headings, and the cells
    of its first sortable table's body rows."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.scripts, self.images, self.links, self.names, self.rows = 0, [], [], [], []
        self.policy, self.style, self.script = "", "", ""
        self._tables, self._summary, self._text_into = 0, False, ""
        self._in_body = self._in_name = self._in_cell = False
        self._text = ""
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self._text_into = tag
        if tag == "script":
            self.scripts += 1
        elif tag == "img":
            self.images.append(a.get("src", ""))
        elif tag in ("a", "link") and "href" in a:
            self.links.append(a["href"])
        elif tag == "meta" and a.get("http-equiv") == "Content-Security-Policy":
            self.policy = a["content"]
        elif tag == "table":
            self._tables += 1
            self._summary = self._tables == 1 and "sortable" in (a.get("class") or "")
        elif tag == "tbody" and self._summary:
            self._in_body = True
        elif tag == "tr" and self._in_body:
            self.rows.append([])
        elif tag == "td" and self._in_body:
            self._in_cell, self._text = True, ""
        elif tag == "span" and a.get("class") == "name":
            self._in_name, self._text = True, ""

    def handle_endtag(self, tag):
        self._text_into = ""
        if tag == "table":
            self._summary = False
        if tag == "tbody":
            self._in_body = False
        elif tag == "td" and self._in_cell:
            self.rows[-1].append(self._text)
            self._in_cell = False
        elif tag == "span" and self._in_name:
            self.names.append(self._text)
            self._in_name = False

    def handle_data(self, data):
        if self._in_cell or self._in_name:
            self._text += data
        elif self._text_into == "style":
            self.style += data
        elif self._text_into == "script":
            self.script += data


def _row(name: str, *, finding: str = "wte.weight 1.3 (21% of ‖g‖²)", ratio: float = 24.9, **extra) -> dict:
    return ScenarioRow(
        scenario=name,
        steps=500,
        spike_step=312,
        spike_ratio=ratio,
        containment="no clip",
        recovery="12 steps",
        recovery_steps=12,
        content_hash="0123456789abcdef",
        description=f"{name}: 500 steps, seed 42, no clip",
        reproduce=f"pytest --spikecheck  # scenario {name}",
        diagnosis={
            "step": 312,
            "lines": [["1 loss", "train loss 14.6"], ["4 token losses", finding]],
            "verdict": "rare tokens + concentrated batch + no clip",
        },
        **extra,
    ).to_json()


@pytest.fixture
def report(tmp_path) -> tuple[Path, dict, dict]:
    rows = {
        "phase19_break": _row("phase19_break", finding=f"worst: {TOKEN!r} 21.5†", ratio=45.7),
        MARKUP: _row(MARKUP, ratio=3.5),
        "control": _row("control", ratio=66.8),
    }
    verdicts = {"phase19_break": "FAIL", MARKUP: "pass", "control": "pass"}
    for name in rows:
        (tmp_path / folder_name(name)).mkdir()
        for panel in ("loss.png", "grad_norm.png"):
            (tmp_path / folder_name(name) / panel).write_bytes(tiny_png())
    return tmp_path, rows, verdicts


def test_every_string_from_a_scenario_or_a_log_is_escaped(report):
    folder, rows, verdicts = report
    facts = Facts(scenario_page(rows, verdicts, folder))
    assert facts.scripts == 1  # the page's own; the name did not open one
    assert sorted(facts.names) == sorted(rows)  # the names read back as they were given
    assert sorted(row[0] for row in facts.rows) == sorted(rows)
    html = scenario_page(rows, verdicts, folder)
    assert MARKUP not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert TOKEN not in html and "&#x27;&amp;&lt;&gt;&quot;&#x27; 21.5†" in html


def test_without_escaping_the_check_sees_an_injected_script(report, monkeypatch):
    """Sabotage: the page written with an esc that escapes nothing."""
    folder, rows, verdicts = report
    monkeypatch.setattr(page_module, "esc", str)
    assert Facts(scenario_page(rows, verdicts, folder)).scripts > 1


def test_the_page_loads_nothing_and_its_policy_pins_its_own_style_and_script(report):
    folder, rows, verdicts = report
    facts = Facts(scenario_page(rows, verdicts, folder))
    assert len(facts.images) == 6 and all(src.startswith("data:image/png;base64,") for src in facts.images)
    assert base64.b64decode(facts.images[0].split(",", 1)[1]) == tiny_png()
    assert all(not re.match(r"[a-z]+:|//", link) or link.startswith("data:") for link in facts.links), facts.links
    assert "default-src 'none'" in facts.policy and "img-src data:" in facts.policy
    for source, directive in ((facts.style, "style-src"), (facts.script, "script-src")):
        digest = base64.b64encode(hashlib.sha256(source.encode()).digest()).decode()
        assert f"{directive} 'sha256-{digest}'" in facts.policy  # anything else inline is refused by the browser


def test_failures_come_first_and_a_missing_panel_says_so(report):
    folder, rows, verdicts = report
    (folder / "control" / "grad_norm.png").unlink()
    html = scenario_page(rows, verdicts, folder)
    facts = Facts(html)
    assert [row[0] for row in facts.rows] == facts.names == ["phase19_break", MARKUP, "control"]  # "<" sorts first
    assert [row[-1] for row in facts.rows] == ["FAIL", "pass", "pass"]
    assert "panel missing: grad_norm.png" in html and len(facts.images) == 5


# --- the real pipeline, and the browser ------------------------------------------------------


def _tiny(*breaks) -> Scenario:
    return Scenario.preset("phase-19").replace(steps=16).with_breaks(RareTokenBurst(count=3, at_step=12), *breaks)


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, Path]:
    """The session's report page over two trained scenarios (one failed, one named as markup), and
    ``spikecheck compare``'s page of the two, the failed one's token string edited to &<>"."""
    root = tmp_path_factory.mktemp("pages")
    session = SpikecheckSession(Settings(enabled=True, backend="torch", report_dir=root / "report"))
    session._backend = "torch"  # resolving "auto" may probe for cupy
    session.run(_tiny(NoClip()), name="tiny_break")
    session.run(_tiny(), name=MARKUP)
    rows = {name: row.to_json() for name, row in session.rows.items()}
    verdicts = {"tiny_break": "FAIL", MARKUP: "pass"}
    write_index(root / "report", rows, verdicts, ["2 scenarios checked (2 trained, 0 from the disk cache).", "1 held, 1 failed."])
    edited = root / "edited"
    run = Run.load(root / "report" / "tiny_break" / "run")  # edited and saved again: its manifest holds
    run.events[0].token_losses["worst"][0]["token"] = TOKEN
    run.save(edited)
    assert main(["compare", str(root / "report" / folder_name(MARKUP) / "run"), str(edited), "--out", str(root / "compare")]) == 0
    return {"report": root / "report" / "index.html", "compare": root / "compare" / "index.html"}


def test_the_session_writes_the_page_beside_index_md(pages):
    report = pages["report"].parent
    assert (report / "index.md").is_file() and (report / folder_name(MARKUP) / "summary.json").is_file()
    assert folder_name(MARKUP) != MARKUP and "/" not in folder_name(MARKUP)
    facts = Facts(pages["report"].read_text())
    assert facts.scripts == 1 and facts.names == ["tiny_break", MARKUP]


def test_the_compare_page_escapes_a_token_string_from_the_log(pages):
    html = pages["compare"].read_text()
    facts = Facts(html)
    assert facts.scripts == 1 and len(facts.images) >= 2 and all(s.startswith("data:image/png") for s in facts.images)
    assert TOKEN not in html and "&#x27;&amp;&lt;&gt;&quot;&#x27;" in html


@pytest.fixture(scope="module")
def browser():
    chromium = Chromium(require_chromium())
    yield chromium
    chromium.close()


TABLE = "document.querySelector('table.sortable')"
COLUMN = f"(n) => Array.from({TABLE}.tBodies[0].rows).map(r => r.cells[n].textContent)"
IMAGES = "Array.from(document.images).map(i => i.complete ? i.naturalWidth : -1)"


def _column(browser: Chromium, n: int) -> list[str]:
    return browser.evaluate(f"({COLUMN})({n})")


def test_the_report_page_in_a_browser(browser, pages):
    loaded = browser.open(pages["report"])
    assert loaded.errors == [] and loaded.dialogs == []
    names = _column(browser, 0)
    assert names == ["tiny_break", MARKUP]  # one row each, the failure first
    widths = browser.evaluate(IMAGES)
    assert len(widths) == 6 and all(w > 0 for w in widths), widths  # loss, grad norm, attention logits each
    assert browser.evaluate("document.scripts.length") == 1
    assert browser.evaluate("document.querySelector('section h2 .name').textContent") == "tiny_break"
    browser.click("table.sortable th:nth-child(1)")  # by name
    assert _column(browser, 0) == sorted(names) != names
    browser.click("table.sortable th:nth-child(1)")  # again: the other way
    assert _column(browser, 0) == sorted(names, reverse=True)
    browser.click("table.sortable th:nth-child(4)")  # by spike ratio, as numbers
    ratios = [float(r.rstrip("×")) for r in _column(browser, 3)]
    assert ratios == sorted(ratios) and len(set(ratios)) > 1


def test_the_compare_page_in_a_browser(browser, pages):
    loaded = browser.open(pages["compare"])
    assert loaded.errors == [] and loaded.dialogs == []
    assert len(_column(browser, 0)) == 2
    widths = browser.evaluate(IMAGES)
    assert len(widths) >= 2 and all(w > 0 for w in widths), widths
    assert f"{TOKEN!r}" in browser.evaluate("document.body.textContent")  # the token reads as it was logged
    browser.click("table.sortable th:nth-child(3)")
    ratios = [float(r.rstrip("×")) for r in _column(browser, 2)]
    assert ratios == sorted(ratios)


def test_the_browser_checks_catch_a_broken_page(browser, pages, tmp_path):
    """Sabotage: a broken image, a tampered script (the policy refuses it: no sorting, an error),
    an injected script (a dialog, an extra script)."""
    html = pages["report"].read_text()
    broken = tmp_path / "broken-image.html"
    broken.write_text(re.sub(r'src="data:image/png;base64,[^"]+"', 'src="data:image/png;base64,AAAA"', html, count=1))
    browser.open(broken)
    assert 0 in browser.evaluate(IMAGES)

    tampered = tmp_path / "tampered.html"
    tampered.write_text(html.replace("return value === null", "return value  === null"))
    loaded = browser.open(tampered)
    assert any("Content Security Policy" in e for e in loaded.errors), loaded.errors
    before = _column(browser, 0)
    browser.click("table.sortable th:nth-child(1)")
    assert _column(browser, 0) == before != sorted(before)

    injected = tmp_path / "injected.html"
    unpinned = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", html)  # else the policy refuses it
    injected.write_text(unpinned.replace("&lt;script&gt;alert(1)&lt;/script&gt;", MARKUP, 1))
    loaded = browser.open(injected)
    assert loaded.dialogs == ["1"] and browser.evaluate("document.scripts.length") > 1
