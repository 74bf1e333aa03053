"""Learning-rate sweeps, judged: Wortsman et al. (2023)'s LR sensitivity and the assertions on a
sweep (the assertions on a run's logits and QK-Clip are in :mod:`.qk_clip`). numpy only; :func:`pytest_spikecheck.sweep.lr_sweep`
trains the sweep.

LR sensitivity (Wortsman et al. 2023, section 3.1): over the learning rates of a sweep, the
mean of min(final loss, initial loss) minus the best final loss. A run that diverges or ends
above where it started counts as the initial loss, so one dead run cannot dominate the mean;
0 means every learning rate of the sweep ends as well as the best one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from pytest_spikecheck.errors import ConfigError, SpikeCheckError
from pytest_spikecheck.records import as_record
from pytest_spikecheck.judge.text import fmt, table
from pytest_spikecheck.judge.verdict import Verdict, emit

__all__ = ["LRSweep", "assert_lr_sensitivity", "assert_stable_up_to", "final_loss", "initial_loss", "lr_sensitivity"]


def final_loss(run: Any) -> float:
    """The last evaluated loss (``eval_loss``, else the train ``loss``) of a run; inf when the run
    stopped on a non-finite value or its last value is not finite (it diverged)."""
    rec = as_record(run)
    m = rec.metrics
    if rec.run is not None and rec.run.stopped_early and rec.run.meta.get("stop_reason"):
        return math.inf
    for name in ("eval_loss", "loss"):
        if name in m:
            values = np.asarray(m[name], dtype=np.float64)
            missing = rec.missing.get(name, np.zeros(values.shape, dtype=bool))
            present = values[~missing & ~np.isnan(values)] if name == "eval_loss" else values
            if present.size:
                last = float(present[-1])
                return last if math.isfinite(last) else math.inf
    raise ConfigError(f"{rec.source} has no loss or eval_loss column to take a final loss from")


def initial_loss(run: Any) -> float:
    """The train loss of the first step (the forward before any update: the loss at initialisation)."""
    rec = as_record(run)
    if "loss" not in rec.metrics or not len(rec.metrics["loss"]):
        raise ConfigError(f"{rec.source} has no loss column to take the initial loss from")
    return float(rec.metrics["loss"][0])


@dataclass
class LRSweep:
    """One recipe trained at several peak learning rates (same seed and steps).

    Build it with :func:`pytest_spikecheck.sweep.lr_sweep`, or from runs you trained
    (``LRSweep.from_runs(name, lrs, runs)``), or from numbers (``final_losses``, ``initial``).
    """

    name: str
    lrs: tuple[float, ...]
    final_losses: tuple[float, ...]  # inf where the run diverged
    initial: float  # the loss at initialisation (the first step's train loss)
    runs: list[Any] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if not self.lrs or len(self.lrs) != len(self.final_losses):
            raise ConfigError(
                f"an LR sweep needs one final loss per learning rate, had {len(self.lrs)} learning "
                f"rates and {len(self.final_losses)} losses"
            )
        if any(not (lr > 0) for lr in self.lrs):
            raise ConfigError(f"learning rates must be > 0, were {list(self.lrs)}")

    @classmethod
    def from_runs(cls, name: str, lrs: Sequence[float], runs: Sequence[Any]) -> LRSweep:
        if len(lrs) != len(runs):
            raise ConfigError(f"an LR sweep needs one run per learning rate, had {len(lrs)} and {len(runs)}")
        initials = [initial_loss(r) for r in runs]
        return cls(
            name=name,
            lrs=tuple(float(lr) for lr in lrs),
            final_losses=tuple(final_loss(r) for r in runs),
            initial=float(np.median(initials)),
            runs=list(runs),
        )

    @property
    def best(self) -> float:
        return float(np.min(self.final_losses))

    @property
    def sensitivity(self) -> float:
        return lr_sensitivity(self)

    def table(self) -> str:
        rows = [[f"{lr:g}", fmt(loss, ".3f")] for lr, loss in zip(self.lrs, self.final_losses)]
        return table(["lr", "final loss"], rows)


def lr_sensitivity(sweep: LRSweep) -> float:
    """Wortsman's LR sensitivity: mean over the sweep of min(final, initial) − the best final loss."""
    finals = np.asarray(sweep.final_losses, dtype=np.float64)
    capped = np.minimum(np.where(np.isnan(finals), np.inf, finals), sweep.initial)
    return float(capped.mean() - min(float(np.min(capped)), sweep.initial))


def assert_lr_sensitivity(sweep: LRSweep, max: float) -> float:  # noqa: A002 - the issue's spelling
    """Assert the sweep's LR sensitivity is at most ``max`` nats; returns it."""
    __tracebackhide__ = True
    value = lr_sensitivity(sweep)
    if not value <= max:
        reason = (
            f"{sweep.name}: LR sensitivity {value:.3f} nats exceeds {max:g} (initial loss {sweep.initial:.3f}, "
            f"best final {sweep.best:.3f})"
        )
        verdict = emit(Verdict("assert_lr_sensitivity", False, reason, metric="lr_sensitivity", measured=value, limit=max))
        raise SpikeCheckError(f"{reason}\n\n{sweep.table()}", verdict=verdict)
    emit(
        Verdict(
            "assert_lr_sensitivity",
            True,
            f"{sweep.name}: LR sensitivity {value:.3f} nats ≤ {max:g}",
            metric="lr_sensitivity",
            measured=value,
            limit=max,
        )
    )
    return value


def assert_stable_up_to(sweep: LRSweep, lr: float, within: float = 0.25) -> None:
    """Assert every learning rate of the sweep up to ``lr`` ends finite and within ``within``
    nats of the sweep's best final loss."""
    __tracebackhide__ = True
    checked = [(x, loss) for x, loss in zip(sweep.lrs, sweep.final_losses) if x <= lr * (1 + 1e-9)]
    if not checked:
        raise ConfigError(f"{sweep.name}: no learning rate of the sweep ({list(sweep.lrs)}) is <= {lr:g}")
    bad = [(x, loss) for x, loss in checked if not loss <= sweep.best + within]
    if bad:
        x, loss = bad[0]
        reason = (
            f"{sweep.name}: lr {x:g} ends at {fmt(loss, '.3f')} nats, more than {within:g} above the sweep's best "
            f"{sweep.best:.3f}: not stable up to lr {lr:g}"
        )
        verdict = emit(
            Verdict("assert_stable_up_to", False, reason, metric="final_loss", measured=float(loss), limit=sweep.best + within)
        )
        raise SpikeCheckError(f"{reason}\n\n{sweep.table()}", verdict=verdict)
    emit(
        Verdict(
            "assert_stable_up_to",
            True,
            f"{sweep.name}: every lr up to {lr:g} ends within {within:g} nats of the best {sweep.best:.3f}",
            metric="final_loss",
            measured=max(loss for _, loss in checked),
            limit=sweep.best + within,
        )
    )
