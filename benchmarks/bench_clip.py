"""Clip benchmarks (pytest-benchmark, group "clip"): every available backend of
pytest_spikecheck.clipping against torch.nn.utils.clip_grad_norm_(foreach=True).

    pytest benchmarks/bench_clip.py --benchmark-json bench.json
    python benchmarks/clip_table.py bench.json

Not collected by the normal test run (testpaths are tests/ and scenarios/).

Shapes are the gradients of real model presets: tiny ("micro" with a 384-token vocabulary,
~0.15M parameters), ANDREA-12M, ANDREA-120M, and GPT-2 small (124,439,808 parameters in 148
tensors: a 50257 x 768 embedding, 1024 positions, 12 blocks, tied head). Two cases: "clip"
(max_norm far below the norm: every gradient is rescaled, 3 accesses per element: 12 bytes per
fp32 parameter, 6 per bf16) and "no clip" (max_norm far above: 1 access, as the scale pass
returns at once -- torch still multiplies every gradient by 1). Each result records in
extra_info the parameter count, dtype, the bytes that case must move, the effective bandwidth
and the fraction of H200's ~4.3 TB/s bound.

Where: on a CUDA machine every backend runs every shape in fp32 and bf16 on the GPU (the
emulator, CPU-only, runs the tiny shape in fp32); on a CPU, ANDREA-120M, GPT-2 and bf16 are
skipped and the emulator runs only the tiny shape.
"""

from __future__ import annotations

import pytest
import torch

from pytest_spikecheck.clipping import available_backends, clip_grad_norm_
from pytest_spikecheck.clipping.conformance import model_gradient_shapes

#: Copy bandwidth of an H200's HBM3e, the bound the effective bandwidth is compared to.
H200_BYTES_PER_SECOND = 4.3e12

#: name -> (model preset, vocabulary override); "gpt2-124m" is built by gpt2_small_shapes().
SHAPES = {
    "tiny": ("micro", 384),
    "andrea-12m": ("andrea-12m", None),
    "andrea-120m": ("andrea-120m", None),
    "gpt2-124m": (None, None),
}

#: case -> (max_norm, memory accesses per gradient element): clipping reads the gradients twice
#: and writes them once; not clipping reads them once.
CASES = {"clip": (1e-3, 3), "no clip": (1e30, 1)}

DTYPES = {"float32": (torch.float32, 4), "bfloat16": (torch.bfloat16, 2)}

#: Shapes and dtypes measured on a GPU only (too slow, or meaningless, on a 2-core CPU).
GPU_ONLY_SHAPES = ("andrea-120m", "gpt2-124m")


def gpt2_small_shapes(
    vocab_size: int = 50257, n_embd: int = 768, n_layer: int = 12, block_size: int = 1024
) -> list[tuple[int, ...]]:
    """The gradient shapes of GPT-2 small (124M parameters; the LM head is tied to wte)."""
    shapes: list[tuple[int, ...]] = [(vocab_size, n_embd), (block_size, n_embd)]
    for _ in range(n_layer):
        shapes += [
            (n_embd,),
            (n_embd,),  # ln_1
            (3 * n_embd, n_embd),
            (3 * n_embd,),  # attention qkv
            (n_embd, n_embd),
            (n_embd,),  # attention out
            (n_embd,),
            (n_embd,),  # ln_2
            (4 * n_embd, n_embd),
            (4 * n_embd,),  # mlp in
            (n_embd, 4 * n_embd),
            (n_embd,),  # mlp out
        ]
    return shapes + [(n_embd,), (n_embd,)]  # ln_f


GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
REFERENCE = "torch.nn.utils.clip_grad_norm_"
IMPLEMENTATIONS = [REFERENCE] + available_backends()


def skip_reason(implementation: str, shape: str, dtype: str = "float32") -> str | None:
    if implementation == "emulator" and (shape != "tiny" or dtype != "float32"):
        return "the emulator runs only the tiny fp32 shape (it exists to prove the kernel, not to be fast)"
    if not GPU and shape in GPU_ONLY_SHAPES:
        return f"{shape} is benchmarked on a GPU only"
    if not GPU and dtype != "float32":
        return f"{dtype} is benchmarked on a GPU only"
    return None


@pytest.fixture(scope="module", params=list(SHAPES))
def shape(request):
    return request.param


def gradient_shapes(shape: str) -> list[tuple[int, ...]]:
    preset, vocab_size = SHAPES[shape]
    return gpt2_small_shapes() if shape == "gpt2-124m" else model_gradient_shapes(preset, vocab_size=vocab_size)


def make_parameters(shape: str, device: str, dtype: torch.dtype = torch.float32) -> list[torch.nn.Parameter]:
    generator = torch.Generator(device=device).manual_seed(0)
    params = []
    for dims in gradient_shapes(shape):
        param = torch.nn.Parameter(torch.empty(dims, device=device, dtype=dtype))
        param.grad = torch.randn(dims, generator=generator, device=device).to(dtype)
        params.append(param)
    return params


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_clip(benchmark, implementation, shape, case, dtype):
    reason = skip_reason(implementation, shape, dtype)
    if reason:
        pytest.skip(reason)
    device = "cpu" if implementation == "emulator" else DEVICE
    torch_dtype, element_bytes = DTYPES[dtype]
    params = make_parameters(shape, device, torch_dtype)
    max_norm, accesses = CASES[case]
    bytes_per_parameter = accesses * element_bytes
    num_parameters = sum(p.numel() for p in params)

    if implementation == REFERENCE:

        def clip():
            torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
    else:

        def clip():
            clip_grad_norm_(params, max_norm, backend=implementation)

    if device == "cuda":

        def run():
            clip()
            torch.cuda.synchronize()
    else:
        run = clip

    benchmark.group = "clip"
    benchmark.extra_info.update(
        implementation=implementation,
        shape=shape,
        case=case,
        dtype=dtype,
        device=device,
        device_name=torch.cuda.get_device_name() if device == "cuda" else "cpu",
        torch_threads=torch.get_num_threads(),
        parameters=num_parameters,
        bytes_moved=bytes_per_parameter * num_parameters,
    )
    run()  # warm up: compile kernels, build tables
    if implementation == "emulator":
        benchmark.pedantic(run, rounds=3, iterations=1)
    else:
        benchmark(run)

    if benchmark.enabled:  # --benchmark-disable runs the function once and records nothing
        median = benchmark.stats.stats.median
        bytes_moved = bytes_per_parameter * num_parameters
        benchmark.extra_info.update(
            median_s=median,
            effective_gb_per_s=bytes_moved / median / 1e9,
            fraction_of_h200_bound=bytes_moved / H200_BYTES_PER_SECOND / median,
        )
