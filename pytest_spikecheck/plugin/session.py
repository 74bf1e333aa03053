"""The per-session scenario runner behind the ``spikecheck`` fixture.

It trains each distinct scenario once per session, across xdist workers too: the runs go into a
:class:`~pytest_spikecheck.training.store.RunStore` (whose key says what made a run) under the
report directory (``--spikecheck-report``: a disk cache that outlives the session) or, under
xdist without one, in the session's shared temporary folder. The first worker that needs a
scenario trains it under the store's lock; the others wait and load it. The session counts how
each run came (trained, loaded from another worker, from the disk cache), writes each scenario's
report folder, and keeps the rows of the summary. The engine (and torch) are imported on the
first ``run()``.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the store imports records (numpy, yaml): loading the plugin stays light
    from pytest_spikecheck.progress import Progress
    from pytest_spikecheck.report.summary import ScenarioRow
    from pytest_spikecheck.training.store import Provenance, RunKey, RunStore


@dataclass(frozen=True)
class Settings:
    enabled: bool = False
    backend: str = "auto"
    device: str = "cpu"
    report_dir: Path | None = None
    seed: int | None = None
    threads: int = 1


@dataclass
class SpikecheckSession:
    settings: Settings
    #: this test session's id (xdist: the run's id, the same on every worker): a stored run
    #: labelled with it was trained by another worker of this session, not found on disk
    session_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    #: the xdist worker this session runs on ("gw0"), None outside xdist
    worker: str | None = None
    #: a folder every worker of this session sees (xdist), where runs are shared without a report
    shared_dir: Path | None = None
    progress: Progress | None = None
    rows: dict[str, ScenarioRow] = field(default_factory=dict)
    #: how this process got its runs: "trained", "worker" (another worker's), "disk" (an earlier session's)
    counts: Counter[str] = field(default_factory=Counter)
    _runs: dict[str, Any] = field(default_factory=dict)
    _backend: str | None = None
    #: name -> content hash of every scenario run this session (a name must mean one scenario)
    _hash_by_name: dict[str, str] = field(default_factory=dict)
    #: names of the scenarios the current test asked for (the plugin links them to its report)
    used_by_current_test: set[str] = field(default_factory=set)

    @property
    def trained(self) -> int:
        return self.counts["trained"]

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

    def _store(self, key: RunKey) -> RunStore | None:
        """Where a run of ``key`` is shared: the disk cache under the report directory, else (under
        xdist) the session's shared folder; None when it cannot be (an unhashable factory) or
        need not be (one process, no report)."""
        from pytest_spikecheck.training.store import RunStore

        if not key.shareable:
            return None
        if self.settings.report_dir is not None:
            root = self.settings.report_dir / ".cache"
        elif self.shared_dir is not None:
            root = self.shared_dir / "spikecheck-runs"
        else:
            return None
        return RunStore(root, session=self.session_id, writer=self.worker or "main", warn=self._warn)

    def _warn(self, message: str) -> None:
        """One line on the terminal (a damaged cache entry), even with -q."""
        import sys

        stream = self.progress.stream if self.progress is not None else sys.stderr
        prefix = self.progress.prefix if self.progress is not None else "spikecheck: "
        stream.write(f"{prefix}{message}\n")
        stream.flush()

    def run(self, scenario: Any, name: str | None = None) -> Any:
        """Train ``scenario`` (or return this session's, another worker's or the disk cache's run of it)."""
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

            raise ConfigError(
                f"two different scenarios are both named {scenario.name!r}: summary rows and report "
                f"folders are keyed by name, so give each one (each sweep point) its own name, or "
                f"leave the name out (a derived name is unique to the content)"
            )
        self.used_by_current_test.add(scenario.name)
        key = self._key(scenario)
        if key.tag not in self._runs:
            run, source, provenance = self._obtain(scenario, key)
            self.counts[source] += 1
            self._runs[key.tag] = (run, source, provenance)
        run, source, provenance = self._runs[key.tag]
        if run.name != scenario.name:
            run = run.renamed(scenario.name)
        if scenario.name not in self.rows:
            from pytest_spikecheck.report.summary import summarise

            self.rows[scenario.name] = row = summarise(run, source=source)
            if self.settings.report_dir is not None or self.worker is not None:
                row.not_cached_because = key.not_shareable_because
            # The worker that trained a run under this name has written its report folder.
            if not (source == "worker" and provenance is not None and provenance.name == scenario.name):
                self._write_report(run)
        return run

    def _obtain(self, scenario: Any, key: RunKey) -> tuple[Any, str, Provenance | None]:
        """The run of ``scenario`` and where it came from: ``trained`` here, or loaded from the
        store (``worker``: this session's, ``disk``: an earlier one's), with who stored it."""
        store = self._store(key)
        if store is None:
            return self._train(scenario), "trained", None
        from pytest_spikecheck.training.store import RunStoreLockError

        try:
            run, provenance = store.get_or_make(key, lambda: self._train(scenario))
        except RunStoreLockError as exc:
            import pytest

            pytest.fail(f"spikecheck: {exc}", pytrace=False)
        if provenance is None:
            return run, "trained", None
        run.meta["from_disk_cache"] = provenance.session != self.session_id
        run = run.renamed(scenario.name)
        return run, "worker" if provenance.session == self.session_id else "disk", provenance

    def _train(self, scenario: Any) -> Any:
        from pytest_spikecheck.progress import Progress
        from pytest_spikecheck.training.launch import train

        s = self.settings
        with (self.progress or Progress(mode="quiet")).task(scenario.name, total=scenario.steps) as task:
            run = train(
                scenario,
                backend=self.backend,
                device=s.device,
                threads=s.threads,
                callbacks=[task.step_callback()] if task.progress.mode == "bar" else [],
            )
            stopped = f", stopped at step {run.meta['stopped_at']} ({run.meta['stop_reason']})" if run.stopped_early else ""
            from pytest_spikecheck.judge.escape import terminal_text

            task.finish(terminal_text(f"trained {scenario.name}: {len(run)} steps in {run.meta['seconds']:.1f} s{stopped}"))
        run.meta["reproduce"] = (
            f"pytest --spikecheck --spikecheck-backend {self.backend}"
            + (f" --spikecheck-seed {s.seed}" if s.seed is not None else "")
            + f"  # scenario {scenario.name}, content hash {run.meta['content_hash']}"
        )
        return run

    def _write_report(self, run: Any) -> None:
        if self.settings.report_dir is None:
            return
        from pytest_spikecheck.judge.defences import QK_CLIP_FACTOR, qk_clip_tau
        from pytest_spikecheck.report import plot_attention, plot_grad_norm, plot_loss
        from pytest_spikecheck.report.summary import diagnosis_markdown, folder_name, markdown_text
        from pytest_spikecheck.training.store import atomic_dir_write

        row = self.rows[run.name]

        def write(folder: Path) -> None:
            marks = list(run.declared_events)
            plot_loss([run], folder / "loss.png", marks, title=f"{run.name}: loss")
            clip = run.facts.clip if run.facts is not None else None  # the record's limit (adaptive: until warm)
            plot_grad_norm(
                [run],
                folder / "grad_norm.png",
                marks,
                clip.max_norm if clip is not None else None,
                title=f"{run.name}: gradient norm, pre- and post-clip",
            )
            if "attn_logit_max" in run.metrics:
                plot_attention(
                    run, folder / "logits.png", qk_clip_tau(run), QK_CLIP_FACTOR, title=f"{run.name}: attention logits"
                )
            (folder / "diagnosis.md").write_text(
                f"# {markdown_text(run.name)}\n\n{markdown_text(row.description)}\n\n{diagnosis_markdown(row.diagnosis)}"
            )
            (folder / "summary.json").write_text(json.dumps(row.to_json(), indent=2))
            run.save(folder / "run")

        report_dir = self.settings.report_dir
        atomic_dir_write(report_dir / folder_name(run.name), write, within=report_dir, owned_by="summary.json")
