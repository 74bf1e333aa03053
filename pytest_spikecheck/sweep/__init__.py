"""Sweeps: a base scenario crossed with axes (any field by its dotted YAML path) and recipes
(named sets of breaks), trained locally or on a Ray cluster, kept in the run store and resumed.

    from pytest_spikecheck.sweep import sweep
    result = sweep(Scenario.preset("phase-19").replace(steps=150),
                   {"optimizer.lr": [0.01, 0.1], "seed": [0, 1, 2]},
                   recipes={"baseline": [], "qk-layernorm": [QKLayerNorm()]}, jobs=2, out="out/lr")
    print(result.summary_table())

One job per module: ``spec`` (the sweep and its points, checked before anything trains),
``worker`` (what a worker does with one point), ``local`` and ``ray_executor`` (the executors),
``engine`` (the driver: store, outputs, progress), ``result`` and ``summary`` (the table and the
``median [min–max]`` summaries), ``panels``, ``lr`` (``lr_sweep``). Ray is imported only by the
ray executor; torch only when a point trains.
"""

from pytest_spikecheck.sweep.engine import SweepInterrupted, make_executor, sweep
from pytest_spikecheck.sweep.lr import lr_sweep
from pytest_spikecheck.sweep.result import SweepResult
from pytest_spikecheck.sweep.spec import Point, Sweep, load_sweep
from pytest_spikecheck.sweep.summary import recovery_spread, spread

__all__ = [
    "Point",
    "Sweep",
    "SweepInterrupted",
    "SweepResult",
    "load_sweep",
    "lr_sweep",
    "make_executor",
    "recovery_spread",
    "spread",
    "sweep",
]
