"""A nanoGPT-style pre-LN transformer LM, small enough to train in seconds on one CPU thread."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from pytest_spikecheck.models.config import IGNORE_INDEX, GPTConfig


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        head_size = config.n_embd // config.n_head
        # qk-layernorm: q and k normalised over each head's features (one gain shared by the
        # heads), so q·k/sqrt(d) stays bounded by the gains however large the weights grow.
        self.q_ln = nn.LayerNorm(head_size, eps=config.layernorm_eps, bias=config.bias) if config.qk_layernorm else None
        self.k_ln = nn.LayerNorm(head_size, eps=config.layernorm_eps, bias=config.bias) if config.qk_layernorm else None

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None,
                stats: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        if self.q_ln is not None:
            q, k = self.q_ln(q), self.k_ln(k)
        if stats is not None:  # read after the last layer (_logit_stats)
            stats.append((q, k))
        if key_mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            # Causal AND only keys the mask allows. A query whose every allowed key is masked
            # gets a softmax over all -inf: NaN. That is the "fully masked row" numeric break.
            causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            allowed = causal[None, None] & key_mask[:, None, None, :]  # (B, 1, T, T)
            att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
            att = att.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.c_proj(y)


@torch.inference_mode()  # not just no_grad: no view or version tracking either (~20 % of this function's time)
def _logit_stats(flat_logits: torch.Tensor, log_probs: torch.Tensor, targets: torch.Tensor,
                 queries_keys: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """[mean log Z, largest |log Z|, largest attention logit] of one training forward, as one
    tensor (one host sync for the three).

    log Z = logit - log p of any one class (class 0 here), over the targets the loss counts.
    The largest |q·k/sqrt(d)| is over every query-key pair of each sequence, every head and
    every layer, from the forward's own q and k (no second forward), all layers in one bmm: a
    small torch call costs ~5-15 us of dispatch here, so fewer calls is what makes this cheaper
    (measured in place on a Phase-19 step: +0.45 ms, against +0.75 ms with one 4-d q @ k.mT per
    layer; docs/benchmarks.md). Future keys are included:
    masking them costs as much again, and the largest pair bounds the causal ones. The attention
    entropy is not recorded: its softmax costs ~1.2 ms per layer on a ~20 ms step (measured)."""
    log_z = flat_logits[:, 0] - log_probs[:, 0]
    counted = targets.reshape(-1) != IGNORE_INDEX
    if not counted.all():
        log_z = log_z[counted]
    B, nh, T, hs = queries_keys[0][0].shape
    queries = torch.stack([q for q, _ in queries_keys]).reshape(-1, T, hs)
    keys = torch.stack([k for _, k in queries_keys]).reshape(-1, T, hs)
    largest = torch.bmm(queries, keys.transpose(1, 2)).abs_().amax() / math.sqrt(hs)
    return torch.stack([log_z.mean(), log_z.abs().amax() if log_z.numel() else log_z.sum(), largest])


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

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None,
                stats: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), key_mask, stats)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """``forward(idx, targets) -> (logits, loss)``; loss is the mean cross-entropy over
    non-ignored targets, plus ``z_loss * mean(log(Z)^2)`` when the config sets ``z_loss``.

    The spikecheck stats hook (any model may implement it): the engine sets ``record_stats``
    to True; a training forward (targets given, gradients enabled: not an evaluation under
    ``no_grad``) then leaves ``spikecheck_stats``, a dict of floats or
    0-d tensors the engine records per step (``attn_logit_max``, ``attn_entropy_min``,
    ``logz_mean``, ``logz_absmax``, and ``z_loss``: the auxiliary term inside ``loss``, which
    the engine subtracts so that the ``loss`` column stays the cross-entropy).
    """

    #: Measure the attention and output-logit statistics (set by the engine; off for bare use).
    record_stats: bool = False

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if config.vocab_size < 1:
            raise ValueError("GPTConfig.vocab_size must be set (the engine takes it from the tokenizer)")
        self.config = config
        padding_idx = config.pad_token_id if config.pad_embedding == "zero" and config.pad_token_id >= 0 else None
        self.wte = nn.Embedding(config.vocab_size, config.n_embd, padding_idx=padding_idx)
        self.wpe = nn.Embedding(config.block_size, config.n_embd) if config.pos_embedding == "learned" else None
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layernorm_eps, bias=config.bias)
        # Untied head (Seed A's model): the rare token's embedding row and its output row
        # are separate parameters, so the diagnosis can say which one carries the spike.
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # GPT-2: scale residual projections by depth
                nn.init.normal_(p, mean=0.0, std=config.init_std / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.init_std)
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        x = self.wte(idx)  # (B, T, C)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(T, device=idx.device))
        if key_mask is None and self.config.mask_padding and self.config.pad_token_id >= 0:
            key_mask = idx != self.config.pad_token_id  # (B, T): which keys attention may use
        # Stats of the training forward only: evaluation runs under no_grad and is not a step.
        record = self.record_stats and targets is not None and torch.is_grad_enabled()
        attention: list[tuple[torch.Tensor, torch.Tensor]] | None = [] if record else None
        for block in self.blocks:
            x = block(x, key_mask, attention)
        logits = self.lm_head(self.ln_f(x))  # (B, T, vocab)
        if self.config.logit_softcap > 0:
            logits = self.config.logit_softcap * torch.tanh(logits / self.config.logit_softcap)
        if targets is None:
            return logits, None
        flat = logits.view(-1, logits.size(-1))
        # cross_entropy is nll_loss(log_softmax) (bit-identical, as torch computes it); holding the
        # log-probabilities gives log Z = logit - log p of any one class, for free
        log_probs = F.log_softmax(flat, dim=-1)
        loss = F.nll_loss(log_probs, targets.reshape(-1), ignore_index=IGNORE_INDEX)
        stats: dict[str, torch.Tensor] = {}
        if self.config.z_loss > 0:
            log_z = (flat[:, 0] - log_probs[:, 0])[targets.reshape(-1) != IGNORE_INDEX]
            z_term = self.config.z_loss * log_z.square().mean()
            loss = loss + z_term
            stats["z_loss"] = z_term.detach()
        if attention is not None:
            stats["logz_mean, logz_absmax, attn_logit_max"] = _logit_stats(flat, log_probs, targets, attention)
        self.spikecheck_stats = stats
        return logits, loss

    @staticmethod
    def token_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Per-token cross-entropy (B, T); ignored positions are 0."""
        return F.cross_entropy(
            logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="none"
        ).view(targets.shape)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
