"""The documentation test's own sabotage: each way a page can be wrong must fail it (and the
honest forms pass). Pages are written into a pytester folder and collected by the same Sybil
the repository uses (tests/docs/docs_harness.py), in one in-process session."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

PAGES = {
    # name -> (page, the outcome its one block must have)
    "number_within": ("```console\n$ echo 'ratio 61.3× at step 312'\nratio 66.8× at step 312\n```\n", "passed"),
    "number_beyond": ("```console\n$ echo 'ratio 40.0× at step 312'\nratio 66.8× at step 312\n```\n", "failed"),
    "text_differs": ("```console\n$ echo 'ratio 66.8× at step 312'\nratio 66.8× on step 312\n```\n", "failed"),
    "ellipsis": ("```console\n$ printf 'a 1\\nb 2\\nc 3\\n'\na 1\n...\nc 3\n```\n", "passed"),
    "extra_output": ("```console\n$ printf 'a 1\\nb 2\\n'\na 1\n```\n", "failed"),
    "unclaimed_text": ("```\nsome output nobody checks\n```\n", "failed"),
    "unknown_language": ("```toml\n[x]\n```\n", "failed"),
    "marked": ("*Not run by the docs test: it needs a GPU cluster.*\n```bash\nexit 3\n```\n", "skipped"),
    "marker_without_block": ("*Not run by the docs test: no block follows.*\n\nSome prose.\n", "failed"),
    "exit_status_wrong": ("```bash\nfalse\n```\n", "failed"),
    "exit_status_declared": ("```bash\nfalse   # exit 1\n```\n", "passed"),
    "undeclared_name": ("```python\nlen(my_documents)\n```\n", "failed"),
    "declared_name": ("```python\n# assumes: my_documents (your texts)\nassert len(my_documents) > 96\n```\n", "passed"),
    "unknown_stand_in": ("```python\n# assumes: my_cluster\npass\n```\n", "failed"),
    "doctest_wrong": ("```python\n>>> 1 + 1\n3\n```\n", "failed"),
    "test_module_fails": ("```python\ndef test_x():\n    assert 1 == 2\n```\n", "failed"),
    "test_module_passes": ("```python\ndef test_x():\n    assert 1 == 1\n```\n", "passed"),
    "yaml_not_the_file": ("```yaml\n# experiments/19-control/config.yaml\npreset: phase-19\nseed: 7\n```\n", "failed"),
    "yaml_typo": ("```yaml\npreset: phase-19\noptimizer: {weight_decy: 0.1}\n```\n", "failed"),
    "yaml_is_the_file": (
        "```yaml\n# experiments/19-control/config.yaml\npreset: phase-19\nseed: 42\n"
        "breaks:\n  - rare_token_burst: {count: 8, at_step: 312, content: greek}\n```\n",
        "passed",
    ),
    "yaml_not_a_scenario": ("```yaml\nname: ci\non: [push]\n```\n", "failed"),
    "synopsis_missing_option": ("<!-- docs-test: cli-synopsis -->\n```\nspikecheck check LOG [--json]\n```\n", "failed"),
    "unknown_check": ("<!-- docs-test: nonsense -->\n```\nx\n```\n", "failed"),
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    pytester_dir = tmp_path_factory.mktemp("pages")
    for name, (page, _) in PAGES.items():
        (pytester_dir / f"{name}.md").write_text(page, encoding="utf-8")
    (pytester_dir / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(HERE)!r})\n"
        f"from docs_harness import sybil\n"
        f"pytest_collect_file = sybil(patterns=['*.md'], path={str(pytester_dir)!r}).pytest()\n"
    )
    (pytester_dir / "pytest.ini").write_text("[pytest]\n")
    import subprocess
    import sys

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-rA",
            "-q",
            str(pytester_dir),
            "-o",
            "addopts=",
            "--rootdir",
            str(pytester_dir),
        ],
        cwd=pytester_dir,
        capture_output=True,
        text=True,
        timeout=300,
    )
    results = {}  # page -> its last example (the block; a marker before it is an example too)
    for line in done.stdout.splitlines():
        m = re.match(r"(PASSED|FAILED|SKIPPED) (?:\[\d+\] )?(?:\S*/)?(\w+)\.md(?:::sybil:docs,line:|:)(\d+)", line)
        if m and (m[2] not in results or int(m[3]) >= results[m[2]][2]):
            results[m[2]] = (m[1].lower(), line, int(m[3]))
    return results, done.stdout


@pytest.mark.parametrize("name", sorted(PAGES))
def test_each_page_has_its_outcome(outcomes, name):
    results, out = outcomes
    assert name in results, out[-3000:]
    assert results[name][0] == PAGES[name][1], results[name][1]


def test_a_marked_block_is_skipped_with_its_reason(outcomes):
    results, _ = outcomes
    assert "it needs a GPU cluster." in results["marked"][1]


ORDERED_PAGE = (
    "```python\nx = 41\n```\n\n"
    "*Not run by the docs test: it needs a GPU cluster.*\n```bash\nexit 3\n```\n\n"
    "```python\nassert x + 1 == 42\n```\n"
)


def test_an_example_run_without_its_page_runs_the_earlier_examples_first(tmp_path):
    # What a worker of `pytest -n 2 --dist load` does: run some of a page's examples, not all.
    # Here the last block (which uses the first's x) and the marked block (whose marker is an
    # earlier example) each run alone: both see what they would in page order.
    import subprocess
    import sys

    (tmp_path / "page.md").write_text(ORDERED_PAGE, encoding="utf-8")
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(HERE)!r})\n"
        f"from docs_harness import sybil\n"
        f"pytest_collect_file = sybil(patterns=['*.md'], path={str(tmp_path)!r}).pytest()\n"
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    lines = ORDERED_PAGE.splitlines()
    last, marked = max(i for i, text in enumerate(lines) if text == "```python") + 1, lines.index("```bash") + 1
    outcomes = {}
    for line in (last, marked):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-p",
                "no:cacheprovider",
                "-q",
                "-o",
                "addopts=",
                "--rootdir",
                str(tmp_path),
                f"page.md::sybil:docs,line:{line},column:1",
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        outcomes[line] = done.stdout.splitlines()[-1]
    assert re.fullmatch(r"=*\s*1 passed in .*", outcomes[last]), outcomes
    assert re.fullmatch(r"=*\s*1 skipped in .*", outcomes[marked]), outcomes
