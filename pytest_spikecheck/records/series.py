"""The metrics table every judgement reads: a :class:`Record` (numpy only).

A Record is built from a Run, a mapping of arrays, or a log file (:mod:`.convert`,
:mod:`.logs`); the detectors, analysis, diagnosis and assertions read nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np


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


def columns_from_mapping(data: Mapping[str, Any]) -> dict[str, np.ndarray]:
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
