"""Every parameter of the public API is explained where the reference page reads it: a
function's in its docstring, a dataclass field's in the class docstring or in the ``#:``
comment above the field (what mkdocstrings renders as the attribute's text). The check fails on
a parameter added without a word, and on a dropped comment (the sabotage cases below)."""

from __future__ import annotations

import dataclasses
import inspect
import re
import textwrap

import pytest_spikecheck

SKIPPED = {"self", "args", "kwargs", "params"}


def _field_comments(cls: type) -> dict[str, str]:
    """field name -> its ``#:`` comment block (above the line) or trailing ``#`` comment."""
    lines = textwrap.dedent(inspect.getsource(cls)).splitlines()
    found: dict[str, str] = {}
    for i, line in enumerate(lines):
        m = re.match(r"    (\w+)\s*:[^=]*(=.*)?$", line)
        if not m or line.startswith("     "):
            continue
        above, j = [], i - 1
        while j >= 0 and lines[j].strip().startswith("#:"):
            above.insert(0, lines[j].strip()[2:].strip())
            j -= 1
        trailing = line.split("  # ", 1)[1] if "  # " in line else ""
        text = " ".join(above) or trailing
        if text:
            found[m.group(1)] = text
    return found


def undocumented(obj: object) -> list[str]:
    """The parameters of ``obj``'s signature that its documentation never explains."""
    doc = inspect.getdoc(obj) or ""
    named = set(re.findall(r"``(\w+)", doc)) | set(re.findall(r"\b(\w+)\b", doc))
    comments = _field_comments(obj) if inspect.isclass(obj) and dataclasses.is_dataclass(obj) else {}
    missing = []
    for name in inspect.signature(obj).parameters:
        if name in SKIPPED or name in named or name in comments:
            continue
        missing.append(name)
    return missing


def public_callables() -> list[tuple[str, object]]:
    out = []
    for name in pytest_spikecheck.__all__:
        obj = getattr(pytest_spikecheck, name)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            try:
                inspect.signature(obj)
            except (TypeError, ValueError):  # a class without an introspectable __init__
                continue
            out.append((name, obj))
    return out


def test_every_public_parameter_is_explained():
    problems = [f"{name}: {', '.join(missing)}" for name, obj in public_callables() if (missing := undocumented(obj))]
    assert not problems, "parameters no docstring or field comment explains:\n" + "\n".join(problems)


def test_the_check_finds_an_unexplained_parameter_and_a_dropped_field_comment():
    def documented(run, at=None):
        """Judge ``run`` at ``at``."""

    def silent(run, window=50):
        """Judge ``run``."""

    @dataclasses.dataclass
    class Commented:
        """A record."""

        #: what it says
        said: int = 0
        kept: int = 1  # why it is kept
        bare: int = 2

    assert undocumented(documented) == []
    assert undocumented(silent) == ["window"]
    assert undocumented(Commented) == ["bare"]
