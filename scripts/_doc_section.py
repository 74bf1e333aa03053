"""One generated section of a docs page, between its start and end markers, written in place:
the scripts that regenerate a table of docs/detectors.md (real_log_table.py, detector_league.py)
share this."""

from __future__ import annotations

from pathlib import Path

#: Where a section that is not on the page yet goes: before this heading.
BEFORE = "\n## At the published defaults"


def write_section(doc: Path, section: str, start: str, end: str, what: str) -> None:
    """Replace the text from ``start`` to ``end`` in ``doc`` with ``section`` (which carries both
    markers), or insert it before :data:`BEFORE` the first time; say what was written."""
    text = doc.read_text()
    if start in text:
        text = text[: text.index(start)] + section + text[text.index(end) + len(end) :]
    else:
        text = text.replace(BEFORE, f"\n{section}\n{BEFORE}", 1)
    doc.write_text(text)
    print(f"wrote the {what} section of {doc}")
