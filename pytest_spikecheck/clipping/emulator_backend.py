"""The ``emulator`` backend: the unmodified ``kernels/clip.cu`` compiled for the CPU.

``kernels/cuda_emulator.h`` turns CUDA threads into std::threads (see its header comment) and
``kernels/emulator_driver.cpp`` exposes one ctypes entry point. The library is built with g++ on
first use -- never at import -- and cached under ``$XDG_CACHE_HOME/pytest-spikecheck/emulator/``
(``~/.cache/...`` by default) in a file named by a hash of the sources and the compiler command,
so an edited kernel is rebuilt and an unchanged one never is.

It exists to prove the CUDA source on machines without a GPU (CI), not to be fast: ``auto`` never
picks it. Gradients are CPU tensors (or numpy arrays, see :meth:`EmulatorClipBackend.clip_arrays_`).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

import numpy as np

from pytest_spikecheck.clipping._kernel_runner import (
    ClipKernelRunner,
    KernelClipBackend,
    KernelCompileError,
    LaunchConfig,
    compile_defines,
    kernel_source,
)

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

#: The files compiled into the emulator library (all in the pytest_spikecheck.kernels package).
EMULATOR_SOURCES = ("cuda_emulator.h", "clip.cu", "emulator_driver.cpp")
EMULATOR_MAIN = "emulator_driver.cpp"

#: g++ flags. -fno-strict-aliasing: CUDA code reads float data through 128-bit integer packs,
#: which nvcc allows and g++'s aliasing rules would not.
CXX_FLAGS = ("-std=c++20", "-O2", "-shared", "-fPIC", "-pthread", "-fno-strict-aliasing", "-Wall", "-Wno-unknown-pragmas")

LIBRARY_PREFIX = "clip-emulator-"


class EmulatorLaunchError(RuntimeError):
    """The emulator refused a launch (bad launch configuration or argument list)."""


def compiler_command() -> list[str]:
    """The C++ compiler to run: ``$CXX`` (may hold arguments, e.g. ``ccache g++``) or ``g++``."""
    return shlex.split(os.environ.get("CXX") or "g++")


def default_cache_dir() -> Path:
    """Where built emulator libraries live: ``$XDG_CACHE_HOME/pytest-spikecheck/emulator``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pytest-spikecheck" / "emulator"


def _packaged_sources() -> dict[str, str]:
    return {name: kernel_source(name) for name in EMULATOR_SOURCES}


def build_emulator(sources: Mapping[str, str] | None = None, cache_dir: Path | None = None) -> Path:
    """Compile the emulator library unless a build of the same sources is cached; return its path.

    ``sources`` maps each name of :data:`EMULATOR_SOURCES` to its text (default: the packaged
    files). Raises :class:`KernelCompileError` naming the compiler's first error line.
    """
    texts = dict(_packaged_sources() if sources is None else sources)
    command = compiler_command()
    if shutil.which(command[0]) is None:
        raise KernelCompileError(command[0], f"error: compiler {command[0]!r} not found on PATH")
    flags = list(CXX_FLAGS) + list(compile_defines())

    digest = hashlib.sha256()
    for part in [*command, *flags, _compiler_version(tuple(command))]:
        digest.update(part.encode() + b"\0")
    for name in EMULATOR_SOURCES:
        digest.update(name.encode() + b"\0" + texts[name].encode() + b"\0")
    directory = cache_dir or default_cache_dir()
    library = directory / f"{LIBRARY_PREFIX}{digest.hexdigest()[:20]}.so"
    if library.exists():
        return library

    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="build-", dir=directory) as build_dir:
        for name in EMULATOR_SOURCES:
            Path(build_dir, name).write_text(texts[name], encoding="utf-8")
        output = Path(build_dir, library.name)
        result = subprocess.run(
            [*command, *flags, "-o", str(output), EMULATOR_MAIN], cwd=build_dir, capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            raise KernelCompileError(" ".join(command), result.stderr + result.stdout)
        # Atomic: a concurrent build (pytest-xdist) of the same sources writes the same bytes.
        os.replace(output, library)
    return library


@cache
def _compiler_version(command: tuple[str, ...]) -> str:
    result = subprocess.run([*command, "--version"], capture_output=True, text=True, check=False)
    return result.stdout.splitlines()[0] if result.stdout else ""


@cache
def load_emulator(library: Path | None = None) -> ctypes.CDLL:
    """The emulator library (built first if needed), with argument types declared."""
    lib = ctypes.CDLL(str(library or build_emulator()))
    lib.emulator_launch.argtypes = [
        ctypes.c_char_p,
        ctypes.c_uint,
        ctypes.c_uint,
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.c_int,
    ]
    lib.emulator_launch.restype = ctypes.c_char_p
    lib.emulator_kernel_names.argtypes = []
    lib.emulator_kernel_names.restype = ctypes.c_char_p
    for name in CONVERSIONS:
        getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        getattr(lib, name).restype = None
    return lib


#: clip.cu's bit-level conversions exported by emulator_driver.cpp: name -> (input dtype, output dtype).
CONVERSIONS = {
    "emulator_float_to_bfloat16": (np.float32, np.uint16),  # what sm_75 GPUs run
    "emulator_bfloat16_to_float": (np.uint16, np.float32),  # what every GPU runs
    "emulator_float_to_half": (np.float32, np.uint16),  # the CPU's (GPUs use cvt.rn.f16.f32)
}


def convert(name: str, values: np.ndarray, library: Path | None = None) -> np.ndarray:
    """Apply clip.cu's conversion ``name`` (a key of :data:`CONVERSIONS`) to every element of
    ``values``: float32 values or uint16 bit patterns in, the same shape out."""
    source, target = CONVERSIONS[name]
    values = np.ascontiguousarray(values, dtype=source)
    out = np.empty(values.shape, dtype=target)
    getattr(load_emulator(library), name)(values.ctypes.data, out.ctypes.data, values.size)
    return out


class EmulatorLauncher:
    """Launches clip.cu's kernels in the emulator library, cuLaunchKernel style."""

    device_type = "cpu"

    def __init__(self, library: ctypes.CDLL) -> None:
        self.library = library

    def kernel_names(self) -> list[str]:
        return self.library.emulator_kernel_names().decode().split()

    def device_key(self, device: torch.device) -> int:
        return 0  # the CPU: one "device" (tests pretend there are more to check the caches' keys)

    def load(self, device_key: int) -> ctypes.CDLL:
        return self.library  # built (or loaded from the cache) when the backend made this launcher

    def activate(self, device: torch.device) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()  # CPU: no device or stream to select

    def launch(self, module: ctypes.CDLL, kernel: str, grid: int, block: int, args: tuple[np.generic, ...]) -> None:
        values = [np.asarray(arg) for arg in args]  # 0-d arrays: each owns its argument's bytes
        pointers = (ctypes.c_void_p * len(values))(*(value.ctypes.data for value in values))
        sizes = (ctypes.c_size_t * len(values))(*(value.nbytes for value in values))
        error = module.emulator_launch(kernel.encode(), grid, block, pointers, sizes, len(values))
        if error is not None:
            raise EmulatorLaunchError(f"{kernel}<<<{grid}, {block}>>>: {error.decode()}")


class EmulatorClipBackend(KernelClipBackend):
    """Clips CPU tensors with the emulated kernels. ``config`` sets the launch parameters (the
    default is what the GPU runs); ``library`` a prebuilt emulator library (default: build)."""

    name = "emulator"

    def __init__(self, config: LaunchConfig = LaunchConfig(), library: Path | None = None) -> None:
        self.config = config
        self._library = library
        self._runner: ClipKernelRunner | None = None

    def unavailable_reason(self) -> str | None:
        compiler = compiler_command()[0]
        if shutil.which(compiler) is None:
            return f"emulator backend needs a C++20 compiler: {compiler!r} not found on PATH (set CXX)"
        return None

    @property
    def runner(self) -> ClipKernelRunner:
        """The kernel runner; the first access builds (or loads) the emulator library."""
        if self._runner is None:
            self._runner = ClipKernelRunner(EmulatorLauncher(load_emulator(self._library)), self.config)
        return self._runner

    def clip_arrays_(self, arrays: list[np.ndarray], max_norm: float) -> tuple[float, float]:
        """Clip float32 / float16 numpy arrays in place (zero-copy views); return (norm, scale)."""
        import torch

        total_norm, scale = self.clip_([torch.from_numpy(array) for array in arrays], max_norm)
        return float(total_norm), float(scale)


BACKEND = EmulatorClipBackend()
