"""Gradient accumulation as people run it, and its two defence bugs caught.

Phase-19 for 30 steps with 3 never-seen Greek-script sentences at step 24, each optimizer step's
batch of 8 split into 4 micro-batches of 2 (``sampler.accumulation: 4``):

- the fixed twin computes the same step as accumulation 1 (the micro-batches' mean losses are
  weighted by their share of the batch's tokens): ``assert_accumulation_invariant`` holds;
- ``AccumulateSum()`` sums the micro-batch means (transformers' GA normalisation bugs):
  loss and gradient ×4, and the invariance assertion says so;
- ``ClipEachMicrobatch()`` clips each micro-batch's gradient on its own and sums the clipped
  parts: the optimizer receives up to 4 × max_norm, and ``assert_clip_contains`` fails.

Run with ``pytest --spikecheck`` (four 30-step runs, ~2 s each on one thread).
"""

from __future__ import annotations

import numpy as np
import pytest

from pytest_spikecheck import (
    AccumulateSum,
    ClipEachMicrobatch,
    RareTokenBurst,
    Scenario,
    SpikeCheckError,
    assert_accumulation_invariant,
    assert_clip_contains,
    assert_spike,
    diagnose,
    spikecheck_scenario,
)

STEPS, BURST, K, MAX_NORM = 30, 24, 4, 1.0
BASE = Scenario.preset("phase-19").replace(steps=STEPS).with_breaks(RareTokenBurst(count=3, at_step=BURST))


@spikecheck_scenario
def accumulation_1():
    return BASE


@spikecheck_scenario
def accumulation_4():
    return BASE.replace(sampler__accumulation=K)


@spikecheck_scenario
def accumulation_4_sum():
    return BASE.replace(sampler__accumulation=K).with_breaks(AccumulateSum())


@spikecheck_scenario
def accumulation_4_clip_each_microbatch():
    return BASE.replace(sampler__accumulation=K).with_breaks(ClipEachMicrobatch())


def test_accumulation_computes_the_same_step(accumulation_4, accumulation_1):
    differences = assert_accumulation_invariant(accumulation_4, accumulation_1)
    # the same weights and batch: float rounding only (measured ~1e-7 on the pre-clip norm)
    assert differences["loss"] <= 1e-6 and differences["grad_norm_pre"] <= 1e-6
    # one row per optimizer step; the batch log holds the step's 4 micro-batches of 2
    assert len(accumulation_4) == STEPS
    batch = accumulation_4.batch_at(BURST)
    assert len(batch["samples"]) == 8 and batch["burst_samples"] == 3
    assert_spike(accumulation_4, at=BURST, min_ratio=3)
    assert_clip_contains(accumulation_4, MAX_NORM)  # the fixed twin: one clip of the accumulated gradient
    assert diagnose(accumulation_4).step == BURST


def test_accumulate_sum_is_caught_at_about_k_times(accumulation_4_sum, accumulation_1):
    ratio = accumulation_4_sum["loss"][0] / accumulation_1["loss"][0]
    assert ratio == pytest.approx(K, rel=0.05)  # each micro-batch's mean, summed: x4
    with pytest.raises(
        SpikeCheckError,
        match=r"accumulation changed the step-1 loss: \S+ \(accumulation 4\) vs \S+ "
        r"\(accumulation 1\), ×4 \(rtol 0\.0001.*: a factor of 4, as when the "
        r"micro-batch losses are summed instead of averaged \(AccumulateSum\)",
    ):
        assert_accumulation_invariant(accumulation_4_sum, accumulation_1)
    assert "summed, not averaged (AccumulateSum): loss and gradient ×4" in diagnose(accumulation_4_sum).verdict


def test_clip_each_microbatch_is_caught(accumulation_4_clip_each_microbatch, accumulation_4):
    run = accumulation_4_clip_each_microbatch
    post = run["grad_norm_post"]
    # each micro-batch's part is clipped to max_norm: their sum reaches past max_norm, never past k x max_norm
    assert post[BURST - 1] > 1.5 * MAX_NORM and np.all(post <= K * MAX_NORM * (1 + 1e-5))
    # the pre-clip norm is the accumulated gradient's, as the fixed twin measures it
    np.testing.assert_allclose(run["grad_norm_pre"][0], accumulation_4["grad_norm_pre"][0], rtol=1e-6)
    with pytest.raises(SpikeCheckError, match=r"the clip did not contain the gradient: post-clip norm"):
        assert_clip_contains(run, MAX_NORM)
    assert "each micro-batch was clipped on its own and the clipped parts summed (ClipEachMicrobatch)" in (
        diagnose(run, BURST).verdict
    )
