"""Which defence a run trained with, as the judges ask it: one accessor per fact, so that each
reads the run's record in one place (today the run's scenario; a run recorded from a user's
trainer answers from what its recorder saw). Each returns None where the record does not say.
numpy only (no numpy, even)."""

from __future__ import annotations

import math
from typing import Any

#: QK-Clip bounds the largest attention logit to this many times its tau from its first clip on
#: (a clip acts after its step's update; the next update moves the weights again).
QK_CLIP_FACTOR = 2.0


def _run(record_or_run: Any) -> Any:
    """The Run behind a Record (or the Run itself); None for a log or arrays."""
    return getattr(record_or_run, "run", record_or_run) if hasattr(record_or_run, "run") else record_or_run


def _optimizer(record_or_run: Any) -> Any:
    return getattr(getattr(_run(record_or_run), "scenario", None), "optimizer", None)


def qk_clip_tau(record_or_run: Any) -> float | None:
    """QK-Clip's threshold tau, None when QK-Clip was not on in the run (or the record cannot say)."""
    tau = getattr(_optimizer(record_or_run), "qk_clip", None)
    return None if tau is None else float(tau)


def grad_clip_limit(record_or_run: Any) -> float | None:
    """The gradient-norm clip's max_norm; inf with no clip; None where the record cannot say."""
    scenario = getattr(_run(record_or_run), "scenario", None)
    limit = getattr(scenario, "max_norm", None)
    return None if limit is None else float(limit)


def grad_clip_adaptive(record_or_run: Any) -> bool:
    """Whether the gradient clip sets its own limit per step (its ``clip_limit`` column)."""
    return getattr(_optimizer(record_or_run), "clip_mode", None) == "adaptive"


def clip_before_unscale(record_or_run: Any) -> int | None:
    """The first step at which the clip saw loss-scaled gradients (declared by the scenario, or
    found by the recorder: ``ClipBeforeUnscaleWarning``), None when it never did."""
    run = _run(record_or_run)
    found = (getattr(run, "meta", None) or {}).get("clip_before_unscale_at")
    if found:
        return int(found[0])
    if getattr(_optimizer(record_or_run), "clip_mode", None) == "before_unscale":
        return 1
    return None


def has_grad_clip(record_or_run: Any) -> bool:
    limit = grad_clip_limit(record_or_run)
    return limit is not None and not math.isinf(limit)
