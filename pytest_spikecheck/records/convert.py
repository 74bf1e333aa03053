"""Turn whatever a user has into the metrics mapping the assertions and detectors read.

Accepted: a :class:`~pytest_spikecheck.records.run.Run`; a mapping of arrays
(``{"loss": [...], "grad_norm_pre": [...]}``, with an optional ``"step"`` column); a path
to a run folder, or to any training log :mod:`pytest_spikecheck.records.logs` reads (a
``trainer_state.json``, a Lightning ``metrics.csv``, TensorBoard event files or their
folder, a CSV or JSONL log). numpy only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.records.logs import read_log
from pytest_spikecheck.records.run import Run, resolve_run_dir
from pytest_spikecheck.records.series import Record, columns_from_mapping


def _from_run(run: Any, source: str) -> Record:
    # A Run's metrics carry their own missing masks (the eval loss where not evaluated), and the
    # steps whose update was skipped (a loss scaler's overflow, SkipSpikes).
    return Record(dict(run.metrics), run, source, missing=dict(run.metrics.missing), skipped=dict(run.skipped), facts=run.facts)


def as_record(obj: Any, steps: Any = None) -> Record:
    """Normalise a Run, a mapping of arrays, or a path into a :class:`Record`.

    A mapping's steps are its ``"step"`` column, or ``steps``, or else 1, 2, 3, ...: the
    first value is step 1 (as in training logs), so Python index ``i`` is step ``i + 1``.
    """
    if steps is not None and not isinstance(obj, Mapping):
        raise TypeError("steps= numbers a mapping of arrays; a Run or a log has its own steps")
    if isinstance(obj, Record):
        return obj
    if isinstance(obj, Run):
        return _from_run(obj, f"run {obj.name}")
    if isinstance(obj, (str, Path)):
        path = Path(obj)
        if path.is_dir():
            try:
                run_dir = resolve_run_dir(path)
            except ConfigError:
                pass  # not one of our run folders: a folder holding another tool's log
            else:
                return _from_run(Run.load(run_dir), str(path))
        return read_log(path)
    if isinstance(obj, Mapping):
        columns, missing = columns_from_mapping(obj, steps)
        return Record(columns, None, "arrays", missing=missing, numbered_from_one="step" not in obj and steps is None)
    raise TypeError(f"expected a Run, a mapping of arrays or a path to a metrics log, was {type(obj).__name__}")
