"""The conformance kit, and our CPU backends checked through it (cupy: tests/test_cupy_gpu.py)."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from pytest_spikecheck import clipping
from pytest_spikecheck.clipping import conformance
from pytest_spikecheck.clipping._kernel_runner import SMALL_LAUNCH
from pytest_spikecheck.clipping._registry import unavailable_reason
from pytest_spikecheck.clipping.conformance import (
    ConformanceError,
    Tolerances,
    check_backend,
    check_case,
    check_clip_function,
    edge_cases,
    every_value_case,
    reference_clip,
)

#: Our CPU backends do torch's arithmetic exactly: every clipped element must match bit for bit.
EXACT = Tolerances(element_ulps=0, allow_flush_to_zero=False)
#: ... and clip.cu's blocked float32 sums keep the norm within 2e-6 of float64.
EMULATOR_EXACT = Tolerances(norm_rtol=2e-6, element_ulps=0, allow_flush_to_zero=False)

needs_emulator = pytest.mark.skipif(
    unavailable_reason("emulator") is not None, reason=f"needs the emulator: {unavailable_reason('emulator')}"
)


# ---------------------------------------------------------------------------------------------
# Our backends


def test_torch_backend_conforms():
    # float16 is left out on purpose: torch computes float16 clip coefficients in float16, which
    # overflow for norms below ~1.5e-5 (see test_clipping.py), and the kit finds that.
    report = check_backend("torch", dtypes=("float32", "bfloat16"), max_examples=50, tolerances=EXACT)
    assert report.edge_cases == 2 * len(edge_cases()) and report.fuzzed_cases >= 50


@needs_emulator
def test_emulator_backend_conforms():
    report = check_backend("emulator", max_examples=25, tolerances=EMULATOR_EXACT)
    assert report.fuzzed_cases >= 25


@needs_emulator
def test_emulator_with_more_chunks_than_threads_conforms():
    """SMALL_LAUNCH: 512-element chunks, 5 blocks looping over them and a 32-thread final block,
    so 40k elements make more chunks than final threads and than blocks."""
    from pytest_spikecheck.clipping.emulator_backend import EmulatorClipBackend

    report = check_clip_function(
        EmulatorClipBackend(SMALL_LAUNCH).clip_,
        dtypes=tuple(conformance.DTYPES),
        max_examples=10,
        max_total_elements=40_000,
        max_tensors=4,
        tolerances=EMULATOR_EXACT,
    )
    assert report.fuzzed_cases >= 10


@needs_emulator
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_emulator_converts_and_rounds_every_16bit_value(dtype):
    from pytest_spikecheck.clipping.emulator_backend import BACKEND

    check_case(BACKEND.clip_, every_value_case(dtype), tolerances=EMULATOR_EXACT)


@needs_emulator
def test_numpy_arrays_conform():
    from pytest_spikecheck.clipping.emulator_backend import BACKEND

    report = check_clip_function(
        BACKEND.clip_arrays_, dtypes=("float32", "float16"), tensor_kind="numpy", max_examples=10, tolerances=EXACT
    )
    assert report.fuzzed_cases >= 10


# ---------------------------------------------------------------------------------------------
# The kit catches broken clip functions


def torch_clip(grads, max_norm):
    return clipping.get_backend("torch").clip_(grads, max_norm)


def no_eps(grads, max_norm):
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
    scale = torch.clamp(max_norm / norm, max=1.0) if torch.isfinite(norm) else torch.ones(())
    for g in grads:
        g.mul_(scale)
    return norm, scale


def per_tensor(grads, max_norm):
    norm, _ = torch_clip([g.clone() for g in grads], math.inf)
    for g in grads:
        torch_clip([g], max_norm)
    return norm, torch.ones(())


def multiplies_by_nan(grads, max_norm):
    norm, _ = torch_clip([g.clone() for g in grads], math.inf)
    scale = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for g in grads:
        g.mul_(scale)
    return norm, scale


def returns_post_clip_norm(grads, max_norm):
    torch_clip(grads, max_norm)
    return torch_clip(grads, math.inf)


def ignores_tails(grads, max_norm):
    """Drops every tensor's last numel % 8 elements (a vector loop without its scalar tail)."""
    heads = [g.view(-1)[: g.numel() - g.numel() % 8] for g in grads]
    return torch_clip(heads, max_norm)


@pytest.mark.parametrize(
    "clip_fn, message",
    [
        (no_eps, r"^scale: expected"),
        (per_tensor, r"^(scale|gradients): "),
        (multiplies_by_nan, r"^(scale: expected 1 for a non-finite norm|gradients: expected them untouched)"),
        (returns_post_clip_norm, r"^norm: expected"),
        (ignores_tails, r"^norm: expected"),
    ],
    ids=lambda value: getattr(value, "__name__", None),
)
def test_kit_catches_broken_clips_in_the_edge_cases(clip_fn, message):
    with pytest.raises(ConformanceError, match=message):
        check_clip_function(clip_fn, max_examples=1)


def test_fuzzing_finds_what_the_edge_cases_miss():
    """A clip that forgets elements past index 70,000 of a tensor passes every edge case (the
    largest tensor there has 65,537 elements); the fuzzed sizes around 2**17 catch it."""

    def ignores_far_elements(grads, max_norm):
        return torch_clip([g.view(-1)[:70_000] for g in grads], max_norm)

    for case in edge_cases():
        check_case(ignores_far_elements, case)
    with pytest.raises(ConformanceError):
        check_clip_function(ignores_far_elements, max_examples=50)


def test_error_message_names_the_case():
    with pytest.raises(ConformanceError) as info:
        check_case(returns_post_clip_norm, edge_cases()[0])
    assert str(info.value).splitlines()[1] == "  case: one element: 1 float32 tensor [(1,)], 1 elements, max_norm=1.0"


# ---------------------------------------------------------------------------------------------
# The reference and the kit's own pieces


def test_reference_clip_by_hand():
    reference = reference_clip([np.array([3.0]), np.array([[4.0]])], 1.0)
    assert reference.total_norm == 5.0
    assert reference.scale == 1.0 / (5.0 + 1e-6)
    assert reference.clipped[1][0, 0] == 4.0 / (5.0 + 1e-6)
    assert not reference.nonfinite


def test_reference_leaves_nonfinite_values_alone():
    reference = reference_clip([np.array([np.inf, 1.0])], 1.0)
    assert reference.nonfinite and reference.total_norm == math.inf and reference.scale == 1.0


def test_kit_eps_is_the_clipping_eps():
    assert conformance.CLIP_EPS == clipping.CLIP_EPS


def test_bfloat16_rounding_matches_torch():
    values = np.random.default_rng(0).standard_normal(10_000).astype(np.float32)
    ties = (np.arange(1000, dtype=np.uint32) << 16 | 0x8000).view(np.float32)  # exactly halfway
    values = np.concatenate([values, ties, -ties])
    ours = conformance._round_to_dtype(values, "bfloat16")
    theirs = torch.from_numpy(values).bfloat16().float().numpy()
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))


def test_every_value_case_holds_every_finite_float16():
    case = every_value_case("float16")
    assert case.values[0].size == 2**16 - 2 * 1024  # all but the inf/NaN exponent
    assert case.max_norm == pytest.approx(0.3 * reference_clip(case.values, math.inf).total_norm)


def test_model_gradient_shapes_of_andrea_120m():
    shapes = conformance.model_gradient_shapes("andrea-120m")
    assert (8449, 768) in shapes and (3 * 768, 768) in shapes
    assert len(shapes) == 149 and sum(math.prod(s) for s in shapes) == 98_230_272


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"tensor_kind": "jax"}, "tensor_kind must be 'torch' or 'numpy', was 'jax'"),
        ({"tensor_kind": "numpy", "dtypes": ("bfloat16",)}, "numpy has no bfloat16"),
        ({"nonfinite": "ignore"}, "nonfinite must be 'untouched' or 'torch', was 'ignore'"),
        ({"dtypes": ("float64",)}, "dtype must be one of float32, float16, bfloat16, was 'float64'"),
    ],
)
def test_bad_arguments_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        check_clip_function(torch_clip, max_examples=1, **kwargs)


def test_importing_the_kit_imports_neither_hypothesis_nor_torch():
    code = "import pytest_spikecheck.clipping.conformance, sys; print('hypothesis' in sys.modules, 'torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "False"]
