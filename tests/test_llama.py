"""The Llama-style model (``model.arch: llama``) and the switches it brings (``n_kv_head``,
``attn_gate``, the arch's position schemes): its shapes, RoPE, grouped-query attention, its
stats hook, each model-level break, and the bad inputs, one line each. No training here but a
few steps of the nano shape."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pytest_spikecheck import (
    ConfigError,
    GatedAttention,
    LayerNormEps0,
    LogitSoftcap,
    MaskPaddingKeys,
    QKLayerNorm,
    Scenario,
    ZLoss,
    train,
)
from pytest_spikecheck.models.config import HEAD_LOGITS_KEY, GPTConfig, model_preset
from pytest_spikecheck.models.gpt import GPT
from pytest_spikecheck.models.llama import Llama, apply_rope, rope_tables, swiglu_hidden
from pytest_spikecheck.training.step import model_stats


def _llama(**options) -> Llama:
    torch.manual_seed(0)
    return Llama(GPTConfig(arch="llama", n_layer=2, n_head=4, n_embd=32, block_size=8, vocab_size=11, **options))


def _tiny_llama(*breaks, steps: int = 2) -> Scenario:
    return (
        Scenario.preset("phase-19")
        .replace(name="tiny-llama", steps=steps, seed=0, model=GPTConfig(arch="llama", n_layer=2, n_head=2, n_embd=32))
        .with_breaks(*breaks)
    )


def test_the_llama_has_rmsnorm_swiglu_no_biases_and_separate_qkv():
    model = _llama(n_kv_head=2)
    names = dict(model.named_parameters())
    assert not [n for n in names if n.endswith("bias")]
    assert names["blocks.0.attn.q_proj.weight"].shape == (32, 32)
    assert names["blocks.0.attn.k_proj.weight"].shape == names["blocks.0.attn.v_proj.weight"].shape == (16, 32)  # 2 kv heads of 8
    assert names["blocks.0.mlp.gate_proj.weight"].shape == (swiglu_hidden(32), 32) == (88, 32)
    assert swiglu_hidden(64) == 176  # 8/3 x 64 = 170.7, up to a multiple of 8
    assert isinstance(model.blocks[0].attn_norm, torch.nn.RMSNorm) and "wpe.weight" not in names
    assert names["lm_head.weight"].data_ptr() != names["wte.weight"].data_ptr()  # untied


def test_rope_makes_attention_depend_on_the_position_difference_only():
    cos, sin = rope_tables(8, 16)
    torch.manual_seed(0)
    q, k = torch.randn(8), torch.randn(8)

    def logit(i, j):
        at = lambda x, t: apply_rope(x.expand(1, 1, 16, 8), cos, sin)[0, 0, t]  # noqa: E731
        return float(at(q, i) @ at(k, j))

    assert logit(5, 3) == pytest.approx(logit(12, 10), abs=1e-5)
    assert logit(5, 3) != pytest.approx(logit(5, 4), abs=1e-3)


def test_the_stats_hook_reports_the_largest_logit_per_head_with_grouped_keys():
    model = _llama(n_kv_head=2)
    model.record_stats = True
    idx = torch.randint(0, 11, (3, 8))
    model(idx, idx)
    # the largest |q·k|/sqrt(d) per (layer, head), from q and k as the first block computes them
    attn = model.blocks[0].attn
    with torch.no_grad():
        x = model.blocks[0].attn_norm(model.wte(idx))
        q = apply_rope(attn.q_proj(x).view(3, 8, 4, 8).transpose(1, 2), model.rope_cos, model.rope_sin)
        k = apply_rope(attn.k_proj(x).view(3, 8, 2, 8).transpose(1, 2), model.rope_cos, model.rope_sin)
        k = k.repeat_interleave(2, dim=1)  # key head j serves query heads 2j and 2j+1
        expected = ((q @ k.transpose(-2, -1)).abs() / math.sqrt(8)).amax(dim=(0, 2, 3))
    per_head = model.spikecheck_stats[HEAD_LOGITS_KEY]
    assert per_head.shape == (2, 4)
    torch.testing.assert_close(per_head[0], expected, rtol=1e-5, atol=1e-6)
    assert model_stats(model)["attn_logit_max"] == float(per_head.max())  # the column is the max over heads


def test_qk_rmsnorm_bounds_the_logits_however_large_the_weights():
    model = _llama(qk_layernorm=True)
    model.record_stats = True
    with torch.no_grad():
        model.blocks[0].attn.q_proj.weight.mul_(1e4)
        model.blocks[0].attn.k_proj.weight.mul_(1e4)
    idx = torch.randint(0, 11, (2, 8))
    model(idx, idx)
    # RMS-normalised q and k have norm sqrt(hs) with unit gains: |q·k|/sqrt(hs) <= sqrt(hs)
    assert model_stats(model)["attn_logit_max"] <= math.sqrt(8) + 1e-3


@pytest.mark.parametrize("arch", ["gpt", "llama"])
def test_the_gate_scales_each_heads_output_by_its_sigmoid(arch):
    torch.manual_seed(0)
    config = GPTConfig(arch=arch, n_layer=1, n_head=4, n_embd=32, block_size=8, vocab_size=11, attn_gate=True)
    model = (Llama if arch == "llama" else GPT)(config)
    gate = model.blocks[0].attn.gate
    assert gate.proj.weight.shape == (4, 32)  # one gate per head
    with torch.no_grad():
        gate.proj.weight.zero_()
        gate.proj.weight[1] = -1e4  # head 1 closed, the others at sigmoid(0) = 1/2
        x, y = torch.randn(2, 8, 32).abs(), torch.randn(2, 4, 8, 8)
        gated = gate(x, y)
    assert torch.equal(gated[:, 1], torch.zeros_like(gated[:, 1]))
    torch.testing.assert_close(gated[:, [0, 2, 3]], y[:, [0, 2, 3]] / 2)


def test_model_level_breaks_act_on_the_llama():
    r = _tiny_llama(QKLayerNorm(), ZLoss(), LogitSoftcap(cap=30), GatedAttention()).resolved()
    run = train(r)
    assert {"attn_logit_max", "logz_mean", "z_loss"} <= run.metrics.keys()
    assert run.meta["parameters"] > 0 and not run.stopped_early
    # RMSNorm with eps 0 meets the zero padding row: 0/0, found in the first norm
    broken = train(_tiny_llama(LayerNormEps0(), steps=1))
    assert broken.meta["stop_reason"] and broken.meta["first_nonfinite"]["module"] == "blocks.0.attn_norm"
    masked = _tiny_llama(MaskPaddingKeys(), steps=1).resolved()
    assert masked.model.mask_padding and masked.model.arch == "llama"


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"arch": "mamba"}, "model.arch must be one of gpt, llama, was 'mamba'"),
        (
            {"arch": "llama", "pos_embedding": "learned"},
            "model.pos_embedding learned does not go with arch llama, which takes rope or none",
        ),
        ({"pos_embedding": "rope"}, "model.pos_embedding rope does not go with arch gpt, which takes learned or none"),
        ({"arch": "llama", "n_kv_head": 3}, r"model.n_kv_head \(3\) must divide model.n_head \(4\)"),
        ({"arch": "llama", "n_kv_head": -1}, "model.n_kv_head must be an integer >= 0"),
        ({"n_kv_head": 2}, "grouped-query attention is the llama model's"),
    ],
)
def test_bad_model_settings_are_one_clear_line(changes, message):
    with pytest.raises(ConfigError, match=message):
        GPTConfig(**changes)


def test_auto_positions_are_each_archs_own():
    assert GPTConfig().positions == "learned" and GPTConfig(arch="llama").positions == "rope"
    assert GPTConfig(arch="llama", pos_embedding="none").positions == "none"
    # a preset's model turned llama keeps auto: the replace does not carry the GPT's positions along
    assert Scenario.preset("phase-19").replace(model__arch="llama").model.positions == "rope"
    assert model_preset("micro").pos_embedding == "auto"


def test_the_llama_trains_on_the_phase19_data_and_records_its_stats():
    run = train(_tiny_llama(steps=3))
    assert np.isfinite(run["attn_logit_max"]).all() and run["loss"][0] == pytest.approx(math.log(run.meta["vocab_size"]), abs=0.3)
    assert run.meta["largest_attn_logit"]["per_head"] and len(run.meta["largest_attn_logit"]["per_head"]) == 2


@pytest.mark.parametrize(
    "make",
    [
        lambda: GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, vocab_size=11, block_size=8, mask_padding=True, pad_token_id=0)),
        lambda: Llama(
            GPTConfig(
                arch="llama", n_layer=1, n_head=2, n_embd=16, vocab_size=11, block_size=8, mask_padding=True, pad_token_id=0
            )
        ),
    ],
    ids=["gpt", "llama"],
)
def test_both_models_check_the_length_and_mask_the_padding_keys_by_default(make):
    torch.manual_seed(0)
    model = make().eval()
    idx = torch.tensor([[0, 0, 3, 4, 5, 6]])  # left padding
    with torch.no_grad():
        default, _ = model(idx)
        masked, _ = model(idx, key_mask=idx != 0)
        unmasked, _ = model(idx, key_mask=torch.ones_like(idx, dtype=torch.bool))
        torch.testing.assert_close(default, masked, rtol=0, atol=0, equal_nan=True)  # a pad row sees no key: NaN
        assert not torch.allclose(default[0, 2:], unmasked[0, 2:])  # the padding keys would change the real tokens' outputs
        with pytest.raises(ValueError, match="sequence length 9 exceeds block_size 8"):
            model(torch.zeros(1, 9, dtype=torch.long))
