"""The reference backend: torch foreach ops, bit-identical to ``torch.nn.utils.clip_grad_norm_``
for finite norms (same ops in the same order), on any device torch supports."""

from __future__ import annotations

import torch

from pytest_spikecheck.clipping import CLIP_EPS


def _groups(grads: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Gradients grouped by (device, dtype), as foreach kernels need; one group in the common case."""
    first = grads[0]
    if all(g.device == first.device and g.dtype == first.dtype for g in grads):
        return [grads]
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for g in grads:
        groups.setdefault((g.device, g.dtype), []).append(g)
    return list(groups.values())


def _foreach_ok(group: list[torch.Tensor]) -> bool:
    return group[0].device.type in ("cpu", "cuda") and all(g.layout == torch.strided for g in group)


def clip_scale(total_norm: torch.Tensor, max_norm: float) -> torch.Tensor:
    """torch's clip coefficient ``min(1, max_norm / (norm + 1e-6))``, and 1 for a NaN/inf norm
    (torch would multiply every gradient by NaN; we keep them). The one definition on the host:
    the torch backend and the process-group clip of every backend use it; clip.cu's
    k_grad_norm_final computes the same float32 operations on the device."""
    coef = torch.clamp(max_norm / (total_norm + CLIP_EPS), max=1.0)
    return torch.where(total_norm.isfinite(), coef, 1.0)


class TorchClipBackend:
    name = "torch"

    @staticmethod
    def unavailable_reason() -> str | None:
        return None

    @staticmethod
    def total_norm(grads: list[torch.Tensor], groups: list[list[torch.Tensor]] | None = None) -> torch.Tensor:
        device = grads[0].device
        norms: list[torch.Tensor] = []
        for group in groups or _groups(grads):
            if _foreach_ok(group):
                norms.extend(torch._foreach_norm(group, 2.0))
            else:
                norms.extend(torch.linalg.vector_norm(g, 2.0) for g in group)
        return torch.linalg.vector_norm(torch.stack([n.to(device) for n in norms]), 2.0)

    def clip_(self, grads: list[torch.Tensor], max_norm: float) -> tuple[torch.Tensor, torch.Tensor]:
        groups = _groups(grads)
        total = self.total_norm(grads, groups)
        scale = clip_scale(total, max_norm)
        if max_norm != float("inf"):
            self.scale_(grads, scale, groups)
        return total, scale

    @staticmethod
    def scale_(grads: list[torch.Tensor], scale: torch.Tensor, groups: list[list[torch.Tensor]] | None = None) -> None:
        """Multiply every gradient in place by the 0-d tensor ``scale``."""
        for group in groups or _groups(grads):
            factor = scale if group[0].device == scale.device else scale.to(group[0].device)
            if _foreach_ok(group):
                torch._foreach_mul_(group, factor)
            else:
                for g in group:
                    g.mul_(factor)


BACKEND = TorchClipBackend()
