import numpy as np

from pytest_spikecheck import diagnose

from short_runs import SHORT_BURST


def test_ladder_on_an_unclipped_burst(short_runs):
    d = diagnose(short_runs[1])
    assert d.step == SHORT_BURST
    rungs = [r for r, _ in d.lines]
    assert rungs == ["1 loss", "2 grad norm", "3 batch", "4 token losses", "5 tensors", "6 Adam v", "7 logits"]
    assert not d.facts["attention_logit_growth"]  # a data spike at lr 1e-2: the attention logits stay small
    assert d.facts["burst_samples"] == 3 and d.facts["ratio"] > 5
    assert "NOT clipped" in dict(d.lines)["2 grad norm"]
    assert d.verdict == "rare tokens + concentrated batch + no clip = one-step destabilisation"


def test_ladder_on_the_clipped_control(short_runs):
    d = diagnose(short_runs[0], SHORT_BURST)
    assert "clipped to 1, clip factor ×" in dict(d.lines)["2 grad norm"]
    assert d.facts["max_norm"] == 1.0 and d.facts["clipped"] is True and d.facts["contained"] is True
    assert "the clip contained it" in d.verdict
    assert "Diagnosis at step" in d.markdown()


def test_bare_arrays_get_the_first_rungs():
    g = [1.0] * 80
    g[60] = 40.0
    d = diagnose({"grad_norm_pre": g, "loss": [2.0] * 80})
    assert d.step == 61 and [r for r, _ in d.lines] == ["1 loss", "2 grad norm"]
    assert "post-clip norm not logged" in d.text() and "cannot be told" in d.verdict
    assert diagnose({"grad_norm_pre": [1.0] * 3}).text() == "diagnosis: no spike found in this record"


def _spike_at_81(**columns):
    """100 steps at norm 1 with a 40× spike at step 81, plus ``columns`` (each a function of pre)."""
    pre = np.ones(100)
    pre[80] = 40.0
    return {"grad_norm_pre": pre, **{name: make(pre) for name, make in columns.items()}}


def test_a_clip_seen_only_in_the_norms_is_not_called_unclipped():
    # Issue 11: pre 40 / post 1 without a clip_factor column read "NOT clipped ... unclipped".
    d = diagnose(_spike_at_81(loss=lambda p: np.full(100, 2.0), grad_norm_post=lambda p: np.minimum(p, 1.0)))
    assert d.step == 81 and d.facts["clipped"] is True
    assert "clipped to 1" in dict(d.lines)["2 grad norm"] and "NOT" not in d.text()
    assert "unclipped" not in d.verdict and "cannot be told" in d.verdict  # no max_norm: containment unknown
    assert "the clip contained it (post-clip 1 ≤ max_norm 1)" in diagnose(_spike_at_81(
        grad_norm_post=lambda p: np.minimum(p, 1.0)), max_norm=1.0).verdict


def test_a_leak_is_never_called_contained():
    # Issue 11: post 3 > max_norm 1 (with a clip factor < 1) read "the clip contained it".
    def leaky(pre):
        post = np.minimum(pre, 1.0)
        post[80] = 3.0
        return post

    record = _spike_at_81(grad_norm_post=leaky, clip_factor=lambda p: np.minimum(1.0, 1.0 / p))
    d = diagnose(record, max_norm=1.0)
    assert d.facts["contained"] is False and "ABOVE max_norm 1" in dict(d.lines)["2 grad norm"]
    assert "LEAKED: post-clip 3 > max_norm 1" in d.verdict and "contained it" not in d.verdict
    assert "contained it" not in diagnose(record).verdict  # nor without a max_norm


def test_containment_tolerance_is_the_assertions():
    # The same rtol as assert_clip_contains: inside it contained, just past it a leak.
    inside = diagnose(_spike_at_81(grad_norm_post=lambda p: np.minimum(p, 1.0 + 5e-6)), max_norm=1.0)
    past = diagnose(_spike_at_81(grad_norm_post=lambda p: np.minimum(p, 1.0 + 2e-5)), max_norm=1.0)
    assert (inside.facts["contained"], past.facts["contained"]) == (True, False)
    # clipped means below the pre-clip norm by more than rounding
    same = diagnose(_spike_at_81(grad_norm_post=lambda p: p * (1 - 5e-7)), max_norm=100.0)
    assert same.facts["clipped"] is False and "NOT clipped: post-clip 40 = pre-clip" in same.text()


def test_no_loss_column_is_not_a_numeric_break():
    # Issue 11: no loss column and every value finite ended in "non-finite values".
    d = diagnose(_spike_at_81(grad_norm_post=lambda p: np.minimum(p, 1.0)))
    assert "train loss not logged" in dict(d.lines)["1 loss"]
    assert "non-finite" not in d.verdict and d.facts["nonfinite"] == []
    nan_loss = diagnose(_spike_at_81(loss=lambda p: np.where(p > 1, np.nan, 2.0)))
    assert nan_loss.verdict.startswith("non-finite values at step 81 (loss nan)")
    missing_loss = diagnose(_spike_at_81(loss=lambda p: [None if v > 1 else 2.0 for v in p]))
    assert "train loss not logged" in missing_loss.text() and "non-finite" not in missing_loss.verdict
