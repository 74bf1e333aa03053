"""A nanoGPT-style pre-LN transformer LM, small enough to train in seconds on one CPU thread."""

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


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v fused (GPT-2)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        head_size = config.n_embd // config.n_head
        # qk-layernorm: q and k normalised over each head's features (one gain shared by the
        # heads), so q·k/sqrt(d) stays bounded by the gains however large the weights grow.
        self.q_ln = nn.LayerNorm(head_size, eps=config.layernorm_eps, bias=config.bias) if config.qk_layernorm else None
        self.k_ln = nn.LayerNorm(head_size, eps=config.layernorm_eps, bias=config.bias) if config.qk_layernorm else None
        self.gate = HeadGate(config.n_embd, config.n_head) if config.attn_gate else None

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None, stats: QueriesKeys | None = None) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        if self.q_ln is not None:
            q, k = self.q_ln(q), self.k_ln(k)
        if stats is not None:  # read after the last layer (layers.logit_stats)
            stats.append((q, k))
        y = causal_attention(q, k, v, key_mask)  # (B, nh, T, hs)
        if self.gate is not None:
            y = self.gate(x, y)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.c_proj(y)

    def qk_projection(self) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor | None, torch.Tensor | None]:
        """(W_q, W_k, n_heads, b_q, b_k) as views of the fused c_attn: what QK-Clip scales."""
        C = self.c_proj.weight.shape[0]
        w, b = self.c_attn.weight, self.c_attn.bias
        return (w[:C], w[C : 2 * C], self.n_head, None if b is None else b[:C], None if b is None else b[C : 2 * C])


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layernorm_eps, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layernorm_eps, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None, stats: QueriesKeys | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), key_mask, stats)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """``forward(idx, targets) -> (logits, loss)``; loss is the mean cross-entropy over
    non-ignored targets, plus ``z_loss * mean(log(Z)^2)`` when the config sets ``z_loss``.

    The spikecheck stats hook (any model may implement it): the engine sets ``record_stats``
    to True; a training forward (targets given, gradients enabled: not an evaluation under
    ``no_grad``) then leaves ``spikecheck_stats``, a dict of floats or
    0-d tensors the engine records per step (``attn_logit_max``, ``logz_mean``, ``logz_absmax``,
    and ``z_loss``: the auxiliary term inside ``loss``, which the engine subtracts so that the
    ``loss`` column stays the cross-entropy), and ``attn_logit_max_per_head``
    (:data:`~pytest_spikecheck.models.config.HEAD_LOGITS_KEY`), a (layers, heads) tensor the
    engine reads at event steps and QK-Clip after every update. The Llama model
    (:mod:`pytest_spikecheck.models.llama`) implements the same hook.

    QK-Clip's hook: :meth:`spikecheck_qk_projections`. Muon's role rule splits ``c_attn`` into
    its q, k and v blocks (:attr:`spikecheck_fused_projections`), so each is orthogonalised alone.
    """

    #: Parameters that hold several matrices stacked by rows, and how many (Muon orthogonalises each alone).
    spikecheck_fused_projections = {"attn.c_attn.weight": 3}

    #: Measure the attention and output-logit statistics (set by the engine; off for bare use).
    record_stats: bool = False

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if config.vocab_size < 1:
            raise ValueError("GPTConfig.vocab_size must be set (the engine takes it from the tokenizer)")
        self.config = config
        padding_idx = config.pad_token_id if config.pad_embedding == "zero" and config.pad_token_id >= 0 else None
        self.wte = nn.Embedding(config.vocab_size, config.n_embd, padding_idx=padding_idx)
        self.wpe = nn.Embedding(config.block_size, config.n_embd) if config.positions == "learned" else None
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layernorm_eps, bias=config.bias)
        # Untied head (Seed A's model): the rare token's embedding row and its output row
        # are separate parameters, so the diagnosis can say which one carries the spike.
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.apply(lambda module: init_weights(module, config.init_std))
        scale_residual_projections(self, ("c_proj.weight",), config.init_std, config.n_layer)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None, key_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        key_mask = checked_key_mask(self.config, idx, key_mask)
        x = self.wte(idx)  # (B, T, C)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        # Stats of the training forward only: evaluation runs under no_grad and is not a step.
        record = self.record_stats and targets is not None and torch.is_grad_enabled()
        attention: QueriesKeys | None = [] if record else None
        for block in self.blocks:
            x = block(x, key_mask, attention)
        logits = self.lm_head(self.ln_f(x))  # (B, T, vocab)
        logits, loss, stats = output_loss_and_stats(self.config, logits, targets, attention)
        if loss is None:
            return logits, None
        self.spikecheck_stats = stats
        return logits, loss

    def spikecheck_qk_projections(self) -> list[tuple]:
        """QK-Clip's hook: per layer, (W_q, W_k, n_heads, b_q, b_k), views QK-Clip scales in place."""
        return [block.attn.qk_projection() for block in self.blocks]

    token_losses = staticmethod(token_losses)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
