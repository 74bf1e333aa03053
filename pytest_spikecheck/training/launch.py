"""``train``: the one entry point that trains a scenario, on one process (the engine's
:class:`~pytest_spikecheck.training.engine.SingleProcess`) or on N ranks
(:mod:`pytest_spikecheck.training.distributed`)."""

from __future__ import annotations

from typing import Iterable

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.records.run import Run
from pytest_spikecheck.scenario import Scenario
from pytest_spikecheck.training.distributed import train_distributed
from pytest_spikecheck.training.engine import StepCallback, train_with_sharding, validate_nproc
from pytest_spikecheck.training.sharding import SingleProcess


def train(
    scenario: Scenario,
    *,
    backend: str = "auto",
    device: str = "cpu",
    threads: int = 1,
    callbacks: Iterable[StepCallback] = (),
    nproc: int = 1,
) -> Run:
    """Train ``scenario`` and return its :class:`Run`. Stops cleanly at the first non-finite
    loss or gradient norm (the step is recorded, the optimizer is not stepped).

    ``backend`` picks the clipping backend (``auto``: cupy for CUDA tensors when usable,
    else torch); ``device`` is a torch device or ``auto`` (CUDA when available); ``threads``
    pins torch's intra-op threads for the run (bit-identical reruns need the same count).
    ``nproc`` > 1 trains on that many processes with ``torch.distributed`` (gloo on CPU, NCCL
    with one GPU per rank on CUDA), the gradients and AdamW state sharded across them
    (:mod:`pytest_spikecheck.training.distributed`); ``threads`` is then per rank, callbacks are not
    accepted, and the returned run is rank 0's record of the whole model."""
    if validate_nproc(nproc) == 1 or device in ("cpu", "auto", "cuda"):  # cuda:N on ranks: distributed says why not
        check_device_and_backend(device, backend)
    if nproc > 1:
        return train_distributed(scenario, nproc=nproc, backend=backend, device=device, threads=threads, callbacks=callbacks)
    return train_with_sharding(scenario, SingleProcess(), backend=backend, device=device, threads=threads, callbacks=callbacks)


def check_device_and_backend(device: str, backend: str) -> None:
    """Refuse, in one line and before anything trains, a device or clipping backend this machine
    cannot run (a CUDA device on a CPU-only machine, the cupy backend without CUDA)."""
    import torch

    from pytest_spikecheck.clipping import unavailable_reason

    if device not in ("cpu", "auto"):
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise ConfigError(f"device {device!r} is not a torch device ({exc})") from None
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                build = "a CPU-only torch build" if torch.version.cuda is None else f"torch {torch.__version__}"
                raise ConfigError(
                    f"device {device!r} needs a CUDA device, and there is none usable here ({build}); train on cpu or auto"
                )
            if dev.index is not None and dev.index >= torch.cuda.device_count():
                raise ConfigError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if backend != "auto":
        reason = unavailable_reason(backend)
        if reason is not None:
            raise ConfigError(f"clipping backend {backend!r} cannot run here: {reason}; use --backend torch or auto")
