"""How large a gradient may be at each step: a fixed max_norm, or an adaptive one (ZClip).

The engine asks the policy for the step's limit before clipping and tells it the norm
afterwards; the clip itself always goes through :mod:`pytest_spikecheck.clipping`. Plain
Python (no torch).
"""

from __future__ import annotations

import math

from pytest_spikecheck.judge.detectors import EmaMoments
from pytest_spikecheck.scenario import ClipSpec


class FixedLimit:
    """``grad_clip`` (inf = no clipping) at every step."""

    def __init__(self, max_norm: float) -> None:
        self.max_norm = max_norm

    def limit(self) -> float:
        return self.max_norm

    def observe(self, norm: float) -> None:
        pass


class AdaptiveLimit:
    """ZClip-style adaptive clipping: the limit is EMA mean + z * EMA std of past pre-clip
    norms (decay ``alpha``; :class:`~pytest_spikecheck.judge.detectors.EmaMoments`). Until
    ``warmup`` finite norms are seen, the fixed ``grad_clip`` applies. As in ZClip, a clipped
    norm enters the EMA at its clipped value, so one spike cannot raise the next limit."""

    def __init__(self, z: float, alpha: float, fallback: float, warmup: int = 25) -> None:
        self.z, self.fallback = z, fallback
        self.ema = EmaMoments(alpha, warmup)

    def limit(self) -> float:
        return self.ema.mean + self.z * self.ema.std if self.ema.ready else self.fallback

    def observe(self, norm: float) -> None:
        if math.isfinite(norm):
            self.ema.update(min(norm, self.limit()))


def clip_policy(clip: ClipSpec) -> FixedLimit | AdaptiveLimit:
    if clip.kind == "adaptive":
        return AdaptiveLimit(clip.z, clip.alpha, fallback=clip.limit)
    return FixedLimit(clip.limit)
