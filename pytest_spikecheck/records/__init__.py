"""The records layer: what a training run or a training log *is*, as numpy arrays (no torch).

``series`` holds :class:`Record`, the metrics table every judgement reads; ``logs`` reads
other tools' logs (Hugging Face, Lightning, TensorBoard, CSV/JSONL) into Records; ``run``
holds :class:`Run`, the engine's record of a run and its folder format; ``convert`` turns
whatever a user has (a Run, arrays, a path) into a Record.
"""

from pytest_spikecheck.records.convert import as_record
from pytest_spikecheck.records.logs import FORMATS, read_log
from pytest_spikecheck.records.run import METRIC_KEYS, Run, resolve_run_dir
from pytest_spikecheck.records.series import Record

__all__ = ["FORMATS", "METRIC_KEYS", "Record", "Run", "as_record", "read_log", "resolve_run_dir"]
