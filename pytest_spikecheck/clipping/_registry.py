"""Which clipping backends exist, which can run here, and how ``auto`` picks one.

A backend is an object with ``name`` and ``clip_(grads, max_norm) -> (total_norm, scale)``
that clips a list of gradient tensors in place with global-L2 semantics and returns two
0-d tensors on the gradients' device. ``max_norm`` is already validated (a float >= 0,
``inf`` for no clipping: measure only, the gradients are not touched). When the norm is
non-finite the backend must return it as is and leave the gradients untouched (scale 1).
``scale_(grads, scale)`` multiplies them in place by a 0-d float32 tensor: the
process-group clip measures each rank's shard with ``clip_(grads, inf)`` and scales it
with ``scale_`` once the ranks agree on the global norm. Backends are imported lazily:
importing this module imports neither torch nor cupy.
"""

from __future__ import annotations

import importlib
import warnings
from functools import cache
from typing import Any

#: Every backend name, in the order ``auto`` prefers them (emulator is never auto-picked:
#: it exists to prove the CUDA source on a CPU, not to be fast).
BACKEND_NAMES = ("cupy", "torch", "emulator")

_MODULES = {
    "torch": "pytest_spikecheck.clipping.torch_backend",
    "cupy": "pytest_spikecheck.clipping.cupy_backend",
    "emulator": "pytest_spikecheck.clipping.emulator_backend",
}


class BackendUnavailableError(RuntimeError):
    """The requested clipping backend cannot run on this machine (the message says why)."""


class SpikecheckBackendWarning(UserWarning):
    """``backend="auto"`` fell back to the torch backend because the cupy backend cannot run on
    the gradients' GPU (clip.cu does not compile or load there); the message names the GPU and the
    reason. Issued once per GPU and process. Silence it with ``backend="torch"``, or turn it into
    an error with ``-W error::pytest_spikecheck.clipping.SpikecheckBackendWarning``."""


_warned: set[str] = set()


@cache
def _load(name: str) -> Any:
    if name not in _MODULES:
        choices = ", ".join(("auto",) + BACKEND_NAMES)
        raise ValueError(f"unknown clipping backend {name!r}; choose one of {choices}")
    module = importlib.import_module(_MODULES[name])
    return module.BACKEND


def unavailable_reason(name: str) -> str | None:
    """``None`` when backend ``name`` can run here, else a one-line reason."""
    try:
        backend = _load(name)
    except ImportError as exc:  # the backend's module needs an optional dependency
        return f"{name} backend needs {exc.name or exc}: pip install 'pytest-spikecheck[gpu]'"
    return backend.unavailable_reason()


def available_backends() -> list[str]:
    """Names of the backends that can run on this machine, in ``auto``'s order of preference."""
    return [name for name in BACKEND_NAMES if unavailable_reason(name) is None]


def resolve_backend(name: str, device: Any = None) -> str:
    """Turn ``"auto"`` into a concrete backend name: cupy when a CUDA device is usable, clip.cu
    compiles and loads on it (and, if ``device`` is given, the gradients live on a CUDA device),
    else torch. When only the compile or load fails, warn once (SpikecheckBackendWarning)."""
    if name == "auto":
        on_cuda = device is None or str(device).startswith("cuda")
        if not on_cuda or unavailable_reason("cupy") is not None:
            return "torch"
        problem = _load("cupy").device_problem(device)  # compiles clip.cu for the GPU (cached)
        if problem is None:
            return "cupy"
        if problem not in _warned:
            _warned.add(problem)
            warnings.warn(f"{problem}; clipping with the torch backend instead", SpikecheckBackendWarning, stacklevel=2)
        return "torch"
    _load(name)  # unknown names raise ValueError here
    return name


def get_backend(name: str) -> Any:
    """The backend object for a concrete name; raises BackendUnavailableError if it cannot run."""
    backend = _load(name)
    reason = backend.unavailable_reason()
    if reason is not None:
        raise BackendUnavailableError(reason)
    return backend
