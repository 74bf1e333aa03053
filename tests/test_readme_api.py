"""The assertions table of the user guide (docs/assertions.md, moved there from the README) is the code's: each row's signature is ``inspect.signature``
of the function it names, every assertion the package exports has a row, and the sentence
above the table names every module they live in."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import pytest_spikecheck

README = Path(__file__).resolve().parents[1] / "docs" / "assertions.md"


def _literal(value: object) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    text = repr(value)
    return re.sub(r"e([-+])0(\d)", r"e\1\2", text)  # 1e-05 -> 1e-5, as people write it


def render(name: str, function) -> str:
    """``name(a, b=1, *, c="x", **kw)``: the signature without annotations, defaults as literals."""
    parts, star_done = [], False
    for p in inspect.signature(function).parameters.values():
        if p.kind is p.KEYWORD_ONLY and not star_done:
            parts.append("*")
            star_done = True
        if p.kind is p.VAR_POSITIONAL:
            parts.append(f"*{p.name}")
            star_done = True
        elif p.kind is p.VAR_KEYWORD:
            parts.append(f"**{p.name}")
        elif p.default is p.empty:
            parts.append(p.name)
        else:
            parts.append(f"{p.name}={_literal(p.default)}")
    return f"{name}({', '.join(parts)})"


def table_rows(text: str) -> dict[str, str]:
    """The assertions table of the page: name -> the signature cell (without backticks)."""
    start = text.index("| assertion | passes when |")
    rows = {}
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cell = line.split("|")[1].strip().strip("`")
        rows[cell.split("(")[0]] = cell
    return rows


def exported_assertions() -> dict[str, object]:
    return {name: getattr(pytest_spikecheck, name) for name in pytest_spikecheck.__all__ if name.startswith("assert_")}


def test_every_exported_assertion_has_a_row_and_no_row_names_another():
    assert set(table_rows(README.read_text())) == set(exported_assertions())


@pytest.mark.parametrize("name", sorted(exported_assertions()))
def test_the_row_is_the_signature(name):
    assert table_rows(README.read_text())[name] == render(name, exported_assertions()[name])


def test_the_sentence_names_every_module_that_defines_one():
    text = README.read_text()
    intro = text[text.index("# Assertions") : text.index("| assertion | passes when |")]
    for function in exported_assertions().values():
        assert f"`{function.__module__}`" in intro, function.__module__


def test_a_stale_row_fails():
    # sabotage: the 0.1.0 row of assert_spike (before min_ratio=None, metric=None and kind)
    stale = (
        "| assertion | passes when |\n|---|---|\n"
        '| `assert_spike(run, at=None, min_ratio=10, metric="grad_norm_pre", window=50)` | ... |\n'
    )
    assert table_rows(stale)["assert_spike"] != render("assert_spike", pytest_spikecheck.assert_spike)


def test_render_spells_defaults_as_the_readme_does():
    def f(run, max_norm, rtol=1e-05, metric="eval_loss", *, strict=False, **params):
        pass

    assert render("f", f) == 'f(run, max_norm, rtol=1e-5, metric="eval_loss", *, strict=False, **params)'
