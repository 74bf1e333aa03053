"""QK-Clip (pytest_spikecheck.training.qk_clip): each head's logits scaled by exactly its gamma,
the guard on a largest logit <= 0 or not finite, per-layer mode, grouped-query attention, the
custom-model hook, and the sabotage tests: a clip that never scales, one that scales the wrong
head, one that divides by a largest logit <= 0 each fail the containment assertion or the
finiteness check that the honest clip passes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pytest_spikecheck import ConfigError, QKClip, Scenario, SpikeCheckError, assert_finite, assert_qk_clip_contains, train
from pytest_spikecheck.models.config import GPTConfig
from pytest_spikecheck.models.gpt import GPT
from pytest_spikecheck.models.llama import Llama, apply_rope
from pytest_spikecheck.training import qk_clip
from pytest_spikecheck.training.qk_clip import QKClipHook, head_gammas, qk_projections, scale_heads_

TAU = 30.0


def _head_logits(model: torch.nn.Module, idx: torch.Tensor) -> torch.Tensor:
    """q·k/sqrt(d) of the first layer, (B, nh, T, T), recomputed from the weights."""
    with torch.no_grad():
        if isinstance(model, GPT):
            x = model.blocks[0].ln_1(model.wte(idx) + model.wpe(torch.arange(idx.shape[1])))
            q, k, _ = model.blocks[0].attn.c_attn(x).split(model.config.n_embd, dim=2)
            nh = nkv = model.config.n_head
        else:
            attn = model.blocks[0].attn
            x = model.blocks[0].attn_norm(model.wte(idx))
            q, k = attn.q_proj(x), attn.k_proj(x)
            nh, nkv = attn.n_head, attn.n_kv_head
        B, T, _ = q.shape
        hs = q.shape[-1] // nh
        q, k = q.view(B, T, nh, hs).transpose(1, 2), k.view(B, T, nkv, hs).transpose(1, 2)
        if not isinstance(model, GPT):
            q, k = apply_rope(q, model.rope_cos, model.rope_sin), apply_rope(k, model.rope_cos, model.rope_sin)
        k = k.repeat_interleave(nh // nkv, dim=1)
        return q @ k.transpose(-2, -1) / math.sqrt(hs)


@pytest.mark.parametrize("arch,n_kv_head", [("gpt", 0), ("llama", 0), ("llama", 2), ("llama", 1)])
def test_each_heads_logits_scale_by_exactly_its_gamma(arch, n_kv_head):
    torch.manual_seed(0)
    config = GPTConfig(arch=arch, n_layer=1, n_head=4, n_embd=32, block_size=8, vocab_size=11, n_kv_head=n_kv_head)
    model = (Llama if arch == "llama" else GPT)(config)
    if arch == "gpt":
        with torch.no_grad():
            model.blocks[0].attn.c_attn.bias.normal_()  # q and k biases scale with their heads too
    idx = torch.randint(0, 11, (2, 8))
    before = _head_logits(model, idx)
    gamma = torch.tensor([[0.5, 1.0, 0.1, 0.9]])
    scale_heads_(qk_projections(model), gamma, alpha=0.5)
    torch.testing.assert_close(_head_logits(model, idx), before * gamma[0].view(1, 4, 1, 1), rtol=2e-5, atol=1e-6)


def test_gammas_skip_heads_at_or_below_zero_and_non_finite_ones():
    head_max = torch.tensor([[0.0, -3.0, math.nan, math.inf, 60.0, 12.0]])
    assert head_gammas(head_max, TAU, per_head=True).tolist() == [[1.0, 1.0, 1.0, 1.0, 0.5, 1.0]]
    per_layer = head_gammas(torch.tensor([[60.0, 12.0], [90.0, 150.0]]), TAU, per_head=False)
    assert per_layer.flatten().tolist() == pytest.approx([0.5, 0.5, 0.2, 0.2])  # each layer's smallest gamma on all its heads


def _unguarded_gammas(head_max: torch.Tensor, tau: float, per_head: bool) -> torch.Tensor:
    """Sabotage: gamma = min(1, tau / S) with no guard on S (Megatron-LM's NaN before PR 7382):
    a head whose largest logit is negative gets a negative gamma, and gamma ** alpha is NaN."""
    return (tau / head_max).clamp(max=1.0)


def test_dividing_by_a_largest_logit_at_or_below_zero_fails_the_finiteness_check():
    torch.manual_seed(0)
    for gammas, finite in ((head_gammas, True), (_unguarded_gammas, False)):
        model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=11))
        head_max = torch.tensor([[-3.0, 60.0]])  # a hook reporting the signed largest logit: head 0 all negative
        scale_heads_(qk_projections(model), gammas(head_max, TAU, True), alpha=0.5)
        assert all(bool(torch.isfinite(p).all()) for p in model.parameters()) is finite


# -- in training: the honest clip and its sabotage ---------------------------------------------

#: The sabotage runs: Phase-19's GPT under Muon at lr 0.4 (the shipped break's recipe), cut to
#: SHORT steps: the honest clip first acts at step 19 here (and holds the logits under 1.8 tau);
#: a clip that never scales lets them pass 2 tau at step 25, one that scales the wrong head at 26
#: (measured, seed 42, 45 steps; the schedule of a 32-step run differs only after step 20).
SHORT = 32


def _muon(steps: int = SHORT, **changes) -> Scenario:
    return (
        Scenario.preset("phase-19")
        .replace(
            name="qk-clip-short", steps=steps, optimizer__name="muon", optimizer__lr=0.4, optimizer__weight_decay=0.0, **changes
        )
        .with_breaks(QKClip(tau=TAU))
    )


@pytest.fixture(scope="module")
def honest():
    return train(_muon())


def test_the_honest_clip_contains_the_logits(honest):
    first = assert_qk_clip_contains(honest)
    assert first is not None and first < SHORT - 10
    assert_finite(honest)


def _never_scales(layers, gamma, alpha) -> None:
    """Sabotage: QK-Clip counts the heads it should clip and scales none."""


def _wrong_head(layers, gamma, alpha) -> None:
    """Sabotage: each head's gamma goes to its neighbour."""
    _honest_scale(layers, gamma.roll(1, dims=1), alpha)


_honest_scale = scale_heads_


@pytest.mark.parametrize("sabotage", [_never_scales, _wrong_head], ids=["never-scales", "wrong-head"])
def test_a_sabotaged_clip_fails_the_containment_assertion(monkeypatch, sabotage):
    monkeypatch.setattr(qk_clip, "scale_heads_", sabotage)
    run = train(_muon())
    assert run["qk_clipped_heads"].sum() > 0  # it believes it clipped
    with pytest.raises(SpikeCheckError, match=r"QK-Clip \(tau 30\) first clipped at step \d+, yet the largest attention logit"):
        assert_qk_clip_contains(run)


def test_a_clip_that_divides_by_a_negative_largest_logit_fails_the_finiteness_check(monkeypatch):
    real = QKClipHook.head_max

    def signed(self):  # as a model reporting the signed largest logit would: layer 0 head 0 all negative
        head_max = real(self).clone()
        head_max[0, 0] = -1.0
        return head_max

    monkeypatch.setattr(QKClipHook, "head_max", signed)
    scenario = _muon(steps=6, model=GPTConfig(n_layer=1, n_head=2, n_embd=32)).replace(name="signed")
    assert_finite(train(scenario))  # the guard skips the head
    monkeypatch.setattr(qk_clip, "head_gammas", _unguarded_gammas)
    with pytest.raises(SpikeCheckError, match="non-finite"):
        assert_finite(train(scenario))


# -- the assertion on numbers -------------------------------------------------------------------


def test_assert_qk_clip_contains_on_arrays():
    record = {
        "step": [1, 2, 3, 4],
        "loss": [1.0] * 4,
        "attn_logit_max": [10.0, 40.0, 55.0, 59.0],
        "qk_clipped_heads": [0, 2, 1, 1],
    }
    assert assert_qk_clip_contains(record, tau=30) == 2
    with pytest.raises(SpikeCheckError, match=r"yet the largest attention logit is 55 > 1.5 x tau at step 3"):
        assert_qk_clip_contains(record, tau=30, factor=1.5)
    silent = dict(record, qk_clipped_heads=[0, 0, 0, 0])
    with pytest.raises(SpikeCheckError, match="exceeded tau 30 at step 2 and QK-Clip clipped no head there"):
        assert_qk_clip_contains(silent, tau=30)
    assert assert_qk_clip_contains(dict(record, attn_logit_max=[1.0] * 4, qk_clipped_heads=[0] * 4), tau=30) is None
    with pytest.raises(SpikeCheckError, match="is nan > 2 x tau"):
        assert_qk_clip_contains(dict(record, attn_logit_max=[10.0, 40.0, math.nan, 1.0]), tau=30)
    with pytest.raises(SpikeCheckError, match="QK-Clip was not on in this run: no qk_clipped_heads column"):
        assert_qk_clip_contains({"step": [1], "loss": [1.0], "attn_logit_max": [1.0]}, tau=30)
    with pytest.raises(ConfigError, match="pass tau"):
        assert_qk_clip_contains(record)
    with pytest.raises(ConfigError, match="needs tau > 0"):
        assert_qk_clip_contains(record, tau=-1)


# -- custom models, several ranks ----------------------------------------------------------------


def _gpt_factory(vocab_size: int) -> GPT:
    """A custom model that has both hooks (the built-in GPT's, through the model contract)."""
    return GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, vocab_size=vocab_size))


class _NoHook(torch.nn.Module):
    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab_size, 16)
        self.hidden = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, vocab_size)

    def forward(self, idx):
        return self.head(self.hidden(self.emb(idx)))


def test_a_custom_model_opts_in_through_the_hook_and_one_without_is_refused():
    run = train(_muon(steps=3).replace(model_factory=_gpt_factory, name="custom-qk"))
    assert "qk_clipped_heads" in run.metrics and "attn_logit_max" in run.metrics
    with pytest.raises(ConfigError, match=r"_NoHook has no spikecheck_qk_projections\(\) method"):
        train(_muon(steps=3).replace(model_factory=_NoHook, name="custom-no-hook"))


def test_qk_clip_on_several_ranks_is_refused_before_training():
    from pytest_spikecheck.training.distributed import check_distributed_scenario

    with pytest.raises(ConfigError, match="QKClip is not supported with nproc > 1"):
        check_distributed_scenario(_muon().resolved(), 2)


def test_the_column_counts_the_clipped_heads(honest):
    clipped = honest["qk_clipped_heads"]
    assert set(np.unique(clipped)) <= set(range(0, 9))  # 2 layers x 4 heads
    assert clipped[:10].sum() == 0 and clipped.max() >= 1


def test_the_run_records_the_query_and_key_weights_norm_product_at_its_end():
    # meta["qk_weight_norm"]: the mean over layers of ||W_q||·||W_k|| after the last update, as a
    # callback at the last step sees the weights; None for a model without the hook.
    seen = {}

    def at_end(ctx) -> None:
        if ctx.step == ctx.scenario.steps:
            seen["value"] = float(np.mean([float(p.q.detach().norm() * p.k.detach().norm()) for p in qk_projections(ctx.model)]))

    run = train(_muon(steps=4).replace(name="qk-norm-meta"), callbacks=[at_end])
    assert run.meta["qk_weight_norm"] == seen["value"] > 0
    no_hook = Scenario.preset("phase-19").replace(steps=2, model_factory=_NoHook, name="qk-norm-meta-no-hook")
    assert train(no_hook).meta["qk_weight_norm"] is None
    # a hook that does not fit is QKClip's error at the start of a run with QKClip; without it,
    # the record leaves the value out rather than failing a trained run at its end
    empty = Scenario.preset("phase-19").replace(steps=2, model_factory=_EmptyHook, name="qk-norm-meta-empty-hook")
    assert train(empty).meta["qk_weight_norm"] is None


class _EmptyHook(_NoHook):
    def spikecheck_qk_projections(self) -> list[tuple]:
        return []


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_largest_logits_are_measured_in_float32_under_autocast(dtype):
    # q·k of 16 x 300 x 300 = 1.44e6 overflows float16 (65504): measured there, the head would read
    # inf and QK-Clip, which skips non-finite heads, would leave exactly the exploding head alone.
    from pytest_spikecheck.models.layers import logit_stats

    q = torch.full((1, 2, 4, 16), 300.0, dtype=dtype)
    k = torch.full((1, 2, 4, 16), 300.0, dtype=dtype)
    flat = torch.zeros(4, 5)
    with torch.autocast("cpu", dtype=dtype):
        _, per_head = logit_stats(flat, torch.log_softmax(flat, -1), torch.zeros(4, dtype=torch.long), [(q, k)])
    assert per_head.dtype == torch.float32
    torch.testing.assert_close(per_head, torch.full((1, 2), 300.0 * 300.0 * 16 / 4))
