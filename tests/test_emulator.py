"""The emulator backend: the unmodified kernels/clip.cu running on the CPU through cuda_emulator.h.

These tests run the host code the GPU runs too (_kernel_runner.py): the tensor table and its
cache, the argument lists (checked against the kernels' signatures) and the launch sequence.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from pytest_spikecheck.clipping import clip_grads_
from pytest_spikecheck.clipping import emulator_backend
from pytest_spikecheck.clipping._kernel_runner import CHUNK_ELEMENTS, KERNEL_NAMES, KernelCompileError, SMALL_LAUNCH, LaunchConfig
from pytest_spikecheck.clipping.emulator_backend import (
    EMULATOR_SOURCES,
    EmulatorClipBackend,
    EmulatorLauncher,
    EmulatorLaunchError,
    build_emulator,
    load_emulator,
)

REASON = emulator_backend.BACKEND.unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"needs the emulator: {REASON}")


def random_grads(shapes, dtype=torch.float32, seed=0, scale=1.0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(shape, generator=generator) * scale).to(dtype) for shape in shapes]


def float64_norm(grads) -> float:
    return math.sqrt(sum(float(torch.sum(g.double() ** 2)) for g in grads))


def assert_scaled_exactly(clipped, original, scale) -> None:
    """Each element is g * scale in float32, rounded to the gradient's dtype (torch's arithmetic)."""
    for after, before in zip(clipped, original, strict=True):
        expected = (before.float() * scale).to(before.dtype)
        assert torch.equal(after, expected)


@pytest.fixture(scope="module")
def emulator():
    return EmulatorClipBackend()


# ---------------------------------------------------------------------------------------------
# Building


def test_library_launches_every_kernel_of_clip_cu():
    assert EmulatorLauncher(load_emulator()).kernel_names() == list(KERNEL_NAMES)


def test_build_is_cached_by_source_hash_and_an_edited_source_gets_its_own_library(tmp_path, monkeypatch):
    sources = {name: emulator_backend.kernel_source(name) for name in EMULATOR_SOURCES}
    # The packaged sources' library, as the session built it once (a g++ build is ~3 CPU-s), in
    # a cache folder of its own under the name their hash gives it
    built = build_emulator()
    shutil.copy(built, tmp_path / built.name)
    real_run = emulator_backend.subprocess.run

    def no_compiler(*args, **kwargs):
        raise AssertionError("the cached library should have been reused")

    monkeypatch.setattr(emulator_backend.subprocess, "run", no_compiler)
    first = build_emulator(cache_dir=tmp_path)
    assert first == tmp_path / built.name
    assert build_emulator(cache_dir=tmp_path) == build_emulator(dict(sources), cache_dir=tmp_path) == first
    # The edit must go to the compiler. A stand-in for g++ (the session's build and the
    # compile-error test below run the real one) checks that it gets the edited text and writes
    # the library where -o says, as g++ would.
    compiled = []

    def compiler(command, *, cwd=None, **kwargs):
        if "--version" in command:
            return real_run(command, cwd=cwd, **kwargs)
        compiled.append(Path(cwd, "clip.cu").read_text(encoding="utf-8"))
        shutil.copy(built, command[command.index("-o") + 1])
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(emulator_backend.subprocess, "run", compiler)
    sources["clip.cu"] += "\n// an edit\n"
    edited = build_emulator(sources, cache_dir=tmp_path)  # compiled into the folder it was given
    assert compiled == [sources["clip.cu"]]
    assert edited != first and edited.parent == tmp_path and edited.exists() and first.exists()


def test_compile_error_names_the_first_error_line(tmp_path):
    sources = {name: emulator_backend.kernel_source(name) for name in EMULATOR_SOURCES}
    lines = sources["clip.cu"].splitlines()
    broken_line = next(i for i, line in enumerate(lines) if "k_grad_scale(" in line) + 1
    lines.insert(broken_line - 1, "this is not C++;")
    sources["clip.cu"] = "\n".join(lines)

    with pytest.raises(
        KernelCompileError, match=rf"clip.cu failed to compile with g\+\+: clip.cu:{broken_line}:\d+: error:"
    ) as info:
        build_emulator(sources, cache_dir=tmp_path)
    assert "this is not C++" in info.value.log
    assert not list(tmp_path.glob("*.so"))


def test_missing_compiler_is_reported(monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    assert EmulatorClipBackend().unavailable_reason() == (
        "emulator backend needs a C++20 compiler: '/nonexistent/g++' not found on PATH (set CXX)"
    )
    with pytest.raises(KernelCompileError, match="compiler '/nonexistent/g\\+\\+' not found on PATH"):
        build_emulator(cache_dir=tmp_path)


def test_cache_dir_follows_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert emulator_backend.default_cache_dir() == tmp_path / "pytest-spikecheck" / "emulator"


# ---------------------------------------------------------------------------------------------
# Launch checks: the emulator holds every argument list to the kernel's real signature


def final_kernel_args(num_chunks=np.int64(1)):
    partial = np.zeros(1, np.float32)
    outputs = np.zeros(2, np.float32)
    flag = np.zeros(1, np.int32)
    pointers = (partial.ctypes.data, outputs.ctypes.data, outputs[1:].ctypes.data, flag.ctypes.data)
    args = (
        np.uint64(pointers[0]),
        num_chunks,
        np.float32(1.0),
        np.float32(1e-6),
        np.uint64(pointers[1]),
        np.uint64(pointers[2]),
        np.uint64(pointers[3]),
    )
    return args, (partial, outputs, flag)


@pytest.mark.parametrize(
    "kernel, block, args_change, message",
    [
        ("k_grad_norm_final", 48, None, "expected a block of 32..1024 threads in whole warps, was 48 threads"),
        ("k_grad_norm_final", 32, "int32", "k_grad_norm_final: argument 1: expected 8 bytes, was 4"),
        ("k_grad_norm_final", 32, "drop", "k_grad_norm_final: expected 7 arguments, was 6"),
        ("k_no_such_kernel", 32, None, "unknown kernel k_no_such_kernel"),
    ],
)
def test_launch_errors_are_clear(kernel, block, args_change, message):
    args, _buffers = final_kernel_args(np.int32(1) if args_change == "int32" else np.int64(1))
    if args_change == "drop":
        args = args[:-1]
    with pytest.raises(EmulatorLaunchError, match=rf"^{kernel}<<<1, {block}>>>: {message}$"):
        EmulatorLauncher(load_emulator()).launch(load_emulator(), kernel, 1, block, args)


# Python 3.12+ warns that forking a multi-threaded process may deadlock: the point of this test.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork:DeprecationWarning")
def test_a_forked_child_launches_with_threads_of_its_own():
    """The block's threads are one team per process, reused by every launch; a child forked after
    a launch holds none of them (fork copies only the calling thread), so it must start its own
    team rather than wait for the parent's threads forever."""
    args, (partial, outputs, _flag) = final_kernel_args()
    launcher = EmulatorLauncher(load_emulator())
    partial[0] = 9.0
    launcher.launch(launcher.library, "k_grad_norm_final", 1, 64, args)  # the parent's team exists
    assert outputs[0] == 3.0
    pid = os.fork()
    if pid == 0:  # the child: report through the exit status, never return into pytest
        status = 2
        try:
            partial[0] = 16.0
            launcher.launch(launcher.library, "k_grad_norm_final", 1, 64, args)
            status = 0 if outputs[0] == 4.0 else 1
        finally:
            os._exit(status)
    deadline = time.monotonic() + 60  # a guard against a hang, not a time limit on the launch
    while (finished := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    if finished[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child's launch did not return: it waited for its parent's threads")
    assert os.waitstatus_to_exitcode(finished[1]) == 0, "the forked child's launch gave a wrong norm"


# Two Python threads launching two different kernels at once (ctypes releases the GIL around each
# launch). Run in a child process so that a deadlock is killed by the timeout, not the session.
_TWO_THREADS_LAUNCHING = """
import sys, threading
import numpy as np
from pathlib import Path
from pytest_spikecheck.clipping.emulator_backend import EmulatorLauncher, load_emulator

launcher = EmulatorLauncher(load_emulator(Path(sys.argv[1])))
wrong = []

def norms():
    partial, outputs, flag = np.zeros(1, np.float32), np.zeros(2, np.float32), np.zeros(1, np.int32)
    args = (np.uint64(partial.ctypes.data), np.int64(1), np.float32(1.0), np.float32(1e-6),
            np.uint64(outputs.ctypes.data), np.uint64(outputs[1:].ctypes.data), np.uint64(flag.ctypes.data))
    for i in range(200):
        partial[0] = float((i % 7 + 1) ** 2)
        launcher.launch(launcher.library, "k_grad_norm_final", 1, 64, args)
        if outputs[0] != i % 7 + 1:
            wrong.append(float(outputs[0]))

def scales():  # a scale of 1: the kernel returns at once, having read it
    one = np.ones(1, np.float32)
    for _ in range(200):
        launcher.launch(launcher.library, "k_grad_scale", 1, 64, (np.uint64(0), np.int32(0), np.int64(0), np.int64(512), np.uint64(one.ctypes.data)))

threads = [threading.Thread(target=norms), threading.Thread(target=scales)]
for t in threads:
    t.start()
for t in threads:
    t.join()
sys.exit(1 if wrong else 0)
"""


def test_launches_of_different_kernels_from_two_threads_take_turns():
    """The launches share one thread team, so every launch in the process must take the one lock
    (a lock per kernel signature let k_grad_norm_final and k_grad_scale hand the team two jobs at
    once: it deadlocked in the first launches)."""
    library = build_emulator()
    try:
        done = subprocess.run(
            [sys.executable, "-c", _TWO_THREADS_LAUNCHING, str(library)],
            capture_output=True,
            text=True,
            timeout=60,  # a guard against the deadlock, not a time limit on the launches
        )
    except subprocess.TimeoutExpired:
        pytest.fail("two threads launching k_grad_norm_final and k_grad_scale deadlocked the thread team")
    assert done.returncode == 0, f"a concurrent launch gave a wrong norm or failed: {done.stderr[-2000:]}"


def test_launch_config_is_validated():
    with pytest.raises(ValueError, match="chunk_elements must be a positive multiple of 8 below 2\\*\\*31, was 12"):
        LaunchConfig(chunk_elements=12)
    with pytest.raises(ValueError, match=r"threads_per_block must be a multiple of 32 in \[32, 1024\], was 48"):
        LaunchConfig(threads_per_block=48)
    with pytest.raises(ValueError, match="max_blocks must be >= 1 or None, was 0"):
        LaunchConfig(max_blocks=0)


@pytest.mark.parametrize(
    "grads, message",
    [
        (
            [torch.zeros(3, dtype=torch.float64)],
            "expected float32, float16, bfloat16 gradients, was gradient 0 of dtype torch.float64",
        ),
        (
            [torch.zeros(4), torch.zeros(4, 4).t()],
            r"expected contiguous gradients, was gradient 1 with shape \(4, 4\) and strides \(1, 4\)",
        ),
        ([torch.zeros(3, device="meta")], "expected gradients on a cpu device, was gradient 0 on meta"),
    ],
    ids=["float64", "transposed", "meta"],
)
def test_unsupported_gradients_are_rejected(emulator, grads, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        emulator.clip_(grads, 1.0)


# ---------------------------------------------------------------------------------------------
# Results


@pytest.mark.parametrize("config", [LaunchConfig(), SMALL_LAUNCH], ids=["gpu-launch", "small-launch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_clip_matches_float64_and_torch_arithmetic(config, dtype):
    shapes = [(97, 48), (48,), (1,), (130,), (0,), (3, 3, 3), (CHUNK_ELEMENTS + 9,)]
    grads = random_grads(shapes, dtype, seed=1, scale=0.05)
    original = [g.clone() for g in grads]
    outputs = EmulatorClipBackend(config).run(grads, 1.0)

    expected_norm = float64_norm(original)
    assert float(outputs.total_norm) == pytest.approx(expected_norm, rel=2e-6)
    assert float(outputs.scale) == pytest.approx(1.0 / (expected_norm + 1e-6), rel=4e-6)
    assert int(outputs.nonfinite_flag) == 0
    assert_scaled_exactly(grads, original, outputs.scale)


def test_scale_is_torchs_formula_applied_to_the_kernels_norm(emulator):
    """Same norm in, same scale out: the kernel computes max_norm / (norm + eps) as torch does."""
    for seed, max_norm in enumerate([0.1, 0.7, 3.0, 1e-3]):
        grads = random_grads([(500,), (37,)], seed=seed)
        outputs = emulator.run(grads, max_norm)
        torch_scale = torch.clamp(max_norm / (outputs.total_norm + 1e-6), max=1.0)
        assert torch.equal(outputs.scale, torch_scale)


def test_norm_is_bitwise_identical_whatever_the_grid():
    grads = random_grads([(20_000,), (7777,), (640,), (65,)], seed=2)  # 59 chunks of 512
    norms = set()
    for max_blocks in (None, 1, 3, 7, 1000):
        config = dataclasses.replace(SMALL_LAUNCH, max_blocks=max_blocks)
        for _ in range(2):
            norms.add(EmulatorClipBackend(config).run(grads, math.inf).total_norm.view(torch.int32).item())
    assert len(norms) == 1


def test_scale_one_leaves_gradients_untouched(emulator):
    grads = random_grads([(300,), (20, 3)], seed=3)
    original = [g.clone() for g in grads]
    outputs = emulator.run(grads, 1e6)
    assert float(outputs.scale) == 1.0
    assert all(torch.equal(a, b) for a, b in zip(grads, original))


def test_max_norm_beyond_float32_range_never_clips(emulator):
    grads = random_grads([(10,)], seed=4, scale=1e3)
    original = grads[0].clone()
    outputs = emulator.run(grads, 1e39)
    assert float(outputs.scale) == 1.0 and torch.equal(grads[0], original)


@pytest.mark.parametrize("bad_value, norm_is", [(math.nan, math.isnan), (math.inf, lambda n: n == math.inf)])
def test_nonfinite_flag_and_gradients_untouched(emulator, bad_value, norm_is):
    grads = random_grads([(100,), (CHUNK_ELEMENTS + 3,)], seed=5, scale=10.0)
    grads[1][CHUNK_ELEMENTS + 1] = bad_value
    original = [g.clone() for g in grads]
    outputs = emulator.run(grads, 1.0)
    assert norm_is(float(outputs.total_norm))
    assert int(outputs.nonfinite_flag) == 1
    assert float(outputs.scale) == 1.0
    for after, before in zip(grads, original):
        assert torch.equal(after.view(torch.int32), before.view(torch.int32))


@pytest.mark.parametrize("dtype, offset", [(torch.float32, 1), (torch.float16, 3), (torch.bfloat16, 1)], ids=str)
def test_misaligned_tensors_take_the_scalar_path(dtype, offset):
    """Views that start off a 16-byte boundary cannot use 128-bit loads; results must not change."""
    storage = random_grads([(5000,)], dtype, seed=6, scale=0.1)[0]
    grads = [storage[offset : offset + 4000], storage[4500 : 4500 + 130]]  # 9 chunks of 512
    assert grads[0].data_ptr() % 16 != 0
    untouched = storage.clone()
    original = [g.clone() for g in grads]
    outputs = EmulatorClipBackend(SMALL_LAUNCH).run(grads, 0.5)
    assert float(outputs.total_norm) == pytest.approx(float64_norm(original), rel=2e-6)
    assert_scaled_exactly(grads, original, outputs.scale)
    # Nothing outside the views was written.
    assert torch.equal(storage[:offset], untouched[:offset])
    assert torch.equal(storage[offset + 4000 : 4500], untouched[offset + 4000 : 4500])


def test_pointer_table_is_rebuilt_only_when_an_address_changes():
    backend = EmulatorClipBackend()
    grads = random_grads([(100,), (50,)], seed=7)
    backend.run(grads, math.inf)
    backend.run(grads, math.inf)
    grads[0].mul_(2.0)  # same storage: the table still holds
    assert backend.runner.table_builds == 1

    grads[1] = grads[1].clone() * 3.0  # new storage
    outputs = backend.run(grads, math.inf)
    assert backend.runner.table_builds == 2
    assert float(outputs.total_norm) == pytest.approx(float64_norm(grads), rel=2e-6)


class TwoDeviceLauncher(EmulatorLauncher):
    """The emulator pretending to drive two GPUs: ``current`` is the device id the next clip runs
    on; each load returns a module tagged with its device id and every launch records which
    module it used on which device."""

    def __init__(self) -> None:
        super().__init__(load_emulator())
        self.current = 0
        self.loads: list[int] = []
        self.launches: list[tuple[int, int]] = []  # (device the clip ran on, device of the module)

    def device_key(self, device):
        return self.current

    def load(self, device_key):
        self.loads.append(device_key)
        return (device_key, self.library)

    def launch(self, module, kernel, grid, block, args):
        module_device, library = module
        self.launches.append((self.current, module_device))
        super().launch(library, kernel, grid, block, args)


def test_modules_and_tables_are_cached_per_device():
    from pytest_spikecheck.clipping._kernel_runner import ClipKernelRunner

    launcher = TwoDeviceLauncher()
    runner = ClipKernelRunner(launcher)
    grads = random_grads([(100,), (50,)], seed=3)
    norms = []
    for device_id in (0, 1, 0, 1):
        launcher.current = device_id
        norms.append(float(runner.run(grads, math.inf).total_norm))
    assert launcher.loads == [0, 1] and runner.module_loads == 2  # one module per device, loaded once
    assert runner.table_builds == 2  # the same tensors get one table per device
    assert all(ran_on == module_of for ran_on, module_of in launcher.launches), launcher.launches
    assert len(launcher.launches) == 8 and len(set(norms)) == 1


def test_a_module_that_cannot_load_fails_the_same_way_every_time():
    from pytest_spikecheck.clipping._kernel_runner import ClipKernelRunner

    class Broken(TwoDeviceLauncher):
        def load(self, device_key):
            self.loads.append(device_key)
            raise RuntimeError(f"no kernel image for device {device_key}")

    launcher = Broken()
    runner = ClipKernelRunner(launcher)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="no kernel image for device 0"):
            runner.run(random_grads([(10,)]), 1.0)
    assert launcher.loads == [0]  # not recompiled at every step


@pytest.mark.parametrize(
    "max_norm, expected",
    [
        (1.0, ["k_grad_norm_partial", "k_grad_norm_final", "k_grad_scale"]),
        (math.inf, ["k_grad_norm_partial", "k_grad_norm_final"]),  # measure only: no scale pass
    ],
)
def test_at_most_three_launches_whatever_the_number_of_tensors(monkeypatch, max_norm, expected):
    backend = EmulatorClipBackend()
    launcher = backend.runner.launcher
    launched = []
    real_launch = launcher.launch
    monkeypatch.setattr(
        launcher, "launch", lambda module, kernel, *args: (launched.append(kernel), real_launch(module, kernel, *args))
    )
    backend.run(random_grads([(3,)] * 40 + [(CHUNK_ELEMENTS * 2 + 1,)], seed=9), max_norm)
    assert launched == expected


def test_only_empty_tensors_give_zero_norm(emulator):
    outputs = emulator.run([torch.zeros(0), torch.zeros(0, 5)], 1.0)
    assert float(outputs.total_norm) == 0.0 and float(outputs.scale) == 1.0 and int(outputs.nonfinite_flag) == 0


def test_numpy_arrays_are_clipped_in_place(emulator):
    arrays = [np.full(10, 3.0, np.float32), np.full(6, 4.0, np.float16)]
    norm, scale = emulator.clip_arrays_(arrays, 1.0)
    expected = math.sqrt(10 * 9 + 6 * 16)
    assert norm == pytest.approx(expected, rel=1e-6)
    assert arrays[0][0] == np.float32(np.float32(3.0) * np.float32(scale))
    assert arrays[1][0] == np.float16(np.float32(4.0) * np.float32(scale))


def test_public_api_runs_the_emulator():
    params = [torch.nn.Parameter(torch.zeros(s)) for s in [(40, 8), (8,)]]
    for p, g in zip(params, random_grads([(40, 8), (8,)], seed=8)):
        p.grad = g
    original = [p.grad.clone() for p in params]
    result = clip_grads_(params, 0.5, backend="emulator")
    assert float(result.total_norm) == pytest.approx(float64_norm(original), rel=2e-6)
    assert not bool(result.nonfinite)
    assert_scaled_exactly([p.grad for p in params], original, result.scale)


# ---------------------------------------------------------------------------------------------
# clip.cu's bit-level conversions (the fp32 -> bf16 one is what sm_75 GPUs run)


def float32_patterns() -> np.ndarray:
    """Every high half (so every bf16 value, every exponent: zeros, subnormals, normals, inf, NaN)
    with the low halves that decide rounding (exact, just above 0, just below / at / just above the
    tie, all ones), and 2**20 random patterns: ~1.4M float32 bit patterns."""
    high = np.arange(2**16, dtype=np.uint32) << 16
    lows = np.array([0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x7FFF, 0x8000, 0x8001, 0xFFFF], dtype=np.uint32)
    random = np.random.default_rng(0).integers(0, 2**32, size=2**20, dtype=np.uint32)
    return np.concatenate([(high[:, None] | lows[None, :]).ravel(), random]).view(np.float32)


def assert_same_bits_except_nan(ours: np.ndarray, theirs: np.ndarray, inputs: np.ndarray, what: str) -> None:
    """Bit-identical results for every non-NaN input (NaN payloads are checked by the callers)."""
    differ = np.flatnonzero((ours != theirs) & ~np.isnan(inputs))
    assert differ.size == 0, (
        f"{what}: {differ.size} of {inputs.size} differ, first input 0x{inputs.view(np.uint32)[differ[0]]:08x}: "
        f"ours 0x{int(ours[differ[0]]):04x}, torch 0x{int(theirs[differ[0]]):04x}"
    )


def test_float_to_bfloat16_rounds_like_torch_for_every_kind_of_float():
    values = float32_patterns()
    ours = emulator_backend.convert("emulator_float_to_bfloat16", values)
    theirs = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert_same_bits_except_nan(ours, theirs, values, "fp32 -> bf16")
    nan = np.isnan(values)
    assert nan.sum() > 1000 and np.all(ours[nan] == ((values[nan].view(np.uint32) >> 16) | 0x40)), (
        "a NaN must stay a quiet NaN with its sign and top payload bits"
    )


def test_bfloat16_to_float_is_exact_for_every_bf16_value():
    bits = np.arange(2**16, dtype=np.uint16)
    ours = emulator_backend.convert("emulator_bfloat16_to_float", bits)
    theirs = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16).float().numpy()
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))


def test_float_to_half_rounds_like_torch_for_every_kind_of_float():
    values = float32_patterns()
    ours = emulator_backend.convert("emulator_float_to_half", values)
    theirs = torch.from_numpy(values).half().view(torch.int16).numpy().view(np.uint16)
    assert_same_bits_except_nan(ours, theirs, values, "fp32 -> fp16")
    nan = np.isnan(values)
    assert np.all((ours[nan] & 0x7E00) == 0x7E00), "a NaN must stay a quiet NaN"
