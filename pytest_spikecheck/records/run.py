"""A training run's record: per-step metrics, batch compositions, event details, metadata.

Everything an analysis or an assertion needs, and nothing that needs torch. A run saves to
a folder that other tools can read::

    config.yaml      the resolved scenario (breaks folded in; their names are in run.json); not
                     written for a run recorded from another trainer (run.json ``recorded``
                     holds what that trainer reports: trainer, seed, lr, clip, accumulation,
                     precision), whose scenario is not ours to retrain
    metrics.jsonl    one JSON object per step: step, loss, grad_norm_pre, grad_norm_post,
                     clip_factor, lr, eval_loss (null where not evaluated), adam_v_norm, and
                     the model's stats where it reports them (MODEL_STAT_KEYS), the set-up's
                     columns where it has them (SETUP_KEYS: loss_scale, clip_limit,
                     qk_clipped_heads, eval_loss_repeat, grad_finite_pre where the
                     pre-clip norm is not finite), and in a
                     run that skipped updates ``skipped``: why (``"overflow"``, ``"skip_spikes"``)
                     or null
    batches.jsonl    one JSON object per step: the batch's samples, sources, rare counts
    events.json      detail at burst steps and detected spikes, one
                     :class:`~pytest_spikecheck.records.events.Event` each: per-token losses with
                     token strings, per-tensor grad norms, Adam update statistics
    run.json         package/torch versions, backend, device, threads, wall time, where the
                     run stopped and why
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.records import integrity
from pytest_spikecheck.records.events import Event, events_from_json, events_to_json
from pytest_spikecheck.records.facts import FORMAT_VERSION, RunFacts, facts_from_format_1, meta_from_format_1
from pytest_spikecheck.records.run_json import check_version, read_meta, scenario_and_facts
from pytest_spikecheck.records.series import MetricColumns
from pytest_spikecheck.scenario import Scenario

#: The per-step metric columns, in file order. ``eval_loss`` is NaN where not evaluated.
#: ``loss`` and ``eval_loss`` are the cross-entropy (an auxiliary z-loss is its own column).
METRIC_KEYS = ("step", "loss", "grad_norm_pre", "grad_norm_post", "clip_factor", "lr", "eval_loss", "adam_v_norm")
#: Columns the model reports through its stats hook (the built-in GPT does): the largest
#: |attention logit| over the layers, the mean and largest |log Z| of the output logits (over
#: the batch's targets), and the z-loss term. Absent for a model without it.
MODEL_STAT_KEYS = ("attn_logit_max", "logz_mean", "logz_absmax", "z_loss")
#: Columns of the training set-up, present where it has them: the loss scale of a run with loss
#: scaling (the scale this step's backward used), the limit an adaptive clip applied at each step,
#: how many attention heads QK-Clip scaled back after the step's update (``qk_clipped_heads``),
#: and on the induction corpus the eval loss on the repeated half of each sequence
#: (``eval_loss_repeat``, NaN where not evaluated). ``grad_finite_pre``, written by the engine and
#: the recorder only at a step whose pre-clip norm is not finite: 1 where every gradient element
#: was finite before the clip all the same (only the norm overflowed), 0 where one was inf or NaN
#: (null elsewhere: a finite pre-clip norm says every element is; a log that lacks it: unknown).
SETUP_KEYS = (
    "loss_scale",
    "clip_limit",
    "qk_clipped_heads",
    "eval_loss_repeat",
    "muon_update_ratio",
    "update_rms",
    "optimizer_steps",
    "update_clip_norm",
    "grad_finite_pre",
)
#: Columns logged only at some steps (NaN elsewhere, marked missing, written as null).
SPARSE_KEYS = ("eval_loss", "eval_loss_repeat", "grad_finite_pre")
#: The per-step column that says why a step's update was not applied (null where it was).
SKIPPED_KEY = "skipped"


#: Who recorded a run (run.json ``trainer``), in words.
TRAINER_NAMES = {"hf": "a Hugging Face Trainer", "lightning": "a Lightning Trainer", "loop": "your own training loop"}


def recorded_by(directory: str | Path) -> str | None:
    """The trainer a run folder was recorded from (``hf``, ``lightning``, ``loop``), None for an
    engine run or no run at all."""
    meta_file = Path(directory) / "run.json"
    if not meta_file.is_file():
        return None
    try:
        meta = json.loads(meta_file.read_text())
    except json.JSONDecodeError:
        return None
    return str(meta.get("trainer", "loop")) if isinstance(meta, dict) and meta.get("recorded") else None


@dataclass
class Run:
    """One training run, step by step: what ``train`` returns, a recorder saves and every
    assertion, diagnosis and report reads.

    ``metrics`` holds one array per column (``step``, ``loss``, ``grad_norm_pre``,
    ``grad_norm_post``, ``clip_factor``, ``lr``, ``eval_loss``, ...; the columns of
    ``metrics.jsonl``), ``batches`` each step's batch composition, ``events`` the detailed
    records (per-token losses, per-tensor norms, Adam statistics) at bursts and detected spikes.
    ``save(folder)`` writes the run folder (config.yaml, metrics.jsonl, batches.jsonl,
    events.json, run.json; the [run-folder schema](run-folder.md)) and
    ``Run.load(folder)`` reads it back, also a folder someone else wrote to that schema. A folder
    that is not a run raises ``ConfigError``::

        run = train(scenario)
        run.save("runs/phase19-break")
        again = Run.load("runs/phase19-break")      # again.metrics["grad_norm_pre"][311]
    """

    #: The resolved scenario of an engine run (what retrains it); None for a run recorded from
    #: another trainer or written by hand: how those were trained is in :attr:`facts` only.
    scenario: Scenario | None
    metrics: dict[str, np.ndarray]
    batches: list[dict[str, Any]] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    #: run.json's entries: the name, ``declared_events``, ``stopped_at``, ``content_hash``,
    #: ``reproduce``, a recorded run's ``recorded`` block, a distributed run's ``distributed``.
    meta: dict[str, Any] = field(default_factory=dict)
    #: step -> why its update was not applied (``"overflow"``: the loss scaler found an inf/NaN;
    #: ``"skip_spikes"``: SkipSpikes); what :attr:`Record.skipped` reads.
    skipped: dict[int, str] = field(default_factory=dict)
    #: How the run was trained (run.json ``facts``): what every judge and report reads. None
    #: given: a format-1 run's, upgraded from its scenario or its ``recorded`` block.
    facts: RunFacts | None = None
    #: The folder this run was loaded from (None: not loaded).
    folder: Path | None = field(default=None, compare=False)

    def __repr__(self) -> str:  # the dataclass repr would print every batch and event
        stopped = f", stopped at step {self.meta['stopped_at']} ({self.meta.get('stop_reason')})" if self.stopped_early else ""
        digest = self.meta.get("content_hash")
        return (
            f"Run({self.name!r}, {len(self)} steps{stopped}, {len(self.events)} event records"
            + (f", content hash {digest}" if digest else "")
            + ")"
        )

    def __post_init__(self) -> None:
        # what the run is (name, description, declared events) is run.json's to state; a format-1
        # folder or a Run built from a scenario alone gets them from its scenario, here, once
        self.meta = meta_from_format_1(self.meta, self.scenario)
        if self.facts is None:
            self.facts = facts_from_format_1(self.meta, self.scenario)
        if not isinstance(self.metrics, MetricColumns):
            # The engine logs every metric at every step except the eval losses, which are NaN
            # where not evaluated (a run stops before evaluating a non-finite model).
            self.metrics = MetricColumns(
                self.metrics,
                {k: np.isnan(np.asarray(self.metrics[k], dtype=np.float64)) for k in SPARSE_KEYS if k in self.metrics},
            )

    # -- convenience ------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The run's name, as run.json states it ("run" where it states none; "" is a name)."""
        name = self.meta.get("name")
        return "run" if name is None else str(name)

    def renamed(self, name: str) -> Run:
        """This run under another name (a cache's copy of the same content, a sweep's point): run.json's
        ``name`` and, for an engine run, its scenario's, so the two never disagree."""
        return dataclasses.replace(
            self,
            scenario=self.scenario.replace(name=name) if self.scenario is not None else None,
            meta={**self.meta, "name": name},
        )

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
        """Steps of the events the writer declared (bursts, a new source's entry), in order, as
        run.json states them (none stated: none)."""
        return tuple(int(s) for s in self.meta.get("declared_events") or ())

    @property
    def phase_boundaries(self) -> tuple[int, ...]:
        """Steps where a mixture's source weights changed (empty without a mixture)."""
        weights = [b.get("weights") for b in self.batches]
        return tuple(b["step"] for b, w, prev in zip(self.batches[1:], weights[1:], weights) if w is not None and w != prev)

    def event_at(self, step: int) -> Event | None:
        return next((e for e in self.events if e.step == step), None)

    def batch_at(self, step: int) -> dict[str, Any] | None:
        return next((b for b in self.batches if b["step"] == step), None)

    def reproduce_command(self) -> str:
        seed = self.facts.seed if self.facts is not None and self.facts.seed is not None else "<seed>"
        return self.meta.get("reproduce", f"spikecheck train <config> --seed {seed}")

    @property
    def recorded(self) -> dict[str, Any] | None:
        """What another trainer reported about this run (it was recorded, not trained by the engine), else None."""
        return self.meta.get("recorded") or None

    def describe(self) -> str:
        """One line saying what the run is: run.json's ``description`` (an engine run's set-up), or
        for a recorded run the facts its trainer reported, else what its facts say."""
        facts = self.recorded
        if facts is None and self.meta.get("description"):
            return f"{self.name}: {self.meta['description']}"
        if facts is None:
            clip = self.facts.clip.describe() if self.facts is not None and self.facts.clip is not None else "clip not recorded"
            return f"{self.name}: {len(self)} steps written by {self.facts.source if self.facts else 'hand'}, {clip}"
        who = TRAINER_NAMES.get(str(facts.get("trainer")), str(facts.get("trainer")))
        version = f" ({facts['trainer_version']})" if facts.get("trainer_version") else ""
        clip = facts.get("max_grad_norm")
        k, micro = facts.get("accumulation") or 1, facts.get("micro_batch_size")
        batch = (
            f"batch {micro * k} = {k} micro-batches of {micro}"
            if micro and k > 1
            else f"batch {micro}"
            if micro
            else f"accumulation {k}"
        )
        parts = [
            f"{len(self)} steps",
            f"seed {facts.get('seed') if facts.get('seed') is not None else 'not given'}",
            f"lr {facts['lr']:g}" if isinstance(facts.get("lr"), (int, float)) else "lr not reported",
            f"max_grad_norm {clip:g}" if clip else "no clip",
            batch,
            f"precision {facts.get('precision')}",
        ]
        bursts = ", ".join(str(s) for s in self.declared_events)
        burst = (
            (
                f"burst at step {bursts}"
                + (f" ({len(self.meta['burst_samples'])} samples)" if self.meta.get("burst_samples") else "")
            )
            if bursts
            else "no bursts"
        )
        return f"{self.name}: recorded from {who}{version}: {', '.join(parts)}; {burst}"

    # -- files ------------------------------------------------------------------------------
    def save(self, directory: str | Path) -> Path:
        """Write the run as a folder, aside and then moved into place whole, its run.json carrying
        the format version, the facts and the manifest of the other files
        (:mod:`pytest_spikecheck.records.integrity`)."""

        def write(out: Path) -> None:
            if self.scenario is not None and self.recorded is None:
                # a recorded or hand-written run has no config: ours would say we can retrain it
                (out / "config.yaml").write_text(self.scenario.to_yaml())
            with open(out / "metrics.jsonl", "w") as f:
                for row in self.rows():
                    f.write(json.dumps(row) + "\n")
            with open(out / "batches.jsonl", "w") as f:
                for b in self.batches:
                    f.write(json.dumps(b) + "\n")
            (out / "events.json").write_text(json.dumps(events_to_json(self.events), indent=1))
            meta = {"format_version": FORMAT_VERSION, **self.meta, "facts": self.facts.to_json() if self.facts else None}
            meta = {**meta, integrity.MANIFEST_KEY: integrity.manifest_of(out, meta, len(self))}
            (out / "run.json").write_text(json.dumps(meta, indent=2, default=str))

        return integrity.save_folder(Path(directory), write)

    def rows(self) -> list[dict[str, Any]]:
        cols = [k for k in METRIC_KEYS + MODEL_STAT_KEYS + SETUP_KEYS if k in self.metrics]
        # A run that skipped a step, or could (it scales its loss), says so at every step.
        with_skipped = bool(self.skipped) or "loss_scale" in self.metrics
        rows = []
        for i in range(len(self)):
            row: dict[str, Any] = {}
            for k in cols:
                v = self.metrics[k][i]
                if k == "step":
                    row[k] = int(v)
                elif k in self.metrics.missing and self.metrics.missing[k][i]:
                    row[k] = None  # not logged (not evaluated) at this step; a real NaN stays NaN
                elif k == "clip_limit" and v == np.inf:
                    row[k] = None  # no clip at this step
                else:
                    row[k] = float(v)
            if with_skipped:
                row[SKIPPED_KEY] = self.skipped.get(row["step"])
            rows.append(row)
        return rows

    @classmethod
    def load(cls, directory: str | Path, *, require_manifest: bool = False) -> Run:
        """The run saved in ``directory``, checked against its manifest: a damaged folder is one
        :class:`~pytest_spikecheck.records.integrity.DamagedRunError` line. ``require_manifest``
        (a cache's entries): a folder without one is damaged too, else it is read as it is."""
        src = Path(directory)
        if not (src / "metrics.jsonl").is_file():
            raise ConfigError(f"not a run directory (no metrics.jsonl): {src}")
        meta = read_meta(src / "run.json")
        # the version first: a future format's manifest may not be one this code can check
        check_version(src, meta)
        why = integrity.problem(src, meta, required=require_manifest)
        if why is not None:
            raise integrity.refuse(src, why)
        metrics = read_metrics_jsonl(src / "metrics.jsonl")
        missing = metrics.pop("__missing__")
        why = integrity.check_steps(src, meta, len(metrics["step"]))
        if why is not None:
            raise integrity.refuse(src, why)
        batches = _read_jsonl(src / "batches.jsonl") if (src / "batches.jsonl").is_file() else []
        events = (
            events_from_json(json.loads((src / "events.json").read_text()), where=str(src / "events.json"))
            if (src / "events.json").is_file()
            else []
        )
        scenario, facts = scenario_and_facts(src, meta)
        if scenario is None and "name" not in meta:
            meta["name"] = src.name
        return cls(
            scenario=scenario,
            metrics=MetricColumns(metrics, missing),
            batches=batches,
            events=events,
            meta=meta,
            skipped=_read_skipped(src / "metrics.jsonl"),
            folder=src,
            facts=facts,
        )


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


def _read_skipped(path: Path) -> dict[int, str]:
    """The ``skipped`` column of a metrics.jsonl (text, so not among the metric columns)."""
    with open(path) as f:
        first = f.readline()
        if f'"{SKIPPED_KEY}"' not in first:
            return {}
        f.seek(0)
        rows = [json.loads(line) for line in f if line.strip()]
    return {int(r["step"]): str(r[SKIPPED_KEY]) for r in rows if r.get(SKIPPED_KEY)}


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
