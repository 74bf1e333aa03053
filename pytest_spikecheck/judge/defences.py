"""Which defence a run trained with, as the judges ask it: one accessor per fact, each reading
the record's facts (:class:`~pytest_spikecheck.records.facts.RunFacts`: what the engine, the
recorder or the log said of the run), never the engine's defaults. Each returns None where the
record does not say. No numpy even."""

from __future__ import annotations

import math
from typing import Any

#: QK-Clip bounds the largest attention logit to this many times its tau from its first clip on
#: (a clip acts after its step's update; the next update moves the weights again).
QK_CLIP_FACTOR = 2.0


def _run(record_or_run: Any) -> Any:
    """The Run behind a Record (or the Run itself); None for a log or arrays."""
    return getattr(record_or_run, "run", record_or_run) if hasattr(record_or_run, "run") else record_or_run


def facts_of(record_or_run: Any) -> Any:
    """The record's facts (a Record's own, e.g. a log's, else its Run's); None where it has none."""
    return getattr(record_or_run, "facts", None) or getattr(_run(record_or_run), "facts", None)


def qk_clip_tau(record_or_run: Any) -> float | None:
    """QK-Clip's threshold tau, None when QK-Clip was not on in the run (or the record cannot say)."""
    qk = getattr(facts_of(record_or_run), "qk_clip", None)
    tau = getattr(qk, "tau", None)
    return None if tau is None else float(tau)


def grad_clip_limit(record_or_run: Any) -> float | None:
    """The gradient-norm clip's fixed max_norm; inf with no clip (or an adaptive one, whose limit
    moves: its ``clip_limit`` column has it); None where the record cannot say."""
    clip = getattr(facts_of(record_or_run), "clip", None)
    return None if clip is None else float(clip.limit)


def grad_clip_adaptive(record_or_run: Any) -> bool:
    """Whether the gradient clip sets its own limit per step (its ``clip_limit`` column)."""
    return getattr(getattr(facts_of(record_or_run), "clip", None), "kind", None) == "adaptive"


def clip_before_unscale(record_or_run: Any) -> int | None:
    """The first step at which the clip saw loss-scaled gradients (found by the recorder:
    ``ClipBeforeUnscaleWarning``, or declared by the facts: ClipBeforeUnscale), None when it never did."""
    run = _run(record_or_run)
    found = (getattr(run, "meta", None) or {}).get("clip_before_unscale_at")
    if found:
        return int(found[0])
    if getattr(getattr(facts_of(record_or_run), "clip", None), "when", None) == "before_unscale":
        return 1
    return None


def has_grad_clip(record_or_run: Any) -> bool:
    limit = grad_clip_limit(record_or_run)
    return limit is not None and not math.isinf(limit)
