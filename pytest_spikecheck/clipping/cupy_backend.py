"""The ``cupy`` backend: ``kernels/clip.cu`` compiled with NVRTC and launched through CuPy.

The module is compiled for each GPU on its first clip (never at import) with ``cupy.RawModule``,
for that GPU's architecture; CuPy caches the binary in ``~/.cupy/kernel_cache``. When clip.cu
cannot compile or load on a GPU, ``auto`` clips with the torch backend instead (one
:class:`~pytest_spikecheck.clipping.SpikecheckBackendWarning`) and an explicit ``backend="cupy"``
raises :class:`~pytest_spikecheck.clipping.BackendUnavailableError` naming the architecture. Kernels run on torch's current CUDA stream, read and write
torch tensors in place and allocate through torch's caching allocator, so a clip is three
asynchronous launches with no host synchronisation. CuPy and NVRTC are imported only inside
functions.
"""

from __future__ import annotations

import contextlib
from functools import cache
from typing import TYPE_CHECKING, Any

import numpy as np

from pytest_spikecheck.clipping._kernel_runner import (
    KERNEL_NAMES,
    NVRTC_OPTIONS,
    ClipKernelRunner,
    KernelClipBackend,
    KernelCompileError,
    LaunchConfig,
    kernel_source,
)
from pytest_spikecheck.clipping._registry import BackendUnavailableError

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

INSTALL_HINT = "pip install 'pytest-spikecheck[gpu]'"


@cache
def cupy_unavailable_reason() -> str | None:
    """``None`` when CuPy imports, NVRTC loads and a CUDA device is usable; else a one-line reason."""
    try:
        import cupy
    except ImportError as exc:
        return f"cupy backend needs cupy ({exc}): {INSTALL_HINT}"
    try:
        device_count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDARuntimeError: no driver, no device, driver too old
        return f"cupy backend needs a CUDA device: {_one_line(exc)}"
    if device_count == 0:
        return "cupy backend needs a CUDA device: none found"
    try:
        cupy.cuda.nvrtc.getVersion()
    except Exception as exc:  # the NVRTC library is missing or does not load
        return f"cupy backend needs NVRTC ({_one_line(exc)}): {INSTALL_HINT}"
    import torch

    if not torch.cuda.is_available():
        return f"cupy backend needs torch with CUDA; this torch ({torch.__version__}) has none"
    return None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def describe_device(index: int) -> str:
    """``"sm_75 (Tesla T4)"``: the architecture and name of CUDA device ``index``."""
    import cupy

    properties = cupy.cuda.runtime.getDeviceProperties(index)
    name = properties["name"]
    name = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
    return f"sm_{properties['major']}{properties['minor']} ({name})"


def compile_and_load(index: int) -> dict[str, Any]:
    """clip.cu compiled for device ``index``'s architecture and loaded on it: the kernels by name.
    Raises KernelCompileError when NVRTC fails; CuPy's own error when loading fails."""
    import cupy

    with cupy.cuda.Device(index):
        try:
            module = cupy.RawModule(code=kernel_source(), options=NVRTC_OPTIONS)
            return {name: module.get_function(name) for name in KERNEL_NAMES}  # compiles and loads
        except cupy.cuda.compiler.CompileException as exc:
            raise KernelCompileError("NVRTC", str(exc)) from exc


class CupyLauncher:
    """Launches clip.cu's kernels with CuPy on torch's current stream; one module per device."""

    device_type = "cuda"

    def __init__(self) -> None:
        self._streams: dict[tuple[int, int], Any] = {}

    def device_key(self, device: torch.device | str | None) -> int:
        import torch

        index = None if device is None else torch.device(device).index
        return index if index is not None else torch.cuda.current_device()

    def load(self, device_key: int) -> dict[str, Any]:
        """The kernels compiled for and loaded on device ``device_key``, or BackendUnavailableError
        with one line: "the cupy clipping backend cannot run on sm_75 (Tesla T4): <reason>"."""
        try:
            return compile_and_load(device_key)
        except Exception as exc:  # NVRTC rejects the arch, the driver cannot load the cubin, ...
            reason = str(exc) if isinstance(exc, KernelCompileError) else _one_line(exc)
            try:
                where = describe_device(device_key)
            except Exception:  # the device cannot even be queried
                where = f"cuda:{device_key}"
            raise BackendUnavailableError(f"the cupy clipping backend cannot run on {where}: {reason}") from exc

    def activate(self, device: torch.device) -> contextlib.ExitStack:
        import cupy
        import torch

        index = self.device_key(device)
        stream_pointer = torch.cuda.current_stream(index).cuda_stream
        stream = self._streams.get((index, stream_pointer))
        if stream is None:
            # torch 2.11 has no __cuda_stream__ protocol; wrap the raw handle instead.
            stream = cupy.cuda.ExternalStream(stream_pointer, index)
            self._streams[(index, stream_pointer)] = stream
        stack = contextlib.ExitStack()
        stack.enter_context(cupy.cuda.Device(index))
        stack.enter_context(stream)
        return stack

    def launch(self, module: dict[str, Any], kernel: str, grid: int, block: int, args: tuple[np.generic, ...]) -> None:
        module[kernel]((grid,), (block,), args)


class CupyClipBackend(KernelClipBackend):
    """Clips CUDA tensors with clip.cu through CuPy. ``config`` sets the launch parameters."""

    name = "cupy"

    def __init__(self, config: LaunchConfig = LaunchConfig()) -> None:
        self.config = config
        self._runner: ClipKernelRunner | None = None

    @staticmethod
    def unavailable_reason() -> str | None:
        return cupy_unavailable_reason()

    @property
    def runner(self) -> ClipKernelRunner:
        if self._runner is None:
            self._runner = ClipKernelRunner(CupyLauncher(), self.config)
        return self._runner


BACKEND = CupyClipBackend()
