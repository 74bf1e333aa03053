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
    """One run's metrics on its own step axis, with what the step numbers alone cannot say.

    ``skipped`` maps a step whose optimizer update was *not applied* to the reason, e.g.
    ``{1234: "overflow"}`` (a loss scaler found inf/NaN gradients and skipped the step) or
    ``{1234: "overflow (inferred: non-finite grad norm, finite loss, fp16 run)"}`` where a
    log reader inferred it (``docs/logs.md`` gives the rule). Empty by default. A skipped
    step's gradient norm is non-finite by design, so the default finiteness judgement
    (``spikecheck check``, ``assert_finite``, ``assert_diverges``) leaves out the gradient
    norms of these steps, never their loss, and says how many steps were skipped; strict
    finiteness (``--strict-finite``, ``assert_finite(..., strict=True)``) ignores this field.
    The loss scale itself is an ordinary metric column, ``loss_scale``. Filled by the log
    readers (from a skip column or a scale column, or by the inference rule) and by runs
    trained with a loss scaler.
    """

    metrics: dict[str, np.ndarray]  # always has an int "step" column, float64 others
    run: Any = None  # the Run when there is one (events, batches, scenario)
    source: str = "arrays"
    # Per metric, True where nothing was logged at that step (stored as NaN in ``metrics``).
    # A NaN that is *not* missing is a real non-finite value and counts as one.
    missing: dict[str, np.ndarray] = field(default_factory=dict)
    log_format: str | None = None  # for a log file: its format (a name in logs.FORMATS)
    #: True when the steps were not given (arrays without a "step" column): numbered 1, 2, 3, ...
    numbered_from_one: bool = False
    notes: tuple[str, ...] = ()  # how the log was read where it was not plain (a restart, a truncated file)
    skipped: Mapping[int, str] = field(default_factory=dict)  # step -> why its update was skipped (above)
    #: How the run was trained, where the record says (a :class:`~pytest_spikecheck.records.facts.RunFacts`:
    #: a Run's own facts, a log's from what the log states); None when it says nothing.
    facts: Any = None

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


class MetricColumns(dict):
    """A run's metric columns: a plain ``{name: array}`` dict that also carries ``missing``,
    per metric a boolean mask of the steps where nothing was logged (the engine's eval loss
    between evaluations). Passing it on as a mapping keeps that knowledge:
    ``assert_finite(run.metrics)`` judges it as ``assert_finite(run)`` does."""

    def __init__(self, columns: Mapping[str, Any] = (), missing: Mapping[str, np.ndarray] | None = None) -> None:
        super().__init__(columns)
        self.missing: dict[str, np.ndarray] = dict(missing or {})


def _float_column(value: Any) -> tuple[np.ndarray, np.ndarray | None]:
    """float64 values, and a mask of the entries that were ``None`` (not logged; stored as NaN)
    or None where every entry was logged. A NaN that was given stays a real NaN."""
    if isinstance(value, np.ndarray) and value.dtype != object:
        return value.astype(np.float64).reshape(-1), None
    raw = np.asarray(value, dtype=object).reshape(-1)
    gone = np.fromiter((v is None for v in raw), dtype=bool, count=raw.size)
    values = np.asarray(np.where(gone, np.nan, raw), dtype=np.float64)
    return values, (gone if gone.any() else None)


def columns_from_mapping(data: Mapping[str, Any], steps: Any = None) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(columns, missing masks) of a mapping of 1-D arrays, one value per step; ``None`` entries
    are "not logged" (NaN in the column, True in its mask). The steps are the ``"step"``
    column, or ``steps``, or else 1, 2, 3, ... (the first value is step 1, as in a training
    log, not index 0). Steps must be distinct integers; 2-D arrays are refused."""
    cols: dict[str, np.ndarray] = {}
    missing: dict[str, np.ndarray] = {
        name: np.asarray(mask, dtype=bool).reshape(-1) for name, mask in getattr(data, "missing", {}).items() if name in data
    }
    length = None
    if steps is not None:
        if "step" in data:
            raise ValueError("steps given twice: as the 'step' column and as steps=; keep one")
        data = {**data, "step": steps}
    for key, value in data.items():
        raw = np.asarray(value) if key == "step" or not isinstance(value, (list, tuple)) else np.asarray(value, dtype=object)
        if raw.ndim > 1:
            raise ValueError(
                f"metric {key!r} is a {raw.ndim}-D array of shape {raw.shape}; give one value per step "
                f"(a 1-D array), e.g. one column of it"
            )
        if key == "step":
            arr = raw.reshape(-1)
        else:
            arr, gone = _float_column(raw)
            if gone is not None:
                missing[key] = missing[key] | gone if key in missing else gone
        if length is not None and arr.size != length:
            raise ValueError(f"metric {key!r} has {arr.size} values but the others have {length}")
        length = arr.size
        cols[key] = arr
    n = length or 0
    if "step" not in cols:
        cols["step"] = np.arange(1, n + 1, dtype=np.int64)
    else:
        try:
            step_values = cols["step"].astype(np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"the step column must hold integers, was {cols['step'][:3].tolist()}…") from None
        if not np.all(np.isfinite(step_values)):
            raise ValueError("the step column holds non-finite values")
        fractional = step_values[step_values != np.round(step_values)]
        if fractional.size:
            raise ValueError(f"the step column must hold integers, has {fractional[0]:g}")
        as_int = step_values.astype(np.int64)
        unique, counts = np.unique(as_int, return_counts=True)
        if (counts > 1).any():
            raise ValueError(f"the step column holds step {int(unique[counts > 1][0])} more than once; steps must be distinct")
        cols["step"] = as_int
    return cols, missing
