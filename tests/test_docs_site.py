"""The documentation site (mkdocs.yml, docs/): it builds with ``mkdocs build --strict`` (broken links,
missing pages and bad docstring references fail), it works offline (no asset from the network),
its generated reference pages say what the code says (every public name with its signature,
every CLI subcommand and option, every registered break, every YAML key, every run-folder key),
the README stays short, and the documentation test covers every page of the nav with blocks.

The site is built once per module, into a temporary folder (about 6 s of CPU). Each check is a
function that returns what is missing, run on the built pages and on a sabotaged copy of them.
"""

from __future__ import annotations

import dataclasses
import html
import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _hooks():
    import importlib.util

    spec = importlib.util.spec_from_file_location("spikecheck_docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    # (no skip without mkdocs: the dev extra pins it, and `make test` must build the site)
    assert done.returncode == 0, (
        f"mkdocs build --strict failed (mkdocs is in the dev extra):\n{done.stdout[-3000:]}{done.stderr[-6000:]}"
    )
    return out


def _text(fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


# --------------------------------------------------------------------------------- offline

#: An attribute that makes the browser fetch something, or a CSS rule that does.
_FETCHES = re.compile(
    r"<(?:script|link|img|iframe|source|video|audio|embed|object)\b[^>]*?\b(?:src|href|data|srcset)"
    r"\s*=\s*[\"']?(?P<url>[^\"'\s>]+)",
    re.IGNORECASE,
)
_CSS_FETCHES = re.compile(r"(?:@import\s+(?:url\()?|url\()\s*[\"']?(?P<url>[^\"')\s]+)", re.IGNORECASE)
_REMOTE = re.compile(r"^(?:https?:)?//", re.IGNORECASE)


def external_assets(text: str, css: bool = False) -> list[str]:
    """The network addresses a page or a stylesheet would load (fonts, CDN scripts, images), and
    a Mermaid block (Material fetches Mermaid from unpkg for it)."""
    found = [m["url"] for m in _CSS_FETCHES.finditer(text) if _REMOTE.match(m["url"])]  # style blocks too
    if not css:
        found += [m["url"] for m in _FETCHES.finditer(text) if _REMOTE.match(m["url"])]
        if re.search(r"class=[\"'][^\"']*\bmermaid\b", text):
            found.append("a mermaid diagram (Material loads it from unpkg.com)")
    return found


def test_the_site_loads_nothing_from_the_network(site):
    problems = {}
    for path in sorted(site.rglob("*")):
        if path.suffix in (".html", ".css"):
            found = external_assets(path.read_text(errors="replace"), css=path.suffix == ".css")
            if found:
                problems[path.relative_to(site).as_posix()] = found
    assert not problems, problems


def test_the_offline_check_finds_a_web_font_a_cdn_script_and_a_css_import():
    page = (
        '<link rel="stylesheet" href="https://fonts.googleapis.com/css?family=Roboto">'
        '<script src="//cdn.jsdelivr.net/npm/x.js"></script><img src="panels/a.png">'
        '<style>@import url("https://unpkg.com/y.css");</style>'
    )
    assert external_assets(page) == [
        "https://unpkg.com/y.css",
        "https://fonts.googleapis.com/css?family=Roboto",
        "//cdn.jsdelivr.net/npm/x.js",
    ]
    assert external_assets("a { background: url(https://example.com/x.png) }", css=True) == ["https://example.com/x.png"]
    assert external_assets('<a href="https://github.com/x">a link, not an asset</a>') == []


def test_the_theme_asks_for_no_web_font():
    import yaml

    assert yaml.safe_load((ROOT / "mkdocs.yml").read_text())["theme"]["font"] is False


# ---------------------------------------------------------------------------- the Python API


def _signature_problems(page: str, name: str, module: str) -> list[str]:
    import pytest_spikecheck

    anchor = f'id="{module}.{name}"'
    if anchor not in page:
        return [f"{name}: no entry ({anchor})"]
    start = page.index(anchor)
    following = page.find('class="doc doc-heading"', page.index("</h", start))
    text = _text(page[start : following if following > 0 else None])
    obj = getattr(pytest_spikecheck, name)
    if not (callable(obj) and not (isinstance(obj, type) and issubclass(obj, BaseException))):
        return [] if name in text else [f"{name}: its entry does not name it"]
    problems = [] if f"{name}(" in text.replace(" (", "(") else [f"{name}: no signature"]
    for parameter in inspect.signature(obj).parameters.values():
        if not re.search(rf"(?<![\w.]){re.escape(parameter.name)}\s*[:=,)]", text):
            problems.append(f"{name}: the signature lacks {parameter.name}")
    return problems


def api_problems(page: str) -> list[str]:
    """Each public name without its entry on the API page, or whose entry lacks a parameter of
    ``inspect.signature``."""
    hooks = _hooks()
    problems: list[str] = []
    for name, module in hooks.public_api().items():
        problems += _signature_problems(page, name, module)
    return problems


def test_the_api_page_has_every_public_name_with_its_signature(site):
    page = (site / "reference" / "api.html").read_text()
    assert api_problems(page) == []
    import pytest_spikecheck

    assert sorted(_hooks().public_api()) == sorted(n for n in pytest_spikecheck.__all__ if n != "__version__")


def test_every_public_module_has_its_group_on_the_api_page():
    hooks = _hooks()
    assert set(hooks.public_api().values()) <= set(hooks.API_GROUPS)


def test_the_api_check_fails_on_a_dropped_name_and_a_stale_signature(site):
    page = (site / "reference" / "api.html").read_text()
    dropped = page.replace('id="pytest_spikecheck.judge.assertions.assert_spike"', 'id="gone"')
    assert 'assert_spike: no entry (id="pytest_spikecheck.judge.assertions.assert_spike")' in api_problems(dropped)
    start = page.index('id="pytest_spikecheck.judge.assertions.assert_recovers"')
    stale = page[:start] + page[start:].replace("within", "inside", 2)
    assert "assert_recovers: the signature lacks within" in api_problems(stale)


def test_the_examples_in_the_public_docstrings_run():
    """The reference shows the docstrings' ``>>>`` examples: each must do what it shows."""
    import doctest

    import pytest_spikecheck

    finder, runner = doctest.DocTestFinder(recurse=False), doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    ran = 0
    for name in _hooks().public_api():
        for test in finder.find(getattr(pytest_spikecheck, name), name, globs={name: getattr(pytest_spikecheck, name)}):
            ran += len(test.examples)
            runner.run(test)
    assert runner.failures == 0 and ran >= 7  # Scenario's and get_detector's, at least


def test_the_docstring_extension_writes_markdown():
    import importlib.util

    spec = importlib.util.spec_from_file_location("griffe_docstrings", ROOT / "docs" / "griffe_docstrings.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.markdown_docstring("Returns a :class:`~.records.run.Run` (:func:`train`).") == "Returns a `Run` (`train`)."
    assert module.markdown_docstring("Like this::\n\n    x = 1") == "Like this:\n\n    x = 1"
    assert module.markdown_docstring("An example.\n\n>>> 1 + 1\n2\n\nDone.") == (
        "An example.\n\n```python\n>>> 1 + 1\n2\n```\n\nDone."
    )


# ------------------------------------------------------------------------------------ the CLI


def _section(page: str, anchor: str, anchors: list[str]) -> str | None:
    """The page from the element with ``id=anchor`` to the next of ``anchors`` (None: no such element)."""
    start = page.find(f'id="{anchor}"')
    if start < 0:
        return None
    ends = [i for i in (page.find(f'id="{other}"', start + 1) for other in anchors) if i > start]
    return page[start : min(ends, default=len(page))]


def cli_problems(page: str) -> list[str]:
    """Each subcommand of ``spikecheck`` without its section, and each argument missing from its table."""
    from pytest_spikecheck.cli.commands import build_parser

    hooks = _hooks()
    _, commands = hooks._subcommands(build_parser())
    problems = []
    for name, parser in commands.items():
        section = _section(page, f"spikecheck-{name}", [f"spikecheck-{n}" for n in commands])
        if section is None:
            problems.append(f"spikecheck {name}: no section")
            continue
        cells = [html.unescape(c) for c in re.findall(r"<td><code>(.*?)</code></td>", section)]
        for action in parser._actions:
            if action.help == "==SUPPRESS==" or type(action).__name__ == "_HelpAction":
                continue
            for option in action.option_strings or [action.metavar or action.dest]:
                if not any(re.match(rf"(?:\S+, )*{re.escape(option)}(?![\w-])", cell) for cell in cells):
                    problems.append(f"spikecheck {name}: {option} is not in its table of options")
    return problems


def test_the_cli_page_names_every_subcommand_and_option(site):
    assert cli_problems((site / "reference" / "cli.html").read_text()) == []


def test_the_cli_check_fails_on_a_missing_option(site):
    page = (site / "reference" / "cli.html").read_text()
    assert "spikecheck check: --strict-finite is not in its table of options" in cli_problems(
        page.replace("<td><code>--strict-finite</code></td>", "<td><code>--x</code></td>")
    )
    assert "spikecheck sweep: no section" in cli_problems(page.replace('id="spikecheck-sweep"', 'id="x"'))


# -------------------------------------------------------------------------- the break catalogue


def break_problems(page: str) -> list[str]:
    """Each registered break without its section (YAML name, class, parameters)."""
    problems = []
    registry = _hooks()._registry()
    for name, cls in registry.items():
        section = _section(page, name, list(registry))
        if section is None:
            problems.append(f"{name}: no section")
            continue
        text = _text(section)
        for needed in [cls.__name__, *(f.name for f in dataclasses.fields(cls))]:
            if needed not in text:
                problems.append(f"{name}: {needed} is not in its section")
    return problems


def test_the_break_catalogue_names_every_registered_break(site):
    assert break_problems((site / "reference" / "breaks.html").read_text()) == []


def test_the_break_check_fails_on_a_dropped_break(site):
    page = (site / "reference" / "breaks.html").read_text()
    assert "qk_clip: no section" in break_problems(page.replace('id="qk_clip"', 'id="x"'))


def test_the_break_catalogue_is_built_from_the_registry(monkeypatch):
    """Sabotage of the generator itself: a break taken out of the registry leaves the page."""
    hooks = _hooks()
    registry = hooks._registry()
    monkeypatch.setattr(hooks, "_registry", lambda: {k: v for k, v in registry.items() if k != "no_clip"})
    assert "{ #no_clip }" not in hooks.breaks_page()
    assert "{ #clip_at }" in hooks.breaks_page()


# ------------------------------------------------------------------------ YAML and run schema


def test_the_yaml_page_has_every_key_of_a_scenario_and_a_sweep_file(site):
    from pytest_spikecheck.scenario.config import CONFIG_KEYS
    from pytest_spikecheck.scenario.sections import SECTIONS
    from pytest_spikecheck.sweep.spec import SWEEP_KEYS

    text = _text((site / "reference" / "yaml.html").read_text())
    wanted = [*CONFIG_KEYS, *SWEEP_KEYS, "preset"]
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            wanted.append(f"{section}.{f.name}")
            default = getattr(cls(), f.name)
            if dataclasses.is_dataclass(default):
                wanted += [f"{section}.{f.name}.{g.name}" for g in dataclasses.fields(default)]
    assert [key for key in wanted if key not in text] == []


def test_the_field_comments_are_the_dataclass_source_comments():
    from pytest_spikecheck.scenario.sections import SamplerSpec

    comments = _hooks().field_comments(SamplerSpec)
    assert comments["rare_cap"] == "stratified: at most this many rare samples per batch"
    assert (
        comments["accumulate"].startswith("mean: the loss is the token-weighted mean")
        and "(AccumulateSum, the bug)" in comments["accumulate"]
    )


def _schema_keys(node: dict, prefix: str = "") -> list[str]:
    keys = []
    for variant in [node, *node.get("oneOf", []), *node.get("anyOf", [])]:
        for key, child in variant.get("properties", {}).items():
            keys.append(prefix + key)
            keys += _schema_keys(child, f"{prefix}{key}.")
        if isinstance(variant.get("items"), dict):
            keys += _schema_keys(variant["items"], f"{prefix[:-1]}[]." if prefix else "")
    return keys


def test_the_run_folder_page_has_every_key_of_the_schema(site):
    schema = json.loads((ROOT / "docs" / "run-schema.json").read_text())
    text = _text((site / "reference" / "run-folder.html").read_text())
    missing = []
    for name, node in schema["properties"].items():
        assert name in text
        missing += [key for key in _schema_keys(node) if key not in text]
    assert missing == []


# ------------------------------------------------------------------------ README and doc tests


def test_the_readme_is_at_most_250_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def test_the_documentation_test_covers_every_nav_page_with_a_block():
    sys.path.insert(0, str(ROOT / "tests" / "docs"))
    try:
        import docs_harness
    finally:
        sys.path.remove(str(ROOT / "tests" / "docs"))
    nav = docs_harness.site_pages()
    with_blocks = [
        f"docs/{p.relative_to(ROOT / 'docs').as_posix()}" for p in (ROOT / "docs").rglob("*.md") if "```" in p.read_text()
    ]
    assert sorted(with_blocks) == sorted(nav), "a page with blocks is missing from mkdocs.yml's nav"
    assert set(docs_harness.PAGES) == {"README.md", *nav}


def test_the_readme_regions_the_pages_include_exist():
    """The pages show the README's blocks that train the demo's runs by including them (one copy,
    doc-tested once: a second copy on another page would train the runs again on another worker)."""
    hooks = _hooks()
    included = hooks.include((ROOT / "docs" / "getting-started.md").read_text())
    assert "<!-- include:" not in included and "make demo" in included and "](docs/" not in included
    assert "def test_spike(phase19_break):" in hooks.include((ROOT / "docs" / "plugin.md").read_text())
    with pytest.raises(ValueError, match="no region 'gone'"):
        hooks.include("<!-- include: README.md gone -->")
