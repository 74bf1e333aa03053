"""The league table in docs/detectors.md (scripts/detector_league.py) is the script's: its held-out
part is recomputed here (64 files; the real Lightning class runs, so torch is imported)."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
pytest.importorskip("lightning")
pytest.importorskip("zclip")  # the league runs the real ZClip class (the dev extra pins it)

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


def test_the_zclip_entrant_is_the_packages_own_decision():
    """The zclip package's class, fed a logged norm as a one-element gradient: it flags where its
    own z-score passes 2.5 after its 25-step warm-up, and a NaN norm enters its EMA (it is blind
    from then on, as its code is) where our zclip detector flags the NaN."""
    import numpy as np
    from zclip import ZClip

    steps = np.arange(1, 61)
    norms = 1.0 + 0.01 * np.sin(np.arange(60.0))
    norms[40] = 20.0
    assert detector_league.zclip(steps, norms) == [41]
    early = norms.copy()
    early[10] = 20.0  # inside its warm-up: collected, never judged
    assert 11 not in detector_league.zclip(steps, early)
    blind = norms.copy()
    blind[30] = float("nan")
    assert detector_league.zclip(steps, blind) == []  # its EMA is NaN from step 31 on
    assert ZClip().z_thresh == 2.5 and ZClip().warmup_steps == 25  # the defaults the docstring names


def test_the_muon_runs_loss_divergence_step():
    import numpy as np

    steps = np.arange(1, 7)
    assert detector_league.loss_divergence(steps, np.array([3.0, 2.0, 1.5, 2.1, 2.19, 2.3])) == 6
    assert detector_league.loss_divergence(steps, np.array([3.0, 2.0, 1.5, 1.6, 1.7, 2.1])) is None
    assert detector_league.loss_divergence(steps, np.array([3.0, 2.0, float("nan"), 1.6, 1.7, 2.1])) == 3
