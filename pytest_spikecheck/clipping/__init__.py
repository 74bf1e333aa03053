"""Global-L2 gradient clipping with interchangeable backends.

One entry point, :func:`clip_grad_norm_`, with the semantics of
``torch.nn.utils.clip_grad_norm_``::

    norm  = sqrt(sum over every gradient element of g**2)   # returned, pre-clip
    scale = min(1, max_norm / (norm + 1e-6))
    g    *= scale                                            # in place

Backends compute the same thing in different places: ``torch`` (foreach ops, any
device), ``cupy`` (CUDA kernels from ``kernels/clip.cu`` launched through CuPy) and
``emulator`` (the same ``.cu`` source compiled for the CPU with a thread emulator).
The training engine calls this module and never knows which backend ran.

Non-finite gradients (the one deliberate difference from torch): when the total norm
is NaN or inf the returned norm is NaN/inf exactly as torch reports it, but the
gradients are left untouched (scale 1) instead of being multiplied by NaN, and
:attr:`ClipResult.nonfinite` is set so the caller can skip the optimizer step.
``error_if_nonfinite=True`` raises :class:`NonFiniteGradientError` instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable

from pytest_spikecheck.clipping._registry import (
    BACKEND_NAMES,
    available_backends,
    get_backend,
    resolve_backend,
    unavailable_reason,
)

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

__all__ = [
    "BACKEND_NAMES",
    "CLIP_EPS",
    "ClipResult",
    "NonFiniteGradientError",
    "available_backends",
    "clip_grad_norm_",
    "clip_grads_",
    "get_backend",
    "resolve_backend",
    "unavailable_reason",
    "validate_max_norm",
]

_CONCRETE = frozenset(BACKEND_NAMES)

#: Added to the norm before dividing, as torch does, so a zero norm never divides by 0.
CLIP_EPS = 1e-6

CLIP_MODES = ("global", "per_tensor")


class NonFiniteGradientError(RuntimeError):
    """Raised with ``error_if_nonfinite=True`` when the total gradient norm is NaN or inf."""


@dataclass(frozen=True)
class ClipResult:
    """What one clip did. Every field is a 0-d tensor on the gradients' device (no host sync).

    ``total_norm`` is the pre-clip global L2 norm (float32, as torch returns it),
    ``scale`` the factor every gradient was multiplied by (1 when not clipped or
    non-finite), ``nonfinite`` a bool tensor, true when the norm is NaN or inf.
    """

    total_norm: "torch.Tensor"
    scale: "torch.Tensor"
    nonfinite: "torch.Tensor"


def validate_max_norm(max_norm: float | None) -> float:
    """Return ``max_norm`` as a float (``None`` means no clipping: ``inf``), or raise ValueError."""
    if max_norm is None:
        return math.inf
    try:
        value = float(max_norm)
    except (TypeError, ValueError):
        raise ValueError(f"max_norm must be a number, inf or None, was {max_norm!r}") from None
    if math.isnan(value) or value < 0:
        raise ValueError(f"max_norm must be >= 0 (inf or None for no clipping), was {max_norm!r}")
    return value


def _collect_grads(parameters: Any) -> list["torch.Tensor"]:
    import torch

    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    params = list(parameters)
    if not params:
        raise ValueError("clip_grad_norm_ got an empty parameter list")
    return [p.grad for p in params if p.grad is not None]


def _clip(parameters: Any, max_norm: float | None, backend: str, mode: str) -> tuple["torch.Tensor", "torch.Tensor"]:
    """Validate, clip in place, return (pre-clip total norm, scale): the work both entry points share."""
    import torch

    limit = validate_max_norm(max_norm)
    if mode not in CLIP_MODES:
        raise ValueError(f"clip mode must be one of {', '.join(CLIP_MODES)}, was {mode!r}")
    grads = _collect_grads(parameters)
    if not grads:
        return torch.zeros((), dtype=torch.float32), torch.ones((), dtype=torch.float32)
    impl = get_backend(backend if backend in _CONCRETE else resolve_backend(backend, grads[0].device))
    if mode == "global":
        return impl.clip_(grads, limit)
    norms_and_scales = [impl.clip_([g], limit) for g in grads]
    device = grads[0].device
    total_norm = torch.linalg.vector_norm(torch.stack([n.to(device) for n, _ in norms_and_scales]))
    after = torch.linalg.vector_norm(torch.stack([(n * s).to(device) for n, s in norms_and_scales]))
    finite = torch.isfinite(total_norm) & (total_norm > 0)
    return total_norm, torch.where(finite, after / torch.where(finite, total_norm, 1.0), 1.0)


def _raise_if_nonfinite(total_norm: "torch.Tensor") -> None:
    if not bool(total_norm.isfinite()):  # the one host sync, only when asked for
        raise NonFiniteGradientError(
            f"the total gradient norm is non-finite ({float(total_norm)}), so it cannot be clipped"
        )


def clip_grads_(
    parameters: Iterable["torch.Tensor"] | "torch.Tensor",
    max_norm: float | None,
    *,
    backend: str = "auto",
    mode: str = "global",
    error_if_nonfinite: bool = False,
) -> ClipResult:
    """Clip gradients in place and return the :class:`ClipResult` (norm, scale, non-finite flag).

    ``mode="per_tensor"`` clips each gradient tensor to ``max_norm`` on its own (the
    variant Seed B warns against: it distorts the relative scale of the tensors); the
    returned ``total_norm`` is still the global pre-clip norm and ``scale`` is the
    global norm after clipping divided by the one before. An empty gradient list (all
    parameters frozen) measures 0 and clips nothing.
    """
    total_norm, scale = _clip(parameters, max_norm, backend, mode)
    if error_if_nonfinite:
        _raise_if_nonfinite(total_norm)
    return ClipResult(total_norm, scale, ~total_norm.isfinite())


def clip_grad_norm_(
    parameters: Iterable["torch.Tensor"] | "torch.Tensor",
    max_norm: float | None,
    *,
    backend: str = "auto",
    mode: str = "global",
    error_if_nonfinite: bool = False,
) -> "torch.Tensor":
    """Drop-in for ``torch.nn.utils.clip_grad_norm_``: clip in place, return the pre-clip norm.

    ``max_norm=None`` or ``inf`` measures the norm without clipping. ``backend`` is one
    of ``"auto"`` (cupy when a CUDA device is usable, else torch), ``"torch"``,
    ``"cupy"`` or ``"emulator"``.

    >>> norm = clip_grad_norm_(model.parameters(), 1.0)  # doctest: +SKIP
    """
    total_norm, _ = _clip(parameters, max_norm, backend, mode)
    if error_if_nonfinite:
        _raise_if_nonfinite(total_norm)
    return total_norm
