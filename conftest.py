"""Hypothesis profiles for this repository's property tests (``tests/`` and ``scenarios/``).

``ci`` is loaded by default, so ``pytest --spikecheck`` runs the properties bounded and
reproducibly; ``pytest --hypothesis-profile dev`` hunts for new failures instead. Health
checks stay on in both: the few tests whose examples are slow by nature (a probe is a
forward, backward and AdamW step; a property may train a run) suppress ``too_slow``
themselves, with the reason.

This is the repository's test configuration, not the plugin's: installing pytest-spikecheck
registers no Hypothesis profile in anyone else's suite.
"""

import importlib.util
import os
import sys
from pathlib import Path

import pytest

# Bytecode caches on, for this process and every one it starts (xdist workers, pytester
# subprocess sessions, spawned ranks and sweep workers, CLI runs), even where the environment
# sets PYTHONDONTWRITEBYTECODE (the 2-core VMs this suite is timed on do): without them each of its ~60
# Python processes compiles our sources again, and each pytest process re-runs the assertion
# rewriting of every test module and of hypothesis's (an xdist worker collecting the suite:
# 17.9 CPU-s without the caches, 9.3 with; docs/testing.md, Suite time, 2026-12-02). The caches
# are __pycache__/ folders: gitignored, and kept out of the sdist by MANIFEST.in.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# The dev extra's tools (hypothesis, sybil) are imported only where they are installed: someone
# who runs an example from this checkout with only that example's extra (`pytest --spikecheck
# examples/hf_trainer` with `.[hf]`) must not need them (each example also has its own pytest.ini).
if importlib.util.find_spec("hypothesis") is not None:
    from hypothesis import settings

    # Bounded and reproducible: the same examples on every run and machine, no example database
    # to drift between runs, no deadline (CI machines are shared; a slow example is not a bug).
    settings.register_profile("ci", max_examples=100, derandomize=True, database=None, deadline=None, print_blob=True)
    # Ten times the examples, fresh ones every run, failures remembered in .hypothesis/.
    settings.register_profile("dev", max_examples=1000, deadline=None, print_blob=True)
    # For mutation runs (pyproject's [tool.mutmut]): every mutant reruns its tests, so few examples.
    settings.register_profile("mutation", max_examples=25, derandomize=True, database=None, deadline=None)
    settings.load_profile("ci")


# Under pytest-xdist (`make test`: `-n auto`, one worker per core) torch would give each worker
# one intra-op thread per core: on 2 cores, 2 workers x 2 OpenMP threads. The engine trains on
# one thread already (and restores the count after); the rest of a worker's torch work (the
# clipping, conformance and model tests, the HF and Lightning trainers) runs on one as well, so
# the workers do not compete for the cores (docs/testing.md, Suite time, 2026-12-02). A worker is
# known by its config (xdist's workerinput), not by PYTEST_XDIST_WORKER alone: the pytest sessions
# a worker starts in subprocesses inherit that variable, and those that never train (tests/launch)
# would import torch (2 CPU-s) for nothing; those that do use torch get one thread once their
# tests are collected.
def pytest_configure(config):
    if hasattr(config, "workerinput") and importlib.util.find_spec("torch") is not None:
        import torch

        torch.set_num_threads(1)


def pytest_collection_finish(session):
    if os.environ.get("PYTEST_XDIST_WORKER") and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


# The documentation test: every fenced block of README.md and docs/ runs (docs/testing.md); only
# the pages it names (an example's README.md is the example's, not one of ours).
ROOT = Path(__file__).parent
if importlib.util.find_spec("sybil") is not None:
    sys.path.insert(0, str(ROOT / "tests" / "docs"))
    from docs_harness import PAGES, sybil as _docs_sybil  # noqa: E402

    _collect_docs = _docs_sybil().pytest()
    _DOC_PAGES = {ROOT / page for page in PAGES}

    def pytest_collect_file(file_path, parent):
        if file_path in _DOC_PAGES:
            return _collect_docs(file_path, parent)
        return None


@pytest.fixture(autouse=True)
def _no_job_summary_from_inner_sessions(monkeypatch):
    """The suite's inner pytest sessions (pytester, the doc test's) would append their summaries,
    deliberate failures included, to the real GitHub job summary; a test that checks it sets it."""
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
