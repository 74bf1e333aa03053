"""The Ray executor: each point a Ray Core task (``num_cpus=1``), on a local Ray or a cluster.

``address=None`` starts a local Ray in this process (``jobs`` CPUs, all of them by default) and
stops it at the end; ``"auto"`` joins the cluster this machine is part of (``ray start --head``
ran here), ``"ray://HOST:10001"`` joins one through Ray Client; a Ray this process already
connected to is used as it is. A worker or node lost mid-point is Ray's to retry
(``max_retries``); a point that raises comes back as a failed outcome from
:func:`~pytest_spikecheck.sweep.worker.run_point` and is never retried (it would raise again).
Results come back to the driver, which alone writes the run store and the outputs: the workers
need no shared disk, only the package (installed, or shipped with ``runtime_env``).

Ray is the ``ray`` extra (``pip install 'pytest-spikecheck[ray]'``), imported here only.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Iterator, Mapping, Sequence

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.sweep.worker import Outcome, PointJob, one_line, run_point


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError("the ray executor needs Ray: pip install 'pytest-spikecheck[ray]'") from None
    return ray


def ray_point(job: PointJob) -> Outcome:
    """:func:`run_point` on a Ray worker, which names its node."""
    import ray

    outcome = run_point(job)
    outcome.where = ray.get_runtime_context().get_node_id()
    return outcome


class RayExecutor:
    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        jobs: int | None = None,
        max_retries: int = 3,
        runtime_env: Mapping[str, Any] | None = None,
    ) -> None:
        if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
            raise ConfigError(f"jobs must be a positive integer, was {jobs!r}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ConfigError(f"max_retries must be an integer >= 0, was {max_retries!r}")
        if address is not None and (not isinstance(address, str) or not address):
            raise ConfigError(f"address must be None (a local Ray), 'auto' or 'ray://HOST:PORT', was {address!r}")
        self.ray = import_ray()  # before anything trains: its absence is one line
        self.address = address
        self.jobs = jobs
        self.max_retries = max_retries
        self.runtime_env = dict(runtime_env) if runtime_env else None

    def describe(self) -> str:
        where = "a local Ray" if self.address is None else f"Ray at {self.address}"
        return f"ray ({where}" + (f", at most {self.jobs} points at a time)" if self.jobs else ")")

    def _connect(self) -> bool:
        """Connect (True: this call started or joined Ray, and ends it after the sweep)."""
        ray = self.ray
        if ray.is_initialized():
            return False
        options: dict[str, Any] = {"logging_level": logging.WARNING, "include_dashboard": False}
        if self.runtime_env:
            options["runtime_env"] = self.runtime_env
        if self.address is None and self.jobs:
            options["num_cpus"] = self.jobs
        try:
            with _without_token_notice(local=self.address is None):
                ray.init(address=self.address, **options)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ConfigError(
                f"could not start or join Ray at {self.address or 'a local Ray'}: {one_line(exc)} "
                f"(a cluster is started with `ray start --head`)"
            ) from None
        return True

    def run(self, jobs: Sequence[PointJob], deliver: Callable[[Outcome], None]) -> None:
        ray = self.ray
        started_here = self._connect()
        task = ray.remote(num_cpus=1, max_retries=self.max_retries, retry_exceptions=False)(ray_point)
        pending = list(jobs)
        pending.reverse()  # pop() from the end: the first job goes first
        window = self.jobs or len(pending)
        in_flight: dict[Any, PointJob] = {}
        try:
            while pending or in_flight:
                while pending and len(in_flight) < window:
                    job = pending.pop()
                    in_flight[task.remote(job)] = job
                ready, _ = ray.wait(list(in_flight), num_returns=1)
                for ref in ready:
                    job = in_flight.pop(ref)
                    try:
                        outcome = ray.get(ref)
                    except ray.exceptions.RayError as exc:  # retries spent: the worker or node kept dying
                        outcome = Outcome(job.index, error=one_line(exc))
                    deliver(outcome)
        except BaseException:  # Ctrl-C, or deliver raised: cancel what runs, keep what finished
            for ref in in_flight:
                try:
                    ray.cancel(ref, force=True)
                except Exception:  # noqa: BLE001 - already finished or gone: nothing to cancel
                    pass
            raise
        finally:
            if started_here:
                ray.shutdown()


#: The logger of Ray's notice that token authentication is on (Ray 2.60 logs it at every start
#: of a local instance, where there is nothing to act on: the token stays on, as Ray sets it).
TOKEN_NOTICE_LOGGER = "ray._private.authentication.authentication_token_setup"


class _DropTokenNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Token authentication is enabled for this Ray cluster")


@contextlib.contextmanager
def _without_token_notice(local: bool) -> Iterator[None]:
    """Ray's start without its token-authentication notice when we start a local instance
    ourselves (a cluster someone joins keeps it: its operator may want it). Only that record is
    dropped; every other warning of Ray's still shows, and authentication stays on."""
    if not local:
        yield
        return
    logger, notice = logging.getLogger(TOKEN_NOTICE_LOGGER), _DropTokenNotice()
    logger.addFilter(notice)
    try:
        yield
    finally:
        logger.removeFilter(notice)
