"""Seed B's machinery on short runs: the bandit sampler, numeric breaks and where they are
found, the guards (skip step, adaptive clip) and the lock-in measurement."""

import math

import numpy as np
import pytest
from short_runs import SHORT_BURST, short_scenario

from pytest_spikecheck import (
    AdaptiveClip,
    BlankDocument,
    HalfPrecision,
    LayerNormEps0,
    LeftPadding,
    MaskPaddingKeys,
    MixtureShift,
    NoClip,
    Scenario,
    SkipSpikes,
    SpikeCheckError,
    assert_finite,
    assert_no_lockin,
    train,
)
from pytest_spikecheck.training.clip_policy import AdaptiveLimit
from pytest_spikecheck.data.samplers import mixture_weights
from pytest_spikecheck.scenario import MixtureSpec

SOURCES = ["docs"] * 5 + ["prose"] * 5 + ["qa"] * 5 + ["foreign"] * 5


def test_bandit_weights_change_only_at_phase_boundaries_of_the_given_lengths():
    spec = MixtureSpec(phase_lengths=(7, 14, 21, 28, 42), concentration=0.3)
    weights = mixture_weights(spec, SOURCES[:15], steps=300, seed=3)
    boundaries = [i for i in range(1, 300) if weights[i] != weights[i - 1]]
    lengths = np.diff([0, *boundaries])
    assert set(lengths) <= {7, 14, 21, 28, 42} and len(boundaries) >= 5
    assert all(math.isclose(sum(w.values()), 1.0) for w in weights)
    assert weights == mixture_weights(spec, SOURCES[:15], steps=300, seed=3)


def test_new_source_is_held_out_then_tried_alone_for_one_phase():
    spec = MixtureSpec(phase_lengths=(7, 14), new_source="foreign", new_source_at=100)
    weights = mixture_weights(spec, SOURCES, steps=300, seed=0)
    first = next(i for i, w in enumerate(weights) if w["foreign"] > 0) + 1
    assert first >= 100 and all(w["foreign"] == 0 for w in weights[: first - 1])
    assert weights[first - 1]["foreign"] == 1.0
    assert any(0 < w["foreign"] < 1 for w in weights[first + 14 :])  # then it joins the draws


def test_mixture_runs_record_weights_and_sources():
    run = train(Scenario.preset("seed-b").replace(steps=40).with_breaks(MixtureShift(phase_lengths=(7,))))
    assert all(set(b["weights"]) == {"docs", "prose", "qa"} for b in run.batches)
    assert {s for b in run.batches for s in b["sources"]} == {"docs", "prose", "qa"}
    assert run.batches[0]["weights"] == run.batches[6]["weights"] != run.batches[7]["weights"]


def test_mixture_shift_config_errors():
    from pytest_spikecheck import ConfigError

    with pytest.raises(ConfigError, match="new_source must be one of"):
        MixtureShift(new_source="klingon")
    with pytest.raises(ConfigError, match="sampler.kind mixture goes with data.corpus mixture"):
        Scenario.preset("phase-19").replace(sampler__kind="mixture")


@pytest.mark.parametrize(
    ("breaks", "step", "module"),
    [
        ((HalfPrecision(),), 2, "wte.weight"),  # fp16 AdamW: eps 1e-8 rounds to 0, 0/0 on step 1's update
        ((LayerNormEps0(),), 1, "blocks.0.ln_1"),
        ((MaskPaddingKeys(), LeftPadding()), 1, "blocks.0.attn"),
        ((MaskPaddingKeys(), BlankDocument(at_step=5)), 5, "blocks.0.attn"),
    ],
)
def test_numeric_breaks_stop_cleanly_and_name_the_module(breaks, step, module):
    run = train(Scenario.preset("phase-19").replace(steps=12).with_breaks(*breaks))
    assert run.meta["stopped_at"] == step and run.meta["first_nonfinite"]["module"] == module
    with pytest.raises(SpikeCheckError, match=f"at step {step}.*first non-finite tensor: .* in {module}"):
        assert_finite(run)


def test_a_blank_document_is_harmless_without_key_masking():
    run = train(Scenario.preset("phase-19").replace(steps=8).with_breaks(BlankDocument(at_step=5)))
    assert not run.stopped_early and run.batch_at(5)["sources"]["burst:blank"] == 1
    assert_finite(run)


def test_skip_step_drops_exactly_the_spike():
    run = train(short_scenario(NoClip(), SkipSpikes(ratio=5.0)))
    assert run.meta["skipped_steps"] == [SHORT_BURST]
    at = SHORT_BURST - 1
    assert run["grad_norm_post"][at] == 0 and run["grad_norm_pre"][at] > 5 * np.median(run["grad_norm_pre"][at - 50 : at])


def test_adaptive_limit_follows_the_norm_and_ignores_one_spike():
    policy = AdaptiveLimit(z=2.5, alpha=0.97, fallback=math.inf, warmup=25)
    for _ in range(25):
        assert policy.limit() == math.inf
        policy.observe(1.0)
    for i in range(100):
        policy.observe(1.0 + 0.1 * ((-1) ** i))
    before = policy.limit()
    assert 1.0 < before < 1.5
    policy.observe(50.0)  # enters the EMA clipped to the limit
    assert policy.limit() < before + 0.2


def test_adaptive_clip_contains_the_burst():
    run = train(short_scenario(NoClip(), AdaptiveClip()))
    at = SHORT_BURST - 1
    assert run["grad_norm_post"][at] < 3 and run["clip_factor"][at] < 0.3


def test_lockin_is_measured_and_asserted(short_runs):
    stats = short_runs[0].meta["lockin"]
    assert set(stats) >= {"top_token", "top_token_share", "distinct_1", "distinct_2", "samples"}
    assert_no_lockin(short_runs[0])
    with pytest.raises(SpikeCheckError, match="repetition lock-in: token .* of the greedy output"):
        assert_no_lockin(short_runs[0], max_top_share=0.01)
    with pytest.raises(SpikeCheckError, match="cannot check lock-in"):
        assert_no_lockin({"loss": [1.0, 2.0]})


def test_first_step_update_is_recorded(short_runs):
    update = short_runs[0].meta["first_step_update"]
    # Adam's first step moves every weight by ~lr (m/sqrt(v) = sign(g)), whatever the clip.
    assert update["max_abs"] == pytest.approx(update["lr"], rel=0.05)
