"""The reference backend: torch foreach ops, bit-identical to ``torch.nn.utils.clip_grad_norm_``
for finite norms (same ops in the same order), on any device torch supports."""

from __future__ import annotations

import torch

from pytest_spikecheck.clipping import CLIP_EPS


def _foreach_ok(grads: list[torch.Tensor]) -> bool:
    return all(g.device.type in ("cpu", "cuda") and g.layout == torch.strided for g in grads)


class TorchClipBackend:
    name = "torch"

    @staticmethod
    def unavailable_reason() -> str | None:
        return None

    @staticmethod
    def total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
        device = grads[0].device
        norms: list[torch.Tensor] = []
        # torch groups by (device, dtype) because foreach kernels need one of each per call.
        groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for g in grads:
            groups.setdefault((g.device, g.dtype), []).append(g)
        for group in groups.values():
            if _foreach_ok(group):
                norms.extend(torch._foreach_norm(group, 2.0))
            else:
                norms.extend(torch.linalg.vector_norm(g, 2.0) for g in group)
        return torch.linalg.vector_norm(torch.stack([n.to(device) for n in norms]), 2.0)

    def clip_(self, grads: list[torch.Tensor], max_norm: float) -> tuple[torch.Tensor, torch.Tensor]:
        total = self.total_norm(grads)
        coef = torch.clamp(max_norm / (total + CLIP_EPS), max=1.0)
        # A NaN/inf norm would turn every gradient into NaN (torch's behaviour); keep them.
        scale = torch.where(torch.isfinite(total), coef, torch.ones_like(coef))
        if max_norm != float("inf"):
            groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
            for g in grads:
                groups.setdefault((g.device, g.dtype), []).append(g)
            for (device, _), group in groups.items():
                if _foreach_ok(group):
                    torch._foreach_mul_(group, scale.to(device))
                else:
                    for g in group:
                        g.mul_(scale.to(device))
        return total, scale


BACKEND = TorchClipBackend()
