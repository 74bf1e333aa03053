"""A Griffe extension (mkdocs.yml, mkdocstrings' ``extensions``): the package's docstrings are
written as reST-flavoured prose for ``help()``; this turns the two reST habits that Markdown
renders badly into their Markdown spelling for the API reference, without touching the source:

- roles such as ``:class:`~.spec.Scenario``` or ``:func:`train``` become code (`` `Scenario` ``);
- a run of doctest lines (``>>> ...`` and their output) becomes a fenced ``python`` block (Markdown
  would read ``>>>`` as a quotation);
- reST's ``::`` that announces an indented literal block becomes ``:`` (the indented block is a
  Markdown code block already).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const):`~?\.?(?:[\w.]*\.)?(?P<name>[^`.]+)`")


def markdown_docstring(text: str) -> str:
    """``text`` with reST roles as code and doctest runs fenced."""
    text = _ROLE.sub(lambda m: f"`{m['name']}`", text)
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].lstrip().startswith(">>>"):
            indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
            block = []
            while i < len(lines) and lines[i].strip() and lines[i].startswith(indent):
                block.append(lines[i][len(indent) :])
                i += 1
            out += [f"{indent}```python", *(indent + b for b in block), f"{indent}```"]
            continue
        line = lines[i]
        if line.rstrip().endswith("::") and not line.strip().startswith("..."):
            line = line.rstrip()[:-1] if line.strip() != "::" else ""
        out.append(line)
        i += 1
    return "\n".join(out)


class ReaderDocstrings(griffe.Extension):
    def on_object(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown_docstring(obj.docstring.value)
