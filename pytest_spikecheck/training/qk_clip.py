"""QK-Clip (Kimi K2, 2025): after each optimizer update, scale back the query and key weights of
every attention head whose largest logit in that step's forward exceeded tau.

For a head with largest logit S > tau, gamma = tau / S; its query rows are multiplied by
gamma^alpha and its key rows by gamma^(1 - alpha) (biases likewise), so the head's logits on
the same input become exactly gamma times what they were: tau at the largest. Other heads are
left alone: that is what per head means (Kimi K2 clips per head; ``per_head=False`` scales a
whole layer by its largest head's gamma instead). Under grouped-query attention one key head
serves several query heads: it takes the smallest gamma of its group to the power 1 - alpha, and
each query head the rest of its own gamma, so each head's logits still scale by its own gamma.

The logits are the forward's own (the model's stats hook: the largest |q·k|/sqrt(d) over every
query-key pair of the step's batch, per layer and head), never a second forward. They are an
absolute value, so they bound Kimi's signed S_max from above, and clipping them bounds the
recorded ``attn_logit_max`` column itself. A head whose largest logit is <= 0 or not finite is
skipped: Megatron-LM's QK-Clip computed gamma = tau / S there and produced NaN (their PR 7382).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.models.config import HEAD_LOGITS_KEY

#: The method a model implements to take QK-Clip (the built-in GPT and Llama do).
QK_HOOK = "spikecheck_qk_projections"


@dataclass(frozen=True)
class QKProjection:
    """One attention layer's query and key weights as QK-Clip scales them: ``q`` (n_heads * hs, C)
    and ``k`` (n_kv_heads * hs, C), rows grouped by head, and their biases (or None)."""

    q: torch.Tensor
    k: torch.Tensor
    n_heads: int
    q_bias: torch.Tensor | None = None
    k_bias: torch.Tensor | None = None

    @property
    def n_kv_heads(self) -> int:
        return self.k.shape[0] // (self.q.shape[0] // self.n_heads)


def qk_projections(model: torch.nn.Module) -> list[QKProjection]:
    """The model's layers as QK-Clip sees them, from its ``spikecheck_qk_projections()`` hook:
    per layer ``(W_q, W_k, n_heads)`` or ``(W_q, W_k, n_heads, b_q, b_k)``. One line if the model
    has no such hook or the shapes do not fit."""
    hook = getattr(model, QK_HOOK, None)
    if not callable(hook):
        raise ConfigError(
            f"QKClip needs the model's per-layer query and key weights, and "
            f"{type(getattr(model, 'inner', model)).__name__} has no {QK_HOOK}() method: implement it "
            f"(README, 'Your own model') or drop the QKClip break"
        )
    layers = []
    for i, entry in enumerate(hook()):
        if not isinstance(entry, (tuple, list)) or len(entry) not in (3, 5):
            raise ConfigError(
                f"{QK_HOOK}() layer {i}: expected (W_q, W_k, n_heads) or (W_q, W_k, n_heads, b_q, b_k), "
                f"got {type(entry).__name__}" + (f" of length {len(entry)}" if isinstance(entry, (tuple, list)) else "")
            )
        q, k, n_heads, *biases = entry
        layer = QKProjection(q, k, int(n_heads), *biases)
        rows_q, rows_k = q.shape[0], k.shape[0]
        if (
            q.dim() != 2
            or k.dim() != 2
            or n_heads < 1
            or rows_q % n_heads
            or rows_k % (rows_q // n_heads)
            or n_heads % layer.n_kv_heads
        ):
            raise ConfigError(
                f"{QK_HOOK}() layer {i}: W_q {tuple(q.shape)} and W_k {tuple(k.shape)} do not split into "
                f"{n_heads} query heads and a divisor of that many key heads"
            )
        layers.append(layer)
    if not layers:
        raise ConfigError(f"{QK_HOOK}() returned no layer: QKClip has nothing to clip")
    return layers


def qk_weight_norm(model: torch.nn.Module) -> float | None:
    """The mean over layers of ||W_q|| * ||W_k|| (Frobenius), the growth weight decay is said to
    keep in check under Muon (Moonlight 2025): recorded at the end of a run, None for a model
    without the ``spikecheck_qk_projections()`` hook."""
    if not callable(getattr(model, QK_HOOK, None)):
        return None
    try:
        layers = qk_projections(model)
    except ConfigError:  # a hook that does not fit is QKClip's error to raise (at the start), not the record's
        return None
    with torch.no_grad():
        return sum(float(layer.q.norm() * layer.k.norm()) for layer in layers) / len(layers)


def head_gammas(head_max: torch.Tensor, tau: float, per_head: bool) -> torch.Tensor:
    """gamma per (layer, head): tau / S where S > tau, else 1 (S <= 0, NaN and inf included:
    such a head is skipped, not divided by). ``per_head=False``: each layer's smallest gamma
    for all its heads."""
    clip = torch.isfinite(head_max) & (head_max > tau)
    gamma = torch.where(clip, tau / torch.where(clip, head_max, 1.0), 1.0)
    if not per_head:
        gamma = gamma.amin(dim=1, keepdim=True).expand_as(gamma)
    return gamma


@torch.no_grad()
def scale_heads_(layers: Sequence[QKProjection], gamma: torch.Tensor, alpha: float) -> None:
    """Scale each head's query rows and key rows in place so that its logits scale by ``gamma``
    (layers x heads): W_k of a key head by (smallest gamma of its query heads)^(1 - alpha), W_q of
    each query head by its gamma over that."""
    for layer, g in zip(layers, gamma):
        hs = layer.q.shape[0] // layer.n_heads
        group = layer.n_heads // layer.n_kv_heads
        k_gamma = g.view(layer.n_kv_heads, group).amin(dim=1) ** (1 - alpha)  # (n_kv,)
        q_gamma = g / k_gamma.repeat_interleave(group)  # (nh,): q_gamma * k_gamma = gamma, per head
        for weight, bias, factor in ((layer.q, layer.q_bias, q_gamma), (layer.k, layer.k_bias, k_gamma)):
            rows = factor.to(weight.dtype).repeat_interleave(hs)
            weight.mul_(rows[:, None])
            if bias is not None:
                bias.mul_(rows)


class QKClipHook:
    """QK-Clip as the optimizer's after-step hook: reads the per-head largest logits the model
    recorded on the step's forward (its stats hook, ``HEAD_LOGITS_KEY``) and scales the heads
    above ``tau``. Returns the step's report, ``{"qk_clipped_heads": n}``."""

    def __init__(self, model: torch.nn.Module, tau: float, alpha: float = 0.5, per_head: bool = True) -> None:
        self.model, self.tau, self.alpha, self.per_head = model, float(tau), float(alpha), per_head
        self._observed: torch.Tensor | None = None
        self.layers = qk_projections(model)
        heads = [layer.n_heads for layer in self.layers]
        if len(set(heads)) != 1:
            raise ConfigError(f"QKClip needs the same number of heads in every layer, the model has {heads}")
        if not hasattr(model, "record_stats"):
            raise ConfigError(
                f"QKClip needs the model's attention logits of each step, and "
                f"{type(getattr(model, 'inner', model)).__name__} has no stats hook (record_stats, "
                f"spikecheck_stats with {HEAD_LOGITS_KEY!r}): implement it (README, 'Your own model')"
            )

    def observe(self, head_logits: torch.Tensor | None) -> None:
        """The step's per-head logits (over all its micro-batches), handed over by the training step."""
        self._observed = head_logits

    def head_max(self) -> torch.Tensor:
        head_max, self._observed = self._observed, None
        if head_max is None:  # a loop that steps the optimizer itself: the model's last training forward
            head_max = (getattr(self.model, "spikecheck_stats", None) or {}).get(HEAD_LOGITS_KEY)
        expected = (len(self.layers), self.layers[0].n_heads)
        if head_max is None or tuple(head_max.shape) != expected:
            raise ConfigError(
                f"QKClip needs the per-head largest attention logits of the step's forward, a "
                f"{expected} tensor under {HEAD_LOGITS_KEY!r} in the model's spikecheck_stats; "
                f"found {None if head_max is None else tuple(head_max.shape)}"
            )
        return head_max.detach().float()

    def __call__(self) -> dict[str, float]:
        gamma = head_gammas(self.head_max(), self.tau, self.per_head)
        clipped = int((gamma < 1).sum())  # the one host sync; a step that clips nothing touches no weight
        if clipped:
            scale_heads_(self.layers, gamma, self.alpha)
        return {"qk_clipped_heads": float(clipped)}
