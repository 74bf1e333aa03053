"""examples/hf_trainer runs as its README says, with only the ``[hf]`` extra: ``pytest --spikecheck``
from its folder and from the repository root. The session sees no package of the dev extra (each
of them raises ImportError here) and no plugin but spikecheck (autoload off), as in a fresh
environment with ``pip install -r requirements.txt``; the example's own pytest.ini keeps the
repository's conftest.py and doc tests out of it (its README.md is not collected)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "hf_trainer"
#: What the dev extra installs that the [hf] extra does not (top-level import names).
DEV_ONLY = (
    "hypothesis",
    "sybil",
    "xdist",
    "pytest_benchmark",
    "lightning",
    "ray",
    "tensorboard",
    "websocket",
    "importlinter",
    "mlflow",
)


def test_the_hf_example_passes_with_only_its_extra(tmp_path):
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    for name in DEV_ONLY:
        (shadow / f"{name}.py").write_text(f"raise ImportError('{name} is not in the [hf] extra')\n")
    env = {**os.environ, "PYTHONPATH": str(shadow), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    env.pop("PYTEST_ADDOPTS", None)
    # the repository's layout (the root's conftest.py and pyproject.toml above the example), in a copy
    repo = tmp_path / "repo"
    (repo / "examples").mkdir(parents=True)
    shutil.copytree(EXAMPLE, repo / "examples" / "hf_trainer", ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    for name in ("conftest.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, repo / name)
    cache = ["-o", f"cache_dir={tmp_path / 'cache'}"]  # the runs train once: the second session reuses them
    command = [sys.executable, "-m", "pytest", "-p", "pytest_spikecheck.plugin", "--spikecheck", "-v", *cache]
    for cwd, args in ((repo / "examples" / "hf_trainer", []), (repo, ["examples/hf_trainer"])):
        done = subprocess.run([*command, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0 and "3 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
        assert "README.md" not in done.stdout
        # the verdicts of its assertions, per test, on the terminal
        assert "pass test_hf_spikes.py::test_the_clip_contains_the_burst" in done.stdout, done.stdout[-3000:]
        assert "pass assert_clip_contains: the gradient-norm clip held" in done.stdout


def test_the_shadow_really_hides_the_dev_extra(tmp_path):
    """Sabotage of the check above: with the shadow on the path, the root conftest.py of before
    (an unconditional ``from hypothesis import settings``) cannot be imported."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "hypothesis.py").write_text("raise ImportError('hypothesis is not in the [hf] extra')\n")
    done = subprocess.run(
        [sys.executable, "-c", "from hypothesis import settings"],
        env={**os.environ, "PYTHONPATH": str(shadow)},
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0 and "not in the [hf] extra" in done.stderr
