"""A training run's record: per-step metrics, batch compositions, event details, metadata.

Everything an analysis or an assertion needs, and nothing that needs torch. A run saves to
a folder that other tools can read::

    config.yaml      the resolved scenario (breaks folded in; their names are in run.json)
    metrics.jsonl    one JSON object per step: step, loss, grad_norm_pre, grad_norm_post,
                     clip_factor, lr, eval_loss (null where not evaluated), adam_v_norm, the
                     model's stats where it reports them (MODEL_STAT_KEYS), and the columns
                     only some runs have (OPTIONAL_KEYS)
    batches.jsonl    one JSON object per step: the batch's samples, sources, rare counts
    events.json      detail at burst steps and detected spikes: per-token losses with token
                     strings, per-tensor grad norms, Adam update statistics
    run.json         package/torch versions, backend, device, threads, wall time, where the
                     run stopped and why
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.records.series import MetricColumns
from pytest_spikecheck.scenario import Scenario

#: The per-step metric columns, in file order. ``eval_loss`` is NaN where not evaluated.
#: ``loss`` and ``eval_loss`` are the cross-entropy (an auxiliary z-loss is its own column).
METRIC_KEYS = ("step", "loss", "grad_norm_pre", "grad_norm_post", "clip_factor", "lr", "eval_loss", "adam_v_norm")
#: Columns the model reports through its stats hook (the built-in GPT does): the largest
#: |attention logit| over the layers, the mean and largest |log Z| of the output logits (over
#: the batch's targets), and the z-loss term. Absent for a model without it.
MODEL_STAT_KEYS = ("attn_logit_max", "logz_mean", "logz_absmax", "z_loss")
#: Columns only some runs have: ``qk_clipped_heads`` (QK-Clip on: how many attention heads it
#: scaled back after that step's update) and ``eval_loss_repeat`` (the induction corpus: the
#: eval loss on the repeated half of each sequence, NaN where not evaluated).
OPTIONAL_KEYS = ("qk_clipped_heads", "eval_loss_repeat")
#: Columns logged only at some steps (NaN elsewhere, marked missing, written as null).
SPARSE_KEYS = ("eval_loss", "eval_loss_repeat")


@dataclass
class Run:
    scenario: Scenario  # resolved
    metrics: dict[str, np.ndarray]
    batches: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:  # the dataclass repr would print every batch and event
        stopped = f", stopped at step {self.meta['stopped_at']} ({self.meta.get('stop_reason')})" if self.stopped_early else ""
        digest = self.meta.get("content_hash")
        return (f"Run({self.name!r}, {len(self)} steps{stopped}, {len(self.events)} event records"
                + (f", content hash {digest}" if digest else "") + ")")

    def __post_init__(self) -> None:
        if not isinstance(self.metrics, MetricColumns):
            # The engine logs every metric at every step except the eval losses, which are NaN
            # where not evaluated (a run stops before evaluating a non-finite model).
            self.metrics = MetricColumns(self.metrics, {k: np.isnan(np.asarray(self.metrics[k], dtype=np.float64))
                                                        for k in SPARSE_KEYS if k in self.metrics})

    # -- convenience ------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.scenario.name

    @property
    def steps(self) -> np.ndarray:
        return self.metrics["step"]

    def __getitem__(self, key: str) -> np.ndarray:
        return self.metrics[key]

    def __len__(self) -> int:
        return len(self.metrics["step"])

    @property
    def stopped_early(self) -> bool:
        return self.meta.get("stopped_at") is not None

    @property
    def declared_events(self) -> tuple[int, ...]:
        """Steps of the events the scenario declared (bursts, a new source's entry), in order."""
        return tuple(self.meta.get("declared_events") or self.scenario.burst_steps)

    @property
    def phase_boundaries(self) -> tuple[int, ...]:
        """Steps where a mixture's source weights changed (empty without a mixture)."""
        weights = [b.get("weights") for b in self.batches]
        return tuple(b["step"] for b, w, prev in zip(self.batches[1:], weights[1:], weights) if w is not None and w != prev)

    def event_at(self, step: int) -> dict[str, Any] | None:
        return next((e for e in self.events if e["step"] == step), None)

    def batch_at(self, step: int) -> dict[str, Any] | None:
        return next((b for b in self.batches if b["step"] == step), None)

    def reproduce_command(self) -> str:
        return self.meta.get("reproduce", f"spikecheck train <config> --seed {self.scenario.seed}")

    # -- files ------------------------------------------------------------------------------
    def save(self, directory: str | Path) -> Path:
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.yaml").write_text(self.scenario.to_yaml())
        with open(out / "metrics.jsonl", "w") as f:
            for row in self.rows():
                f.write(json.dumps(row) + "\n")
        with open(out / "batches.jsonl", "w") as f:
            for b in self.batches:
                f.write(json.dumps(b) + "\n")
        (out / "events.json").write_text(json.dumps(self.events, indent=1))
        (out / "run.json").write_text(json.dumps(self.meta, indent=2, default=str))
        return out

    def rows(self) -> list[dict[str, Any]]:
        cols = [k for k in METRIC_KEYS + MODEL_STAT_KEYS + OPTIONAL_KEYS if k in self.metrics]
        rows = []
        for i in range(len(self)):
            row: dict[str, Any] = {}
            for k in cols:
                v = self.metrics[k][i]
                if k == "step":
                    row[k] = int(v)
                elif k in self.metrics.missing and self.metrics.missing[k][i]:
                    row[k] = None  # not logged (not evaluated) at this step; a real NaN stays NaN
                else:
                    row[k] = float(v)
            rows.append(row)
        return rows

    @classmethod
    def load(cls, directory: str | Path) -> "Run":
        src = Path(directory)
        if not (src / "metrics.jsonl").is_file():
            raise ConfigError(f"not a run directory (no metrics.jsonl): {src}")
        scenario = Scenario.from_yaml(src / "config.yaml") if (src / "config.yaml").is_file() else Scenario()
        metrics = read_metrics_jsonl(src / "metrics.jsonl")
        missing = metrics.pop("__missing__")
        batches = _read_jsonl(src / "batches.jsonl") if (src / "batches.jsonl").is_file() else []
        events = json.loads((src / "events.json").read_text()) if (src / "events.json").is_file() else []
        meta = json.loads((src / "run.json").read_text()) if (src / "run.json").is_file() else {}
        return cls(scenario=scenario, metrics=MetricColumns(metrics, missing), batches=batches, events=events, meta=meta)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"{path}:{n}: not valid JSON ({exc.msg})") from None
    return out


def read_metrics_jsonl(path: str | Path) -> dict[str, Any]:
    """Read a metrics.jsonl into columns, through :func:`pytest_spikecheck.records.logs.read_log` (the
    one reader of JSONL logs): an int ``step`` column and float64 metrics.

    Missing values and ``null`` become NaN and are marked in the ``"__missing__"`` entry (a
    dict of boolean masks); ``NaN``/``Infinity`` stay real non-finite values.
    """
    from pytest_spikecheck.records.logs import read_log

    record = read_log(path, format="jsonl")
    return {**record.metrics, "__missing__": record.missing}


def resolve_run_dir(path: str | Path) -> Path:
    """A run directory, or an experiment directory whose ``run/`` holds one."""
    p = Path(path)
    if (p / "metrics.jsonl").is_file():
        return p
    if (p / "run" / "metrics.jsonl").is_file():
        return p / "run"
    if not p.exists():
        raise ConfigError(f"no such run or experiment directory: {p}")
    raise ConfigError(f"{p} holds no run (no metrics.jsonl); train it first: spikecheck train {p}")
