"""The site's generated reference pages (a MkDocs hook, ``hooks:`` in mkdocs.yml).

Each page is built from the code or the file it documents when the site is built, never
copied by hand: the Python API from ``pytest_spikecheck.__all__`` (rendered by mkdocstrings),
the CLI from the ``spikecheck`` argument parsers, the break catalogue from the break registry,
the YAML schema of a scenario and of a sweep file from the section dataclasses and the
sweep reader, and the run-folder schema from ``docs/run-schema.json``. ``tests/test_docs_site.py``
checks each against its source. The pages are virtual files: they appear under
``reference/`` in the built site and nowhere in ``docs/``.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import re
import typing
from pathlib import Path
from typing import Any, Callable

DOCS = Path(__file__).resolve().parent

#: The public names by the area of the reference page they belong to (every name of
#: ``__all__`` must be in exactly one; tests/test_docs_site.py checks it).
API_GROUPS: dict[str, str] = {
    "pytest_spikecheck.scenario": "Scenarios",
    "pytest_spikecheck.scenario.breaks": "Breaks and defences",
    "pytest_spikecheck.training.launch": "Training",
    "pytest_spikecheck.records.run": "Runs",
    "pytest_spikecheck.judge.assertions": "Assertions on a run or a log",
    "pytest_spikecheck.judge.setup_checks": "Assertions on a training set-up",
    "pytest_spikecheck.judge.update_checks": "Assertions on the optimizer's update",
    "pytest_spikecheck.judge.qk_clip": "Assertions on logits and QK-Clip",
    "pytest_spikecheck.judge.sweeps": "LR sweeps",
    "pytest_spikecheck.sweep": "Sweeps",
    "pytest_spikecheck.judge.verdict": "Verdicts",
    "pytest_spikecheck.judge.diagnosis": "Diagnosis",
    "pytest_spikecheck.judge.detectors": "Detectors",
    "pytest_spikecheck.clipping": "Clipping",
    "pytest_spikecheck.plugin.fixtures": "The pytest plugin",
    "pytest_spikecheck.integrations.recorder": "Recording your own trainer",
    "pytest_spikecheck.integrations.burst": "Recording your own trainer",
    "pytest_spikecheck.preflight.result": "Preflight",
    "pytest_spikecheck.errors": "Errors and warnings",
    "pytest_spikecheck.models.config": "Constants",
}


def _md(text: str) -> str:
    """A plain string for a Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _code(text: Any) -> str:
    text = str(text)
    if not text:
        return '`""`'
    fence = "``" if "`" in text else "`"
    pad = " " if "`" in text else ""
    return f"{fence}{pad}{text}{pad}{fence}".replace("|", "\\|")


# ------------------------------------------------------------------------------ the Python API


def public_api() -> dict[str, str]:
    """Every public name of the package -> the module that defines it (``__all__``, ``__version__`` aside)."""
    import pytest_spikecheck

    exports = vars(pytest_spikecheck)["_EXPORTS"]
    return {name: exports[name] for name in pytest_spikecheck.__all__ if name != "__version__"}


def api_page() -> str:
    """The API reference: one mkdocstrings block per public name, grouped by area."""
    import pytest_spikecheck

    groups: dict[str, list[str]] = {}
    for name, module in public_api().items():
        groups.setdefault(API_GROUPS.get(module, "Other"), []).append(name)
    out = [
        "# Python API",
        "",
        "Every public name of the package, importable from `pytest_spikecheck` (lazily: `import "
        "pytest_spikecheck` imports neither torch nor matplotlib). Generated from the docstrings and "
        f"signatures of version {pytest_spikecheck.__version__} by mkdocstrings; each entry names the "
        "module that defines it.",
        "",
    ]
    order = list(dict.fromkeys(API_GROUPS.values())) + ["Other"]
    for title in order:
        if title not in groups:
            continue
        names = ", ".join(f"[`{n}`](#{public_api()[n]}.{n})" for n in groups[title])
        out += [f"- **{title}**: {names}"]
    out.append("")
    for title in order:
        for i, name in enumerate(groups.get(title, [])):
            if i == 0:
                out += [f"## {title}", ""]
            module = public_api()[name]
            if module == "pytest_spikecheck.models.config":
                out += _constant(name, module)
                continue
            out += [
                f"::: {module}.{name}",
                "    options:",
                "      heading_level: 3",
                f'      heading: "{name}"',
                f'      toc_label: "{name}"',
                "",
            ]
    return "\n".join(out) + "\n"


def _constant(name: str, module: str) -> list[str]:
    """A module constant (mkdocstrings cannot see pytest_spikecheck.models, a package-dir of
    setuptools): its value and the ``#:`` comment above its definition."""
    import importlib

    mod = importlib.import_module(module)
    lines = inspect.getsource(mod).splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(f"{name} ="))
    doc = []
    for line in reversed(lines[:at]):
        if not line.startswith("#:"):
            break
        doc.insert(0, line[2:].strip())
    anchor = f"{module}.{name}"
    return [f"### `{name}` {{ #{anchor} }}", "", f"`{name} = {getattr(mod, name)!r}` (in `{module}`)", "", " ".join(doc), ""]


# ------------------------------------------------------------------------------------- the CLI


def _subcommands(parser: argparse.ArgumentParser) -> tuple[Any, dict[str, argparse.ArgumentParser]]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub, dict(sub.choices)


def _option_rows(parser: argparse.ArgumentParser) -> list[str]:
    formatter = parser._get_formatter()
    rows = ["| argument | help |", "|---|---|"]
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.option_strings:
            spelled = ", ".join(action.option_strings)
            if action.nargs != 0:
                spelled += " " + formatter._format_args(action, action.dest.upper())
        else:
            spelled = formatter._format_args(action, action.dest)
        text = formatter._expand_help(action) if action.help else ""
        if action.choices is not None and not isinstance(action.choices, dict):
            text += f" (one of {', '.join(map(str, action.choices))})"
        if action.required and action.option_strings:
            text += " (required)"
        rows.append(f"| {_code(spelled)} | {_md(text)} |")
    return rows


def cli_page() -> str:
    """The ``spikecheck`` command: every subcommand's usage, description and options, read from
    the argument parsers the command itself builds."""
    from pytest_spikecheck.cli.commands import build_parser

    os.environ.setdefault("COLUMNS", "100")  # argparse wraps the usage to the terminal width
    parser = build_parser()
    sub, commands = _subcommands(parser)
    helps = {a.dest: a.help for a in sub._choices_actions}
    out = [
        "# Command line",
        "",
        "Generated from the argument parsers of `spikecheck` "
        "(`pytest_spikecheck.cli.commands.build_parser`). `spikecheck COMMAND --help` prints the same.",
        "",
        "```text",
        parser.format_usage().rstrip(),
        "```",
        "",
        _md(parser.description or ""),
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    out += [f"| [`{name}`](#spikecheck-{name}) | {_md(helps.get(name, ''))} |" for name in commands]
    out += ["", *_option_rows(parser), ""]
    for name, command in commands.items():
        out += [
            f"## spikecheck {name} {{ #spikecheck-{name} }}",
            "",
            _md(helps.get(name, "")),
            "",
            "```text",
            command.format_usage().rstrip(),
            "```",
            "",
        ]
        if command.description:
            out += [_md(command.description), ""]
        out += [*_option_rows(command), ""]
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------- the break catalogue


def _registry() -> dict[str, type]:
    from pytest_spikecheck.scenario import break_base

    import pytest_spikecheck.scenario.breaks  # noqa: F401  (the breaks register when defined)

    return {name: break_base._REGISTRY[name] for name in break_base.break_names()}


def _yaml_spelling(cls: type) -> str:
    params = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            params[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            params[f.name] = f.default_factory()  # type: ignore[misc]
        else:
            params[f.name] = "..."
    if not params:
        return cls.config_name
    inner = ", ".join(f"{k}: {_yaml_value(v)}" for k, v in params.items())
    return f"{{{cls.config_name}: {{{inner}}}}}"


def _yaml_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return "[" + ", ".join(_yaml_value(v) for v in value) + "]"
    return str(value)


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, str):
        return annotation
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def breaks_page() -> str:
    """Every registered break: its class, YAML spelling, docstring and fields with defaults."""
    import pytest_spikecheck

    exported = set(pytest_spikecheck.__all__)
    registry = _registry()
    out = [
        "# Break catalogue",
        "",
        f"The {len(registry)} breaks and defences of the break registry "
        "(`pytest_spikecheck.scenario.break_base`), generated from their classes. In Python a break is "
        'an instance (`Scenario.preset("phase-19").with_breaks(NoClip())`); in a `config.yaml` or a '
        "sweep's recipe it is its YAML name, alone or with its parameters (`breaks: [no_clip, "
        "{rare_token_burst: {count: 3, at_step: 312}}]`). A parameter left out keeps its default.",
        "",
        "| YAML name | class | parameters |",
        "|---|---|---|",
    ]
    for name, cls in registry.items():
        params = ", ".join(f.name for f in dataclasses.fields(cls)) or "none"
        out.append(f"| [`{name}`](#{name}) | `{cls.__name__}` | {params} |")
    out.append("")
    for name, cls in registry.items():
        if cls.__name__ in exported:
            where = f"[`pytest_spikecheck.{cls.__name__}`](api.md#{public_api()[cls.__name__]}.{cls.__name__})"
        else:
            where = f"`{cls.__module__}.{cls.__name__}`"
        out += [f"## `{name}` {{ #{name} }}", "", f"Class {where}; in YAML `{_yaml_spelling(cls)}`.", "", _docstring(cls), ""]
        hints = typing.get_type_hints(cls)
        rows = [
            f"| `{f.name}` | `{_md(_type_name(hints.get(f.name, f.type)))}` | {_default(f)} |" for f in dataclasses.fields(cls)
        ]
        if rows:
            out += ["| parameter | type | default |", "|---|---|---|", *rows, ""]
    return "\n".join(out) + "\n"


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return _code(repr(f.default))
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return _code(repr(f.default_factory()))  # type: ignore[misc]
    return "required"


def _docstring(obj: Any) -> str:
    """A docstring as Markdown: reST's double backticks are Markdown code spans already; the
    ``:class:`X``` roles become plain code."""
    return _markdown(inspect.getdoc(obj) or "")


def _markdown(doc: str) -> str:
    import sys

    if str(DOCS) not in sys.path:  # griffe_docstrings.py beside this file
        sys.path.insert(0, str(DOCS))
    from griffe_docstrings import markdown_docstring

    return markdown_docstring(doc)


# ------------------------------------------------------------------ the scenario and sweep YAML


def field_comments(cls: type) -> dict[str, str]:
    """The comment on each field of a dataclass's source (``name: type = default  # comment``),
    with its continuation lines (comment lines right after it that go on in lower case) and the
    comment lines right above it."""
    lines = inspect.getsource(cls).splitlines()
    names = {f.name for f in dataclasses.fields(cls)}
    comments: dict[str, str] = {}
    current, above = None, []
    for line in lines:
        m = re.match(r"\s+(\w+)\s*:[^#]*?(?:#\s?(?P<comment>.*))?$", line)
        if m and m[1] in names and not line.lstrip().startswith("#"):
            current = m[1]
            comments[current] = " ".join([*above, (m["comment"] or "").strip()]).strip()
            above = []
            continue
        c = re.match(r"\s+#:?\s?(?P<text>.*)$", line)
        if c and current and c["text"][:1] and (c["text"][0].islower() or c["text"][0] in "(.…"):
            comments[current] = f"{comments[current]} {c['text'].strip()}".strip()
        elif c and c["text"].strip():  # a comment above the next field (it explains a group, or that field)
            current = None
            above.append(c["text"].strip())
        else:
            current, above = None, []
    return {name: _markdown(text) for name, text in comments.items()}


def _allowed(path: str) -> str:
    """A numeric field's range, as the scenario checks it (``RANGES``; docs/limits.md)."""
    from pytest_spikecheck.scenario.sections import RANGES

    return _code(RANGES[path].text()) if path in RANGES else ""


def _section_rows(section: str, cls: type) -> list[str]:
    defaults = cls()
    comments = field_comments(cls)
    hints = typing.get_type_hints(cls)
    rows = ["| key | type | default | range | meaning |", "|---|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        default = getattr(defaults, f.name)
        shown = _yaml_value(default) if not dataclasses.is_dataclass(default) else "(below)"
        path = f"{section}.{f.name}"
        rows.append(
            f"| `{path}` | `{_md(_type_name(hints.get(f.name, f.type)))}` | "
            f"{_code(shown)} | {_allowed(path)} | {_md(comments.get(f.name, ''))} |"
        )
    return rows


def yaml_page() -> str:
    """The keys of a scenario's config.yaml (from the section dataclasses the YAML codec reads)
    and of a sweep file (from the sweep reader)."""
    from pytest_spikecheck.models.config import PRESETS
    from pytest_spikecheck.scenario import Scenario
    from pytest_spikecheck.scenario.config import CONFIG_KEYS
    from pytest_spikecheck.scenario.preset_registry import scenario_preset_names as preset_names
    from pytest_spikecheck.scenario.sections import SCALARS, SECTIONS
    from pytest_spikecheck.sweep.spec import SWEEP_KEYS, Sweep, load_sweep

    scenario = Scenario()
    top_comments = field_comments(Scenario)
    out = [
        "# YAML schema: scenarios and sweep files",
        "",
        "Generated from the dataclasses that the YAML codec (`pytest_spikecheck.scenario.config`) reads "
        "and checks. Every key is checked: an unknown key, a key given twice, a value of the wrong type or "
        "out of range is one line naming the file and the key, before anything trains.",
        "",
        "## A scenario's config.yaml",
        "",
        f"Top-level keys: `preset`, {', '.join(f'`{k}`' for k in sorted(CONFIG_KEYS))}.",
        "",
        "Numbers outside their range, and NaN or infinity, are refused ([limits](../limits.md)).",
        "",
        "| key | default | range | meaning |",
        "|---|---|---|---|",
        f"| `preset` | none | | a named starting point: {', '.join(f'`{p}`' for p in preset_names())}; "
        "the other keys change it |",
    ]
    for key in SCALARS:
        default = "derived from the content" if key == "name" else _code(_yaml_value(getattr(scenario, key)))
        out.append(f"| `{key}` | {default} | {_allowed(key)} | {_md(top_comments.get(key, ''))} |")
    out.append(
        "| `breaks` | `[]` | | a list of breaks, each a YAML name or a one-key mapping "
        "`{name: {parameter: value}}`: the [break catalogue](breaks.md) |"
    )
    out += [
        "",
        "```yaml",
        "# experiments/19-break-no-clip/config.yaml",
        (DOCS.parent / "experiments" / "19-break-no-clip" / "config.yaml").read_text().rstrip(),
        "```",
        "",
    ]
    for section, cls in SECTIONS.items():
        out += [f"### `{section}`", ""]
        doc = _docstring(cls)
        if doc and not doc.startswith(cls.__name__ + "("):
            out += [doc, ""]
        if section == "model":
            out += [
                "`model.preset` picks a shape first: "
                + ", ".join(f"`{name}` ({p.n_embd} wide, {p.n_layer} layers)" for name, p in PRESETS.items())
                + ". `model.factory` (an import path `package.module:function`) and `model.kwargs` train your "
                "own model instead ([your own model](../scenarios.md#your-own-model)).",
                "",
            ]
        out += _section_rows(section, cls)
        out.append("")
        for f in dataclasses.fields(cls):
            nested = getattr(cls(), f.name)
            if dataclasses.is_dataclass(nested):
                out += [
                    f"#### `{section}.{f.name}`",
                    "",
                    _docstring(type(nested)),
                    "",
                    *_section_rows(f"{section}.{f.name}", type(nested)),
                    "",
                ]
    out += [
        "## A sweep file",
        "",
        f"Top-level keys: {', '.join(f'`{k}`' for k in SWEEP_KEYS)}, and any key of a config.yaml "
        f"({', '.join(f'`{k}`' for k in sorted(CONFIG_KEYS - {'name'}))}) as an override of the base.",
        "",
        _docstring(load_sweep),
        "",
        "In Python, `pytest_spikecheck.Sweep`:",
        "",
        _docstring(Sweep),
        "",
        "```yaml",
        "# experiments/sweeps/lr-sensitivity-by-width.yaml",
        (DOCS.parent / "experiments" / "sweeps" / "lr-sensitivity-by-width.yaml").read_text().rstrip(),
        "```",
        "",
    ]
    return "\n".join(out) + "\n"


# -------------------------------------------------------------------------- the run-folder schema


def _schema_type(node: dict) -> str:
    if "const" in node:
        return f"const {json.dumps(node['const'])}"
    if "enum" in node:
        return "one of " + ", ".join(json.dumps(v) for v in node["enum"])
    if "oneOf" in node or "anyOf" in node:
        return " or ".join(_schema_type(n) for n in node.get("oneOf", node.get("anyOf", [])))
    t = node.get("type", "any")
    if isinstance(t, list):
        t = " or ".join(t)
    if t == "array" and isinstance(node.get("items"), dict):
        t = f"array of {_schema_type(node['items'])}"
    return t


def _schema_rows(node: dict, path: str, required: bool, rows: list[str]) -> None:
    rows.append(f"| `{path}` | {_md(_schema_type(node))} | {'yes' if required else ''} | {_md(node.get('description', ''))} |")
    variants = [node] + [n for n in node.get("oneOf", node.get("anyOf", [])) if isinstance(n, dict)]
    for variant in variants:
        for key, child in variant.get("properties", {}).items():
            _schema_rows(child, f"{path}.{key}", key in variant.get("required", []), rows)
        items = variant.get("items")
        if isinstance(items, dict) and items.get("properties"):
            for key, child in items["properties"].items():
                _schema_rows(child, f"{path}[].{key}", key in items.get("required", []), rows)


def run_schema_page() -> str:
    """Every key of a run folder's files, from the JSON Schema the tests validate run folders with."""
    schema = json.loads((DOCS / "run-schema.json").read_text())
    out = [
        "# Run-folder schema",
        "",
        f"*{_md(schema['title'])}*, generated from "
        "[`run-schema.json`](../run-schema.json) (JSON Schema draft 2020-12; the suite validates the run "
        "folders it writes against it). What each field means in words: [run format](../run-format.md).",
        "",
        _md(schema.get("description", "")),
        "",
    ]
    for name, node in schema["properties"].items():
        out += [
            f"## `{name}`",
            "",
            _md(node.get("description", "")),
            "",
            "| key | type | required | description |",
            "|---|---|---|---|",
        ]
        rows: list[str] = []
        for key, child in node.get("properties", {}).items():
            _schema_rows(child, key, key in node.get("required", []), rows)
        items = node.get("items")
        if isinstance(items, dict):
            for key, child in items.get("properties", {}).items():
                _schema_rows(child, key, key in items.get("required", []), rows)
        out += rows + [""]
    return "\n".join(out) + "\n"


#: The generated pages: path under docs/ -> the function that writes it.
PAGES: dict[str, Callable[[], str]] = {
    "reference/api.md": api_page,
    "reference/cli.md": cli_page,
    "reference/breaks.md": breaks_page,
    "reference/yaml.md": yaml_page,
    "reference/run-folder.md": run_schema_page,
}


ROOT = DOCS.parent
_INCLUDE = re.compile(r"^<!--\s*include:\s*(?P<file>\S+)\s+(?P<region>[\w-]+)\s*-->[ \t]*$", re.MULTILINE)
_LINK = re.compile(r"(?<!!)\[(?P<text>[^\]]*)\]\((?P<target>[^)\s#]+)(?P<anchor>#[^)\s]*)?\)")


def include(text: str) -> str:
    """``<!-- include: README.md quick-start -->``: the region of the repository file between
    ``<!-- site: quick-start -->`` and ``<!-- /site: quick-start -->``, its links (written from the
    repository root) rewritten for a page in docs/. The README stays the one copy of its text
    (the documentation test runs its blocks there)."""

    def region(m: re.Match) -> str:
        source = (ROOT / m["file"]).read_text()
        start, end = f"<!-- site: {m['region']} -->", f"<!-- /site: {m['region']} -->"
        if start not in source or end not in source:
            raise ValueError(f"{m['file']} has no region {m['region']!r} ({start} ... {end})")
        body = source.split(start, 1)[1].split(end, 1)[0].strip("\n")
        return _LINK.sub(lambda link: _from_root(link), body)

    return _INCLUDE.sub(region, text)


def _from_root(link: re.Match) -> str:
    target = link["target"]
    if re.match(r"[a-z]+:", target):
        return link[0]
    rel = target[len("docs/") :] if target.startswith("docs/") else f"../{target}"
    return f"[{link['text']}]({rel}{link['anchor'] or ''})"


def outside_links(text: str, page: str) -> tuple[str, list[str]]:
    """Links from a page to repository files outside docs/ (``../scenarios/test_x.py``): on GitHub
    they open the file; the site has no copy of it, so there it shows the path as text. A link
    to a file that does not exist is returned as a problem (a warning: ``--strict`` fails)."""
    problems: list[str] = []
    here = (DOCS / page).parent

    def one(link: re.Match) -> str:
        target = link["target"]
        if re.match(r"[a-z]+:", target):
            return link[0]
        path = (here / target).resolve()
        if path.is_relative_to(DOCS) or not path.is_relative_to(ROOT):
            return link[0]
        if not path.exists():
            problems.append(f"{page}: links to {target}, which the repository does not have")
            return link[0]
        shown = path.relative_to(ROOT).as_posix() + ("/" if path.is_dir() else "")
        text = link["text"]
        return text if shown.rstrip("/") in text else f"{text} (`{shown}`)"

    return _LINK.sub(one, text), problems


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """MkDocs event: the README regions included, links to repository files outside docs/ as text."""
    import logging

    markdown, problems = outside_links(include(markdown), page.file.src_uri)
    for problem in problems:
        logging.getLogger("mkdocs.plugins.spikecheck").warning(problem)
    return markdown


def on_files(files: Any, config: Any) -> Any:
    """MkDocs event: add the generated pages as files of the site."""
    from mkdocs.structure.files import File

    for path, build in PAGES.items():
        files.append(File.generated(config, path, content=build()))
    return files
