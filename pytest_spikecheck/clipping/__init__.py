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

Sharded gradients (``process_group=``): when each rank of a ``torch.distributed`` group
holds a shard of the gradients (FSDP, ZeRO), the global norm needs every shard. Each rank
measures its shard with its backend, the squared norms are added by one ``all_reduce`` in
float64, and every rank derives the same norm and scale from the same sum and scales its own
shard. The result equals the single-process clip of the concatenated gradients within float32
rounding (~1e-7 relative), and the non-finite rule holds across ranks: a NaN on one rank makes
the sum NaN, so every rank reports a non-finite norm and leaves its shard untouched. Without
the group each rank would clip to its own shard's norm: the per-rank-norm bug that
:class:`~pytest_spikecheck.scenario.breaks.ShardLocalNorm` reproduces.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable

from pytest_spikecheck.clipping._registry import (
    BACKEND_NAMES,
    BackendUnavailableError,
    SpikecheckBackendWarning,
    available_backends,
    get_backend,
    resolve_backend,
    unavailable_reason,
)
from pytest_spikecheck.scenario.sections import check_max_norm

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

__all__ = [
    "BACKEND_NAMES",
    "BackendUnavailableError",
    "CLIP_EPS",
    "ClipResult",
    "NonFiniteGradientError",
    "SpikecheckBackendWarning",
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

    total_norm: torch.Tensor
    scale: torch.Tensor
    nonfinite: torch.Tensor


def validate_max_norm(max_norm: float | None) -> float:
    """Return ``max_norm`` as a float (``None`` means no clipping: ``inf``), or raise a
    ConfigError (a ValueError). The one rule for a limit
    (:func:`~pytest_spikecheck.scenario.sections.check_max_norm`) with torch's 0: these are drop-in
    replacements for ``torch.nn.utils.clip_grad_norm_``, which accepts ``max_norm=0`` (it zeroes
    the gradient), and the conformance kit tests that case. A scenario, a recorder or an
    assertion refuses 0 through the same function."""
    limit = check_max_norm(max_norm, "max_norm", zero="clips")
    return math.inf if limit is None else limit


def _collect_params(parameters: Any) -> list[torch.Tensor]:
    import torch

    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    params = list(parameters)
    if not params:
        raise ValueError("clip_grad_norm_ got an empty parameter list")
    return params


def _clip(
    parameters: Any, max_norm: float | None, backend: str, mode: str, process_group: Any = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate, clip in place, return (pre-clip total norm, scale): the work both entry points share."""
    import torch

    limit = validate_max_norm(max_norm)
    if mode not in CLIP_MODES:
        raise ValueError(f"clip mode must be one of {', '.join(CLIP_MODES)}, was {mode!r}")
    params = _collect_params(parameters)
    grads = [p.grad for p in params if p.grad is not None]
    if process_group is not None:
        if mode != "global":
            raise ValueError(
                f"clip mode {mode!r} cannot take a process_group: a shard may hold part of a tensor, "
                f"so only the global norm is defined across ranks"
            )
        return _clip_across_ranks(grads, params[0].device, limit, backend, process_group)
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


def _clip_across_ranks(
    grads: list[torch.Tensor], device: Any, limit: float, backend: str, process_group: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """The global clip of gradients sharded over ``process_group``; every rank must call it.

    A rank's squared shard norm is exact in float64 (its float32 norm squared), so the sum
    over ranks loses nothing to the reduction, whatever the number of ranks.
    """
    import torch
    import torch.distributed as dist

    from pytest_spikecheck.clipping.torch_backend import clip_scale

    impl = None
    if grads:
        impl = get_backend(backend if backend in _CONCRETE else resolve_backend(backend, grads[0].device))
        shard_norm, _ = impl.clip_(grads, math.inf)  # inf: measure only
        sum_of_squares = shard_norm.to(torch.float64).square()
    else:  # a rank without gradients still takes part in the all_reduce (the others wait for it)
        sum_of_squares = torch.zeros((), dtype=torch.float64, device=device)
    dist.all_reduce(sum_of_squares, op=dist.ReduceOp.SUM, group=process_group)
    total_norm = sum_of_squares.sqrt().to(torch.float32)
    scale = clip_scale(total_norm, limit)
    if impl is not None and limit != math.inf:
        impl.scale_(grads, scale)
    return total_norm, scale


def _raise_if_nonfinite(total_norm: torch.Tensor) -> None:
    if not bool(total_norm.isfinite()):  # the one host sync, only when asked for
        raise NonFiniteGradientError(f"the total gradient norm is non-finite ({float(total_norm)}), so it cannot be clipped")


def clip_grads_(
    parameters: Iterable[torch.Tensor] | torch.Tensor,
    max_norm: float | None,
    *,
    backend: str = "auto",
    mode: str = "global",
    error_if_nonfinite: bool = False,
    process_group: Any = None,
) -> ClipResult:
    """Clip gradients in place and return the :class:`ClipResult` (norm, scale, non-finite flag).

    ``mode="per_tensor"`` clips each gradient tensor to ``max_norm`` on its own (the
    variant Seed B warns against: it distorts the relative scale of the tensors); the
    returned ``total_norm`` is still the global pre-clip norm and ``scale`` is the
    global norm after clipping divided by the one before. An empty gradient list (all
    parameters frozen) measures 0 and clips nothing.

    ``process_group``: the gradients are this rank's shard; the norm, scale and flag are
    those of every rank's gradients together, identical on every rank (see the module
    docstring). Every rank of the group must call it, with or without gradients.
    """
    total_norm, scale = _clip(parameters, max_norm, backend, mode, process_group)
    if error_if_nonfinite:
        _raise_if_nonfinite(total_norm)
    return ClipResult(total_norm, scale, ~total_norm.isfinite())


def clip_grad_norm_(
    parameters: Iterable[torch.Tensor] | torch.Tensor,
    max_norm: float | None,
    *,
    backend: str = "auto",
    mode: str = "global",
    error_if_nonfinite: bool = False,
    process_group: Any = None,
    norm_type: float = 2.0,
) -> torch.Tensor:
    """Drop-in for ``torch.nn.utils.clip_grad_norm_``: clip in place, return the pre-clip norm.

    ``norm_type`` is 2.0 (the global L2 norm every backend computes) or ``inf`` (the largest
    ``|g|``, computed with torch whatever the backend), as in torch; any other value is refused.

    ``max_norm=None`` or ``inf`` measures the norm without clipping; ``error_if_nonfinite=True``
    raises :class:`NonFiniteGradientError` on a NaN or inf total norm (else the gradients are
    left untouched and the norm returned). ``mode`` is ``"global"`` or ``"per_tensor"``
    (each tensor clipped on its own), as in :func:`clip_grads_`. ``backend`` is one
    of ``"auto"`` (cupy when a CUDA device is usable, else torch), ``"torch"``,
    ``"cupy"`` or ``"emulator"``. With ``process_group`` the parameters are this rank's
    shard and the norm is the global one over every rank's shard (every rank must call it).

    >>> norm = clip_grad_norm_(model.parameters(), 1.0)  # doctest: +SKIP
    >>> norm = clip_grad_norm_(my_shard, 1.0, process_group=dist.group.WORLD)  # doctest: +SKIP
    """
    if isinstance(norm_type, bool) or not isinstance(norm_type, numbers.Real) or float(norm_type) not in (2.0, math.inf):
        raise ValueError(
            f"norm_type must be 2.0 (global L2) or inf (largest |g|), was {norm_type!r}: the kernels "
            f"and the training engine clip by the L2 norm"
        )
    if float(norm_type) == math.inf:
        total_norm = _clip_max_abs(parameters, max_norm, mode, process_group)
    else:
        total_norm, _ = _clip(parameters, max_norm, backend, mode, process_group)
    if error_if_nonfinite:
        _raise_if_nonfinite(total_norm)
    return total_norm


def _clip_max_abs(parameters: Any, max_norm: float | None, mode: str, process_group: Any) -> torch.Tensor:
    """``norm_type=inf``: the norm is the largest |g| over every gradient, clipped by the same
    rule as the L2 norm."""
    import torch

    limit = validate_max_norm(max_norm)
    if mode != "global" or process_group is not None:
        raise ValueError("norm_type=inf clips globally on one process only (mode='global', no process_group)")
    grads = [p.grad for p in _collect_params(parameters) if p.grad is not None]
    if not grads:
        return torch.zeros((), dtype=torch.float32)
    device = grads[0].device
    total_norm = torch.stack([g.detach().abs().max().float().to(device) for g in grads]).max()
    if math.isfinite(limit):
        # The L2 path's rule: coefficient min(1, max_norm / (norm + 1e-6)); a non-finite norm clips nothing.
        coefficient = torch.clamp(limit / (total_norm + 1e-6), max=1.0)
        scale = torch.where(torch.isfinite(total_norm), coefficient, torch.ones_like(total_norm))
        for g in grads:
            g.mul_(scale.to(g.dtype))
    return total_norm
