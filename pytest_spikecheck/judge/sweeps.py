"""Learning-rate sweeps, judged: Wortsman et al. (2023)'s LR sensitivity and the assertions on a
sweep and on a run's logits. numpy only; :func:`pytest_spikecheck.sweep.lr_sweep`
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

__all__ = ["LRSweep", "assert_logits_bounded", "assert_lr_sensitivity", "assert_qk_clip_contains", "assert_stable_up_to",
           "final_loss", "initial_loss", "lr_sensitivity"]


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
            raise ConfigError(f"an LR sweep needs one final loss per learning rate, had {len(self.lrs)} learning "
                              f"rates and {len(self.final_losses)} losses")
        if any(not (lr > 0) for lr in self.lrs):
            raise ConfigError(f"learning rates must be > 0, were {list(self.lrs)}")

    @classmethod
    def from_runs(cls, name: str, lrs: Sequence[float], runs: Sequence[Any]) -> "LRSweep":
        if len(lrs) != len(runs):
            raise ConfigError(f"an LR sweep needs one run per learning rate, had {len(lrs)} and {len(runs)}")
        initials = [initial_loss(r) for r in runs]
        return cls(name=name, lrs=tuple(float(lr) for lr in lrs), final_losses=tuple(final_loss(r) for r in runs),
                   initial=float(np.median(initials)), runs=list(runs))

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
        raise SpikeCheckError(f"{sweep.name}: LR sensitivity {value:.3f} nats exceeds {max:g} (initial loss "
                              f"{sweep.initial:.3f}, best final {sweep.best:.3f})\n\n{sweep.table()}")
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
        raise SpikeCheckError(f"{sweep.name}: lr {x:g} ends at {fmt(loss, '.3f')} nats, more than {within:g} above "
                              f"the sweep's best {sweep.best:.3f}: not stable up to lr {lr:g}\n\n{sweep.table()}")


def assert_logits_bounded(run: Any, attention: float | None = None, z: float | None = None) -> None:
    """Assert the largest |attention logit| (``attn_logit_max``) stays <= ``attention`` and the
    largest |log Z| of the output logits (``logz_absmax``) stays <= ``z`` at every step."""
    __tracebackhide__ = True
    rec = as_record(run)
    if attention is None and z is None:
        raise ConfigError("assert_logits_bounded needs a bound: attention=..., z=... or both")
    for column, bound, what in (("attn_logit_max", attention, "attention logit"), ("logz_absmax", z, "|log Z|")):
        if bound is None:
            continue
        if column not in rec.metrics:
            raise ConfigError(f"{rec.source} has no {column} column (the model reports it through the spikecheck "
                              f"stats hook: README, 'Attention and output logits')")
        steps, values = np.asarray(rec.metrics["step"]), np.asarray(rec.metrics[column], dtype=np.float64)
        over = np.flatnonzero(~(values <= bound))
        if over.size:
            first, worst = int(over[0]), int(np.nanargmax(np.where(np.isnan(values), np.inf, values)))
            raise SpikeCheckError(f"{what} {values[first]:,.4g} exceeds {bound:g} at step {int(steps[first])} "
                                  f"(largest {fmt(values[worst], '.4g')} at step {int(steps[worst])})\n\n"
                                  f"record: {rec.source}")


#: QK-Clip bounds the largest attention logit to this many times its tau from its first clip on
#: (a clip acts after its step's update; the next update moves the weights again).
QK_CLIP_FACTOR = 2.0


def assert_qk_clip_contains(run: Any, tau: float | None = None, factor: float = QK_CLIP_FACTOR) -> int | None:
    """Assert QK-Clip held the attention logits: from the first step at which it had to act (its
    ``qk_clipped_heads`` column is > 0 there, or the largest attention logit exceeded ``tau``),
    the largest attention logit of every later step is at most ``factor * tau``. ``tau`` defaults
    to the run's own (``optimizer.qk_clip``). Returns that first step (None if it never had to act).

    A clip acts after its step's update, on that step's logits, so the next forward is the first
    it bounds; the weights move again in the next update, hence the ``factor`` (2 by default)."""
    __tracebackhide__ = True
    rec = as_record(run)
    m = rec.metrics
    if tau is None:
        qk_clip = getattr(getattr(rec.run, "facts", None), "qk_clip", None)
        tau = qk_clip.tau if qk_clip is not None else None
        if tau is None:
            raise ConfigError(f"{rec.source}: pass tau=... (the run does not say it trained with QK-Clip)")
    if not (isinstance(tau, (int, float)) and 0 < tau < math.inf) or not (isinstance(factor, (int, float)) and factor >= 1):
        raise ConfigError(f"assert_qk_clip_contains needs tau > 0 and factor >= 1, was tau={tau!r}, factor={factor!r}")
    for column in ("attn_logit_max", "qk_clipped_heads"):
        if column not in m:
            raise ConfigError(f"{rec.source} has no {column} column (QK-Clip records how many heads it clipped per "
                              f"step; the model's stats hook the largest attention logit)")
    steps = np.asarray(m["step"])
    logits = np.asarray(m["attn_logit_max"], dtype=np.float64)
    clipped = np.asarray(m["qk_clipped_heads"], dtype=np.float64)
    acted = np.flatnonzero((np.nan_to_num(clipped) > 0) | ~(logits <= tau))
    if not acted.size:
        return None  # the logits never exceeded tau: nothing to contain
    first = int(acted[0])
    if not clipped[first] > 0:
        raise SpikeCheckError(f"the largest attention logit {fmt(logits[first], ',.4g')} exceeded tau {tau:g} at step "
                              f"{int(steps[first])} and QK-Clip clipped no head there\n\nrecord: {rec.source}")
    after = np.arange(first + 1, len(steps))
    over = after[~(logits[after] <= factor * tau)]
    if over.size:
        worst = int(after[np.nanargmax(np.where(np.isnan(logits[after]), np.inf, logits[after]))])
        raise SpikeCheckError(f"QK-Clip (tau {tau:g}) first clipped at step {int(steps[first])}, yet the largest attention "
                              f"logit is {fmt(logits[over[0]], ',.4g')} > {factor:g} x tau at step {int(steps[over[0]])} "
                              f"(largest {fmt(logits[worst], ',.4g')} at step {int(steps[worst])})\n\nrecord: {rec.source}")
    return int(steps[first])
