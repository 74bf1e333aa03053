"""Turn whatever a user has into the metrics mapping the assertions and detectors read.

Accepted: a :class:`~pytest_spikecheck.run.Run`; a mapping of arrays
(``{"loss": [...], "grad_norm_pre": [...]}``, with an optional ``"step"`` column); a path
to a run folder, or to any training log :mod:`pytest_spikecheck.logs` reads (a
``trainer_state.json``, a Lightning ``metrics.csv``, TensorBoard event files or their
folder, a CSV or JSONL log). numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from pytest_spikecheck.errors import ConfigError


@dataclass(frozen=True)
class Record:
    metrics: dict[str, np.ndarray]  # always has an int "step" column, float64 others
    run: Any = None  # the Run when there is one (events, batches, scenario)
    source: str = "arrays"
    # Per metric, True where nothing was logged at that step (stored as NaN in ``metrics``).
    # A NaN that is *not* missing is a real non-finite value and counts as one.
    missing: dict[str, np.ndarray] = field(default_factory=dict)
    log_format: str | None = None  # for a log file: its format (a name in logs.FORMATS)
    notes: tuple[str, ...] = ()  # how the log was read where it was not plain (a restart, a truncated file)

    def series(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) of ``name`` where it was logged; real NaN/inf values are kept."""
        steps = np.asarray(self.metrics["step"])
        values = np.asarray(self.metrics[name], dtype=np.float64)
        if name in self.missing:
            keep = ~self.missing[name]
            return steps[keep], values[keep]
        return steps, values

    def reproduce_command(self) -> str | None:
        if self.run is not None:
            return self.run.reproduce_command()
        return None


def _from_mapping(data: Mapping[str, Any]) -> dict[str, np.ndarray]:
    cols: dict[str, np.ndarray] = {}
    length = None
    for key, value in data.items():
        arr = np.asarray(value, dtype=np.float64).reshape(-1) if key != "step" else np.asarray(value).reshape(-1)
        if length is not None and arr.size != length:
            raise ValueError(f"metric {key!r} has {arr.size} values but the others have {length}")
        length = arr.size
        cols[key] = arr
    n = length or 0
    if "step" not in cols:
        cols["step"] = np.arange(1, n + 1, dtype=np.int64)
    else:
        steps = cols["step"].astype(np.float64)
        if not np.all(np.isfinite(steps)):
            raise ValueError("the step column holds non-finite values")
        cols["step"] = steps.astype(np.int64)
    return cols


def _from_run(run: Any, source: str) -> Record:
    # The engine logs every metric at every step except the eval loss, which is NaN where
    # it was not evaluated (a run stops before evaluating a non-finite model).
    return Record(dict(run.metrics), run, source, missing={"eval_loss": np.isnan(run.metrics["eval_loss"])}
                  if "eval_loss" in run.metrics else {})


def as_record(obj: Any) -> Record:
    """Normalise a Run, a mapping of arrays, or a path into a :class:`Record`."""
    from pytest_spikecheck.run import Run

    if isinstance(obj, Record):
        return obj
    if isinstance(obj, Run):
        return _from_run(obj, f"run {obj.name}")
    if isinstance(obj, (str, Path)):
        path = Path(obj)
        if path.is_dir():
            from pytest_spikecheck.cli import resolve_run_dir

            try:
                run_dir = resolve_run_dir(path)
            except ConfigError:
                pass  # not one of our run folders: a folder holding another tool's log
            else:
                return _from_run(Run.load(run_dir), str(path))
        from pytest_spikecheck.logs import read_log

        return read_log(path)
    if isinstance(obj, Mapping):
        return Record(_from_mapping(obj), None, "arrays")
    raise TypeError(f"expected a Run, a mapping of arrays or a path to a metrics log, was {type(obj).__name__}")
