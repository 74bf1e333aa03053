"""The per-session scenario runner behind the ``spikecheck`` fixture.

It trains each distinct scenario once per session, optionally caches runs on disk under the
report directory (a :class:`~pytest_spikecheck.training.store.RunStore`, whose key says what made
a run), writes each scenario's report folder, and keeps the rows of the terminal summary. The
engine (and torch) are imported on the first ``run()``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the store imports records (numpy, yaml): loading the plugin stays light
    from pytest_spikecheck.training.store import RunKey, RunStore


@dataclass(frozen=True)
class Settings:
    enabled: bool = False
    backend: str = "auto"
    device: str = "cpu"
    report_dir: Path | None = None
    seed: int | None = None
    threads: int = 1


@dataclass
class ScenarioRow:
    """One line of the terminal summary (JSON-able so xdist workers can send it)."""

    scenario: str
    steps: int
    spike_step: int | None
    spike_ratio: float
    containment: str
    recovery: str
    cached: bool
    stopped: str | None = None
    not_cached_because: str | None = None  # why a run of this scenario is never cached on disk

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _containment(run: Any) -> str:
    """The summary's clip-containment cell: did the post-clip norm stay under the limit?"""
    import numpy as np

    from pytest_spikecheck.judge.analysis import CLIP_RTOL
    from pytest_spikecheck.judge.text import fmt

    post = np.asarray(run.metrics["grad_norm_post"], dtype=float)
    finite = post[np.isfinite(post)]
    worst = fmt(float(finite.max()), ".3g") if finite.size else "—"
    if run.scenario.optimizer.clip_mode == "adaptive":
        return f"adaptive (max {worst})"
    max_norm = run.scenario.max_norm
    if math.isinf(max_norm):
        return "no clip"
    if run.stopped_early and finite.size < post.size:
        return f"n/a (non-finite at step {run.meta['stopped_at']})"
    held = bool(np.all(post <= max_norm * (1 + CLIP_RTOL)))
    return f"held (max {worst} ≤ {max_norm:g})" if held else f"BROKEN (max {worst} > {max_norm:g})"


def summarise(run: Any, cached: bool) -> ScenarioRow:
    from pytest_spikecheck.judge.analysis import EventSummary

    bursts = run.declared_events
    s = EventSummary.measure(run.metrics, bursts[0] if bursts else None)
    containment = _containment(run)
    recovery = "—" if s.step is None else (f"{s.recovery} steps" if s.recovery is not None else "not back")
    return ScenarioRow(
        scenario=run.name, steps=len(run), spike_step=s.step, spike_ratio=s.ratio,
        containment=containment, recovery=recovery, cached=cached,
        stopped=run.meta["stop_reason"] if run.stopped_early else None,
    )


def _diagnosis_markdown(diagnosis: Any) -> str:
    """The diagnosis as Markdown, its table through judge.text.table, which escapes a "|" in a
    cell (the Adam rung's |g|/√v̂ would otherwise split its row into extra columns)."""
    from pytest_spikecheck.judge.text import table

    if diagnosis.step is None:
        return diagnosis.markdown()
    rows = table(["rung", "finding"], [[str(r), str(f)] for r, f in diagnosis.lines], markdown=True)
    return f"**Diagnosis at step {diagnosis.step}**\n\n{rows}\n\n**Verdict:** {diagnosis.verdict}\n"


@dataclass
class SpikecheckSession:
    settings: Settings
    rows: dict[str, ScenarioRow] = field(default_factory=dict)
    _runs: dict[str, Any] = field(default_factory=dict)
    trained: int = 0
    _backend: str | None = None
    #: name -> content hash of every scenario run this session (a name must mean one scenario)
    _hash_by_name: dict[str, str] = field(default_factory=dict)
    #: names of the scenarios the current test asked for (the plugin links them to its report)
    used_by_current_test: set[str] = field(default_factory=set)

    @property
    def backend(self) -> str:
        """The concrete clipping backend (``auto`` resolved on first use: it may import cupy)."""
        if self._backend is None:
            from pytest_spikecheck.clipping import resolve_backend

            device = self.settings.device
            self._backend = resolve_backend(self.settings.backend, None if device == "auto" else device)
        return self._backend

    def _key(self, scenario: Any) -> RunKey:
        from pytest_spikecheck.training.store import run_key

        s = self.settings
        return run_key(scenario, backend=self.backend, device=s.device, threads=s.threads)

    def _disk_cache(self, key: RunKey) -> RunStore | None:
        """The run store under the report directory, where a run of ``key`` can be stored."""
        from pytest_spikecheck.training.store import RunStore

        if self.settings.report_dir is None or not key.shareable:
            return None
        return RunStore(self.settings.report_dir / ".cache")

    def run(self, scenario: Any, name: str | None = None) -> Any:
        """Train ``scenario`` (or return this session's or the disk cache's run of it)."""
        from pytest_spikecheck.scenario import Scenario

        if not isinstance(scenario, Scenario):
            raise TypeError(f"spikecheck.run expects a Scenario, was {type(scenario).__name__}")
        if name is not None:
            scenario = scenario.replace(name=name)
        if self.settings.seed is not None:  # the name stays the one the test declared
            scenario = scenario.replace(seed=self.settings.seed, name=scenario.name)
        digest = scenario.content_hash()
        if self._hash_by_name.setdefault(scenario.name, digest) != digest:
            from pytest_spikecheck.errors import ConfigError

            raise ConfigError(f"two different scenarios are both named {scenario.name!r}: summary rows and report "
                              f"folders are keyed by name, so give each one (each sweep point) its own name, or "
                              f"leave the name out (a derived name is unique to the content)")
        self.used_by_current_test.add(scenario.name)
        key = self._key(scenario)
        if key.tag not in self._runs:
            self._runs[key.tag] = self._load_or_train(scenario, key)
        run = self._runs[key.tag]
        if run.name != scenario.name:
            run = dataclasses.replace(run, scenario=run.scenario.replace(name=scenario.name))
        if scenario.name not in self.rows:
            self.rows[scenario.name] = summarise(run, cached=run.meta.get("from_disk_cache", False))
            if self.settings.report_dir is not None:
                self.rows[scenario.name].not_cached_because = key.not_shareable_because
            self._write_report(run)
        return run

    def _load_or_train(self, scenario: Any, key: RunKey) -> Any:
        cache = self._disk_cache(key)
        found = cache.get(key) if cache is not None else None
        if found is not None:
            run = found[0]
            run.meta["from_disk_cache"] = True
            return dataclasses.replace(run, scenario=run.scenario.replace(name=scenario.name))
        from pytest_spikecheck.training.launch import train

        s = self.settings
        run = train(scenario, backend=self.backend, device=s.device, threads=s.threads)
        self.trained += 1
        run.meta["reproduce"] = (f"pytest --spikecheck --spikecheck-backend {self.backend}"
                                 + (f" --spikecheck-seed {s.seed}" if s.seed is not None else "")
                                 + f"  # scenario {scenario.name}, content hash {run.meta['content_hash']}")
        if cache is not None:
            cache.put(key, run)
        return run

    def _write_report(self, run: Any) -> None:
        if self.settings.report_dir is None:
            return
        from pytest_spikecheck.judge.diagnosis import diagnose
        from pytest_spikecheck.report import plot_grad_norm, plot_loss
        from pytest_spikecheck.training.store import atomic_dir_write

        def write(folder: Path) -> None:
            marks = list(run.declared_events)
            plot_loss([run], folder / "loss.png", marks, title=f"{run.name}: loss")
            max_norm = run.scenario.max_norm
            plot_grad_norm([run], folder / "grad_norm.png", marks, None if math.isinf(max_norm) else max_norm,
                           title=f"{run.name}: gradient norm, pre- and post-clip")
            (folder / "diagnosis.md").write_text(f"# {run.name}\n\n{run.scenario.describe()}\n\n{_diagnosis_markdown(diagnose(run))}")
            (folder / "summary.json").write_text(json.dumps(self.rows[run.name].to_json(), indent=2))
            run.save(folder / "run")

        atomic_dir_write(self.settings.report_dir / run.name, write)
