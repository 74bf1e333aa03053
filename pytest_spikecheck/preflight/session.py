"""A preflight inside a pytest session: each point trained through the ``spikecheck`` fixture
(``spikecheck.run``), so under ``pytest --spikecheck -n N`` a point is trained once, by the
first worker that asks for it, and loaded from the session's run store by every other test and
worker (the plugin's lock), and kept in the report folder's disk cache for the next session."""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from pytest_spikecheck.sweep.worker import Outcome, PointJob, one_line


class SessionExecutor:
    """A sweep executor (``run(jobs, deliver)``) whose points are the plugin session's runs."""

    name = "spikecheck session"

    def __init__(self, spikecheck: Any) -> None:
        if not callable(getattr(spikecheck, "run", None)):
            raise TypeError(f"SessionExecutor takes the spikecheck fixture, was {type(spikecheck).__name__}")
        self.spikecheck = spikecheck

    def describe(self) -> str:
        return "the spikecheck fixture (one training per point per session)"

    def run(self, jobs: Sequence[PointJob], deliver: Callable[[Outcome], None]) -> None:
        for job in sorted(jobs, key=lambda j: j.index):  # every worker asks in the same order
            started = time.perf_counter()
            try:
                run = self.spikecheck.run(job.scenario)
                deliver(Outcome(job.index, run=run, seconds=time.perf_counter() - started, where="session"))
            except Exception as exc:  # noqa: BLE001 - a point's failure is that point's, recorded
                deliver(Outcome(job.index, error=one_line(exc), seconds=time.perf_counter() - started, where="session"))
