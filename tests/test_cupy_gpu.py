"""The cupy backend on a CUDA device: kernels/clip.cu through CuPy, against torch and float64.

The GPU tests (marked ``gpu``) are skipped, with the reason, where the cupy backend cannot run (no
CUDA device, no cupy). Run them with ``pytest tests -m gpu`` (scripts/gpu_check.sh does, on an
H200). The fallback tests at the end run everywhere: they fake a GPU where clip.cu cannot compile.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from pytest_spikecheck.clipping import clip_grads_, get_backend, resolve_backend
from pytest_spikecheck.clipping._kernel_runner import SMALL_LAUNCH, LaunchConfig
from pytest_spikecheck.clipping._registry import unavailable_reason
from pytest_spikecheck.clipping.conformance import (
    DTYPES,
    Tolerances,
    check_backend,
    check_case,
    check_clip_function,
    every_value_case,
    model_gradient_shapes,
)

REASON = unavailable_reason("cupy")
needs_gpu = [
    pytest.mark.gpu,
    pytest.mark.skipif(REASON is not None, reason=f"needs a CUDA device (cupy backend unavailable: {REASON})"),
]

#: The GPU kernels do torch's arithmetic exactly, subnormals included (clip.cu ignores CuPy's -ftz=true).
GPU_EXACT = Tolerances(norm_rtol=2e-6, element_ulps=0, allow_flush_to_zero=False)


def apply(marks):
    def decorate(function):
        for mark in marks:
            function = mark(function)
        return function

    return decorate


MODELS = {"micro": {"vocab_size": 384}, "andrea-120m": {}}


@pytest.fixture(scope="module")
def backend():
    return get_backend("cupy")


@pytest.fixture(scope="module", params=list(MODELS))
def model_shapes(request):
    return request.param, model_gradient_shapes(request.param, **MODELS[request.param])


def random_grads(shapes, dtype=torch.float32, seed=0, scale=1e-3) -> list[torch.Tensor]:
    generator = torch.Generator(device="cuda").manual_seed(seed)
    return [(torch.randn(s, generator=generator, device="cuda") * scale).to(dtype) for s in shapes]


def float64_norm(grads) -> float:
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.double()) for g in grads])))


def assert_scaled_exactly(clipped, original, scale) -> None:
    for after, before in zip(clipped, original, strict=True):
        assert torch.equal(after, (before.float() * scale).to(before.dtype))


@apply(needs_gpu)
def test_auto_resolves_to_cupy():
    assert resolve_backend("auto") == "cupy"


@apply(needs_gpu)
def test_matches_torch_and_float64_at_model_shapes(backend, model_shapes):
    name, shapes = model_shapes
    grads = random_grads(shapes, seed=1)  # norm ~ 1e-3 * sqrt(N): clipped at max_norm 1
    original = [g.clone() for g in grads]
    params = [torch.nn.Parameter(torch.empty_like(g)) for g in grads]
    for param, grad in zip(params, original):
        param.grad = grad.clone()

    outputs = backend.run(grads, 1.0)
    torch_norm = torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
    reference = float64_norm(original)

    assert float(outputs.total_norm) == pytest.approx(reference, rel=2e-6), name
    assert float(torch_norm) == pytest.approx(reference, rel=1e-4), name
    assert float(outputs.scale) < 1.0 and int(outputs.nonfinite_flag) == 0
    assert_scaled_exactly(grads, original, outputs.scale)
    for ours, theirs in zip(grads, params):
        torch.testing.assert_close(ours, theirs.grad, rtol=1e-5, atol=0)


@apply(needs_gpu)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_16bit_gradients_at_micro_shapes(backend, dtype):
    grads = random_grads(model_gradient_shapes("micro", vocab_size=384), dtype, seed=2, scale=0.05)
    original = [g.clone() for g in grads]
    outputs = backend.run(grads, 1.0)
    assert float(outputs.total_norm) == pytest.approx(float64_norm(original), rel=2e-6)
    assert_scaled_exactly(grads, original, outputs.scale)


@apply(needs_gpu)
def test_mixed_dtypes_in_one_call(backend):
    shapes = [(300, 7), (64,), (1,), (4097,)]
    grads = [
        g.to(dtype)
        for g, dtype in zip(
            random_grads(shapes, seed=3, scale=0.1), (torch.float32, torch.bfloat16, torch.float16, torch.float32)
        )
    ]
    original = [g.clone() for g in grads]
    outputs = backend.run(grads, 0.5)
    assert float(outputs.total_norm) == pytest.approx(float64_norm(original), rel=2e-6)
    assert_scaled_exactly(grads, original, outputs.scale)


@apply(needs_gpu)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_converts_and_rounds_every_16bit_value(backend, dtype):
    check_case(backend.clip_, every_value_case(dtype), device="cuda", tolerances=GPU_EXACT)


@apply(needs_gpu)
def test_conforms(backend):
    report = check_backend("cupy", max_examples=50, tolerances=GPU_EXACT)
    assert report.fuzzed_cases >= 50


@apply(needs_gpu)
def test_conforms_with_more_chunks_than_threads():
    from pytest_spikecheck.clipping.cupy_backend import CupyClipBackend

    report = check_clip_function(
        CupyClipBackend(SMALL_LAUNCH).clip_,
        dtypes=tuple(DTYPES),
        device="cuda",
        max_examples=30,
        max_total_elements=40_000,
        tolerances=GPU_EXACT,
    )
    assert report.fuzzed_cases >= 30


@apply(needs_gpu)
def test_norm_is_bitwise_identical_across_runs_and_grids():
    from pytest_spikecheck.clipping.cupy_backend import CupyClipBackend

    grads = random_grads(model_gradient_shapes("andrea-120m"), seed=4)
    sm_count = torch.cuda.get_device_properties(grads[0].device).multi_processor_count
    norms = []
    for max_blocks in (None, 1, sm_count, 4 * sm_count + 3):
        backend = CupyClipBackend(LaunchConfig(max_blocks=max_blocks))
        for _ in range(2):
            norms.append(backend.run(grads, math.inf).total_norm.clone())
    bits = {int(n.view(torch.int32)) for n in norms}
    assert len(bits) == 1, [float(n) for n in norms]


@apply(needs_gpu)
def test_kernels_run_on_torchs_current_stream(backend):
    """On a side stream: sleep, then write the gradients, then clip. A kernel launched on another
    stream would not wait for the writes and would see zeros."""
    source = random_grads(model_gradient_shapes("micro", vocab_size=384), seed=5)
    targets = [torch.zeros_like(s) for s in source]
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU cycles queued before the writes
        for target, values in zip(targets, source):
            target.copy_(values)
        outputs = backend.run(targets, math.inf)
    stream.synchronize()
    assert float(outputs.total_norm) == pytest.approx(float64_norm(source), rel=2e-6)


@apply(needs_gpu)
def test_clip_never_synchronises_the_host(backend):
    grads = random_grads([(1000, 64), (64,)], seed=6)
    backend.run(grads, 1.0)  # compile and cache first
    fresh = [g.clone() for g in grads]  # new addresses: the table is rebuilt and uploaded
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        backend.run(grads, 1.0)
        backend.run(fresh, 1.0)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@apply(needs_gpu)
def test_at_most_three_launches(backend):
    from torch.profiler import ProfilerActivity, profile

    grads = random_grads(model_gradient_shapes("micro", vocab_size=384), seed=7)
    backend.run(grads, 1.0)
    backend.run(grads, math.inf)  # compiled and cached: no uploads inside the profile
    torch.cuda.synchronize()
    launched = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the profiler may warn about its own set-up
        for max_norm in (1.0, math.inf):
            with profile(activities=[ProfilerActivity.CUDA]) as profiler:
                backend.run(grads, max_norm)
                torch.cuda.synchronize()
            events = profiler.events()
            launched[max_norm] = [event.name for event in events if event.name.startswith("k_grad")]
    if not launched[1.0] and not launched[math.inf]:
        pytest.skip("torch.profiler recorded no CUDA kernels here (CUPTI unavailable?)")
    assert sorted(launched[1.0]) == ["k_grad_norm_final", "k_grad_norm_partial", "k_grad_scale"]
    assert sorted(launched[math.inf]) == ["k_grad_norm_final", "k_grad_norm_partial"]


@apply(needs_gpu)
def test_pointer_table_is_rebuilt_when_an_address_changes():
    from pytest_spikecheck.clipping.cupy_backend import CupyClipBackend

    backend = CupyClipBackend()
    grads = random_grads([(100, 3), (50,)], seed=8)
    backend.run(grads, math.inf)
    backend.run(grads, math.inf)
    assert backend.runner.table_builds == 1
    grads[1] = grads[1] * 3.0  # new storage, new values
    outputs = backend.run(grads, math.inf)
    assert backend.runner.table_builds == 2
    assert float(outputs.total_norm) == pytest.approx(float64_norm(grads), rel=2e-6)


@apply(needs_gpu)
@pytest.mark.parametrize("bad_value", [math.nan, math.inf])
def test_nonfinite_flag_on_the_gpu(backend, bad_value):
    grads = random_grads([(5000,), (20_000,)], seed=9, scale=10.0)
    grads[1][17_000] = bad_value
    original = [g.clone() for g in grads]
    outputs = backend.run(grads, 1.0)
    assert int(outputs.nonfinite_flag) == 1 and float(outputs.scale) == 1.0
    norm = float(outputs.total_norm)
    assert math.isnan(norm) if math.isnan(bad_value) else norm == math.inf
    for after, before in zip(grads, original):
        assert torch.equal(after.view(torch.int32), before.view(torch.int32))


@apply(needs_gpu)
def test_misaligned_views(backend):
    storage = random_grads([(50_000,)], seed=10, scale=0.1)[0]
    grads = [storage[1:40_001], storage[45_000:45_130]]
    original = [g.clone() for g in grads]
    outputs = backend.run(grads, 0.5)
    assert float(outputs.total_norm) == pytest.approx(float64_norm(original), rel=2e-6)
    assert_scaled_exactly(grads, original, outputs.scale)


@apply(needs_gpu)
def test_public_api_with_auto_backend_clips_on_the_gpu():
    params = [torch.nn.Parameter(torch.zeros(s, device="cuda")) for s in [(64, 32), (32,)]]
    for param, grad in zip(params, random_grads([(64, 32), (32,)], seed=11, scale=1.0)):
        param.grad = grad
    original = [p.grad.clone() for p in params]
    result = clip_grads_(params, 1.0)  # backend="auto"
    assert result.total_norm.device.type == "cuda"
    assert float(result.total_norm) == pytest.approx(float64_norm(original), rel=2e-6)
    assert not bool(result.nonfinite)
    assert_scaled_exactly([p.grad for p in params], original, result.scale)


# ---------------------------------------------------------------------------------------------
# Fallback where clip.cu cannot compile or load on the GPU (runs on any machine: the GPU is faked)

T4_ERROR = (
    "clip.cu(233): error: ptxas application ptx input, line 1017; error   : Feature '.bf16' requires .target sm_80 or higher"
)


@pytest.fixture
def fake_gpu(monkeypatch):
    """A cupy backend that believes a Tesla T4 (sm_75) is cuda:0 and compiles with ``compile_fn``."""
    from pytest_spikecheck.clipping import _registry, cupy_backend
    from pytest_spikecheck.clipping.cupy_backend import CupyClipBackend

    backend = CupyClipBackend()
    calls = []

    def use(compile_fn):
        def counted(index):
            calls.append(index)
            return compile_fn(index)

        monkeypatch.setattr(cupy_backend, "compile_and_load", counted)
        return backend, calls

    real_load = _registry._load
    monkeypatch.setattr(_registry, "_load", lambda name: backend if name == "cupy" else real_load(name))
    monkeypatch.setattr(_registry, "unavailable_reason", lambda name: None)
    monkeypatch.setattr(_registry, "_warned", set())
    monkeypatch.setattr(cupy_backend, "describe_device", lambda index: f"sm_75 (Tesla T4 #{index})")
    return use


def compile_fails(index):
    from pytest_spikecheck.clipping._kernel_runner import KernelCompileError

    raise KernelCompileError("NVRTC", T4_ERROR)


def test_auto_falls_back_to_torch_with_one_warning(fake_gpu):
    from pytest_spikecheck.clipping import SpikecheckBackendWarning

    _, calls = fake_gpu(compile_fails)
    with pytest.warns(SpikecheckBackendWarning) as record:
        assert resolve_backend("auto", "cuda:0") == "torch"
    assert len(record) == 1
    assert str(record[0].message) == (
        f"the cupy clipping backend cannot run on sm_75 (Tesla T4 #0): clip.cu failed to compile with NVRTC: "
        f"{T4_ERROR}; clipping with the torch backend instead"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second warning would raise here
        assert resolve_backend("auto", "cuda:0") == "torch"
        assert resolve_backend("auto", torch.device("cuda", 0)) == "torch"
    assert calls == [0]  # compiled once: the failure is cached per device


def test_auto_falls_back_when_the_module_cannot_load(fake_gpu):
    from pytest_spikecheck.clipping import SpikecheckBackendWarning

    def load_fails(index):
        raise RuntimeError("CUDA_ERROR_NO_BINARY_FOR_GPU: no kernel image is available\nfor this device")

    fake_gpu(load_fails)
    with pytest.warns(
        SpikecheckBackendWarning,
        match=r"sm_75 \(Tesla T4 #0\): RuntimeError: CUDA_ERROR_NO_BINARY_FOR_GPU: "
        r"no kernel image is available; clipping with the torch",
    ):
        assert resolve_backend("auto", "cuda:0") == "torch"


def test_each_gpu_is_checked_on_its_own(fake_gpu):
    from pytest_spikecheck.clipping import SpikecheckBackendWarning

    def only_gpu_1_fails(index):
        if index == 1:
            compile_fails(index)
        return {"compiled for": index}

    backend, calls = fake_gpu(only_gpu_1_fails)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_backend("auto", "cuda:0") == "cupy"
    with pytest.warns(SpikecheckBackendWarning, match=r"Tesla T4 #1"):
        assert resolve_backend("auto", "cuda:1") == "torch"
    assert calls == [0, 1] and backend.runner.module("cuda:0") == {"compiled for": 0}


def test_explicit_cupy_fails_with_one_line_naming_the_architecture(fake_gpu):
    from pytest_spikecheck.clipping import BackendUnavailableError

    backend, _ = fake_gpu(compile_fails)
    with pytest.raises(BackendUnavailableError) as raised:
        backend.runner.module(torch.device("cuda", 0))  # what backend="cupy"'s first clip runs
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("the cupy clipping backend cannot run on sm_75 (Tesla T4 #0): clip.cu failed to compile")
