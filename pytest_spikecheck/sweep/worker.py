"""What a worker does with one point, whichever executor runs it: check that it runs the code the
driver keyed the point with, train the scenario exactly as ``train()`` would alone, and hand back
the run, or the error in one line. Only this function runs on workers; the store, the outputs
and the progress stay with the driver. torch is imported when a point trains."""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from pytest_spikecheck.scenario import Scenario


@dataclass(frozen=True)
class PointJob:
    """A point to train: its index in the sweep, the scenario, and how to train it (a concrete
    clipping backend, the device, the torch threads); ``key`` is the driver's run-store key tag."""

    index: int
    scenario: Scenario
    backend: str
    device: str
    threads: int
    key: str
    key_shareable: bool = True


@dataclass
class Outcome:
    """What came back for a point: the run, or the error (one line). ``where`` names the worker
    (``host:pid``; a Ray node id with the ray executor), ``seconds`` its wall time there."""

    index: int
    run: Any = None
    error: str | None = None
    seconds: float = 0.0
    where: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None


def one_line(exc: BaseException) -> str:
    """``Type: message`` on one line (the first line of the message, which names the problem)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def run_point(job: PointJob) -> Outcome:
    """Train ``job``'s scenario with ``train()`` and return it; an exception becomes a failed
    outcome (the sweep goes on), and so does a worker whose package or torch is not the driver's
    (its run would not be the run the key promises)."""
    started = time.perf_counter()
    where = f"{socket.gethostname()}:{os.getpid()}"
    try:
        from pytest_spikecheck.training.store import run_key

        if job.key_shareable:
            mine = run_key(job.scenario, backend=job.backend, device=job.device, threads=job.threads).tag
            if mine != job.key:
                return Outcome(
                    job.index,
                    error=(
                        f"this worker's code differs from the driver's (run key {mine} here, {job.key} there): install "
                        f"the same pytest-spikecheck and torch on every worker, or ship the package with Ray's runtime_env"
                    ),
                    seconds=time.perf_counter() - started,
                    where=where,
                )
        from pytest_spikecheck.training.launch import train

        run = train(job.scenario, backend=job.backend, device=job.device, threads=job.threads)
        return Outcome(job.index, run=run, seconds=time.perf_counter() - started, where=where)
    except Exception as exc:  # noqa: BLE001 - any failure of one point is that point's, recorded
        return Outcome(job.index, error=one_line(exc), seconds=time.perf_counter() - started, where=where)
