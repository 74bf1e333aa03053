"""Run the ``kernels/clip.cu`` kernels on a list of gradients: shared by the cupy and emulator backends.

The two backends differ only in how one kernel is launched (CuPy on torch's CUDA stream, or the
C++ thread emulator on the CPU). Everything else lives here: the launch constants, the table of
gradient tensors and its cache, the argument lists and the order of the three launches. So the
emulator tests run on a CPU the same host code the GPU runs, and the emulator checks every
argument list against the kernels' real signatures.

Imports neither torch nor cupy at module level (torch is imported when a clip runs).
"""

from __future__ import annotations

import importlib.resources
import math
from collections import OrderedDict
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from pytest_spikecheck.clipping import CLIP_EPS

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

#: The kernels in clip.cu, in launch order.
KERNEL_NAMES = ("k_grad_norm_partial", "k_grad_norm_final", "k_grad_scale")

#: Gradient dtypes the kernels read, and the code each gets in the table. clip.cu receives them as
#: ``-DGRAD_DTYPE_FLOAT32=0`` etc. (:func:`compile_defines`), so this dict is their one definition.
GRAD_DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2}

#: Elements per chunk. A chunk is one block's unit of work and one slot of the partial sums.
#: 16,384 fp32 elements (64 KB) cut ANDREA-120M (98M parameters) into 6,088 chunks: enough
#: blocks to keep every SM busy, and a final reduction over only 24 KB. A small tensor is one chunk.
CHUNK_ELEMENTS = 16_384

#: The most values one 128-bit load holds (8 fp16/bf16). Chunk sizes are multiples of it, so every
#: chunk of a 16-byte-aligned tensor starts 16-byte aligned and can use vector loads.
PACK_ELEMENTS = 8

#: Threads per block of k_grad_norm_partial and k_grad_scale (8 warps).
THREADS_PER_BLOCK = 256

#: Threads of k_grad_norm_final's single block.
FINAL_THREADS = 256

WARP_SIZE = 32
MAX_THREADS_PER_BLOCK = 1024

#: Columns of the int64 table the kernels read (struct GradTableRow in clip.cu).
TABLE_COLUMNS = ("address", "numel", "first_chunk", "dtype")

#: Distinct gradient sets whose tables stay cached. Global clipping needs one; per-tensor clipping
#: of a model needs one per tensor (~150 for ANDREA-120M). An entry is ~32 bytes per tensor.
MAX_CACHED_TABLES = 256


def compile_defines() -> tuple[str, ...]:
    """The ``-D`` flags that give clip.cu its dtype codes (for NVRTC and g++ alike)."""
    return tuple(f"-DGRAD_DTYPE_{name.upper()}={code}" for name, code in GRAD_DTYPE_CODES.items())


#: Options for NVRTC besides the ones CuPy adds itself (``-arch=sm_XX``,
#: ``--device-as-default-execution-space``, and ``-ftz=true`` last, so it cannot be overridden;
#: see :func:`cupy_implicit_nvrtc_options`). clip.cu does its fp32 arithmetic in inline PTX that
#: -ftz cannot change (design choice 8 in clip.cu).
NVRTC_OPTIONS = ("-std=c++17",) + compile_defines()

#: The GPU architectures clip.cu must compile for (NVRTC, no device needed; tests/test_kernels_compile.py):
#: T4 (7.5), A100 (8.0), A10/RTX 30 (8.6), L4/RTX 40 (8.9), H100/H200 (9.0), B200 (10.0), RTX 50 (12.0).
#: NVRTC 13.0 supports every one of them (and drops everything below sm_75).
ARCHITECTURES = (75, 80, 86, 89, 90, 100, 120)


def cupy_implicit_nvrtc_options(arch: int) -> tuple[str, ...]:
    """What ``cupy.RawModule`` (CuPy 14) adds to our options for a device of compute capability
    ``arch`` (e.g. 90): the compile test uses these so it compiles exactly what the cupy backend will."""
    return (f"-arch=sm_{arch}", "--device-as-default-execution-space", "-ftz=true")


#: :func:`cupy_implicit_nvrtc_options` for an H100 / H200.
CUPY_IMPLICIT_NVRTC_OPTIONS = cupy_implicit_nvrtc_options(90)


def kernel_source(name: str = "clip.cu") -> str:
    """The text of a file in the ``pytest_spikecheck.kernels`` package (``clip.cu`` by default)."""
    return importlib.resources.files("pytest_spikecheck.kernels").joinpath(name).read_text("utf-8")


def first_error_line(log: str) -> str:
    """The compiler's first line that mentions an error (or its first non-blank line)."""
    lines = [line.strip() for line in log.replace("\x00", "").splitlines() if line.strip()]
    for line in lines:
        if "error" in line.lower():
            return line
    return lines[0] if lines else "(the compiler printed nothing)"


class KernelCompileError(ValueError):
    """A kernel source failed to compile. ``log`` holds the compiler's whole output."""

    def __init__(self, compiler: str, log: str) -> None:
        self.log = log
        super().__init__(f"clip.cu failed to compile with {compiler}: {first_error_line(log)}")


class KernelLauncher(Protocol):
    """How a backend loads and launches the kernels of clip.cu."""

    #: Device type the gradients must be on ("cuda" or "cpu").
    device_type: str

    def device_key(self, device: torch.device) -> int:
        """The id of the device whose module runs for gradients on ``device`` (a CUDA ordinal)."""

    def load(self, device_key: int) -> Any:
        """Compile / load clip.cu for that device; what ``launch`` gets back as ``module``.
        Raises (with a one-line message) when the module cannot compile or load there."""

    def activate(self, device: torch.device) -> AbstractContextManager[Any]:
        """A context in which launches run on ``device`` (for CUDA: on torch's current stream)."""

    def launch(self, module: Any, kernel: str, grid: int, block: int, args: tuple[np.generic, ...]) -> None:
        """Launch ``module``'s ``kernel<<<grid, block>>>(*args)``. Pointers are np.uint64 addresses."""


@dataclass(frozen=True)
class LaunchConfig:
    """Launch parameters. The defaults are what the GPU runs; tests shrink them to reach the
    many-chunks paths with few elements. ``max_blocks`` caps the grid of the partial and scale
    kernels (``None``: one block per chunk); any value gives bitwise the same result."""

    chunk_elements: int = CHUNK_ELEMENTS
    threads_per_block: int = THREADS_PER_BLOCK
    final_threads: int = FINAL_THREADS
    max_blocks: int | None = None

    def __post_init__(self) -> None:
        if self.chunk_elements <= 0 or self.chunk_elements % PACK_ELEMENTS or self.chunk_elements >= 2**31:
            raise ValueError(
                f"chunk_elements must be a positive multiple of {PACK_ELEMENTS} below 2**31, was {self.chunk_elements}"
            )
        for field in ("threads_per_block", "final_threads"):
            threads = getattr(self, field)
            if not (WARP_SIZE <= threads <= MAX_THREADS_PER_BLOCK and threads % WARP_SIZE == 0):
                raise ValueError(
                    f"{field} must be a multiple of {WARP_SIZE} in [{WARP_SIZE}, {MAX_THREADS_PER_BLOCK}], was {threads}"
                )
        if self.max_blocks is not None and self.max_blocks < 1:
            raise ValueError(f"max_blocks must be >= 1 or None, was {self.max_blocks}")


#: A launch that reaches the paths of large models with few elements (for tests): 2 warps per
#: block that both have work in every chunk (512 elements: 2 fp32 packs or 1 16-bit pack per
#: thread), a grid of 5 blocks that loop over chunks, and a one-warp final block that sums more
#: slots than it has threads once there are more than 32 chunks (~16k elements).
SMALL_LAUNCH = LaunchConfig(chunk_elements=512, threads_per_block=64, final_threads=32, max_blocks=5)


@dataclass(frozen=True)
class KernelOutputs:
    """What one clip wrote, as 0-d tensors on the gradients' device: the pre-clip norm (float32),
    the scale applied (float32) and k_grad_norm_final's non-finite flag (int32, 1 when the norm is
    NaN or inf: the caller can skip the optimizer step without a host sync)."""

    total_norm: torch.Tensor
    scale: torch.Tensor
    nonfinite_flag: torch.Tensor


@dataclass(frozen=True)
class _GradTable:
    rows: torch.Tensor  # int64 (num_tensors, 4) on the gradients' device
    num_tensors: int
    num_chunks: int


def _dtype_name(grad: torch.Tensor) -> str:
    return str(grad.dtype).removeprefix("torch.")


class ClipKernelRunner:
    """Clips a list of gradients with the three kernels of clip.cu through ``launcher``."""

    def __init__(self, launcher: KernelLauncher, config: LaunchConfig = LaunchConfig()) -> None:
        self.launcher = launcher
        self.config = config
        # Both caches are keyed by the launcher's device id: a module loaded on one GPU, or a table
        # copied to it, is never used on another.
        self._modules: dict[int, Any] = {}
        self._load_errors: dict[int, Exception] = {}
        self._tables: OrderedDict[tuple[Any, ...], _GradTable] = OrderedDict()
        self.table_builds = 0  # how many tables were built (tests check the cache with it)
        self.module_loads = 0  # how many modules were loaded (one per device)

    def module(self, device: torch.device) -> Any:
        """clip.cu loaded for ``device`` (compiled on first use; a failure is cached and re-raised)."""
        key = self.launcher.device_key(device)
        module = self._modules.get(key)
        if module is None:
            if key in self._load_errors:
                raise self._load_errors[key]
            try:
                module = self.launcher.load(key)
            except Exception as exc:
                self._load_errors[key] = exc
                raise
            self._modules[key] = module
            self.module_loads += 1
        return module

    def run(self, grads: list[torch.Tensor], max_norm: float) -> KernelOutputs:
        """Clip ``grads`` in place to global L2 norm ``max_norm`` (inf: measure only).

        At most three launches, whatever the number of tensors, and no host synchronisation:
        the norm, scale and flag are written to device memory and returned as tensors.
        """
        import torch

        device = self._check_grads(grads)
        module = self.module(device)
        table = self._table(grads, device)
        config = self.config
        scratch = torch.empty(max(table.num_chunks, 1), dtype=torch.float32, device=device)
        norm_and_scale = torch.empty(2, dtype=torch.float32, device=device)
        nonfinite_flag = torch.empty((), dtype=torch.int32, device=device)
        total_norm, scale = norm_and_scale[0], norm_and_scale[1]
        with np.errstate(over="ignore"):  # a max_norm above float32's range means "never clip"
            max_norm_f32 = np.float32(max_norm)

        with self.launcher.activate(device):
            self._launch_over_table(module, "k_grad_norm_partial", table, scratch)
            self.launcher.launch(
                module,
                "k_grad_norm_final",
                1,
                config.final_threads,
                (
                    np.uint64(scratch.data_ptr()),
                    np.int64(table.num_chunks),
                    max_norm_f32,
                    np.float32(CLIP_EPS),
                    np.uint64(total_norm.data_ptr()),
                    np.uint64(scale.data_ptr()),
                    np.uint64(nonfinite_flag.data_ptr()),
                ),
            )
            if not math.isinf(max_norm):
                self._launch_scale(module, table, scale)
        return KernelOutputs(total_norm, scale, nonfinite_flag)

    def scale_(self, grads: list[torch.Tensor], scale: torch.Tensor) -> None:
        """Multiply ``grads`` in place by ``scale``, a 0-d float32 tensor on their device, with
        k_grad_scale alone (one launch, no host sync). The process-group clip uses it: the scale
        comes from the norm of every rank's gradients, which no single rank's kernels can see."""
        import torch

        device = self._check_grads(grads)
        if scale.dtype != torch.float32 or scale.numel() != 1 or scale.device != device:
            raise ValueError(
                f"expected the scale as one float32 value on {device}, "
                f"was {scale.dtype} of shape {tuple(scale.shape)} on {scale.device}"
            )
        module = self.module(device)
        table = self._table(grads, device)
        with self.launcher.activate(device):
            self._launch_scale(module, table, scale.reshape(()))

    def _launch_scale(self, module: Any, table: _GradTable, scale: torch.Tensor) -> None:
        """k_grad_scale over ``table``: ``g *= *scale`` (a no-op on the device when it is 1)."""
        self._launch_over_table(module, "k_grad_scale", table, scale)

    def _launch_over_table(self, module: Any, kernel: str, table: _GradTable, buffer: torch.Tensor) -> None:
        """Launch one of the two kernels that walk every chunk of ``table``; both take the table,
        its sizes, the chunk size and one device pointer (the partial sums, or the scale)."""
        if not table.num_chunks:
            return
        config = self.config
        self.launcher.launch(
            module,
            kernel,
            self._grid(table),
            config.threads_per_block,
            (
                np.uint64(table.rows.data_ptr()),
                np.int32(table.num_tensors),
                np.int64(table.num_chunks),
                np.int64(config.chunk_elements),
                np.uint64(buffer.data_ptr()),
            ),
        )

    def _grid(self, table: _GradTable) -> int:
        """Blocks of the partial and scale kernels: one per chunk, at most ``max_blocks``."""
        return min(table.num_chunks, self.config.max_blocks or table.num_chunks)

    def _check_grads(self, grads: list[torch.Tensor]) -> torch.device:
        if not grads:
            raise ValueError("expected at least one gradient tensor, was an empty list")
        device = grads[0].device
        for index, grad in enumerate(grads):
            if grad.device.type != self.launcher.device_type:
                raise ValueError(
                    f"expected gradients on a {self.launcher.device_type} device, was gradient {index} on {grad.device}"
                )
            if grad.device != device:
                raise ValueError(f"expected every gradient on {device}, was gradient {index} on {grad.device}")
            if _dtype_name(grad) not in GRAD_DTYPE_CODES:
                raise ValueError(f"expected {', '.join(GRAD_DTYPE_CODES)} gradients, was gradient {index} of dtype {grad.dtype}")
            if not grad.is_contiguous():
                raise ValueError(
                    f"expected contiguous gradients, was gradient {index} with shape "
                    f"{tuple(grad.shape)} and strides {grad.stride()}"
                )
        return device

    def _table(self, grads: list[torch.Tensor], device: torch.device) -> _GradTable:
        """The table for these gradients, rebuilt only when an address, size or dtype changes.

        The key is exactly the table's content plus the device id and the stream (a table is
        allocated on the stream that uses it), so a cached table can never be stale or belong to
        another GPU.
        """
        import torch

        stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
        key = (self.launcher.device_key(device), stream, tuple((g.data_ptr(), g.numel(), g.dtype) for g in grads))
        table = self._tables.get(key)
        if table is not None:
            self._tables.move_to_end(key)
            return table

        chunk = self.config.chunk_elements
        rows = []
        num_chunks = 0
        for grad in grads:
            numel = grad.numel()
            if numel == 0:
                continue  # contributes nothing; a row with no chunks would confuse the search
            rows.append((grad.data_ptr(), numel, num_chunks, GRAD_DTYPE_CODES[_dtype_name(grad)]))
            num_chunks += -(-numel // chunk)
        host_rows = torch.tensor(rows, dtype=torch.int64).reshape(len(rows), len(TABLE_COLUMNS))
        if device.type == "cuda":
            # Pinned memory makes the copy asynchronous: building a table never syncs the host.
            # pin_memory() draws from torch's caching host allocator, which reuses a block once the
            # event it recorded for the previous copy from it has completed; a page-locked
            # allocation (which serialises streams) happens only while that pool grows, i.e. in the
            # first steps. Tables are cached per (device, stream, tensor set), so steady training
            # rebuilds none (docs/kernels.md, "Caches").
            host_rows = host_rows.pin_memory()
        device_rows = host_rows.to(device, non_blocking=True)

        table = _GradTable(device_rows, len(rows), num_chunks)
        self._tables[key] = table
        if len(self._tables) > MAX_CACHED_TABLES:
            self._tables.popitem(last=False)
        self.table_builds += 1
        return table


class KernelClipBackend:
    """What the cupy and emulator backends share: a clip is a :class:`ClipKernelRunner` run.
    Subclasses provide ``runner`` (how one kernel is launched) and ``unavailable_reason``."""

    name = ""

    @property
    def runner(self) -> ClipKernelRunner:  # pragma: no cover - abstract
        raise NotImplementedError

    def run(self, grads: list[torch.Tensor], max_norm: float) -> KernelOutputs:
        """Clip in place; return the norm, scale and the kernel's non-finite flag (no host sync)."""
        return self.runner.run(grads, max_norm)

    def clip_(self, grads: list[torch.Tensor], max_norm: float) -> tuple[torch.Tensor, torch.Tensor]:
        outputs = self.run(grads, max_norm)
        return outputs.total_norm, outputs.scale

    def scale_(self, grads: list[torch.Tensor], scale: torch.Tensor) -> None:
        """Multiply in place by a 0-d float32 tensor ``scale`` (k_grad_scale alone)."""
        self.runner.scale_(grads, scale)

    def device_problem(self, device: torch.device) -> str | None:
        """``None`` when clip.cu compiles and loads for ``device`` (it is then cached), else the
        one-line reason. ``auto`` asks this before it picks the backend."""
        try:
            self.runner.module(device)
        except Exception as exc:
            return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return None
