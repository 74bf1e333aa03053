"""Clip benchmarks (pytest-benchmark, group "clip"): every available backend of
pytest_spikecheck.clipping against torch.nn.utils.clip_grad_norm_(foreach=True).

    pytest benchmarks/bench_clip.py --benchmark-json bench.json
    python benchmarks/clip_table.py bench.json

Not collected by the normal test run (testpaths are tests/ and scenarios/).

Shapes are the gradients of real model presets: tiny ("micro" with a 384-token vocabulary,
~0.15M parameters), ANDREA-12M and ANDREA-120M. Two cases: "clip" (max_norm far below the norm:
every gradient is rescaled, 12 bytes of traffic per fp32 parameter) and "no clip" (max_norm far
above: 4 bytes per parameter, as the scale pass returns at once -- torch still multiplies every
gradient by 1). Each result records in extra_info the parameter count, the bytes that case must
move, the effective bandwidth and the fraction of H200's ~4.3 TB/s bound.

Where: on a CUDA machine every backend runs every shape on the GPU (the emulator, CPU-only,
runs the tiny shape); on a CPU, ANDREA-120M is skipped and the emulator runs only the tiny shape.
"""

from __future__ import annotations

import pytest
import torch

from pytest_spikecheck.clipping import available_backends, clip_grad_norm_
from pytest_spikecheck.conformance import model_gradient_shapes

#: Copy bandwidth of an H200's HBM3e, the bound the effective bandwidth is compared to.
H200_BYTES_PER_SECOND = 4.3e12

#: name -> (model preset, vocabulary override)
SHAPES = {
    "tiny": ("micro", 384),
    "andrea-12m": ("andrea-12m", None),
    "andrea-120m": ("andrea-120m", None),
}

#: case -> (max_norm, bytes moved per fp32 parameter): clipping reads the gradients twice and
#: writes them once; not clipping reads them once.
CASES = {"clip": (1e-3, 12), "no clip": (1e30, 4)}

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
REFERENCE = "torch.nn.utils.clip_grad_norm_"
IMPLEMENTATIONS = [REFERENCE] + available_backends()


def skip_reason(implementation: str, shape: str) -> str | None:
    if implementation == "emulator" and shape != "tiny":
        return "the emulator runs only the tiny shape (it exists to prove the kernel, not to be fast)"
    if not GPU and shape == "andrea-120m":
        return "ANDREA-120M is benchmarked on a GPU only"
    return None


@pytest.fixture(scope="module", params=list(SHAPES))
def shape(request):
    return request.param


def make_parameters(shape: str, device: str) -> list[torch.nn.Parameter]:
    preset, vocab_size = SHAPES[shape]
    generator = torch.Generator(device=device).manual_seed(0)
    params = []
    for dims in model_gradient_shapes(preset, vocab_size=vocab_size):
        param = torch.nn.Parameter(torch.empty(dims, device=device))
        param.grad = torch.randn(dims, generator=generator, device=device)
        params.append(param)
    return params


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_clip(benchmark, implementation, shape, case):
    reason = skip_reason(implementation, shape)
    if reason:
        pytest.skip(reason)
    device = "cpu" if implementation == "emulator" else DEVICE
    params = make_parameters(shape, device)
    max_norm, bytes_per_parameter = CASES[case]
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
        implementation=implementation, shape=shape, case=case, device=device,
        device_name=torch.cuda.get_device_name() if device == "cuda" else "cpu",
        torch_threads=torch.get_num_threads(),
        parameters=num_parameters, bytes_moved=bytes_per_parameter * num_parameters,
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
