"""Learning-rate schedules (pure Python, so tests and reports can evaluate them without torch)."""

from __future__ import annotations

import math

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.scenario import ScheduleSpec
from pytest_spikecheck.scenario.sections import SCHEDULES


def lr_at(step: int, *, base_lr: float, total_steps: int, spec: ScheduleSpec) -> float:
    """LR for optimizer step ``step`` (1-based): linear warmup to ``base_lr`` over
    ``warmup_steps``, then constant or cosine decay to ``base_lr * min_lr_ratio`` at ``total_steps``."""
    if step < 1:
        raise ValueError(f"steps are 1-based, was {step}")
    if spec.name not in SCHEDULES:  # never cosine by default
        raise ConfigError(f"schedule.name must be one of {', '.join(SCHEDULES)}, was {spec.name!r}")
    if spec.warmup_steps and step <= spec.warmup_steps:
        return base_lr * step / spec.warmup_steps
    if spec.name == "constant":
        return base_lr
    min_lr = base_lr * spec.min_lr_ratio
    span = max(1, total_steps - spec.warmup_steps)
    progress = min(1.0, (step - spec.warmup_steps) / span)
    return min_lr + 0.5 * (base_lr - min_lr) * (1.0 + math.cos(math.pi * progress))
