"""Defence bugs that shipped in the big frameworks, reproduced on the nano GPT, each beside its
fixed twin (docs/defence-bugs.md has the catalogue and the public threads):

- ``ClipMuonUpdate()`` (DeepSpeed issue 8439): the global clip is taken over Muon's
  orthogonalised update instead of the gradient and divides the update by its own norm;
  ``assert_muon_update_scale`` fails it, the fixed twin (the clip on the gradient) passes, and the
  attenuation equals the norm the clip divided by, as in the issue's table;
- ``SkipStepCounter()`` (OLMo-core PR 317): a skip-step AdamW whose step counter never advanced;
  ``assert_optimizer_steps`` fails it at step 1, ``SkipSpikes()`` (the fixed twin) passes, and
  the update is larger from step 3 on (Adam's bias correction stuck at step 1);
- ``ClipInfToLog()`` (a review comment on Skovorp/feral PR 16): ``clip_grad_norm_(max_norm=inf)``
  called only to log the norm. Unclipped SGD at lr 1 diverges; at step 21 every gradient is still
  finite (the largest 7.9e24, their float64 norm 2.6e25) but torch's float32 norm overflows to inf,
  and the logging call turns every gradient NaN. ``assert_clip_keeps_finite`` fails it (finite
  gradients before the clip, NaN after) and passes the fixed twin (the norm measured, the
  gradients left alone: they reach the optimizer finite). The twin is the same diverging run, so
  ``assert_finite`` fails both, each with its cause: the NaN the call made, the norm that overflowed.

Run with ``pytest --spikecheck`` (four 8-step nano runs, ~1 s each on one thread, and two 21-step ones).
"""

from __future__ import annotations

import numpy as np
import pytest

from pytest_spikecheck import (
    ClipInfToLog,
    ClipMuonUpdate,
    HighLR,
    NoClip,
    Scenario,
    SkipSpikes,
    SkipStepCounter,
    assert_clip_keeps_finite,
    assert_finite,
    assert_muon_update_scale,
    assert_optimizer_steps,
    spikecheck_scenario,
)
from pytest_spikecheck.models.config import GPTConfig

STEPS = 8
NANO = Scenario.preset("phase-19").replace(steps=STEPS, seed=0, model=GPTConfig(arch="gpt", n_layer=2, n_head=2, n_embd=32))
# weight decay 0: Muon's whole step is its orthogonalised update, so the attenuation reads exactly
MUON = NANO.replace(optimizer__name="muon", optimizer__lr=0.02, optimizer__weight_decay=0.0)


# unclipped SGD at lr 1 diverges: its gradient grows ~1e3x a step until the float32 norm overflows
DIVERGING_SGD = NANO.replace(steps=24, optimizer__name="sgd").with_breaks(HighLR(1.0))


@spikecheck_scenario
def sgd_norm_measured():
    return DIVERGING_SGD.with_breaks(NoClip())


@spikecheck_scenario
def sgd_norm_logged_through_clip_inf():
    return DIVERGING_SGD.with_breaks(ClipInfToLog())


@spikecheck_scenario
def muon_clipped_gradient():
    return MUON


@spikecheck_scenario
def muon_clipped_update():
    return MUON.with_breaks(ClipMuonUpdate())


@spikecheck_scenario
def skip_step_adamw():
    return NANO.with_breaks(SkipSpikes())


@spikecheck_scenario
def skip_step_adamw_counter_bug():
    return NANO.with_breaks(SkipStepCounter())


def test_muon_update_keeps_its_scale_when_the_gradient_is_clipped(muon_clipped_gradient):
    stats = assert_muon_update_scale(muon_clipped_gradient)
    assert 0.8 <= stats["min"] and stats["max"] <= 1.0  # measured 0.87-0.90 (Newton-Schulz's singular values)


def test_clipping_muons_update_is_caught_and_attenuates_by_the_clips_norm(muon_clipped_update, muon_clipped_gradient):
    with pytest.raises(
        AssertionError,
        match=r"Muon's update at step \d+ was \S+x its expected scale .*attenuated .*"
        r"divided it by \S+ \(update_clip_norm\).*DeepSpeed issue 8439",
    ):
        assert_muon_update_scale(muon_clipped_update)
    # step 1: the same weights and batch; Muon's update is scale-free in the gradient, so the only
    # difference is the clip's coefficient, max_norm / norm: the attenuation is the norm (max_norm 1)
    attenuation = muon_clipped_gradient["muon_update_ratio"][0] / muon_clipped_update["muon_update_ratio"][0]
    assert attenuation == pytest.approx(muon_clipped_update["update_clip_norm"][0], rel=5e-3)
    assert attenuation > 10  # ~21x on the nano GPT: the norm of its 12 orthogonalised matrices
    assert np.all(muon_clipped_update["clip_factor"] == 1.0)  # the gradient itself was never clipped


def test_skip_step_adamw_counts_its_steps(skip_step_adamw):
    assert assert_optimizer_steps(skip_step_adamw) == {"applied": STEPS, "counted": STEPS}


def test_a_skip_step_adamw_whose_counter_never_advances_is_caught(skip_step_adamw_counter_bug, skip_step_adamw):
    with pytest.raises(AssertionError, match=r"at step 1 the optimizer counted 0 steps but 1 were applied .*never advanced"):
        assert_optimizer_steps(skip_step_adamw_counter_bug)
    bug, fixed = skip_step_adamw_counter_bug["update_rms"], skip_step_adamw["update_rms"]
    # step 1 agrees (the same bias correction); then that of step 1 on accumulated moments makes
    # each update larger: measured 1.34x at step 2, 1.93x at step 8 (the PR's note: ~2.2x the lr)
    assert bug[0] == pytest.approx(fixed[0], rel=1e-6)
    assert np.all(bug[1:] > 1.3 * fixed[1:]) and bug[-1] > 1.8 * fixed[-1]


def test_logging_the_norm_through_clip_inf_turns_every_gradient_nan(sgd_norm_logged_through_clip_inf, sgd_norm_measured):
    bug, fixed = sgd_norm_logged_through_clip_inf, sgd_norm_measured
    with pytest.raises(
        AssertionError,
        match=r"^non-finite grad_norm_pre at step 21 \(inf\); the gradient norm was inf and "
        r"then every gradient NaN .*clip_grad_norm_\(max_norm=inf\)",
    ):
        assert_finite(bug)
    # the same run up to the overflow: the logging call changes nothing while the norm is finite
    assert np.array_equal(bug["grad_norm_pre"], fixed["grad_norm_pre"])
    assert np.array_equal(bug["loss"], fixed["loss"]) and np.isfinite(bug["loss"]).all()
    assert np.array_equal(bug["grad_norm_post"][:-1], fixed["grad_norm_post"][:-1])
    # at step 21 both norms are inf in float32; the twin's gradients are finite (their float64 norm
    # 2.56e25, above float32's ~1.8e19 limit on summed squares), the bug's are all NaN
    assert bug["step"][-1] == fixed["step"][-1] == 21 and np.isinf(fixed["grad_norm_pre"][-1])
    assert np.isnan(bug["grad_norm_post"][-1]) and 1e20 < fixed["grad_norm_post"][-1] < 1e38
    # the twin diverges as well (no clip, lr 1); its failure names the overflowed norm, not the clip
    with pytest.raises(AssertionError, match=r"^non-finite grad_norm_pre at step 21 \(inf\); every gradient is finite"):
        assert_finite(fixed)


def test_logging_the_norm_through_clip_inf_fails_the_clip_check_and_its_twin_passes(
    sgd_norm_logged_through_clip_inf, sgd_norm_measured
):
    bug, fixed = sgd_norm_logged_through_clip_inf, sgd_norm_measured
    # the bug's own harm: finite gradients before the call (recorded, measured in float64), NaN after
    assert bug["grad_finite_pre"][-1] == fixed["grad_finite_pre"][-1] == 1.0
    with pytest.raises(
        AssertionError,
        match=r"^at step 21 the clip turned finite gradients non-finite: every gradient element was finite "
        r"before the clip .* but the optimizer received nan \(grad_norm_post\); with no clip .*"
        r"torch.nn.utils.clip_grad_norm_\(max_norm=inf\) called only to log the norm",
    ):
        assert_clip_keeps_finite(bug)
    # the fixed twin: the same finite gradients reached the optimizer; one step's norm overflowed
    assert assert_clip_keeps_finite(fixed) == {"judged": 21, "norm_overflowed": 1, "not_judged": 0}
    # its divergence is a separate failure, assert_finite's (above): only the norm overflowed
