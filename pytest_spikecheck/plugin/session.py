"""The per-session scenario runner behind the ``spikecheck`` fixture.

It trains each distinct scenario once per session, optionally caches runs on disk under the
report directory, writes each scenario's report folder, and keeps the rows of the terminal
summary. The engine (and torch) are imported on the first ``run()``.

A run is reused only by the code that made it. Its key holds the scenario's content hash, the
clipping backend, device and thread count, the package version, a digest of the package's
source (every .py, .cu and C++ file, so an edit without a version bump still retrains), the torch
version, and for a ``model_factory`` a digest of its module's source. A factory whose code
cannot be told apart by its module (a lambda, a function defined inside another) is keyed by
the object in the session and never cached on disk; the summary says so.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import importlib.util
import inspect
import json
import math
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest_spikecheck
from pytest_spikecheck import __version__

#: The source files whose text decides what a run computes (the kernels' package data too).
_SOURCE_SUFFIXES = (".py", ".cu", ".cuh", ".h", ".hpp", ".cpp")


@functools.lru_cache(maxsize=None)
def package_digest() -> str:
    """sha256 (first 12 hex digits) of the installed package's source files, with their paths,
    computed once per process. ``models`` and ``kernels`` install from top-level folders, so
    their locations are asked of the import system (without importing them: that needs torch)."""
    roots = [Path(pytest_spikecheck.__file__).parent]
    for sub in ("pytest_spikecheck.models", "pytest_spikecheck.kernels"):
        spec = importlib.util.find_spec(sub)
        roots += [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    files = {f.resolve(): f"{root.name}/{f.relative_to(root).as_posix()}"
             for root in roots for f in root.rglob("*") if f.suffix in _SOURCE_SUFFIXES and f.is_file()}
    h = hashlib.sha256()
    for path, name in sorted(files.items(), key=lambda item: item[1]):
        h.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def torch_version() -> str:
    """The installed torch's version, read from its metadata (importing torch takes seconds)."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "none"


def model_factory_digest(factory: Any) -> tuple[str | None, str | None]:
    """(digest, None) for a factory whose code its module's source decides: sha256 of that source
    and the factory's qualified name; (None, why not) for one it does not: a lambda or a
    function defined inside another (``<locals>``: it may close over values), or code without
    a source file."""
    if isinstance(factory, str):  # an import path "package.module:function"
        module_name = factory.partition(":")[0]
        try:
            spec = importlib.util.find_spec(module_name)
        except ImportError:  # its package is missing: the training says so, with the path
            spec = None
        source = spec.origin if spec is not None else None
        if source is None or not Path(source).is_file():
            return None, f"model_factory {factory} has no source file to hash, so its runs are not cached on disk"
        return hashlib.sha256(Path(source).read_bytes() + b"\0" + factory.encode()).hexdigest()[:12], None
    name = getattr(factory, "__qualname__", None) or type(factory).__qualname__
    label = f"{getattr(factory, '__module__', '?')}.{name}"
    if "<lambda>" in name or "<locals>" in name:
        kind = "a lambda" if "<lambda>" in name else "defined inside a function"
        return None, (f"model_factory {label} is {kind}: its module's source does not tell it apart from "
                      f"another, so its runs are not cached on disk (make it a module-level def to cache them)")
    module = sys.modules.get(getattr(factory, "__module__", None) or "")
    try:
        source = inspect.getsourcefile(module) if module is not None else None
    except TypeError:  # a built-in module
        source = None
    if source is None or not Path(source).is_file():
        return None, f"model_factory {label} has no source file to hash, so its runs are not cached on disk"
    digest = hashlib.sha256(Path(source).read_bytes() + b"\0" + label.encode()).hexdigest()[:12]
    return digest, None


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
    """The summary's clip-containment cell: did the post-clip norm stay under the limit, and
    not scale below it (over-clipped)? Steps whose update was skipped are left out."""
    import numpy as np

    from pytest_spikecheck.judge.analysis import CLIP_RTOL, overclipped
    from pytest_spikecheck.judge.text import fmt

    applied = ~np.isin(run.metrics["step"], np.fromiter(run.skipped, dtype=np.int64, count=len(run.skipped)))
    post = np.asarray(run.metrics["grad_norm_post"], dtype=float)[applied]
    pre = np.asarray(run.metrics["grad_norm_pre"], dtype=float)[applied]
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
    if not held:
        return f"BROKEN (max {worst} > {max_norm:g})"
    under = overclipped(pre, post, max_norm)
    if under.any():
        return f"OVER-CLIPPED (min {fmt(float(post[under].min()), '.2g')} for max_norm {max_norm:g})"
    return f"held (max {worst} ≤ {max_norm:g})"


def summarise(run: Any, cached: bool) -> ScenarioRow:
    from pytest_spikecheck.judge.analysis import EventSummary

    bursts = run.declared_events
    s = EventSummary.measure(run.metrics, bursts[0] if bursts else None)
    containment = _containment(run)
    recovery = "—" if s.step is None else (f"{s.recovery} steps" if s.recovery is not None else "not back")
    return ScenarioRow(
        scenario=run.name, steps=len(run), spike_step=s.step,
        # a step the loss scaler skipped has the overflow's norm, not the data's: no ratio to show
        spike_ratio=math.nan if str(run.skipped.get(s.step, "")).startswith("overflow") else s.ratio,
        containment=containment, recovery=recovery, cached=cached,
        stopped=run.meta["stop_reason"] if run.stopped_early else None,
    )


def _atomic_dir_write(target: Path, write) -> None:
    """Write a folder next to ``target`` and move it into place (parallel workers may race)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        write(tmp)
        if target.exists():
            shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not target.exists():
            raise


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

    def _tag(self, scenario: Any) -> str:
        """The run's key (see the module docstring); a factory that cannot be hashed is keyed by
        the object itself (``!`` marks such a key: valid in this process only)."""
        s = self.settings
        tag = (f"{scenario.content_hash()}-{self.backend}-{s.device}-t{s.threads}-v{__version__}"
               f"-src{package_digest()}-torch{torch_version()}")
        if scenario.model_factory is not None:
            digest, _ = model_factory_digest(scenario.model_factory)
            tag += f"-model{digest}" if digest is not None else f"-model!{id(scenario.model_factory):x}"
        return tag

    def _not_cached_because(self, scenario: Any) -> str | None:
        return None if scenario.model_factory is None else model_factory_digest(scenario.model_factory)[1]

    def _cache_dir(self, scenario: Any) -> Path | None:
        if self.settings.report_dir is None or self._not_cached_because(scenario) is not None:
            return None
        return self.settings.report_dir / ".cache" / self._tag(scenario)

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
        key = self._tag(scenario)
        cached = key in self._runs
        if not cached:
            run = self._load_or_train(scenario)
            self._runs[key] = run
        run = self._runs[key]
        if run.name != scenario.name:
            run = dataclasses.replace(run, scenario=run.scenario.replace(name=scenario.name))
        if scenario.name not in self.rows:
            self.rows[scenario.name] = summarise(run, cached=run.meta.get("from_disk_cache", False))
            if self.settings.report_dir is not None:
                self.rows[scenario.name].not_cached_because = self._not_cached_because(scenario)
            self._write_report(run)
        return run

    def _load_or_train(self, scenario: Any) -> Any:
        from pytest_spikecheck.records.run import Run

        cache = self._cache_dir(scenario)
        if cache is not None and (cache / "metrics.jsonl").is_file():
            run = Run.load(cache)
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
            _atomic_dir_write(cache, run.save)
        return run

    def _write_report(self, run: Any) -> None:
        if self.settings.report_dir is None:
            return
        from pytest_spikecheck.judge.diagnosis import diagnose
        from pytest_spikecheck.report import plot_grad_norm, plot_loss

        def write(folder: Path) -> None:
            marks = list(run.declared_events)
            plot_loss([run], folder / "loss.png", marks, title=f"{run.name}: loss")
            max_norm = run.scenario.max_norm
            plot_grad_norm([run], folder / "grad_norm.png", marks, None if math.isinf(max_norm) else max_norm,
                           title=f"{run.name}: gradient norm, pre- and post-clip")
            (folder / "diagnosis.md").write_text(f"# {run.name}\n\n{run.describe()}\n\n{_diagnosis_markdown(diagnose(run))}")
            (folder / "summary.json").write_text(json.dumps(self.rows[run.name].to_json(), indent=2))
            run.save(folder / "run")

        _atomic_dir_write(self.settings.report_dir / run.name, write)
