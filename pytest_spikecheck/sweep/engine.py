"""``sweep()``: expand a sweep, take what the run store already holds, train the rest on an
executor, and gather the result (the table, the summaries, the files).

The driver alone keeps the books: it keys every point (``training.store.run_key``, the
plugin's disk-cache key), looks it up in the run store, hands the missing points to the
executor, and as each outcome arrives stores the run, writes ``runs/<point>/`` and advances the
progress. So a sweep stopped anywhere (Ctrl-C, a crash, a lost cluster) keeps every point that
finished, and the next invocation trains only the rest.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Mapping, Sequence

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.progress import Progress
from pytest_spikecheck.records.integrity import is_whole, link_run
from pytest_spikecheck.report.summary import folder_name
from pytest_spikecheck.scenario import Scenario
from pytest_spikecheck.sweep.result import PointRow, SweepResult, row_for
from pytest_spikecheck.sweep.spec import Point, Sweep, axis_value
from pytest_spikecheck.sweep.summary import measure
from pytest_spikecheck.sweep.worker import Outcome, PointJob
from pytest_spikecheck.training.store import RunStore, run_key

EXECUTORS = ("local", "ray")
#: The run store's folder inside a sweep's output folder (unless ``store=`` puts it elsewhere).
STORE_DIR = ".store"


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped the sweep: ``result`` holds what finished (the rest is ``not run``); the
    outputs and the run store were written before this was raised."""

    def __init__(self, result: SweepResult) -> None:
        super().__init__(f"sweep {result.name} interrupted: {result.counts_text()}")
        self.result = result


def make_executor(
    executor: Any,
    *,
    jobs: int | None = None,
    address: str | None = None,
    max_retries: int = 3,
    runtime_env: Mapping[str, Any] | None = None,
) -> Any:
    """An executor by name (``local``, ``ray``), or an executor object passed through."""
    if not isinstance(executor, str):
        return executor
    if executor == "local":
        if address is not None:
            raise ConfigError("an address is for the ray executor; the local executor trains on this machine")
        if runtime_env is not None:
            raise ConfigError("runtime_env is for the ray executor")
        from pytest_spikecheck.sweep.local import LocalExecutor

        return LocalExecutor(jobs=jobs, max_retries=max_retries)
    if executor == "ray":
        from pytest_spikecheck.sweep.ray_executor import RayExecutor

        return RayExecutor(address=address, jobs=jobs, max_retries=max_retries, runtime_env=runtime_env)
    raise ConfigError(f"unknown executor {executor!r}; choose one of {', '.join(EXECUTORS)}")


def sweep(
    base: Scenario | Sweep,
    grid: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]] | None = None,
    *,
    recipes: Mapping[str, Sequence[Any]] | None = None,
    executor: Any = "local",
    jobs: int | None = None,
    address: str | None = None,
    out: str | Path | None = None,
    fresh: bool = False,
    store: str | Path | None = None,
    progress: bool | str | Progress = True,
    max_retries: int = 3,
    runtime_env: Mapping[str, Any] | None = None,
    backend: str = "auto",
    device: str = "cpu",
    threads: int = 1,
    name: str | None = None,
) -> SweepResult:
    """Train every point of a sweep and return its :class:`SweepResult`.

    ``base`` is a :class:`Sweep`, or a scenario with ``grid`` (a mapping of dotted field paths to
    lists of values, crossed; or a list of such mappings: explicit points) and ``recipes``
    (name -> breaks added to the base's). ``executor`` is ``"local"`` (spawned 1-thread worker
    processes, ``jobs`` at a time; ``jobs=1`` trains in this process) or ``"ray"`` (a Ray task
    per point; ``address`` None starts a local Ray, ``"auto"`` or ``"ray://..."`` joins a cluster;
    ``runtime_env`` is Ray's). Every run is bit-identical to ``train()`` of its scenario alone.

    With ``out``, finished runs are kept in the run store (``out/.store``, or ``store``) under
    the plugin's disk-cache key, so a rerun trains only the missing points (``fresh=True``
    retrains them all), and ``out`` receives ``runs/<point>/``, sweep.csv, sweep.json,
    sweep.md and the panels. A point that raises is recorded as failed with its error, and the
    sweep goes on. Ctrl-C raises :class:`SweepInterrupted` once the finished points are written.
    ``progress``: True (a bar on a terminal, a line per point otherwise), False, a mode
    (``bar``, ``lines``, ``quiet``) or a :class:`~pytest_spikecheck.progress.Progress`."""
    if isinstance(base, Sweep) and (grid is not None or recipes is not None):
        raise ConfigError(
            "sweep(): a Sweep carries its own grid and recipes; give grid= and recipes= with a base "
            "Scenario, or put them in the Sweep"
        )
    plan = base if isinstance(base, Sweep) else _plan(base, grid, recipes, name)
    points = plan.expand()  # every point checked before anything trains (once: load_sweep's are reused)
    if name is not None:
        plan = dataclasses.replace(plan, name=name)
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ConfigError(f"threads must be a positive integer, was {threads!r}")
    runner = make_executor(executor, jobs=jobs, address=address, max_retries=max_retries, runtime_env=runtime_env)
    from pytest_spikecheck.clipping import resolve_backend

    backend = resolve_backend(backend, None if device == "auto" else device)
    out = Path(out) if out is not None else None
    if out is not None and out.exists() and not out.is_dir():
        raise ConfigError(f"out {out} is an existing file; a sweep writes a folder: give a folder path")
    runs_store = (
        RunStore(store if store is not None else out / STORE_DIR, session=uuid.uuid4().hex, writer="sweep")
        if (store is not None or out is not None)
        else None
    )
    keys = [run_key(p.scenario, backend=backend, device=device, threads=threads) for p in points]
    books = _Books(
        plan.name or plan.base.name,
        plan.axes,
        points,
        out,
        runs_store,
        keys,
        _progress(progress),
        getattr(runner, "describe", lambda: str(runner))(),
    )
    started = time.perf_counter()
    todo: list[PointJob] = []
    elsewhere: list[Point] = []  # claimed by another sweep on this store: wait for its run
    with books.task:
        try:
            for point, key in zip(points, keys):
                shared = runs_store is not None and key.shareable and not fresh
                found = runs_store.get(key) if shared else None
                if found is not None:
                    books.record(point, found[0], "cached")
                elif shared and not runs_store.claim(key):
                    elsewhere.append(point)
                else:
                    todo.append(_job(point, key, backend, device, threads))
            while todo or elsewhere:
                todo.sort(key=lambda job: -points[job.index].cost)  # the dearest first: the last to finish is a cheap one
                if todo:
                    runner.run(todo, books.deliver)
                todo = _collect(elsewhere, runs_store, keys, books, backend, device, threads)
        except KeyboardInterrupt:
            result = books.result(time.perf_counter() - started, interrupted=True)
            books.task.finish(f"{result.name}: interrupted after {result.counts_text()}")
            raise SweepInterrupted(result) from None
        finally:
            if runs_store is not None:
                for key in keys:
                    if key.shareable:
                        runs_store.release(key)
        result = books.result(time.perf_counter() - started)
        books.task.finish(f"{result.name}: {len(points)} points ({result.counts_text()}) in {result.wall_seconds:.0f} s")
    return result


def _job(point: Point, key: Any, backend: str, device: str, threads: int) -> PointJob:
    return PointJob(point.index, point.scenario, backend, device, threads, key.tag, key.shareable)


def _collect(
    elsewhere: list[Point], store: Any, keys: list, books: _Books, backend: str, device: str, threads: int
) -> list[PointJob]:
    """Wait for the points another sweep on the same store claimed: each is ``cached`` once its
    claim is released with the run stored; one whose claim was dropped without a run (that sweep
    failed or stopped) is claimed here and returned, to train. Empties ``elsewhere``."""
    todo: list[PointJob] = []
    waited = time.monotonic()
    while elsewhere:
        for point in list(elsewhere):
            key = keys[point.index]
            if store.claimed_elsewhere(key):
                continue
            found = store.get(key)
            if found is not None:
                books.record(point, found[0], "cached")
                elsewhere.remove(point)
            elif store.claim(key):
                todo.append(_job(point, key, backend, device, threads))
                elsewhere.remove(point)
        if todo:
            break
        if elsewhere:
            if time.monotonic() - waited > store.lock_timeout:
                raise ConfigError(
                    f"waited {store.lock_timeout:g} s for another sweep on {store.root} to train "
                    f"{len(elsewhere)} of this sweep's points"
                )
            time.sleep(0.2)
    return todo


def _plan(base: Any, grid: Any, recipes: Any, name: str | None) -> Sweep:
    if not isinstance(base, Scenario):
        raise ConfigError(f"sweep() takes a Scenario or a Sweep, was {type(base).__name__}")
    if grid is None:
        grid = {}
    if isinstance(grid, Mapping):
        return Sweep(base, grid=grid, recipes=recipes, name=name or "")
    return Sweep(base, points=list(grid), recipes=recipes, name=name or "")


def _progress(progress: bool | str | Progress) -> Progress:
    if isinstance(progress, Progress):
        return progress
    if progress is True:
        return Progress(sys.stderr)
    if progress is False:
        return Progress(sys.stderr, mode="quiet")
    return Progress(sys.stderr, mode=progress)


class _Books:
    """The driver's record of a sweep as outcomes arrive: runs, rows, store, files, progress."""

    def __init__(
        self,
        name: str,
        axes: tuple[str, ...],
        points: list[Point],
        out: Path | None,
        store: RunStore | None,
        keys: list,
        progress: Progress,
        executor: str,
    ) -> None:
        self.name, self.axes, self.points, self.out, self.store, self.keys = name, axes, points, out, store, keys
        self.executor = executor
        self.runs: list[Any] = [None] * len(points)
        self.rows: list[PointRow | None] = [None] * len(points)
        self.task = progress.task(name, total=len(points), unit="point")

    def record(self, point: Point, run: Any, status: str, where: str = "") -> None:
        renamed = run.name != point.name
        if renamed:  # the store's copy may carry another name for the same content
            run = run.renamed(point.name)
        self.runs[point.index] = run
        measured = measure(run)
        self.rows[point.index] = row_for(point, status, measured, where=where)
        if self.out is not None:
            folder = self.out / "runs" / folder_name(point.name)  # as the plugin's report names its folders
            if status != "cached" or not is_whole(folder):  # a cut or half-written copy is written again
                key = self.keys[point.index]
                entry = self.store.path(key) if self.store is not None and key.shareable else None
                if entry is not None and not renamed and is_whole(entry):
                    link_run(entry, folder)  # the store's files under a second name: each run on disk once
                else:
                    run.save(folder)
            self.rows[point.index] = dataclasses.replace(self.rows[point.index], run=f"runs/{folder.name}")
        self.task.update(outcome=status)
        self.task.line(
            f"[{self.task.done}/{len(self.points)}] {point.name}: {status}"
            + (f" in {measured.seconds:.1f} s" if status == "done" else "")
            + f", final eval loss {measured.final_eval_loss:.3f}"
        )

    def deliver(self, outcome: Outcome) -> None:
        point = self.points[outcome.index]
        if outcome.ok:
            key = self.keys[point.index]
            if self.store is not None and key.shareable:
                self.store.put(key, outcome.run)
                self.store.release(key)  # another sweep waiting for this point finds it stored
            self.record(point, outcome.run, "done", outcome.where)
            return
        if self.store is not None and self.keys[point.index].shareable:
            self.store.release(self.keys[point.index])
        self.rows[point.index] = row_for(point, "failed", seconds=outcome.seconds, error=outcome.error, where=outcome.where)
        self.task.update(outcome="failed")
        self.task.line(f"[{self.task.done}/{len(self.points)}] {point.name}: failed: {outcome.error}")

    def result(self, wall_seconds: float, interrupted: bool = False) -> SweepResult:
        rows = [row if row is not None else row_for(point, "not run") for point, row in zip(self.points, self.rows)]
        # every row names every axis: explicit points may set different ones; an axis a point does
        # not set holds its scenario's value (the base's), so rows sort and group on every axis
        rows = [r.with_axes(self.axes, lambda a, p=p: axis_value(p.scenario, a)) for p, r in zip(self.points, rows)]
        result = SweepResult(
            self.name,
            self.axes,
            self.points,
            rows,
            list(self.runs),
            executor=self.executor,
            wall_seconds=wall_seconds,
            interrupted=interrupted,
        )
        if self.out is not None:
            result.write(self.out)
        return result
