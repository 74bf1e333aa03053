"""Every kernel in kernels/clip.cu compiles with NVRTC for sm_90, with the options the cupy backend
uses, and spills no registers. Needs no GPU: cupy-cuda13x imports without one and the
nvidia-cuda-nvrtc wheel supplies NVRTC.

CI installs the gpu extra, so a missing NVRTC fails these tests. Set SPIKECHECK_ALLOW_NO_NVRTC=1
to skip them instead (for a machine without the gpu extra).
"""

from __future__ import annotations

import os
import re

import pytest

from pytest_spikecheck.clipping._kernel_runner import (
    CUPY_IMPLICIT_NVRTC_OPTIONS,
    KERNEL_NAMES,
    NVRTC_OPTIONS,
    KernelCompileError,
    kernel_source,
)

ALLOW_NO_NVRTC = "SPIKECHECK_ALLOW_NO_NVRTC"


@pytest.fixture(scope="module")
def nvrtc():
    try:
        from cupy.cuda import nvrtc

        nvrtc.getVersion()
    except Exception as exc:  # ImportError, or NVRTC's library failing to load
        reason = f"NVRTC is needed to compile clip.cu ({type(exc).__name__}: {exc})"
        if os.environ.get(ALLOW_NO_NVRTC) == "1":
            pytest.skip(f"{reason}; skipped because {ALLOW_NO_NVRTC}=1")
        pytest.fail(f"{reason}: pip install 'pytest-spikecheck[gpu]', or set {ALLOW_NO_NVRTC}=1 to skip")
    return nvrtc


def compile_program(nvrtc, source: str, options: tuple[str, ...]) -> tuple[str, object]:
    """(compiler log, program) for ``source``; raises KernelCompileError when it does not compile."""
    program = nvrtc.createProgram(source, "clip.cu", [], [])
    try:
        nvrtc.compileProgram(program, list(options))
    except nvrtc.NVRTCError as exc:
        raise KernelCompileError("NVRTC", nvrtc.getProgramLog(program) or str(exc)) from None
    return nvrtc.getProgramLog(program).replace("\x00", ""), program


@pytest.fixture(scope="module")
def sm90(nvrtc):
    """clip.cu compiled to an sm_90 cubin exactly as cupy.RawModule would, plus ptxas's report."""
    options = NVRTC_OPTIONS + CUPY_IMPLICIT_NVRTC_OPTIONS + ("--ptxas-options=-v",)
    log, program = compile_program(nvrtc, kernel_source(), options)
    return log, nvrtc.getCUBIN(program)


@pytest.fixture(scope="module")
def ptx(nvrtc):
    """The PTX of clip.cu for compute_90, to read the instructions the kernels use."""
    options = NVRTC_OPTIONS + ("-arch=compute_90", "-ftz=true", "--device-as-default-execution-space")
    _, program = compile_program(nvrtc, kernel_source(), options)
    text = nvrtc.getPTX(program)
    return text.decode() if isinstance(text, bytes) else text


def resource_usage(log: str) -> dict[str, dict[str, int]]:
    """Per kernel: stack frame, spill stores and spill loads in bytes, and registers (ptxas -v)."""
    usage = {}
    pattern = re.compile(
        r"Function properties for (\w+)\s*\n.*?(\d+) bytes stack frame, (\d+) bytes spill stores, "
        r"(\d+) bytes spill loads\s*\n.*?Used (\d+) registers"
    )
    for name, stack, stores, loads, registers in pattern.findall(log):
        usage[name] = {
            "stack": int(stack), "spill_stores": int(stores), "spill_loads": int(loads),
            "registers": int(registers),
        }
    return usage


def test_cubin_is_an_sm90_elf(sm90):
    _, cubin = sm90
    assert cubin[:4] == b"\x7fELF"


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
def test_kernel_compiles_for_sm90_without_spills(sm90, kernel):
    log, _ = sm90
    usage = resource_usage(log)
    assert kernel in usage, f"ptxas compiled no entry function {kernel}:\n{log}"
    assert usage[kernel]["spill_stores"] == 0 and usage[kernel]["spill_loads"] == 0, usage[kernel]
    assert usage[kernel]["stack"] == 0, f"{kernel} uses local memory: {usage[kernel]}"


def kernel_body(ptx: str, kernel: str) -> str:
    start = ptx.index(f".entry {kernel}(")
    following = ptx.find(".entry ", start + 1)
    return ptx[start:following if following != -1 else len(ptx)]


@pytest.mark.parametrize("kernel, instructions", [
    ("k_grad_norm_partial", ("ld.global.v4.u32", "ld.global.v4.f32")),  # 16-bit and fp32 packs
    ("k_grad_scale", ("ld.global.v4", "st.global.v4")),
])
def test_gradients_move_in_128_bit_global_accesses(ptx, kernel, instructions):
    body = kernel_body(ptx, kernel)
    for instruction in instructions:
        assert instruction in body, f"{kernel} has no {instruction}"
    assert not re.search(r"\bld\.v4|\bst\.v4", body), f"{kernel} uses generic (not global) vector accesses"


def test_a_compile_error_raises_with_the_first_error_line(nvrtc):
    lines = kernel_source().splitlines()
    line_number = next(i for i, line in enumerate(lines) if "k_grad_scale(" in line) + 1
    lines.insert(line_number - 1, "this is not CUDA;")
    with pytest.raises(KernelCompileError, match=rf"clip.cu failed to compile with NVRTC: clip.cu\({line_number}\): error"):
        compile_program(nvrtc, "\n".join(lines), NVRTC_OPTIONS + CUPY_IMPLICIT_NVRTC_OPTIONS)


def test_the_dtype_defines_are_required(nvrtc):
    with pytest.raises(KernelCompileError, match="compile with the -DGRAD_DTYPE_\\* flags"):
        compile_program(nvrtc, kernel_source(), CUPY_IMPLICIT_NVRTC_OPTIONS)
