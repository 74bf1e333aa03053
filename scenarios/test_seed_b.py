"""Seed B as a scenario suite: the bandit's source shifts, a new source entering, numeric
breaks, ANDREA v1's recipe and the guards. Thresholds from docs/fidelity.md (Seed B part)
and docs/mitigations.md, with margin. Run with ``pytest --spikecheck``.
"""

from __future__ import annotations

import numpy as np
import pytest

from pytest_spikecheck import (
    AdaptiveClip,
    BlankDocument,
    HalfPrecision,
    LayerNormEps0,
    MaskPaddingKeys,
    MixtureShift,
    NoClip,
    NoWeightDecay,
    Scenario,
    SkipSpikes,
    SpikeCheckError,
    assert_clip_contains,
    assert_diverges,
    assert_finite,
    assert_no_lockin,
    assert_spike,
    spikecheck_scenario,
)
from pytest_spikecheck.judge.analysis import loss_jump, spike_ratio

STEPS = 400  # shorter than Phase-19's 500 to keep the suite fast; the events sit at 312
ENTRY = 312
#: The bandit's runs have no event to reach: 200 steps hold 9 switches after step 60 (the test
#: needs 5). Measured on 2026-12-01 (AMD EPYC VM): largest switch ratio 1.93x without clip,
#: 2.10x with clip 1.0 (docs/testing.md, Suite time), against the test's limit of 10x.
BANDIT_STEPS = 200
#: The new source's runs stop 10 steps after its entry (step 330, the first switch after 312): the
#: tests read the entry step, the 50 steps before it and the eval jump in the 10 from it. The first
#: 340 of the 400 steps (``stop_after``), bit-identical to the whole run's (tests/test_train_prefix.py).
AFTER_ENTRY = 10  # loss_jump's window (its default ``after``)
NEW_SOURCE_STOP = 330 + AFTER_ENTRY


def _bandit(*breaks) -> Scenario:
    return Scenario.preset("seed-b").replace(steps=BANDIT_STEPS).with_breaks(MixtureShift(), *breaks)


def _new_source(*breaks) -> Scenario:
    return (
        Scenario.preset("seed-b")
        .replace(steps=STEPS, stop_after=NEW_SOURCE_STOP)
        .with_breaks(MixtureShift(new_source="foreign", new_source_at=ENTRY), *breaks)
    )


def _entry_step(run) -> int:
    (entry,) = run.declared_events  # the engine declares the step the new source first reaches a batch
    assert entry + AFTER_ENTRY <= NEW_SOURCE_STOP == len(run), f"the run stops before the {AFTER_ENTRY} steps after entry {entry}"
    return entry


def _boundaries(run) -> list[int]:
    weights = [b["weights"] for b in run.batches]
    return [run.batches[i]["step"] for i in range(1, len(weights)) if weights[i] != weights[i - 1]]


@spikecheck_scenario
def seedb_bandit():
    """The bandit re-weights docs / prose / Q&A every 7-42 steps; clip 1.0."""
    return _bandit()


@spikecheck_scenario
def seedb_bandit_no_clip():
    return _bandit(NoClip())


@spikecheck_scenario
def seedb_new_source_no_clip():
    """A source in a never-seen script enters at the first boundary after step 312, alone; no clip."""
    return _new_source(NoClip())


@spikecheck_scenario
def seedb_new_source_clip():
    return _new_source()


@spikecheck_scenario
def seedb_new_source_skip_step():
    return _new_source(NoClip(), SkipSpikes(ratio=5.0))


@spikecheck_scenario
def seedb_new_source_adaptive_clip():
    return _new_source(NoClip(), AdaptiveClip())


@spikecheck_scenario
def andrea_v1_recipe():
    """ANDREA-120M v1's recipe at our scale: no clip, no weight decay, frequent source switches."""
    return Scenario.preset("seed-b").with_breaks(MixtureShift(phase_lengths=(7, 14)), NoClip(), NoWeightDecay())


@spikecheck_scenario
def numeric_fp16():
    """Pure fp16 AdamW, no master weights, no loss scaling."""
    return Scenario.preset("phase-19").replace(steps=20).with_breaks(HalfPrecision())


@spikecheck_scenario
def numeric_layernorm_eps0():
    return Scenario.preset("phase-19").replace(steps=20).with_breaks(LayerNormEps0())


@spikecheck_scenario
def numeric_masked_row():
    """Attention masks padding keys; a blank document reaches the batch of step 312."""
    return Scenario.preset("phase-19").replace(steps=STEPS).with_breaks(MaskPaddingKeys(), BlankDocument(at_step=ENTRY))


def test_bandit_transitions_are_mild_shocks(seedb_bandit_no_clip):
    # Seed B says 10-100x per switch; re-weighting sources the model already knows gives far less.
    ratios = [spike_ratio(seedb_bandit_no_clip.metrics, s) for s in _boundaries(seedb_bandit_no_clip) if s > 60]
    assert len(ratios) >= 5
    assert max(ratios) < 10, ratios


def test_bandit_clip_contains(seedb_bandit):
    assert_clip_contains(seedb_bandit, max_norm=1.0)


def test_a_new_source_is_the_real_shock(seedb_new_source_no_clip):
    entry = _entry_step(seedb_new_source_no_clip)
    assert entry == next(b["step"] for b in seedb_new_source_no_clip.batches if "foreign" in b["sources"])
    assert entry >= ENTRY and set(seedb_new_source_no_clip.batch_at(entry)["sources"]) == {"foreign"}
    assert_spike(seedb_new_source_no_clip, at=entry, min_ratio=10)


def test_clip_contains_the_new_source_and_halves_the_harm(seedb_new_source_clip, seedb_new_source_no_clip):
    entry = _entry_step(seedb_new_source_clip)
    assert_clip_contains(seedb_new_source_clip, max_norm=1.0)
    assert loss_jump(seedb_new_source_clip.metrics, entry) < 0.5 * loss_jump(seedb_new_source_no_clip.metrics, entry)


def test_skip_step_drops_the_entry_step(seedb_new_source_skip_step):
    entry = _entry_step(seedb_new_source_skip_step)
    assert entry in seedb_new_source_skip_step.meta["skipped_steps"]
    assert_finite(seedb_new_source_skip_step)


def test_adaptive_clip_contains_the_entry(seedb_new_source_adaptive_clip, seedb_new_source_no_clip):
    entry = _entry_step(seedb_new_source_adaptive_clip)
    at = int(np.flatnonzero(seedb_new_source_adaptive_clip["step"] == entry)[0])
    assert seedb_new_source_adaptive_clip["clip_factor"][at] < 0.2
    assert loss_jump(seedb_new_source_adaptive_clip.metrics, entry) < 0.5 * loss_jump(seedb_new_source_no_clip.metrics, entry)


def test_v1_recipe_does_not_lock_in_at_our_scale(andrea_v1_recipe):
    # Seed B: ANDREA-120M v1 ended in repetition lock-in. At 0.1M parameters it does not.
    assert_finite(andrea_v1_recipe)
    # Measured on 2026-11-30 (this scenario, seed 42): top-token share 0.091, distinct-2 0.440;
    # seeds 0–4 (docs/seed_b.json): 0.073–0.096 and 0.36–0.46. The limits sit at about twice
    # the share and half the distinct-2 measured: a drift that far is no longer this model.
    assert_no_lockin(andrea_v1_recipe, max_top_share=0.2, min_distinct_2=0.2)


def _assert_found(run, step: int, module: str) -> None:
    assert assert_diverges(run) == step
    with pytest.raises(SpikeCheckError, match=f"first non-finite tensor: .* in {module} at step {step}"):
        assert_finite(run)


def test_fp16_adamw_dies_on_its_first_update(numeric_fp16):
    # eps = 1e-8 rounds to 0 in fp16: weights with a zero gradient get 0/0 at step 1, and the
    # forward pass of step 2 meets them.
    _assert_found(numeric_fp16, 2, "wte.weight")


def test_layernorm_eps0_meets_a_constant_input(numeric_layernorm_eps0):
    _assert_found(numeric_layernorm_eps0, 1, "blocks.0.ln_1")


def test_a_fully_masked_attention_row_is_found_at_its_step(numeric_masked_row):
    _assert_found(numeric_masked_row, ENTRY, "blocks.0.attn")
