"""``lr_sweep``: one scenario trained at several peak learning rates, in parallel processes,
judged as Wortsman et al. (2023) do (:mod:`pytest_spikecheck.judge.sweeps`)."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from typing import Sequence

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.judge.sweeps import LRSweep
from pytest_spikecheck.records.run import Run
from pytest_spikecheck.scenario import Scenario
from pytest_spikecheck.training.launch import train


def _train_at(scenario: Scenario, threads: int) -> Run:
    return train(scenario, threads=threads)


def lr_sweep(scenario: Scenario, lrs: Sequence[float], *, processes: int = 2, threads: int = 1,
             name: str | None = None) -> LRSweep:
    """Train ``scenario`` once per learning rate in ``lrs`` (its ``optimizer.lr`` replaced, breaks
    and everything else kept) on up to ``processes`` worker processes of ``threads`` threads
    each, and return the :class:`~pytest_spikecheck.judge.sweeps.LRSweep` (runs included, in
    ``lrs`` order). Each run is bit-identical to ``train`` of the same scenario alone."""
    lrs = tuple(float(lr) for lr in lrs)
    if not lrs or any(not (0 < lr < float("inf")) for lr in lrs):
        raise ConfigError(f"lr_sweep needs learning rates > 0, was {list(lrs)}")
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise ConfigError(f"processes must be a positive integer, was {processes!r}")
    # The LR goes last, after the breaks, so a HighLR break in the scenario does not override the sweep.
    scenarios = [scenario.resolved().replace(name=f"{scenario.name}@lr={lr:g}", optimizer__lr=lr) for lr in lrs]
    if processes == 1 or len(lrs) == 1:
        runs = [_train_at(s, threads) for s in scenarios]
    else:
        # spawn: a forked child would inherit torch's thread pools mid-state
        with ProcessPoolExecutor(min(processes, len(lrs)), mp_context=multiprocessing.get_context("spawn")) as pool:
            runs = list(pool.map(_train_at, scenarios, [threads] * len(scenarios)))
    return LRSweep.from_runs(name or scenario.name, lrs, runs)
