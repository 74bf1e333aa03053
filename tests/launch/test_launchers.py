"""``pytest`` and ``python -m pytest`` give the same session (README: "pytest --spikecheck" from the
repository root). They differ in ``sys.path`` when the plugins load: under the ``pytest`` script
the source tree is not on it, so pytest finds the editable install's metadata without the
package's files and imports the package without registering it for assertion rewriting; a
pytester session run in process registers it later and, under ``filterwarnings = error``, failed
with "Module already imported so cannot be rewritten; pytest_spikecheck". The package opts out
of rewriting (it has no plain ``assert``), so the order no longer matters."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import pytest_spikecheck

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pytest_spikecheck", "models", "kernels")


@pytest.mark.parametrize("launcher", ["script", "module"])
def test_an_in_process_pytester_session_passes_however_pytest_is_launched(launcher):
    script = Path(sys.executable).with_name("pytest")
    command = [str(script)] if launcher == "script" else [sys.executable, "-m", "pytest"]
    result = subprocess.run(
        command + ["-p", "no:cacheprovider", "-p", "no:xdist", "-q", "tests/launch/test_in_process_session.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "1 passed" in result.stdout


def test_the_package_has_no_plain_assert_and_opts_out_of_rewriting():
    """Opting out is only right while no module relies on assert rewriting for its messages."""
    assert "PYTEST_DONT_REWRITE" in (pytest_spikecheck.__doc__ or "")
    asserts = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Assert)
    ]
    assert asserts == []
