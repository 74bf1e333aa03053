"""The ``cupy`` backend: ``kernels/clip.cu`` compiled with NVRTC and launched through CuPy.

The module is compiled on the first clip (never at import) with ``cupy.RawModule``; CuPy caches
the binary in ``~/.cupy/kernel_cache``. Kernels run on torch's current CUDA stream, read and write
torch tensors in place and allocate through torch's caching allocator, so a clip is three
asynchronous launches with no host synchronisation. CuPy and NVRTC are imported only inside
functions.
"""

from __future__ import annotations

import contextlib
from functools import lru_cache
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

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

INSTALL_HINT = "pip install 'pytest-spikecheck[gpu]'"


@lru_cache(maxsize=None)
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


class CupyLauncher:
    """Launches clip.cu's kernels with CuPy on torch's current stream."""

    device_type = "cuda"

    def __init__(self) -> None:
        self._kernels: dict[str, Any] | None = None
        self._streams: dict[tuple[int, int], Any] = {}

    def kernels(self) -> dict[str, Any]:
        """The kernels by name; the first call compiles clip.cu (KernelCompileError on failure)."""
        if self._kernels is None:
            import cupy

            try:
                module = cupy.RawModule(code=kernel_source(), options=NVRTC_OPTIONS)
                self._kernels = {name: module.get_function(name) for name in KERNEL_NAMES}
            except cupy.cuda.compiler.CompileException as exc:
                raise KernelCompileError("NVRTC", str(exc)) from exc
        return self._kernels

    def activate(self, device: "torch.device") -> contextlib.ExitStack:
        import cupy
        import torch

        index = device.index if device.index is not None else torch.cuda.current_device()
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

    def launch(self, kernel: str, grid: int, block: int, args: tuple[np.generic, ...]) -> None:
        self.kernels()[kernel]((grid,), (block,), args)


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
