"""Text from data made safe for where it is shown: the one place every writer escapes names, log
keys and token strings (a scenario's name, a column of someone's log, a token of their corpus are
data, never markup or terminal commands).

- :func:`markdown_text`: for Markdown that renders HTML (GitHub's job summary, ``index.md``,
  ``diagnosis.md``, ``comparison.md``): no tag, entity, link or image can open, and no newline can
  start a block (a heading, an image on a line of its own, a new table row).
- :func:`markdown_cell`: the same inside a table cell, ``|`` escaped too.
- :func:`terminal_text`: for a terminal: control characters (escape sequences that clear the
  screen or paint a fake green ``OK``, a carriage return that overwrites a line, bidirectional
  overrides) are shown as ``\\xNN`` / ``\\uNNNN`` instead of acting.
"""

from __future__ import annotations

import re

#: C0 and C1 control characters, DEL, and the Unicode bidirectional controls.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_CONTROL_BUT_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
#: Characters Markdown gives a meaning: a backslash escapes, brackets open links and images.
_MARKDOWN = str.maketrans({"&": "&amp;", "<": "&lt;", "\\": "\\\\", "[": "\\[", "]": "\\]"})


def _shown(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_text(text: object, *, lines: bool = False) -> str:
    """``text`` with every control character shown escaped; ``lines``: newlines and tabs kept
    (a multi-line report of ours), else they are escaped too (one name, one key)."""
    return (_CONTROL_BUT_LINES if lines else _CONTROL).sub(_shown, str(text))


def markdown_text(text: object) -> str:
    """``text`` as one line of literal Markdown: ``&`` ``<`` as entities, ``\\`` ``[`` ``]``
    backslash-escaped, and each run of newlines and other control characters one space.
    (``>`` alone opens nothing, so "|g|/√v̂ > 10" stays readable.)"""
    return _CONTROL.sub(" ", str(text)).translate(_MARKDOWN)


def markdown_cell(text: object) -> str:
    """:func:`markdown_text` for a table cell: ``|`` escaped too (it would split the row)."""
    return markdown_text(text).replace("|", "\\|")
