"""The local executor: points trained on this machine, ``jobs`` at a time, each in a spawned
1-thread worker process (``jobs=1``: in this process, one after the other).

Spawned, not forked: a forked child would inherit torch's thread pools mid-state. Spawn
re-imports the main module in every worker, so a script that starts a sweep at its top level
without ``if __name__ == "__main__":`` kills its own workers at start-up: that is said in one line
(:class:`WorkersCouldNotStart`), not as a broken pool. A worker lost while training (killed, out of
memory) is replaced and its point trained again, up to ``max_retries`` times, as Ray does with a
lost worker. Workers ignore Ctrl-C: the driver stops them and keeps what finished. A worker whose
driver is gone (``kill -9``) ends itself within a second.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
from collections import Counter, deque
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Sequence

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.sweep.worker import Outcome, PointJob, one_line, run_point


class WorkersCouldNotStart(ConfigError):
    """The spawned worker processes exited before they could take a point (one line: why)."""


#: How often a worker checks that its driver is still there.
_DRIVER_POLL_SECONDS = 0.5


def _worker_started(started: Any, driver: int) -> None:
    # Ctrl-C reaches the whole process group: the driver decides what stops, and when.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _watch_driver(driver)
    started.set()


def _watch_driver(driver: int) -> None:
    """End this worker when its driver is gone (killed with -9, it cannot stop its workers: they
    would sit idle under pid 1, with the resource tracker, for good): a daemon thread that checks
    the parent pid twice a second."""
    import threading

    def watch() -> None:
        while os.getppid() == driver:
            time.sleep(_DRIVER_POLL_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="spikecheck-driver-watch", daemon=True).start()


def _main_module() -> str:
    main = sys.modules.get("__main__")
    return getattr(main, "__file__", None) or "the main module"


class LocalExecutor:
    name = "local"

    def __init__(self, jobs: int | None = None, max_retries: int = 3, work: Callable[[PointJob], Outcome] = run_point) -> None:
        """``work`` is what a worker does with each job: :func:`run_point` (a test gives a stand-in
        that needs no torch, to lose a worker cheaply)."""
        if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
            raise ConfigError(f"jobs must be a positive integer, was {jobs!r}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ConfigError(f"max_retries must be an integer >= 0, was {max_retries!r}")
        self.jobs = jobs or os.cpu_count() or 1
        self.max_retries = max_retries
        self.work = work

    def describe(self) -> str:
        return f"local, {self.jobs} job{'s' if self.jobs != 1 else ''}"

    def run(self, jobs: Sequence[PointJob], deliver: Callable[[Outcome], None]) -> None:
        """Train every job, handing each outcome to ``deliver`` as it arrives (in the driver)."""
        if self.jobs == 1 or len(jobs) == 1:
            for job in jobs:
                deliver(self.work(job))
            return
        if getattr(multiprocessing.current_process(), "_inheriting", False):
            # This is a spawned worker re-importing a main module that starts a sweep at its top level:
            # leave quietly (the driver says why in one line) instead of multiprocessing's page-long error.
            raise SystemExit(1)
        context = multiprocessing.get_context("spawn")
        started = context.Event()
        pending = deque(jobs)
        lost: Counter[int] = Counter()
        while pending:
            workers = min(self.jobs, len(pending))
            pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_started, initargs=(started, os.getpid()))
            in_flight: dict[Future, PointJob] = {}
            stopped = False
            try:
                while pending or in_flight:
                    # one point per worker at a time: when the pool breaks, what was in flight is known
                    while pending and len(in_flight) < workers:
                        future = pool.submit(self.work, pending[0])  # raises on a broken pool: the job stays pending
                        in_flight[future] = pending.popleft()
                    done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                    broken = [f for f in done if isinstance(f.exception(), BrokenProcessPool)]
                    for future in done:
                        if future in broken:
                            continue
                        job = in_flight.pop(future)
                        error = future.exception()
                        deliver(future.result() if error is None else Outcome(job.index, error=one_line(error)))
                    if broken:
                        raise BrokenProcessPool
            except BrokenProcessPool:
                if not started.is_set():
                    raise WorkersCouldNotStart(
                        f"the local executor's worker processes exited before they could start: each spawned worker "
                        f"re-imports the main module ({_main_module()}), so a script that starts a sweep (sweep(), "
                        f'lr_sweep()) must do so under `if __name__ == "__main__":`, or train in this process with '
                        f"jobs=1"
                    ) from None
                # A worker died mid-point (killed, out of memory): the pool is gone with every point in
                # flight; train them again on a new pool.
                for job in in_flight.values():
                    lost[job.index] += 1
                    if lost[job.index] > self.max_retries:
                        times = "once" if lost[job.index] == 1 else f"{lost[job.index]} times"
                        deliver(
                            Outcome(
                                job.index,
                                error=f"the local worker pool broke {times} while this point trained "
                                f"(a worker killed, or out of memory?)",
                            )
                        )
                    else:
                        pending.appendleft(job)
            except BaseException:  # Ctrl-C, or deliver raised: stop the workers, keep what finished
                _stop(pool)
                stopped = True
                raise
            finally:
                pool.shutdown(wait=not stopped, cancel_futures=True)


def _stop(pool: ProcessPoolExecutor) -> None:
    """Terminate the pool's workers now (``shutdown`` alone waits for the points in flight).
    Python 3.14 has ``terminate_workers()``; before it, the processes are the pool's ``_processes``."""
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        if process.is_alive():
            process.terminate()
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        process.join(timeout=5)
