"""Today's recipe breaks differently: under Muon the attention max logit explodes (Kimi K2, 2025).
Muon on the hidden matrices at lr 0.4 (torch's defaults otherwise, no weight decay) drives the
largest q·k/√d into the thousands on Phase-19's sentences (the GPT) and on induction sequences
(the Llama); QK-Clip (Kimi K2's tau 100, alpha 0.5) keeps it under 2 tau from its first clip on,
qk-norm under 50, and on the induction corpus, where only attention can finish a sequence, the
qk-norm twin ends well below the break (over half a nat at step 150: 0.92 on the AMD EPYC VM, 1.24
on the Intel Xeon VM, 2026-12-01; the Muon runs follow the CPU's float kernels; 1.31 at step 100,
where these runs stop) and copies. No NaN anywhere: the failure is a model that stops learning,
not an overflow. No multiplier anywhere either: the optimizer does it.

Measured over seeds 0-4 (scripts/muon_fidelity.py, docs/fidelity.md, Muon / QK-Clip section);
the thresholds hold for the default seed with margin. Run with ``pytest --spikecheck``.
"""

from __future__ import annotations

import pytest

from pytest_spikecheck import (
    QKClip,
    QKLayerNorm,
    Scenario,
    assert_finite,
    assert_logits_bounded,
    assert_qk_clip_contains,
    diagnose,
    spikecheck_scenario,
)
from pytest_spikecheck.judge.sweeps import final_loss

#: The schedule of the measured runs: 150 steps (warmup 20, cosine) at Muon lr 0.4. At lr 0.2 the
#: logits pass 1,000 only after ~130 steps and, on induction, the break still learns to copy.
MUON = {"optimizer__name": "muon", "optimizer__lr": 0.4, "optimizer__weight_decay": 0.0, "steps": 150}
#: Each run trains only a prefix of that schedule (``stop_after``: the same steps, LR and batches as
#: the 150-step run's, bit for bit). Measured on the AMD EPYC VM, 2026-12-02: the GPT break's max
#: logit passes tau 100 at step 29 and 1,000 at step 65 (largest 1,643 by step 80; 2,429 by 150), QK-Clip first
#: acts at step 29 (GPT) / 28 (Llama) and its largest logit is 150 at step 60 / 131 at step 49;
#: the Llama break passes 1,000 at step 53. So the GPT runs and the Llama's QK-Clip twin stop at 80.
GPT_STOP = 80
#: The induction comparison is read at step 100: eval loss 3.018 (break) vs 1.711 (qk-norm), and
#: on the repeated half 2.337 vs 0.074 (at step 150: 2.551 vs 1.626, 1.452 vs 0.015).
INDUCTION_STOP = 100
#: Induction: 2,000 training sequences in batches of 32, so that a healthy model learns to copy
#: within 150 steps (in batches of 8 it does not yet; of 16, on 2 seeds of 5).
INDUCTION = {"data__corpus": "induction", "data__n_sentences": 2000, "sampler__batch_size": 32}


def _gpt(*defences) -> Scenario:
    return Scenario.preset("phase-19").replace(**MUON, stop_after=GPT_STOP).with_breaks(*defences)


def _llama(*defences, stop_after: int = INDUCTION_STOP) -> Scenario:
    return (
        Scenario.preset("phase-19")
        .replace(model__arch="llama", **MUON, **INDUCTION, stop_after=stop_after)
        .with_breaks(*defences)
    )


@spikecheck_scenario
def muon_gpt():
    """The GPT on Phase-19's sentences under Muon lr 0.4."""
    return _gpt()


@spikecheck_scenario
def muon_gpt_qk_clip():
    return _gpt(QKClip())


@spikecheck_scenario
def muon_gpt_qk_norm():
    return _gpt(QKLayerNorm())


@spikecheck_scenario
def muon_llama_induction():
    """The Llama on induction sequences under Muon lr 0.4."""
    return _llama()


@spikecheck_scenario
def muon_llama_induction_qk_clip():
    return _llama(QKClip(), stop_after=GPT_STOP)  # containment alone: the induction test does not read it


@spikecheck_scenario
def muon_llama_induction_qk_norm():
    return _llama(QKLayerNorm())


BREAKS = ("muon_gpt", "muon_llama_induction")
CLIPPED = ("muon_gpt_qk_clip", "muon_llama_induction_qk_clip")
NORMED = ("muon_gpt_qk_norm", "muon_llama_induction_qk_norm")


@pytest.mark.parametrize("name", BREAKS)
def test_the_max_logit_explodes_under_muon(request, name):
    logits = request.getfixturevalue(name)["attn_logit_max"]
    assert logits.max() >= 1000 and logits.max() >= 100 * logits[9], (logits[9], logits.max())


@pytest.mark.parametrize("name", CLIPPED)
def test_qk_clip_keeps_it_under_two_tau_from_its_first_clip(request, name):
    run = request.getfixturevalue(name)
    assert assert_qk_clip_contains(run) is not None  # it had to act: the logits reached tau


@pytest.mark.parametrize("name", NORMED)
def test_qk_norm_bounds_it(request, name):
    assert_logits_bounded(request.getfixturevalue(name), attention=50)


@pytest.mark.parametrize("name", BREAKS + CLIPPED + NORMED)
def test_no_nan_anywhere(request, name):
    assert_finite(request.getfixturevalue(name))


def test_on_induction_the_qk_norm_twin_ends_well_below_the_break(muon_llama_induction, muon_llama_induction_qk_norm):
    broken, defended = final_loss(muon_llama_induction), final_loss(muon_llama_induction_qk_norm)
    # Half a nat, not the 1 nat of 4 of 5 seeds on the Xeon at step 150: this seed gives 3.018 vs 1.711
    # at step 100 on the EPYC VM (2.551 vs 1.626 at 150; 2.878 vs 1.635 on the Xeon at 150), and the
    # same scenario is bit-identical per machine only.
    assert broken - defended >= 0.5, f"{broken:.3f} without qk-norm vs {defended:.3f} with it"
    # the rescue is the copying: the repeated half, which only attention can predict
    assert muon_llama_induction_qk_norm["eval_loss_repeat"][-1] < 0.5 < muon_llama_induction["eval_loss_repeat"][-1]


@pytest.mark.parametrize("name", BREAKS)
def test_the_diagnosis_names_the_max_logit_explosion_under_muon(request, name):
    d = diagnose(request.getfixturevalue(name))
    assert d.facts["attention_logit_growth"] and d.facts["optimizer"] == "muon", d.text()
    assert "under Muon; " in d.text() and "QK-Clip off" in d.text() and f"in layer {d.facts['max_logit_layer']} head" in d.text()
    assert "a max-logit explosion under Muon: QK-Clip or qk-norm contains it" in d.verdict


def test_the_diagnosis_reports_qk_clips_activity(muon_gpt_qk_clip):
    d = diagnose(muon_gpt_qk_clip)
    assert not d.facts["attention_logit_growth"] and d.facts["qk_clip_steps"] > 0, d.text()
    assert "QK-Clip (τ 100) active on" in d.text()
