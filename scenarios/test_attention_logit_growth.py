"""Instabilities that kill (Wortsman et al. 2023): at a high learning rate the Phase-19 model's
attention logits grow into the thousands and the run stays stuck near the unigram loss; the
same run with qk-layernorm trains. No multiplier anywhere: the learning rate alone does it.

Measured over seeds 0-4 (scripts/high_lr.py, docs/fidelity.md, Wortsman section);
the thresholds below hold for the default seed with margin. Run with ``pytest --spikecheck``.
"""

from __future__ import annotations

from pytest_spikecheck import (
    GatedAttention,
    HighLR,
    QKLayerNorm,
    Scenario,
    assert_finite,
    assert_logits_bounded,
    diagnose,
    spikecheck_scenario,
)
from pytest_spikecheck.judge.sweeps import final_loss

#: The smallest set-up that still shows it on every seed 0-4: Phase-19's model (the nano model
#: at n_embd 32 escapes on 2 seeds of 5), 150 steps with warmup 20 and clip 1.0.
HIGH_LR, STEPS = 0.1, 150


def _high_lr(*defences) -> Scenario:
    return Scenario.preset("phase-19").replace(steps=STEPS).with_breaks(HighLR(lr=HIGH_LR), *defences)


@spikecheck_scenario
def high_lr_break():
    """lr 0.1 (10x Phase-19's), clip 1.0 and warmup kept: attention-logit growth."""
    return _high_lr()


@spikecheck_scenario
def high_lr_qk_layernorm():
    """The same run with LayerNorm on each head's queries and keys."""
    return _high_lr(QKLayerNorm())


@spikecheck_scenario
def high_lr_gated_attention():
    """The same run with a per-head sigmoid gate on each attention output (Qiu et al. 2025)."""
    return _high_lr(GatedAttention())


def test_the_break_ends_over_a_nat_worse_than_its_defended_twin(high_lr_break, high_lr_qk_layernorm):
    broken, defended = final_loss(high_lr_break), final_loss(high_lr_qk_layernorm)
    assert broken - defended > 1.2, f"lr {HIGH_LR}: {broken:.3f} without qk-layernorm vs {defended:.3f} with it"


def test_attention_logits_grow_without_qk_layernorm(high_lr_break):
    logits = high_lr_break["attn_logit_max"]
    assert logits.max() > 1000 and logits.max() > 100 * logits[9], (logits[9], logits.max())


def test_qk_layernorm_bounds_the_attention_logits(high_lr_qk_layernorm):
    assert_logits_bounded(high_lr_qk_layernorm, attention=50)


def test_the_run_dies_without_a_nan(high_lr_break):
    # The failure is a run stuck at a high loss, not an overflow: every value stays finite.
    assert_finite(high_lr_break)


def test_the_diagnosis_names_attention_logit_growth(high_lr_break):
    d = diagnose(high_lr_break)
    assert d.facts["attention_logit_growth"], d.text()
    assert "attention-logit growth" in d.verdict


def test_the_output_gate_rescues_the_run_without_bounding_the_logits(high_lr_break, high_lr_gated_attention):
    # The gate lets a head switch itself off instead of parking its attention: the run trains
    # (seed 42: 1.466 vs 3.023), yet the largest logit still grows into the thousands (5,118).
    broken, gated = final_loss(high_lr_break), final_loss(high_lr_gated_attention)
    assert broken - gated > 1.0, f"lr {HIGH_LR}: {broken:.3f} without the gate vs {gated:.3f} with it"
    assert high_lr_gated_attention["attn_logit_max"].max() > 1000
    assert_finite(high_lr_gated_attention)
