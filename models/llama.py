"""A Llama-style pre-norm transformer LM (``model.arch: llama``), as small as the GPT beside it.

What differs from models/gpt.py, each as Llama (Touvron et al. 2023) has it: RMSNorm instead of
LayerNorm, rotary position embeddings on q and k (RoPE) instead of learned absolute positions,
a SwiGLU MLP (hidden width ~8/3 of the residual stream), no biases anywhere, separate q, k, v
projections, and grouped-query attention (``n_kv_head`` key/value heads shared by the query
heads). The output head is untied, as in the GPT, so the two models' embedding and head rows
stay separate parameters. The attention core, the gate, the loss, the stats hook and the
initialisation are the GPT's (models/layers.py).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from pytest_spikecheck.models.config import GPTConfig
from pytest_spikecheck.models.layers import (
    HeadGate,
    QueriesKeys,
    causal_attention,
    checked_key_mask,
    init_weights,
    output_loss_and_stats,
    scale_residual_projections,
    token_losses,
)

#: RoPE's base wavelength (Llama's).
ROPE_BASE = 10_000.0


def swiglu_hidden(n_embd: int, multiple_of: int = 8) -> int:
    """The SwiGLU MLP's hidden width: 8/3 of the residual stream (the three matrices then cost
    what the GPT's two of width 4x do), rounded up to a multiple of ``multiple_of`` (64 -> 176)."""
    hidden = int(8 * n_embd / 3)
    return multiple_of * -(-hidden // multiple_of)


def rope_tables(head_size: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position t times frequency i (ROPE_BASE^(-2i/hs)), (block_size, hs/2) each."""
    freqs = ROPE_BASE ** -(torch.arange(0, head_size, 2, dtype=torch.float32) / head_size)
    angles = torch.outer(torch.arange(block_size, dtype=torch.float32), freqs)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each (first-half, second-half) feature pair of x (B, nh, T, hs) by its position's
    angle: q·k then depends on the two positions only through their difference."""
    T = x.size(-2)
    cos, sin = cos[:T].to(x.dtype), sin[:T].to(x.dtype)  # (T, hs/2)
    first, second = x.chunk(2, dim=-1)
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


class LlamaAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head, self.n_kv_head = config.n_head, config.kv_heads
        self.head_size = config.n_embd // config.n_head
        self.q_proj = nn.Linear(config.n_embd, self.n_head * self.head_size, bias=False)
        self.k_proj = nn.Linear(config.n_embd, self.n_kv_head * self.head_size, bias=False)
        self.v_proj = nn.Linear(config.n_embd, self.n_kv_head * self.head_size, bias=False)
        self.o_proj = nn.Linear(self.n_head * self.head_size, config.n_embd, bias=False)
        # qk-norm as OLMo 2 and Marin have it: RMSNorm on each head's q and k, before the rotation.
        eps = config.layernorm_eps
        self.q_norm = nn.RMSNorm(self.head_size, eps=eps) if config.qk_layernorm else None
        self.k_norm = nn.RMSNorm(self.head_size, eps=eps) if config.qk_layernorm else None
        self.gate = HeadGate(config.n_embd, config.n_head) if config.attn_gate else None
        self.rotary = config.positions == "rope"

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        key_mask: torch.Tensor | None = None,
        stats: QueriesKeys | None = None,
    ) -> torch.Tensor:
        B, T, C = x.shape
        hs = self.head_size
        q = self.q_proj(x).view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = self.k_proj(x).view(B, T, self.n_kv_head, hs).transpose(1, 2)  # (B, n_kv, T, hs)
        v = self.v_proj(x).view(B, T, self.n_kv_head, hs).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if self.n_kv_head != self.n_head:  # each key/value head serves n_head / n_kv_head query heads
            k = k.repeat_interleave(self.n_head // self.n_kv_head, dim=1)  # (B, nh, T, hs)
            v = v.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
        if stats is not None:  # read after the last layer (layers.logit_stats)
            stats.append((q, k))
        y = causal_attention(q, k, v, key_mask)  # (B, nh, T, hs)
        if self.gate is not None:
            y = self.gate(x, y)
        return self.o_proj(y.transpose(1, 2).contiguous().view(B, T, self.n_head * hs))


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)) (Shazeer 2020, as Llama)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        hidden = swiglu_hidden(config.n_embd)
        self.gate_proj = nn.Linear(config.n_embd, hidden, bias=False)
        self.up_proj = nn.Linear(config.n_embd, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(config.n_embd, eps=config.layernorm_eps)
        self.attn = LlamaAttention(config)
        self.mlp_norm = nn.RMSNorm(config.n_embd, eps=config.layernorm_eps)
        self.mlp = SwiGLU(config)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        key_mask: torch.Tensor | None = None,
        stats: QueriesKeys | None = None,
    ) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rope, key_mask, stats)
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    """``forward(idx, targets) -> (logits, loss)``, the same contract and the same spikecheck stats
    hook as :class:`pytest_spikecheck.models.gpt.GPT` (its docstring), and QK-Clip's hook
    :meth:`spikecheck_qk_projections`. The model-level breaks mean here what they mean there:
    ``qk_layernorm`` is qk-RMSNorm, ``layernorm_eps`` the RMSNorms' eps (0 meets the zero padding
    row as 0/0), ``pos_embedding: none`` drops RoPE (NoPE)."""

    #: Measure the attention and output-logit statistics (set by the engine; off for bare use).
    record_stats: bool = False

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if config.vocab_size < 1:
            raise ValueError("GPTConfig.vocab_size must be set (the engine takes it from the tokenizer)")
        if config.arch != "llama":
            raise ValueError(f"Llama needs model.arch llama, was {config.arch!r}")
        self.config = config
        padding_idx = config.pad_token_id if config.pad_embedding == "zero" and config.pad_token_id >= 0 else None
        self.wte = nn.Embedding(config.vocab_size, config.n_embd, padding_idx=padding_idx)
        self.blocks = nn.ModuleList(LlamaBlock(config) for _ in range(config.n_layer))
        self.norm_f = nn.RMSNorm(config.n_embd, eps=config.layernorm_eps)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        cos, sin = rope_tables(config.n_embd // config.n_head, config.block_size)
        self.register_buffer("rope_cos", cos, persistent=False)  # (block_size, hs/2)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(lambda module: init_weights(module, config.init_std))
        scale_residual_projections(self, ("o_proj.weight", "down_proj.weight"), config.init_std, config.n_layer)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None, key_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        key_mask = checked_key_mask(self.config, idx, key_mask)
        x = self.wte(idx)  # (B, T, C)
        record = self.record_stats and targets is not None and torch.is_grad_enabled()
        attention: QueriesKeys | None = [] if record else None
        rope = (self.rope_cos, self.rope_sin)
        for block in self.blocks:
            x = block(x, rope, key_mask, attention)
        logits = self.lm_head(self.norm_f(x))  # (B, T, vocab)
        logits, loss, stats = output_loss_and_stats(self.config, logits, targets, attention)
        if loss is None:
            return logits, None
        self.spikecheck_stats = stats
        return logits, loss

    def spikecheck_qk_projections(self) -> list[tuple]:
        """QK-Clip's hook: per layer, (W_q, W_k, n_heads); W_k has n_kv_head heads' rows."""
        return [(block.attn.q_proj.weight, block.attn.k_proj.weight, block.attn.n_head) for block in self.blocks]

    token_losses = staticmethod(token_losses)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
