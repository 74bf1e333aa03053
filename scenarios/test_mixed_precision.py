"""fp16 with dynamic loss scaling as people run it (``experiments/fp16-accumulation``: autocast,
GradScaler at torch's defaults, 4 micro-batches per step), and the classic AMP bug caught.

- The fixed twin unscales before the clip: the clip holds at every step, and the step whose
  gradients overflow at the starting scale 2¹⁶ (the 8-sample Greek burst at step 24) is
  skipped by the GradScaler, marked ``skipped: overflow``, not a non-finite failure; the
  diagnosis there says so and still reads the batch.
- ``ClipBeforeUnscale()`` clips the scaled gradients: the optimizer receives ‖g‖ ≈ 1/65536
  of max_norm at every step, which ``assert_clip_contains`` calls over-clipped (the one-sided
  check, ``allow_overclip=True``, is blind to it).

Run with ``pytest --spikecheck`` (two 30-step fp16 runs, ~3-5 s each on one thread).
"""

from __future__ import annotations

import numpy as np
import pytest

from pytest_spikecheck import (
    ClipBeforeUnscale,
    Scenario,
    SpikeCheckError,
    assert_clip_contains,
    assert_finite,
    assert_overflow_skips,
    diagnose,
    spikecheck_scenario,
)

BURST, MAX_NORM = 24, 1.0
FP16 = Scenario.from_yaml("experiments/fp16-accumulation")


@spikecheck_scenario
def fp16_accumulation():
    return FP16


@spikecheck_scenario
def fp16_clip_before_unscale():
    return FP16.with_breaks(ClipBeforeUnscale())


def test_the_yaml_declares_fp16_with_dynamic_scaling_and_accumulation():
    resolved = FP16.resolved()
    assert (resolved.amp.dtype, resolved.amp.loss_scale, resolved.sampler.accumulation) == ("float16", "dynamic", 4)


def test_the_fixed_twin_holds_and_its_overflow_skip_is_no_failure(fp16_accumulation):
    run = fp16_accumulation
    assert run.skipped == {BURST: "overflow"}
    assert run["loss_scale"][BURST - 1] == 2**16 and run["loss_scale"][BURST] == 2**15  # halved after it
    assert not np.isfinite(run["grad_norm_pre"][BURST - 1])  # the unscaled gradient overflowed ...
    finite = assert_finite(run)  # ... which is not a failure: the update was skipped
    assert finite.skipped_steps == (BURST,)
    assert_clip_contains(run, MAX_NORM)
    assert assert_overflow_skips(run, max_fraction=0.05) == pytest.approx(1 / 30)
    d = diagnose(run)
    assert d.step == BURST and d.facts["burst_samples"] == 8
    assert d.verdict.startswith(
        "GradScaler skipped this step (overflow at scale 2¹⁶; scale halved): the update "
        "was not applied, not a numeric break; the data: rare tokens concentrated in one batch"
    )


def test_clip_before_unscale_is_caught_as_over_clipped(fp16_clip_before_unscale, fp16_accumulation):
    run = fp16_clip_before_unscale
    applied = run["step"] != BURST
    # The optimizer gets max_norm / scale: the clip saw the gradient times the scale (2¹⁶, 2¹⁵ after the skip).
    np.testing.assert_allclose(run["grad_norm_post"][applied] * run["loss_scale"][applied], MAX_NORM, rtol=1e-4)
    # The records keep the unscaled pre-clip norm: step 1 is the fixed twin's (same weights, same batch).
    np.testing.assert_allclose(run["grad_norm_pre"][0], fp16_accumulation["grad_norm_pre"][0], rtol=1e-6)
    with pytest.raises(
        SpikeCheckError,
        match=r"over-clipped at step 1: the optimizer received 1\.5e-5 for pre-clip "
        r"\S+ and max_norm 1 \(×\S+ too small\) .*: clipped before unscaling",
    ):
        assert_clip_contains(run, MAX_NORM)
    assert_clip_contains(run, MAX_NORM, allow_overclip=True)  # the one-sided check does not see it
    assert diagnose(run, 5).verdict == "clipped before unscaling: the optimizer received ‖g‖ = 1.5e-5 for max_norm 1"
