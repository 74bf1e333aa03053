"""The clipping API (pytest_spikecheck.clipping) and its torch backend."""

from __future__ import annotations

import math
import re
import subprocess
import sys

import pytest
import torch

from pytest_spikecheck import clipping
from pytest_spikecheck.clipping import (
    CLIP_EPS,
    NonFiniteGradientError,
    available_backends,
    clip_grad_norm_,
    clip_grads_,
    get_backend,
    resolve_backend,
)
from pytest_spikecheck.clipping._registry import BackendUnavailableError, unavailable_reason


def make_params(shapes=((17, 8), (8,), (33, 5), (1,)), dtype=torch.float32, seed=0, grad_scale=1.0) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    params = []
    for shape in shapes:
        param = torch.nn.Parameter(torch.zeros(shape, dtype=dtype))
        param.grad = (torch.randn(shape, generator=generator) * grad_scale).to(dtype)
        params.append(param)
    return params


def grads_of(params) -> list[torch.Tensor]:
    return [p.grad.clone() for p in params]


def assert_same_bits(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    for a, e in zip(actual, expected, strict=True):
        assert a.dtype == e.dtype
        assert torch.equal(
            a.view(torch.int16 if a.element_size() == 2 else torch.int32),
            e.view(torch.int16 if e.element_size() == 2 else torch.int32),
        )


# ---------------------------------------------------------------------------------------------
# The torch backend is torch.nn.utils.clip_grad_norm_, bit for bit


@pytest.mark.parametrize(
    "dtypes", [(torch.float32,), (torch.bfloat16,), (torch.float16,), (torch.float32, torch.bfloat16)], ids=str
)
@pytest.mark.parametrize("max_norm", [0.5, 1e3, math.inf])
@pytest.mark.parametrize("foreach", [None, True, False])
def test_torch_backend_is_bit_identical_to_torch(dtypes, max_norm, foreach):
    shapes = ((17, 8), (8,), (33, 5), (1,), (0,))
    ours = [p for i, dtype in enumerate(dtypes) for p in make_params(shapes, dtype, seed=i)]
    theirs = [p for i, dtype in enumerate(dtypes) for p in make_params(shapes, dtype, seed=i)]

    norm = clip_grad_norm_(ours, max_norm, backend="torch")
    expected = torch.nn.utils.clip_grad_norm_(theirs, max_norm, foreach=foreach)

    assert norm.dtype == expected.dtype
    assert torch.equal(norm, expected)
    assert_same_bits([p.grad for p in ours], [p.grad for p in theirs])


def test_clipped_norm_is_max_norm():
    params = make_params(grad_scale=10.0)
    before = float(clip_grad_norm_(params, 1.0, backend="torch"))
    after = float(clip_grad_norm_(params, math.inf, backend="torch"))
    assert before > 1.0
    assert after == pytest.approx(1.0 * before / (before + CLIP_EPS), rel=1e-6)


def test_max_norm_none_measures_without_clipping():
    params = make_params(grad_scale=10.0)
    original = grads_of(params)
    norm = clip_grad_norm_(params, None, backend="torch")
    expected = torch.linalg.vector_norm(torch.cat([g.flatten() for g in original]))
    assert norm == pytest.approx(float(expected), rel=1e-6)
    assert_same_bits([p.grad for p in params], original)


def test_clip_grads_returns_norm_scale_and_flag():
    params = make_params(grad_scale=10.0)
    result = clip_grads_(params, 1.0, backend="torch")
    assert result.total_norm.dtype == torch.float32 and result.total_norm.dim() == 0
    assert float(result.scale) == pytest.approx(1.0 / (float(result.total_norm) + CLIP_EPS), rel=1e-6)
    assert result.nonfinite.dtype == torch.bool and not bool(result.nonfinite)


def test_clip_grad_norm_returns_clip_grads_total_norm():
    a, b = make_params(seed=3), make_params(seed=3)
    assert torch.equal(clip_grad_norm_(a, 0.3, backend="torch"), clip_grads_(b, 0.3, backend="torch").total_norm)


def test_parameters_without_gradients_give_zero_norm():
    params = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))]
    result = clip_grads_(params, 1.0, backend="torch")
    assert float(result.total_norm) == 0.0 and float(result.scale) == 1.0 and not bool(result.nonfinite)


def test_a_single_tensor_is_accepted_like_torch():
    param = make_params(shapes=((4, 4),), grad_scale=10.0)[0]
    norm = clip_grad_norm_(param, 1.0, backend="torch")
    assert float(torch.linalg.vector_norm(param.grad)) == pytest.approx(1.0, rel=1e-5)
    assert norm > 1.0


def test_float16_clip_coefficient_overflows_in_torch_and_in_the_torch_backend():
    """torch computes the coefficient in the gradients' dtype: for float16 gradients whose norm is
    below ~1.5e-5, 1 / (norm + 1e-6) overflows to inf, the coefficient clamps to 1 and nothing is
    clipped. The torch backend keeps that behaviour (it is torch); the kernels compute in float32
    and clip. This is why the conformance kit checks the torch backend on float32 and bfloat16."""
    grads = [torch.full((4,), 6e-6, dtype=torch.float16)]
    ours, theirs = [g.clone() for g in grads], [torch.nn.Parameter(g.clone()) for g in grads]
    theirs[0].grad = grads[0].clone()
    max_norm = 1e-6
    norm, scale = get_backend("torch").clip_(ours, max_norm)
    torch.nn.utils.clip_grad_norm_(theirs, max_norm)
    assert float(norm) > max_norm
    assert float(scale) == 1.0  # not clipped
    assert torch.equal(ours[0], grads[0]) and torch.equal(theirs[0].grad, grads[0])


# ---------------------------------------------------------------------------------------------
# Per-tensor mode


def test_per_tensor_mode_clips_each_tensor_to_max_norm():
    params = make_params(shapes=((10,), (20,), (5,)), grad_scale=0.1)
    params[1].grad.mul_(1000)  # the only tensor above max_norm
    original = grads_of(params)
    max_norm = 2.0
    result = clip_grads_(params, max_norm, backend="torch", mode="per_tensor")

    norms_before = [float(torch.linalg.vector_norm(g)) for g in original]
    norms_after = [float(torch.linalg.vector_norm(p.grad)) for p in params]
    assert norms_before[1] > max_norm and norms_before[0] < max_norm and norms_before[2] < max_norm
    assert norms_after[1] == pytest.approx(max_norm, rel=1e-5)
    assert torch.equal(params[0].grad, original[0]) and torch.equal(params[2].grad, original[2])
    # total_norm is the global pre-clip norm; scale is the global norm after / before
    assert float(result.total_norm) == pytest.approx(math.hypot(*norms_before), rel=1e-6)
    assert float(result.scale) == pytest.approx(math.hypot(*norms_after) / math.hypot(*norms_before), rel=1e-5)


def test_per_tensor_mode_changes_relative_scales_but_global_mode_keeps_them():
    """Seed B's point: per-tensor clipping distorts the ratio between tensors, global does not."""
    global_params = make_params(shapes=((10,), (10,)), seed=1)
    global_params[1].grad.mul_(50)
    per_tensor_params = [torch.nn.Parameter(p.detach().clone()) for p in global_params]
    for p, q in zip(per_tensor_params, global_params):
        p.grad = q.grad.clone()
    ratio_before = float(torch.linalg.vector_norm(global_params[1].grad) / torch.linalg.vector_norm(global_params[0].grad))

    clip_grads_(global_params, 1.0, backend="torch")
    clip_grads_(per_tensor_params, 1.0, backend="torch", mode="per_tensor")

    def ratio(ps):
        return float(torch.linalg.vector_norm(ps[1].grad) / torch.linalg.vector_norm(ps[0].grad))

    assert ratio(global_params) == pytest.approx(ratio_before, rel=1e-5)
    assert ratio(per_tensor_params) < ratio_before / 10


# ---------------------------------------------------------------------------------------------
# Non-finite gradients


@pytest.mark.parametrize("bad_value, expected_norm", [(math.nan, "nan"), (math.inf, "inf"), (-math.inf, "inf")])
def test_nonfinite_norm_is_reported_and_gradients_are_left_alone(bad_value, expected_norm):
    params = make_params(grad_scale=10.0)
    params[2].grad[3, 1] = bad_value
    original = grads_of(params)
    result = clip_grads_(params, 1.0, backend="torch")
    if expected_norm == "nan":
        assert math.isnan(float(result.total_norm))
    else:
        assert float(result.total_norm) == math.inf
    assert bool(result.nonfinite)
    assert float(result.scale) == 1.0
    for grad, before in zip((p.grad for p in params), original):
        assert torch.equal(grad.nan_to_num(), before.nan_to_num())
        assert torch.equal(grad.isnan(), before.isnan())


def test_error_if_nonfinite_raises():
    params = make_params()
    params[0].grad[0, 0] = math.nan
    with pytest.raises(NonFiniteGradientError, match=r"total gradient norm is non-finite \(nan\)"):
        clip_grad_norm_(params, 1.0, backend="torch", error_if_nonfinite=True)


def test_error_if_nonfinite_is_quiet_for_finite_norms():
    params = make_params(grad_scale=10.0)
    assert math.isfinite(float(clip_grad_norm_(params, 1.0, backend="torch", error_if_nonfinite=True)))


# ---------------------------------------------------------------------------------------------
# Validation


@pytest.mark.parametrize(
    "max_norm, message",
    [
        (-1.0, r"max_norm must be >= 0 \(inf or None for no clipping\), was -1.0"),
        (math.nan, r"max_norm must be a number, inf or None, was nan"),
        ("one", r"max_norm must be a number, inf or None \(no clipping\), was 'one'"),
    ],
)
def test_invalid_max_norm_is_rejected(max_norm, message):
    with pytest.raises(ValueError, match=message):
        clip_grad_norm_(make_params(), max_norm, backend="torch")


def test_empty_parameter_list_is_rejected():
    with pytest.raises(ValueError, match="empty parameter list"):
        clip_grad_norm_([], 1.0, backend="torch")


def test_unknown_backend_is_rejected():
    with pytest.raises(ValueError, match=r"unknown clipping backend 'tpu'; choose one of auto, cupy, torch, emulator"):
        clip_grad_norm_(make_params(), 1.0, backend="tpu")


def test_unknown_mode_is_rejected():
    with pytest.raises(ValueError, match=r"clip mode must be one of global, per_tensor, was 'layerwise'"):
        clip_grad_norm_(make_params(), 1.0, backend="torch", mode="layerwise")


# ---------------------------------------------------------------------------------------------
# Backend selection


def test_auto_falls_back_to_torch_when_cupy_cannot_run(monkeypatch):
    cupy_backend = pytest.importorskip("pytest_spikecheck.clipping.cupy_backend")
    monkeypatch.setattr(cupy_backend.BACKEND, "unavailable_reason", lambda: "no GPU in this test")
    assert resolve_backend("auto") == "torch"
    assert "cupy" not in available_backends()
    with pytest.raises(BackendUnavailableError, match="no GPU in this test"):
        get_backend("cupy")


@pytest.mark.parametrize("name", clipping.BACKEND_NAMES)
def test_available_means_it_clips_and_unavailable_means_it_says_why(name):
    # Listed as available: get_backend works and a global clip through it holds the
    # measured norm to max_norm. Not listed: get_backend refuses with the one-line reason.
    if name not in available_backends():
        reason = unavailable_reason(name)
        assert reason is not None and "\n" not in reason
        with pytest.raises(BackendUnavailableError, match=re.escape(reason)):
            get_backend(name)
        return
    assert get_backend(name) is not None
    params = make_params()
    clip_grads_(params, 1.0, backend=name)
    measured = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in params))
    assert measured == pytest.approx(1.0, rel=1e-5)


def test_torch_is_always_available():
    # The fallback of ``auto`` on a machine without CUDA: the whole harness depends on it.
    assert "torch" in available_backends() and unavailable_reason("torch") is None


@pytest.mark.skipif(unavailable_reason("cupy") is None, reason="a CUDA device is present")
def test_cupy_reason_is_one_line_naming_what_is_missing():
    reason = unavailable_reason("cupy")
    assert reason is not None and "\n" not in reason
    assert reason.startswith("cupy backend needs")


def test_importing_the_clipping_package_imports_neither_torch_nor_cupy():
    code = "import pytest_spikecheck.clipping, sys; print('torch' in sys.modules, 'cupy' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "False"]


def test_auto_prefers_backends_in_the_registry_order(monkeypatch):
    # Without cupy, ``auto`` is torch, never the emulator (even where the emulator can run);
    # the available list keeps the registry's order of preference.
    cupy_backend = pytest.importorskip("pytest_spikecheck.clipping.cupy_backend")
    monkeypatch.setattr(cupy_backend.BACKEND, "unavailable_reason", lambda: "no GPU in this test")
    assert resolve_backend("auto") == "torch" and resolve_backend("auto", "cpu") == "torch"
    assert [n for n in clipping.BACKEND_NAMES if n in available_backends()] == available_backends()


@pytest.mark.parametrize("norm_type", [2.0, 2, math.inf])
def test_norm_type_2_and_inf_match_torch(norm_type):
    torch.manual_seed(0)
    ours = [torch.randn(5, 3, requires_grad=True), torch.randn(7, requires_grad=True)]
    theirs = [p.detach().clone().requires_grad_(True) for p in ours]
    for a, b in zip(ours, theirs):
        a.grad = torch.randn_like(a) * 3
        b.grad = a.grad.clone()
    norm = clip_grad_norm_(ours, 0.5, backend="torch", norm_type=norm_type)
    expected = torch.nn.utils.clip_grad_norm_(theirs, 0.5, norm_type=norm_type)
    torch.testing.assert_close(norm, expected)
    for a, b in zip(ours, theirs):  # torch divides by norm + 1e-6: equal to ~1e-6 relative
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"norm_type": 1.0}, "norm_type must be 2.0 .global L2. or inf"),
        ({"norm_type": "2"}, "norm_type must be 2.0"),
        ({"max_norm": "1.0"}, r"max_norm must be a number, inf or None \(no clipping\), was '1.0'"),
        ({"max_norm": True}, r"max_norm must be a number, inf or None \(no clipping\), was True"),
    ],
)
def test_clip_grad_norm_refuses_what_torch_would_not_mean(kwargs, message):
    p = torch.ones(3, requires_grad=True)
    p.grad = torch.ones(3)
    with pytest.raises(ValueError, match=message):
        clip_grad_norm_([p], **{"max_norm": 1.0, **kwargs}, backend="torch")
