"""Every kernel in kernels/clip.cu compiles with NVRTC for every architecture of ARCHITECTURES
(sm_75 ... sm_120), with the options the cupy backend uses, spills no registers, uses the bf16
instruction only where it exists (sm_80+) and no flush-to-zero instruction anywhere. Needs no GPU: cupy-cuda13x imports without one and the
nvidia-cuda-nvrtc wheel supplies NVRTC.

CI installs the gpu extra, so a missing NVRTC fails these tests. Set SPIKECHECK_ALLOW_NO_NVRTC=1
to skip them instead (for a machine without the gpu extra).
"""

from __future__ import annotations

import os
import re

import pytest

from pytest_spikecheck.clipping._kernel_runner import (
    ARCHITECTURES,
    CUPY_IMPLICIT_NVRTC_OPTIONS,
    KERNEL_NAMES,
    NVRTC_OPTIONS,
    KernelCompileError,
    cupy_implicit_nvrtc_options,
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


def test_nvrtc_supports_every_architecture(nvrtc):
    supported = set(nvrtc.getSupportedArchs())
    missing = [arch for arch in ARCHITECTURES if arch not in supported]
    assert not missing, f"NVRTC {nvrtc.getVersion()} cannot target sm_{missing}; it supports {sorted(supported)}"


@pytest.fixture(scope="module", params=ARCHITECTURES, ids=lambda arch: f"sm_{arch}")
def cubin(nvrtc, request):
    """(arch, ptxas's report, cubin): clip.cu compiled exactly as cupy.RawModule would on that GPU."""
    arch = request.param
    options = NVRTC_OPTIONS + cupy_implicit_nvrtc_options(arch) + ("--ptxas-options=-v",)
    log, program = compile_program(nvrtc, kernel_source(), options)
    return arch, log, nvrtc.getCUBIN(program)


def ptx_for(nvrtc, arch: int) -> str:
    """The PTX of clip.cu for compute_<arch>, with CuPy's options (-ftz=true included)."""
    options = NVRTC_OPTIONS + (f"-arch=compute_{arch}", "--device-as-default-execution-space", "-ftz=true")
    _, program = compile_program(nvrtc, kernel_source(), options)
    text = nvrtc.getPTX(program)
    return text.decode() if isinstance(text, bytes) else text


@pytest.fixture(scope="module")
def ptx(nvrtc):
    """The PTX of clip.cu for compute_90, to read the instructions the kernels use."""
    return ptx_for(nvrtc, 90)


def resource_usage(log: str) -> dict[str, dict[str, int]]:
    """Per kernel: stack frame, spill stores and spill loads in bytes, and registers (ptxas -v)."""
    usage = {}
    pattern = re.compile(
        r"Function properties for (\w+)\s*\n.*?(\d+) bytes stack frame, (\d+) bytes spill stores, "
        r"(\d+) bytes spill loads\s*\n.*?Used (\d+) registers"
    )
    for name, stack, stores, loads, registers in pattern.findall(log):
        usage[name] = {"stack": int(stack), "spill_stores": int(stores), "spill_loads": int(loads), "registers": int(registers)}
    return usage


def test_cubin_is_an_elf(cubin):
    _, _, binary = cubin
    assert binary[:4] == b"\x7fELF"


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
def test_kernel_compiles_without_spills(cubin, kernel):
    arch, log, _ = cubin
    usage = resource_usage(log)
    assert kernel in usage, f"ptxas compiled no entry function {kernel} for sm_{arch}:\n{log}"
    assert usage[kernel]["spill_stores"] == 0 and usage[kernel]["spill_loads"] == 0, (arch, usage[kernel])
    assert usage[kernel]["stack"] == 0, f"{kernel} uses local memory on sm_{arch}: {usage[kernel]}"


@pytest.mark.parametrize("arch", ARCHITECTURES, ids=lambda arch: f"sm_{arch}")
def test_bf16_instruction_only_where_the_gpu_has_it(nvrtc, arch):
    """sm_75 has no bf16 instruction: there clip.cu rounds on the bit pattern (integer PTX only)."""
    instructions = [line.strip() for line in ptx_for(nvrtc, arch).splitlines() if ".bf16" in line]
    if arch < 80:
        assert not instructions, f"sm_{arch} cannot run {instructions[:3]}"
    else:
        assert any(line.startswith("cvt.rn.bf16.f32") for line in instructions), f"sm_{arch}: no cvt.rn.bf16.f32"


@pytest.mark.parametrize("arch", [75, 90], ids=lambda arch: f"sm_{arch}")
def test_no_flush_to_zero_under_cupys_ftz_flag(nvrtc, arch):
    """CuPy appends -ftz=true; clip.cu's fp32 arithmetic is inline PTX without .ftz, so subnormal
    gradients are summed and scaled on the GPU as torch and the emulator do (design choice 8)."""
    flushing = [line.strip() for line in ptx_for(nvrtc, arch).splitlines() if ".ftz" in line]
    assert not flushing, f"sm_{arch}: {len(flushing)} flush-to-zero instructions, e.g. {flushing[:3]}"


def kernel_body(ptx: str, kernel: str) -> str:
    start = ptx.index(f".entry {kernel}(")
    following = ptx.find(".entry ", start + 1)
    return ptx[start : following if following != -1 else len(ptx)]


@pytest.mark.parametrize(
    "kernel, instructions",
    [
        ("k_grad_norm_partial", ("ld.global.v4.u32", "ld.global.v4.f32")),  # 16-bit and fp32 packs
        ("k_grad_scale", ("ld.global.v4", "st.global.v4")),
    ],
)
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
