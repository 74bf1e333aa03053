"""``lr_sweep``: one scenario trained at several peak learning rates, judged as Wortsman et al.
(2023) do (:mod:`pytest_spikecheck.judge.sweeps`). A thin call of :func:`~.engine.sweep`."""

from __future__ import annotations

from typing import Sequence

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.judge.sweeps import LRSweep
from pytest_spikecheck.scenario import Scenario
from pytest_spikecheck.sweep.engine import sweep
from pytest_spikecheck.sweep.spec import Sweep


def lr_sweep(
    scenario: Scenario, lrs: Sequence[float], *, processes: int = 2, threads: int = 1, name: str | None = None
) -> LRSweep:
    """Train ``scenario`` once per learning rate in ``lrs`` (its ``optimizer.lr`` replaced, breaks
    and everything else kept) with the local executor, ``processes`` spawned workers of
    ``threads`` threads each (1: in this process), and return the
    :class:`~pytest_spikecheck.judge.sweeps.LRSweep` (runs included, in ``lrs`` order). Each run
    is bit-identical to ``train`` of the same scenario alone. ``name`` names the sweep (default:
    the scenario's name)."""
    lrs = tuple(float(lr) for lr in lrs)
    if not lrs or any(not (0 < lr < float("inf")) for lr in lrs):
        raise ConfigError(f"lr_sweep needs learning rates > 0, was {list(lrs)}")
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise ConfigError(f"processes must be a positive integer, was {processes!r}")
    # The LR is set on the resolved scenario, so a HighLR break in it does not override the sweep.
    plan = Sweep(scenario.resolved(), grid={"optimizer.lr": list(lrs)}, name=name or scenario.name)
    result = sweep(plan, executor="local", jobs=min(processes, len(lrs)), threads=threads, progress=False)
    if result.failed:
        first = result.failed[0]
        raise ConfigError(f"lr_sweep: lr {first['optimizer.lr']:g} failed: {first['error']}")
    return LRSweep.from_runs(name or scenario.name, lrs, result.runs)
