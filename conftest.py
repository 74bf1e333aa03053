"""Hypothesis profiles for this repository's property tests (``tests/`` and ``scenarios/``).

``ci`` is loaded by default, so ``pytest --spikecheck`` runs the properties bounded and
reproducibly; ``pytest --hypothesis-profile dev`` hunts for new failures instead. Health
checks stay on in both: the few tests whose examples are slow by nature (a probe is a
forward, backward and AdamW step; a property may train a run) suppress ``too_slow``
themselves, with the reason.

This is the repository's test configuration, not the plugin's: installing pytest-spikecheck
registers no Hypothesis profile in anyone else's suite.
"""

import pytest
from hypothesis import settings

# Bounded and reproducible: the same examples on every run and machine, no example database
# to drift between runs, no deadline (CI machines are shared; a slow example is not a bug).
settings.register_profile("ci", max_examples=100, derandomize=True, database=None, deadline=None, print_blob=True)
# Ten times the examples, fresh ones every run, failures remembered in .hypothesis/.
settings.register_profile("dev", max_examples=1000, deadline=None, print_blob=True)
# For mutation runs (pyproject's [tool.mutmut]): every mutant reruns its tests, so few examples.
settings.register_profile("mutation", max_examples=25, derandomize=True, database=None, deadline=None)
settings.load_profile("ci")

# The documentation test: every fenced block of README.md and docs/ runs (docs/testing.md).
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent / "tests" / "docs"))
from docs_harness import sybil as _docs_sybil  # noqa: E402

pytest_collect_file = _docs_sybil().pytest()


@pytest.fixture(autouse=True)
def _no_job_summary_from_inner_sessions(monkeypatch):
    """The suite's inner pytest sessions (pytester, the doc test's) would append their summaries,
    deliberate failures included, to the real GitHub job summary; a test that checks it sets it."""
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
