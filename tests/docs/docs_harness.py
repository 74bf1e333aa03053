"""The documentation test: every fenced block of the documented pages runs (docs/testing.md).

Sybil parses each page into examples that run in page order in one namespace per page; this
module gives it three parsers:

- **fenced blocks** (every one, whatever its language): ``python`` runs (a doctest when it
  holds ``>>>``; a test module under an in-process ``pytest --spikecheck`` when it defines
  ``test_*`` functions or fixtures; a script in a subprocess when it has an
  ``if __name__ == "__main__":`` guard; else in the page's namespace), ``bash`` runs each
  command line and checks its exit status (``# exit N`` says which), ``console`` runs each
  ``$ command`` and compares its output with the lines below it, ``yaml`` loads as a
  scenario (and equals the file its first line names). Any other block (``text``, none) must
  be claimed by a named check (``<!-- docs-test: NAME -->`` above it) or marked;
- **the marker** ``*Not run by the docs test: REASON.*`` on the line above a block: the
  block is reported as skipped with that reason, which the reader sees too;
- **named checks** ``<!-- docs-test: NAME -->`` for blocks that are neither code nor a
  transcript (the CLI synopsis, a failure message): NAME is a function in ``CHECKS``.

What a block assumes the reader has (their model, their data, their log file) it says in a
first comment line ``# assumes: NAME, ...``; the stand-ins of ``docs_stand_ins`` are given
to exactly those blocks. Blocks run in a sandbox folder per page (a copy of the shipped
experiments' configs, the repository's ``tests/data``), with this interpreter's ``bin/``
first on ``PATH`` (as after ``source .venv/bin/activate``). Trainings are shared: while a
block runs, ``train`` returns a copy of an earlier identical run of this process (same
content hash, backend, device, threads: bit-identical by the engine's determinism).
"""

from __future__ import annotations

import contextlib
import copy
import doctest
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any, Callable, Iterable

import pytest
from sybil import Document, Region, Sybil
from sybil.parsers.markdown.lexers import RawFencedCodeBlockLexer

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def site_pages(root: Path = ROOT) -> list[str]:
    """The pages of the documentation site's nav (mkdocs.yml) that are files of docs/ with a
    fenced block, relative to the repository root (the reference pages are generated at build
    time: they have no file here)."""
    import yaml

    def walk(node: Any) -> Iterable[str]:
        if isinstance(node, str):
            yield node
        elif isinstance(node, list):
            for item in node:
                yield from walk(item)
        elif isinstance(node, dict):
            for value in node.values():
                yield from walk(value)

    config = yaml.safe_load((root / "mkdocs.yml").read_text())
    docs = root / config.get("docs_dir", "docs")
    pages = []
    for page in walk(config["nav"]):
        path = docs / page
        if page.endswith(".md") and path.is_file() and "```" in path.read_text():
            pages.append(path.relative_to(root).as_posix())
    return pages


#: The pages whose blocks run (relative to the repository root): the README and every page of the
#: site's nav that has a block.
PAGES = ["README.md", *site_pages()]

MARKER = "*Not run by the docs test: REASON.*"
_MARKER = re.compile(r"^\*Not run by the docs test: (?P<reason>[^\n]+?)\*[ \t]*$", re.MULTILINE)
_CHECK = re.compile(r"^<!--\s*docs-test:\s*(?P<name>[\w-]+)\s*-->[ \t]*$", re.MULTILINE)
_NEXT_FENCE = re.compile(r"\n[ \t]*\n?[ \t]*(```|~~~)")
_ASSUMES = re.compile(r"^\s*#\s*assumes:\s*(?P<names>[^(\n]+)", re.MULTILINE)
_EXIT = re.compile(r"#\s*exit\s+(?P<code>\d+)")

#: Relative tolerance for numbers in expected output: float32 kernels differ between CPUs
#: and a spike amplifies the difference (the demo table's 66.8× on one VM was 61.3× on
#: another). Text must match exactly (runs of spaces count as one: table columns widen).
OUTPUT_RTOL = 0.2
_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?")

_PENDING = "__docs_pending__"
_ENV = "__docs_env__"
_DONE = "__docs_done__"  # the start offsets of the page's examples that ran in this process


class DocsError(AssertionError):
    """A block that does not do what its page says (the message names the page and line)."""


# ----------------------------------------------------------------------------- the sandbox


class PageEnv:
    """One page's sandbox: a folder laid out like a fresh clone (experiment configs and the
    repository's test data), where the page's blocks run one after another."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="spikecheck-docs-"))
        shutil.copytree(ROOT / "experiments", self.dir / "experiments", ignore=shutil.ignore_patterns("run", "run-*"))
        (self.dir / "tests").mkdir()
        os.symlink(ROOT / "tests" / "data", self.dir / "tests" / "data")
        # the inner pytest sessions: this sandbox is their rootdir; Hypothesis runs 10 examples
        (self.dir / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\nfilterwarnings = error\n")
        (self.dir / "conftest.py").write_text(
            "from hypothesis import settings\n"
            "settings.register_profile('docs', max_examples=10, derandomize=True, database=None, deadline=None)\n"
            "settings.load_profile('docs')\n"
        )
        self.modules = 0

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "GITHUB_STEP_SUMMARY"}  # (see _no_job_summary)
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        return env

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def _page_env(namespace: dict) -> PageEnv:
    if _ENV not in namespace:
        namespace[_ENV] = PageEnv()
    return namespace[_ENV]


def _teardown(namespace: dict) -> None:
    env = namespace.pop(_ENV, None)
    if env is not None:
        env.close()


# ------------------------------------------------------------------- shared training runs

_RUNS: dict[tuple, Any] = {}


def _shared_train(real_train: Callable) -> Callable:
    def train(scenario, *, backend="auto", device="cpu", threads=1, callbacks=(), nproc=1):
        if callbacks or nproc != 1 or scenario.model_factory is not None:
            return real_train(scenario, backend=backend, device=device, threads=threads, callbacks=callbacks, nproc=nproc)
        from pytest_spikecheck.clipping import resolve_backend

        # "auto" on the CPU is torch: the plugin asks for "torch", a snippet for "auto"; one run
        concrete = resolve_backend(backend, device) if device == "cpu" else backend
        key = (scenario.content_hash(), concrete, device, threads)
        if key not in _RUNS:
            _RUNS[key] = real_train(scenario, backend=backend, device=device, threads=threads)
        run = copy.deepcopy(_RUNS[key])
        return run.renamed(scenario.name)

    return train


#: What a block that trains says; a block that says none of it runs without importing torch
#: here (unless torch is imported already), so the harness's own tests stay light.
_TRAINS = re.compile(
    r"\btrain\(|spikecheck\.run\(|probe_at\(|lr_sweep\(|record\(|\bimport torch|"
    r"spikecheck_scenario|^spikecheck (train|search)\b",
    re.MULTILINE,
)


@contextlib.contextmanager
def _running_in(env: PageEnv, source: str = ""):
    """cwd = the sandbox, the stand-ins importable; for a block that trains (``_TRAINS``, or
    any block once torch is imported) also trainings shared and torch on one thread (as the
    engine pins it: two threads on a shared 2-core machine ran a snippet's loop 37× slower);
    all undone afterwards."""
    before, old_path = os.getcwd(), list(sys.path)
    os.chdir(env.dir)
    sys.path[:0] = [str(HERE), str(env.dir)]
    try:
        if "torch" in sys.modules or _TRAINS.search(source):
            with _sharing_trainings():
                yield
        else:
            yield
    finally:
        os.chdir(before)
        sys.path[:] = old_path


@contextlib.contextmanager
def _sharing_trainings():
    import torch

    import pytest_spikecheck
    from pytest_spikecheck.training import launch

    real = launch.train
    shared = _shared_train(real)
    had = "train" in vars(pytest_spikecheck)
    launch.train = shared
    pytest_spikecheck.train = shared
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        launch.train = real
        if had:
            pytest_spikecheck.train = real
        else:
            vars(pytest_spikecheck).pop("train", None)


# ------------------------------------------------------------------------ output matching


def _numbers_match(expected: str, actual: str) -> bool:
    e, a = float(expected.replace(",", "")), float(actual.replace(",", ""))
    digits = expected.split("e")[0]
    unit = 10.0 ** -len(digits.split(".")[1]) if "." in digits else 1.0
    return abs(a - e) <= max(OUTPUT_RTOL * abs(e), 2 * unit)


def _line_pattern(expected: str) -> tuple[re.Pattern, list[str]]:
    """A regex for one expected line: text literal (any run of spaces), each number a group,
    each ``...`` any text; and the expected numbers, in order."""
    text = " ".join(expected.split())
    parts, numbers, pos = [], [], 0
    for m in re.finditer(r"\.\.\.|" + _NUMBER.pattern, text):
        parts.append(re.escape(text[pos : m.start()]).replace("\\ ", " "))
        if m[0] == "...":
            parts.append(".*?")
        else:
            parts.append(f"({_NUMBER.pattern})")
            numbers.append(m[0])
        pos = m.end()
    parts.append(re.escape(text[pos:]).replace("\\ ", " "))
    return re.compile("".join(parts)), numbers


def match_line(expected: str, actual: str) -> bool:
    """Text equal (runs of spaces count as one: table columns widen with their numbers),
    numbers within OUTPUT_RTOL (or two units of their last digit), ``...`` any text."""
    pattern, numbers = _line_pattern(expected)
    m = pattern.fullmatch(" ".join(actual.split()))
    return m is not None and all(_numbers_match(e, a) for e, a in zip(numbers, m.groups()))


def match_output(expected: list[str], actual: list[str]) -> str | None:
    """None when ``actual`` matches ``expected`` (a line ``...`` matches any lines), else
    a message pointing at the first difference."""

    def match(i: int, j: int) -> bool:
        if i == len(expected):
            return all(not line.strip() for line in actual[j:])
        if expected[i].strip() == "...":
            return any(match(i + 1, k) for k in range(j, len(actual) + 1))
        return j < len(actual) and match_line(expected[i], actual[j]) and match(i + 1, j + 1)

    while expected and not expected[-1].strip():
        expected = expected[:-1]
    if match(0, 0):
        return None
    # the first expected line that no actual line matches, for the message
    j = 0
    for i, line in enumerate(expected):
        if line.strip() == "...":
            continue
        found = next((k for k in range(j, len(actual)) if match_line(line, actual[k])), None)
        if found is None:
            near = actual[j] if j < len(actual) else "<end of output>"
            return f"expected line {i + 1}:\n  {line}\ngot (next unmatched line):\n  {near}"
        j = found + 1
    return "the output has lines the block does not show (end the block with ... if that is intended)"


# ------------------------------------------------------------------------------- commands


def _run_command(command: str, env: PageEnv) -> tuple[int, str]:
    """Run one shell line in the sandbox; ``spikecheck ...`` runs in this process (so it
    shares trainings), anything else under bash. Returns (exit status, stdout + stderr)."""
    line = command.split(" #")[0].strip()
    words = shlex.split(line)
    if "||" in words[1:] and words[words.index("||") + 1 :][:1] == ["exit"]:
        words = words[: words.index("||")]  # `cmd || exit 1`: a failing status fails the block anyway
    if words and words[0] == "spikecheck" and not any(w in ("|", ">", "&&", ";") for w in words):
        from pytest_spikecheck.cli import main

        out = io.StringIO()
        with _running_in(env, line), contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                code = main(words[1:])
            except SystemExit as stop:  # argparse's usage errors
                code = stop.code if isinstance(stop.code, int) else 1
        return int(code or 0), out.getvalue()
    done = subprocess.run(["bash", "-c", line], cwd=env.dir, env=env.env(), capture_output=True, text=True, timeout=600)
    return done.returncode, done.stdout + done.stderr


def _expected_exit(command: str) -> int:
    comment = command.split(" #", 1)[1] if " #" in command else ""
    m = _EXIT.search("#" + comment)
    return int(m["code"]) if m else 0


def run_bash(source: str, env: PageEnv, where: str) -> None:
    _lay_files(_assumed(source), env)
    for raw in _logical_lines(source):
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        code, out = _run_command(raw, env)
        want = _expected_exit(raw)
        if code != want:
            raise DocsError(f"{where}: `{raw.split(' #')[0].strip()}` exited {code}, the page says {want}\n{out[-3000:]}")


def run_console(source: str, env: PageEnv, where: str) -> None:
    _lay_files(_assumed(source), env)
    blocks: list[tuple[str, list[str]]] = []
    for line in source.splitlines():
        if line.startswith("$ "):
            blocks.append((line[2:], []))
        elif not blocks:
            raise DocsError(f"{where}: a console block starts with a `$ command` line")
        else:
            blocks[-1][1].append(line)
    for command, expected in blocks:
        code, out = _run_command(command, env)
        want = _expected_exit(command)
        if code != want:
            raise DocsError(f"{where}: `{command}` exited {code}, the page says {want}\n{out[-3000:]}")
        problem = match_output(expected, out.splitlines())
        if problem:
            raise DocsError(
                f"{where}: the output of `{command}` differs from the page (numbers within "
                f"{OUTPUT_RTOL:.0%}):\n{problem}\n--- the whole output:\n{out}"
            )


def _logical_lines(source: str) -> Iterable[str]:
    pending = ""
    for line in source.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield pending + line
        pending = ""


# --------------------------------------------------------------------------------- python


def _assumed(source: str) -> list[str]:
    names: list[str] = []
    for m in _ASSUMES.finditer(source):
        names += [n.strip() for n in m["names"].split(",") if n.strip()]
    return names


def _stand_ins(names: list[str], where: str) -> dict[str, Any]:
    import docs_stand_ins

    out = {}
    for name in names:
        if "/" in name or ":" in name or "." in name:
            continue  # a file or an import path: the sandbox or the stand-in package has it
        if not hasattr(docs_stand_ins, name):
            raise DocsError(f"{where}: assumes {name!r}, which tests/docs/docs_stand_ins.py does not provide")
        out[name] = getattr(docs_stand_ins, name)
    return out


def _lay_files(names: list[str], env: PageEnv) -> None:
    """The files a block assumes (``# assumes: output/trainer_state.json``)."""
    import docs_stand_ins

    for name in names:
        if "/" in name and name in docs_stand_ins.FILES:
            target = env.dir / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / docs_stand_ins.FILES[name], target)


def run_python(source: str, namespace: dict, env: PageEnv, where: str, line: int, path: Path) -> None:
    names = _assumed(source)
    _lay_files(names, env)
    if ">>>" in source:
        return _run_doctest(source, namespace, env, where, line, path, names)
    if re.search(r"^if __name__ == ['\"]__main__['\"]:", source, re.MULTILINE):
        return _run_script(source, env, where, names)
    if re.search(r"^(def test_|@spikecheck_scenario|@pytest\.fixture|@given|@pytest\.mark)", source, re.MULTILINE):
        return _run_test_module(source, env, where, names)
    namespace.update(_stand_ins(names, where))
    code = compile(source, f"{path}:{line}", "exec")
    with _running_in(env, source):
        exec(code, namespace)


def _run_doctest(source, namespace, env, where, line, path, names) -> None:
    namespace.update(_stand_ins(names, where))
    test = doctest.DocTestParser().get_doctest(source, namespace, where, str(path), line)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    out = io.StringIO()
    with _running_in(env):
        runner.run(test, out=out.write, clear_globs=False)
    if runner.failures:
        raise DocsError(f"{where}: the doctest fails\n{out.getvalue()}")


def _prelude(names: list[str]) -> str:
    plain = [n for n in names if not ("/" in n or ":" in n or "." in n)]
    return f"from docs_stand_ins import {', '.join(plain)}  # the block's '# assumes:'\n" if plain else ""


def _run_script(source: str, env: PageEnv, where: str, names: list[str]) -> None:
    env.modules += 1
    script = env.dir / f"docs_script_{env.modules}.py"
    script.write_text(_prelude(names) + source)
    done = subprocess.run([sys.executable, script.name], cwd=env.dir, env=env.env(), capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise DocsError(f"{where}: the script exits {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-4000:]}")


class _Reports:
    def __init__(self) -> None:
        self.failed: list[str] = []
        self.passed = 0

    def pytest_runtest_logreport(self, report) -> None:
        if report.failed:
            self.failed.append(f"{report.nodeid} ({report.when}):\n{report.longreprtext}")
        elif report.when == "call" and report.passed:
            self.passed += 1

    def pytest_collectreport(self, report) -> None:
        if report.failed:
            self.failed.append(f"collecting {report.nodeid}:\n{report.longreprtext}")


@contextlib.contextmanager
def _no_job_summary():
    """A block's inner session must not append to the GitHub job summary of the run that tests the docs."""
    saved = os.environ.pop("GITHUB_STEP_SUMMARY", None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ["GITHUB_STEP_SUMMARY"] = saved


def _run_test_module(source: str, env: PageEnv, where: str, names: list[str]) -> None:
    """A block that defines tests or fixtures is a test module: run it with ``pytest
    --spikecheck`` in this process (its trainings shared with the page's other blocks)."""
    env.modules += 1
    module = env.dir / f"test_docs_block_{env.modules}.py"
    module.write_text(_prelude(names) + source)
    reports = _Reports()
    with _running_in(env, source), contextlib.redirect_stdout(io.StringIO()) as out, _no_job_summary():
        code = pytest.main(
            [
                str(module),
                "--spikecheck",
                "-q",
                "-p",
                "no:cacheprovider",
                "-p",
                "no:randomly",
                f"--rootdir={env.dir}",
                "-c",
                str(env.dir / "pytest.ini"),
            ],
            plugins=[reports],
        )
    sys.modules.pop(module.stem, None)
    if reports.failed or code not in (0, pytest.ExitCode.NO_TESTS_COLLECTED):
        detail = "\n".join(reports.failed) or out.getvalue()[-4000:]
        raise DocsError(f"{where}: its tests fail under pytest --spikecheck (exit {int(code)})\n{detail}")


# ----------------------------------------------------------------------------------- yaml


def run_yaml(source: str, env: PageEnv, where: str) -> None:
    """A scenario config (every key checked, as `spikecheck train` reads it); with a first line
    ``# PATH`` naming a file of the repository, that file's content (its scenario, for a
    scenario config; its YAML data otherwise, e.g. a CI workflow shipped in the repository)."""
    import yaml

    from pytest_spikecheck.errors import ConfigError
    from pytest_spikecheck.scenario import Scenario

    first = source.lstrip().splitlines()[0] if source.strip() else ""
    named = re.match(r"#\s*(\S+\.ya?ml)\s*$", first)
    raw = yaml.safe_load(source) or {}
    if named and (ROOT / named[1]).is_file():
        shipped = yaml.safe_load((ROOT / named[1]).read_text())
        try:
            same = Scenario.from_dict(raw).content_hash() == Scenario.from_yaml(ROOT / named[1]).content_hash()
        except ConfigError:
            same = raw == shipped
        if not same:
            raise DocsError(f"{where}: this block is not the content of {named[1]}")
        return
    if named:
        raise DocsError(f"{where}: names {named[1]}, which the repository does not have")
    with _running_in(env):
        try:
            scenario = Scenario.from_dict(raw, where=where)
        except ConfigError as problem:
            raise DocsError(
                f"{where}: not a scenario config ({problem}); if it is another file's YAML, name the "
                f"file on its first line (# PATH) or mark the block: {MARKER}"
            ) from None
    if scenario.model_factory is not None and not _assumed(source):
        raise DocsError(f"{where}: names a model factory: say which with '# assumes:'")


# ---------------------------------------------------------------------------- named checks


def check_cli_synopsis(source: str, env: PageEnv, where: str) -> None:
    """Each `spikecheck CMD` line group lists exactly the options CMD's parser has."""
    from pytest_spikecheck.cli.commands import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    shown: dict[str, set[str]] = {}
    current = None
    for line in source.splitlines():
        m = re.match(r"spikecheck (\w+)", line.strip())
        if m:
            current = m[1]
            shown[current] = set()
        if current:
            shown[current] |= set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", line))
    problems = []
    for name, command in sub.choices.items():
        have = {o for a in command._actions for o in a.option_strings if o.startswith("--") and o != "--help"}
        if name not in shown:
            problems.append(f"`spikecheck {name}` is missing")
            continue
        if have - shown[name]:
            problems.append(f"`spikecheck {name}` lacks {sorted(have - shown[name])}")
        if shown[name] - have:
            problems.append(f"`spikecheck {name}` shows {sorted(shown[name] - have)}, which it does not have")
    problems += [f"`spikecheck {n}` is not a command" for n in shown if n not in sub.choices]
    if problems:
        raise DocsError(f"{where}: the synopsis differs from the parser: " + "; ".join(problems))


def check_failure_example(source: str, env: PageEnv, where: str) -> None:
    """The failure shown is what ``assert_spike`` raises on the scenario the plugin's own
    failure test trains (tests/plugin/test_failure_messages.py: 40 steps, a burst at 30)."""
    from pytest_spikecheck import NoClip, RareTokenBurst, Scenario, assert_spike
    from pytest_spikecheck.errors import SpikeCheckError

    scenario = (
        Scenario.preset("phase-19")
        .replace(name="tiny_break", steps=40)
        .with_breaks(NoClip(), RareTokenBurst(count=3, at_step=30))
    )
    with _running_in(env, "train("):
        from pytest_spikecheck.training.launch import train

        run = train(scenario, backend="torch")
        run.meta["reproduce"] = (
            f"pytest --spikecheck --spikecheck-backend torch  # scenario tiny_break, content hash {run.meta['content_hash']}"
        )
    from pytest_spikecheck.judge.verdict import collecting

    try:
        # as the plugin runs the page's test: its reproduce line names the test, whatever runs this check
        with collecting(reproduce="pytest 'test_fail.py::test_too_demanding' --spikecheck"):
            assert_spike(run, at=30, min_ratio=1000)
    except SpikeCheckError as failure:
        lines = str(failure).splitlines()
        actual = [f"E   pytest_spikecheck.errors.SpikeCheckError: {lines[0]}"] + [f"E   {x}".rstrip() for x in lines[1:]]
    else:
        raise DocsError(f"{where}: assert_spike passed where the page shows a failure")
    problem = match_output([x.rstrip() for x in source.splitlines()], actual)
    if problem:
        raise DocsError(f"{where}: the failure differs from the page:\n{problem}\n--- the whole failure:\n" + "\n".join(actual))


CHECKS: dict[str, Callable[[str, PageEnv, str], None]] = {
    "cli-synopsis": check_cli_synopsis,
    "failure-example": check_failure_example,
}


# -------------------------------------------------------------------------------- parsers


def _where(example) -> str:
    return f"{Path(example.path).relative_to(ROOT) if Path(example.path).is_relative_to(ROOT) else example.path}:{example.line}"


def _in_page_order(evaluate: Callable) -> Callable:
    """A page's examples share a namespace and a sandbox, and run in page order (a marker
    hands its block a pending skip; a block defines what a later one uses). Under ``pytest -n N
    --dist load`` a worker gets some of a page's examples, not all: before an example runs, the
    page's earlier examples that have not run in this process run first (a skipped one stays
    skipped), so that each example sees what it would in page order. Under ``--dist loadscope``
    (``make test``) a page runs whole on one worker and nothing runs twice."""

    def in_order(example) -> Any:
        done = example.namespace.setdefault(_DONE, set())
        for earlier in example.document.examples():
            if earlier.start >= example.start:
                break
            if earlier.start not in done:
                done.add(earlier.start)
                try:
                    earlier.evaluate()
                except pytest.skip.Exception:
                    pass
        done.add(example.start)
        return evaluate(example)

    return in_order


@_in_page_order
def evaluate_block(example) -> None:
    info, source = example.parsed
    namespace = example.namespace
    pending = namespace.pop(_PENDING, None)
    where = _where(example)
    if pending and pending[0] == "skip":
        # reported at the block's page and line (the item's location), as a skip mark is
        raise pytest.skip.Exception(pending[1], _use_item_location=True)
    env = _page_env(namespace)
    language = info.split()[0].lower() if info.strip() else ""
    if pending and pending[0] == "check":
        if pending[1] not in CHECKS:
            raise DocsError(f"{where}: no docs check named {pending[1]!r} (known: {', '.join(CHECKS)})")
        return CHECKS[pending[1]](source, env, where)
    if language == "python":
        return run_python(source, namespace, env, where, example.line, Path(example.path))
    if language in ("bash", "sh", "shell"):
        return run_bash(source, env, where)
    if language == "console":
        return run_console(source, env, where)
    if language == "yaml":
        return run_yaml(source, env, where)
    raise DocsError(
        f"{where}: a ```{language or ' '} block that nothing checks: show it as a ```console "
        f"transcript, name a check above it (<!-- docs-test: NAME -->, NAME one of {', '.join(CHECKS)}), "
        f"or mark it on the line above: {MARKER}"
    )


@_in_page_order
def evaluate_marker(example) -> None:
    kind, value, followed = example.parsed
    if not followed:
        raise DocsError(f"{_where(example)}: the line after a docs-test marker must open the block it marks")
    if example.namespace.get(_PENDING):
        raise DocsError(f"{_where(example)}: two docs-test markers for one block")
    example.namespace[_PENDING] = (kind, value)


def parse_blocks(document: Document) -> Iterable[Region]:
    lexer = RawFencedCodeBlockLexer(
        info_pattern=re.compile(r"(?P<info>[^\n]*)$\n", re.MULTILINE), mapping={"info": "info", "source": "source"}
    )
    for region in lexer(document):
        info, source = region.lexemes["info"], region.lexemes["source"]
        yield Region(region.start, region.end, (str(info), textwrap.dedent(str(source))), evaluate_block)


def parse_markers(document: Document) -> Iterable[Region]:
    for kind, pattern, group in (("skip", _MARKER, "reason"), ("check", _CHECK, "name")):
        for m in pattern.finditer(document.text):
            followed = _NEXT_FENCE.match(document.text, m.end()) is not None
            yield Region(m.start(), m.end(), (kind, m[group].strip(), followed), evaluate_marker)


def sybil(patterns: list[str] = PAGES, path: Path = ROOT) -> Sybil:
    """The documentation test's Sybil: ``pytest_collect_file = sybil().pytest()`` (root conftest.py)."""
    return Sybil(parsers=[parse_markers, parse_blocks], patterns=patterns, path=str(path), teardown=_teardown, name="docs")
