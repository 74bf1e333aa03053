"""clip.cu in the training loop on every CI run, without a GPU: a short burst scenario trains with
the emulator backend (the unmodified CUDA source on the CPU, through the same host code the cupy
backend runs) and with the torch backend, and the two runs must agree step by step.

Run with ``pytest --spikecheck scenarios/test_emulator_training.py`` (~10 s on one thread). The
runs call ``train`` directly because the session trains every scenario with one backend.

The emulator launches 2-warp blocks here instead of the GPU's 8 warps (every emulated thread
sleeps and wakes at each barrier: on the nano GPT's 45,696 parameters one clip takes 0.28 s of wall
and 0.43 CPU-s with 8 warps, 0.09 s and 0.12 CPU-s with 2, on the 2-core VM, 2026-12-02). Two warps still reduce across
warps through shared memory and __syncthreads; tests/test_emulator.py runs the GPU's launch
configuration on loose tensors.
"""

from __future__ import annotations

import numpy as np
import pytest

from pytest_spikecheck import RareTokenBurst, Scenario, assert_clip_contains, assert_finite, assert_spike, train
from pytest_spikecheck.clipping._kernel_runner import LaunchConfig
from pytest_spikecheck.models.config import model_preset

pytestmark = pytest.mark.spikecheck

BURST = 30
MAX_NORM = 1.0
SCENARIO = (
    Scenario.preset("phase-19")
    .replace(name="emulator_training", steps=40, model=model_preset("nano"))
    .with_breaks(RareTokenBurst(count=3, at_step=BURST))
)
TRAINING_LAUNCH = LaunchConfig(threads_per_block=64, final_threads=32)
#: clip.cu sums squares per chunk in float32 and across chunks in float64, torch with its foreach
#: norm: the norms differ in the last bits (at most 3.3e-7 relative measured over the 40 steps).
RTOL = 1e-6


@pytest.fixture(scope="module")
def runs(spikecheck):
    """(torch run, emulator run) of SCENARIO, same seed and batches."""
    from pytest_spikecheck.clipping import emulator_backend

    reason = emulator_backend.BACKEND.unavailable_reason()
    if reason is not None:
        pytest.fail(f"the emulator backend cannot run here: {reason}")
    settings = spikecheck.settings
    scenario = SCENARIO if settings.seed is None else SCENARIO.replace(seed=settings.seed)
    with pytest.MonkeyPatch.context() as patch:  # the shared emulator backend, with 2-warp blocks
        patch.setattr(emulator_backend.BACKEND, "config", TRAINING_LAUNCH)
        patch.setattr(emulator_backend.BACKEND, "_runner", None)
        emulated = train(scenario, backend="emulator", threads=settings.threads)
    reference = train(scenario, backend="torch", threads=settings.threads)
    return reference, emulated


def column(run, name: str) -> np.ndarray:
    return np.asarray(run.metrics[name], dtype=np.float64)


def test_both_runs_used_the_backend_they_asked_for(runs):
    reference, emulated = runs
    assert (reference.meta["backend"], emulated.meta["backend"]) == ("torch", "emulator")
    assert len(column(reference, "step")) == len(column(emulated, "step")) == SCENARIO.steps


@pytest.mark.parametrize("name", ["grad_norm_pre", "grad_norm_post", "clip_factor"])
def test_norms_and_clip_factor_match_torch_at_every_step(runs, name):
    reference, emulated = runs
    expected, actual = column(reference, name), column(emulated, name)
    relative = np.abs(actual - expected) / np.abs(expected)
    worst = int(np.argmax(relative))
    assert relative[worst] <= RTOL, (
        f"{name} at step {worst}: emulator {actual[worst]!r}, torch {expected[worst]!r} "
        f"({relative[worst]:.2e} relative, more than {RTOL:g})"
    )


def test_clip_decisions_are_identical(runs):
    reference, emulated = runs
    clipped_reference = column(reference, "clip_factor") < 1.0
    clipped_emulated = column(emulated, "clip_factor") < 1.0
    assert clipped_reference.any(), "the scenario should clip on some steps"
    assert np.array_equal(clipped_reference, clipped_emulated), np.flatnonzero(clipped_reference != clipped_emulated)


def test_the_emulated_clip_finds_and_contains_the_burst(runs):
    _, emulated = runs
    assert_finite(emulated)
    assert_spike(emulated, at=BURST, min_ratio=5)
    assert_clip_contains(emulated, MAX_NORM)
