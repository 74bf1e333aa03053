"""The judgements on how a trainer computes its step, on records (no training, no torch):
the over-clip side of ``assert_clip_contains``, ``assert_accumulation_invariant``,
``assert_overflow_skips``, and the diagnosis of a skipped or over-clipped step. Each check is
also shown failing on the sabotaged record it exists for."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pytest_spikecheck import (
    SpikeCheckError,
    assert_accumulation_invariant,
    assert_clip_contains,
    assert_finite,
    assert_overflow_skips,
    diagnose,
)
from pytest_spikecheck.records import Record
from pytest_spikecheck.records.series import columns_from_mapping


def _record(skipped=None, **columns) -> Record:
    metrics, missing = columns_from_mapping(columns)
    return Record(metrics, None, "arrays", missing=missing, skipped=skipped or {})


def test_a_clip_that_scales_too_far_fails_with_its_numbers():
    over = {"grad_norm_pre": [5.8, 0.5, 2.0], "grad_norm_post": [1.0, 0.5, 2.0 / 65536]}
    with pytest.raises(SpikeCheckError) as info:
        assert_clip_contains(over, 1.0)
    assert str(info.value).splitlines()[0] == (
        "over-clipped at step 3: the optimizer received 3.1e-5 for pre-clip 2 and max_norm 1 (×3.3e4 too small): "
        "clipped before unscaling? (a loss scale between the clip and the optimizer shrinks it this much)"
    )
    assert_clip_contains(over, 1.0, allow_overclip=True)  # the one-sided check of before


@pytest.mark.parametrize(
    ("post", "passes"),
    [
        ([1.0, 0.5], True),  # clipped to max_norm, and untouched below it
        ([1.0 - 1e-6, 0.5], True),  # torch's coefficient max_norm / (norm + 1e-6) leaves up to 1e-6 below
        ([1.0 - 2e-5, 0.5], False),  # beyond rtol 1e-5 and the epsilon: over-clipped
        ([1.0, 0.4], False),  # a gradient below max_norm was scaled down: over-clipped
    ],
)
def test_the_over_clip_threshold(post, passes):
    record = {"grad_norm_pre": [3.0, 0.5], "grad_norm_post": post}
    if passes:
        assert_clip_contains(record, 1.0)
    else:
        with pytest.raises(SpikeCheckError, match=r"^over-clipped at step \d: "):
            assert_clip_contains(record, 1.0)


def test_a_small_over_clip_is_not_blamed_on_a_loss_scale():
    with pytest.raises(
        SpikeCheckError,
        match=r"\(×2 too small\): a clip that scales below min\(pre-clip, max_norm\) "
        r"breaks the update it guards",
    ):
        assert_clip_contains({"grad_norm_pre": [3.0], "grad_norm_post": [0.5]}, 1.0)


def test_skipped_steps_are_left_out_of_clip_containment():
    record = _record(skipped={2: "overflow"}, grad_norm_pre=[2.0, math.inf, 2.0], grad_norm_post=[1.0, 0.0, 1.0])
    assert_clip_contains(record, 1.0)
    sabotaged = _record(grad_norm_pre=[2.0, 1.5, 2.0], grad_norm_post=[1.0, 0.0, 1.0])  # the same 0, not skipped
    with pytest.raises(SpikeCheckError, match=r"^over-clipped at step 2: the optimizer received 0 "):
        assert_clip_contains(sabotaged, 1.0)


def test_accumulation_invariance_on_records():
    one = {"loss": [5.9457, 5.8, 5.7], "grad_norm_pre": [2.5, 2.0, 1.9]}
    assert assert_accumulation_invariant(dict(one), one) == {"loss": 0.0, "grad_norm_pre": 0.0}
    summed = {"loss": [4 * 5.9457, 23.2, 22.8], "grad_norm_pre": [10.0, 8.0, 7.6]}
    with pytest.raises(
        SpikeCheckError,
        match=r"^accumulation changed the step-1 loss: 23\.7828 \(run A\) vs 5\.9457 "
        r"\(run B\), ×4 \(rtol 0\.0001",
    ):
        assert_accumulation_invariant(summed, one)
    drifting = {"loss": [5.9457, 5.8, 6.5], "grad_norm_pre": [2.5, 2.0, 1.9]}
    with pytest.raises(SpikeCheckError, match=r"^the runs drift apart at step 3: loss 6\.5 \(run A\) vs 5\.7 \(run B\)"):
        assert_accumulation_invariant(drifting, one)
    assert_accumulation_invariant(drifting, one, steps=2)  # step 3 is past the window asked for
    with pytest.raises(SpikeCheckError, match=r"share no step"):
        assert_accumulation_invariant({"step": [5], "loss": [1.0], "grad_norm_pre": [1.0]}, one)


def test_overflow_skips_are_counted_and_bounded():
    record = _record(
        skipped={1: "overflow", 2: "overflow", 7: "skip_spikes"}, loss=[1.0] * 10, loss_scale=[2.0**24, 2.0**23] + [2.0**22] * 8
    )
    with pytest.raises(
        SpikeCheckError,
        match=r"^the loss scaler skipped 2 of 10 steps on overflow \(20%, more than 1%\): "
        r"steps 1, 2; the loss scale went from 2²⁴ to 2²²",
    ):
        assert_overflow_skips(record)
    assert assert_overflow_skips(record, max_fraction=0.2) == 0.2
    assert assert_overflow_skips(record, after_step=2) == 0.0  # a SkipSpikes skip is no overflow
    with pytest.raises(SpikeCheckError, match=r"no skipped marks and no loss_scale column"):
        assert_overflow_skips({"loss": [1.0, 2.0]})  # a record that cannot say fails: it shows nothing
    with pytest.raises(ValueError, match=r"max_fraction must be in \[0, 1\]"):
        assert_overflow_skips(record, max_fraction=2)


def test_a_skipped_steps_gradient_norm_is_excused_never_its_loss():
    skipped = _record(skipped={2: "overflow"}, loss=[1.0, 1.1, 1.0], grad_norm_pre=[1.0, math.inf, 1.0])
    assert len(assert_finite(skipped).skipped_steps) == 1
    bad_loss = _record(skipped={2: "overflow"}, loss=[1.0, math.nan, 1.0], grad_norm_pre=[1.0, math.inf, 1.0])
    with pytest.raises(SpikeCheckError, match=r"^non-finite loss at step 2"):
        assert_finite(bad_loss)


def _spike_record(skipped=None, post=None, overflowed=False):
    pre = np.ones(40)
    pre[30] = math.inf if overflowed else 20.0
    return _record(
        skipped=skipped,
        loss=np.where(np.arange(40) == 30, 6.0, 2.0),
        grad_norm_pre=pre,
        grad_norm_post=np.minimum(pre, 1.0) if post is None else post,
        loss_scale=np.where(np.arange(40) > 30, 2.0**15, 2.0**16),
    )


def test_the_diagnosis_of_a_step_the_scaler_skipped():
    d = diagnose(_spike_record(skipped={31: "overflow"}, post=np.where(np.arange(40) == 30, 0.0, 1.0), overflowed=True), 31)
    assert d.lines[1] == (
        "2 grad norm",
        "pre-clip inf; GradScaler skipped this step (overflow at scale 2¹⁶; scale halved): nothing reached the optimizer",
    )
    assert d.verdict == (
        "GradScaler skipped this step (overflow at scale 2¹⁶; scale halved): the update was not "
        "applied, not a numeric break; the data: an outlier batch (train loss 3.0× its median)"
    )
    # sabotage: the same record without the skip mark is the numeric break it was read as before
    unmarked = diagnose(_spike_record(post=np.where(np.arange(40) == 30, 0.0, 1.0), overflowed=True), 31)
    assert "a numeric break (overflow, 0/0), not a data spike" in unmarked.verdict and "GradScaler" not in unmarked.verdict


def test_the_diagnosis_of_an_undeclared_over_clip():
    post = np.full(40, 1.0 / 65536)
    d = diagnose(_spike_record(post=post), 31, max_norm=1.0)
    assert d.facts["overclipped"] is True
    assert d.verdict == (
        "an outlier batch; over-clipped: the optimizer received ‖g‖ = 1.5e-5 for max_norm 1 and "
        "pre-clip 20 (×6.6e4 too small): clipped before unscaling?"
    )
