"""The league table in docs/detectors.md (scripts/detector_league.py) is the script's: its held-out
part is recomputed here (10 files; the real Lightning class runs, so torch is imported)."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
pytest.importorskip("lightning")

import detector_league  # noqa: E402


def test_the_committed_heldout_league_is_the_scripts():
    body = detector_league.committed_body(detector_league.DOC.read_text())
    heldout = detector_league.table(("heldout",)).strip()
    assert heldout in body


def test_flagscale_rule_as_its_source_reads():
    import numpy as np
    steps = np.arange(1, 8)
    # +25 % flags and keeps the old reference; a NaN silently becomes the reference; inf flags
    assert detector_league.flagscale(steps, np.array([2.0, 2.5, 2.1, float("nan"), 3.0, float("inf"), 2.0])) == [2, 6]
