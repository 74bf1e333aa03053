"""The pieces the built-in models share (models/gpt.py, models/llama.py): the causal attention
core, the per-head attention gate, the output head's loss and the spikecheck stats hook's
measurements, the initialisation. One copy of each, so both models measure the same things.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from pytest_spikecheck.models.config import HEAD_LOGITS_KEY, IGNORE_INDEX, GPTConfig

#: What a recording forward collects per layer: that layer's queries and keys, (B, nh, T, hs)
#: each (keys repeated per query head under grouped-query attention).
QueriesKeys = list[tuple[torch.Tensor, torch.Tensor]]


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
    """softmax(q·kᵀ/√d) v over the causal past, q/k/v (B, nh, T, hs) -> (B, nh, T, hs).

    With ``key_mask`` (B, T) only the keys it allows count. A query whose every allowed key is
    masked gets a softmax over all -inf: NaN. That is the "fully masked row" numeric break."""
    if key_mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.size(-2)
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    allowed = causal[None, None] & key_mask[:, None, None, :]  # (B, 1, T, T)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
    att = att.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
    return att @ v


class HeadGate(nn.Module):
    """Gated attention (Qiu et al. 2025, the head-wise variant): each head's output is multiplied
    by sigmoid(w_h · x), x the attention block's (normalised) input at that position. A head can
    then switch itself off where attending anywhere would only add noise, instead of parking its
    attention on one token (an attention sink) with ever larger logits."""

    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.proj = nn.Linear(n_embd, n_head, bias=False)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """x (B, T, C), y (B, nh, T, hs) -> y gated, (B, nh, T, hs)."""
        return y * torch.sigmoid(self.proj(x)).transpose(1, 2).unsqueeze(-1)


@torch.inference_mode()  # not just no_grad: no view or version tracking either (~20 % of this function's time)
def logit_stats(
    flat_logits: torch.Tensor, log_probs: torch.Tensor, targets: torch.Tensor, queries_keys: QueriesKeys
) -> tuple[torch.Tensor, torch.Tensor]:
    """([mean log Z, largest |log Z|, largest attention logit], per-head largest attention logit)
    of one training forward: the first as one tensor (one host sync for the three), the second a
    (layers, heads) tensor left on the device (read only where needed: QK-Clip, event records).

    log Z = logit - log p of any one class (class 0 here), over the targets the loss counts.
    The largest |q·k/sqrt(d)| is over every query-key pair of each sequence, every head and
    every layer, from the forward's own q and k (no second forward), all layers in one bmm: a
    small torch call costs ~5-15 us of dispatch here, so fewer calls is what makes this cheaper
    (measured in place on a Phase-19 step: +0.45 ms, against +0.75 ms with one 4-d q @ k.mT per
    layer; docs/benchmarks.md). Future keys are included:
    masking them costs as much again, and the largest pair bounds the causal ones. The attention
    entropy is not recorded: its softmax costs ~1.2 ms per layer on a ~20 ms step (measured).
    The largest over all heads is the largest of the per-head ones: max and a division by a
    positive constant commute exactly, so the per-step column is what it was before per-head."""
    log_z = flat_logits[:, 0] - log_probs[:, 0]
    counted = targets.reshape(-1) != IGNORE_INDEX
    if not counted.all():
        log_z = log_z[counted]
    L = len(queries_keys)
    B, nh, T, hs = queries_keys[0][0].shape
    # in float32 whatever the autocast: an fp16 product overflows at 65504 (a logit of 16k at head
    # size 16), and QK-Clip skips a head whose largest logit is not finite (a no-op in float32 runs)
    with torch.autocast(queries_keys[0][0].device.type, enabled=False):
        queries = torch.stack([q.float() for q, _ in queries_keys]).reshape(-1, T, hs)
        keys = torch.stack([k.float() for _, k in queries_keys]).reshape(-1, T, hs)
        per_head = torch.bmm(queries, keys.transpose(1, 2)).abs_().amax(dim=(1, 2)).view(L, B, nh).amax(dim=1)
    per_head = per_head / math.sqrt(hs)  # (L, nh)
    largest = per_head.amax()
    return torch.stack([log_z.mean(), log_z.abs().amax() if log_z.numel() else log_z.sum(), largest]), per_head


def output_loss_and_stats(
    config: GPTConfig, logits: torch.Tensor, targets: torch.Tensor | None, attention: QueriesKeys | None
) -> tuple[torch.Tensor, torch.Tensor | None, dict]:
    """The output head's tail, shared by the models: the soft-cap, the loss (mean cross-entropy
    over non-ignored targets, plus ``z_loss * mean(log(Z)^2)`` when the config sets it) and the
    stats hook's dict (:class:`pytest_spikecheck.models.gpt.GPT`'s docstring). Returns
    ``(logits, loss, stats)``; ``loss`` is None without targets."""
    if config.logit_softcap > 0:
        logits = config.logit_softcap * torch.tanh(logits / config.logit_softcap)
    if targets is None:
        return logits, None, {}
    flat = logits.view(-1, logits.size(-1))
    # cross_entropy is nll_loss(log_softmax) (bit-identical, as torch computes it); holding the
    # log-probabilities gives log Z = logit - log p of any one class, for free
    log_probs = F.log_softmax(flat, dim=-1)
    loss = F.nll_loss(log_probs, targets.reshape(-1), ignore_index=IGNORE_INDEX)
    stats: dict[str, torch.Tensor] = {}
    if config.z_loss > 0:
        log_z = (flat[:, 0] - log_probs[:, 0])[targets.reshape(-1) != IGNORE_INDEX]
        z_term = config.z_loss * log_z.square().mean()
        loss = loss + z_term
        stats["z_loss"] = z_term.detach()
    if attention is not None:
        scalars, per_head = logit_stats(flat, log_probs, targets, attention)
        stats["logz_mean, logz_absmax, attn_logit_max"] = scalars
        stats[HEAD_LOGITS_KEY] = per_head
    return logits, loss, stats


def checked_key_mask(config: GPTConfig, idx: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor | None:
    """The forward's input checks, shared by both models: a sequence longer than ``block_size``
    is one ValueError; the keys attention may use (B, T) are ``key_mask``, else (with
    ``mask_padding``) every key that is not the padding token, else all (None)."""
    T = idx.shape[1]
    if T > config.block_size:
        raise ValueError(f"sequence length {T} exceeds block_size {config.block_size}")
    if key_mask is None and config.mask_padding and config.pad_token_id >= 0:
        return idx != config.pad_token_id
    return key_mask


def init_weights(module: nn.Module, std: float) -> None:
    """GPT-2's initialisation, for ``model.apply``: normal(0, std) for every Linear and Embedding
    weight, zero biases, and a zero padding row where the embedding has one."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=std)
    if isinstance(module, nn.Embedding) and module.padding_idx is not None:
        with torch.no_grad():
            module.weight[module.padding_idx].zero_()
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def scale_residual_projections(model: nn.Module, names: tuple[str, ...], std: float, n_layer: int) -> None:
    """GPT-2: the projections that write into the residual stream start at std / sqrt(2 * n_layer),
    so the stream's variance does not grow with depth."""
    for name, p in model.named_parameters():
        if name.endswith(names):
            nn.init.normal_(p, mean=0.0, std=std / math.sqrt(2 * n_layer))


def token_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-token cross-entropy (B, T); ignored positions are 0."""
    return F.cross_entropy(
        logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="none"
    ).view(targets.shape)
