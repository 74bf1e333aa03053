"""One event record's shape: the detail of a declared event, a spike or a non-finite step.

Both writers fill an :class:`Event`: the engine's ``EventRecorder``
(:mod:`pytest_spikecheck.training.recorders`) and the recorder in someone else's loop
(:mod:`pytest_spikecheck.integrations.recorder`, also under the HF and Lightning callbacks);
``events.json`` is the list of their :meth:`Event.to_json`; the judges (``Run.event_at``, the
diagnosis' rungs 4-6) read the fields. The published schema is the ``events.json`` part of
docs/run-schema.json. numpy only (no torch).

The three tables stay JSON objects (their keys are described in docs/run-format.md):
``token_losses`` (the batch's per-token losses: ``mean``, ``p50``, ``p90``, ``p99``, ``max``,
``n_tokens``, ``rare_loss_share``, ``novel_loss_share``, ``novel_tokens``, ``worst``,
``by_token``), ``adam_surprise`` (``threshold``, ``share``, ``by_param``) and ``update``
(``max_abs``, ``by_param``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.records.facts import check_fields

#: Fields written only where the writer measured them (left out of events.json otherwise, so
#: an engine run's events.json is what it was before the type).
_WHERE_MEASURED = ("attn_logit_max_per_head", "update")


@dataclass(frozen=True)
class Event:
    """One event step's record. Every field but ``step`` may be None: not recorded."""

    step: int
    kinds: tuple[str, ...] = ()  # declared (burst, new_source), spike, nonfinite, overflow, skipped
    loss: float | None = None
    grad_norm_pre: float | None = None
    baseline_grad_norm: float | None = None  # the spike detector's median of the recent norms
    clip_factor: float | None = None
    max_norm: float | None = None  # this step's clip limit (None: no clip)
    grad_norm_post: float | None = None
    skipped: bool | None = None  # the update was not applied
    token_losses: Mapping[str, Any] | None = None  # None: the writer got no logits and targets
    param_grad_norms: Mapping[str, float] = field(default_factory=dict)  # pre-clip, largest first
    adam_surprise: Mapping[str, Any] | None = None  # None: not measured (a non-finite step)
    attn_logit_max_per_head: list[list[float]] | None = None  # layers x heads, where the model reports it
    update: Mapping[str, Any] | None = None  # the update's size (engine runs; None for a skipped step)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kinds", tuple(self.kinds))

    def to_json(self) -> dict[str, Any]:
        """The events.json object (keys in field order; a field of :data:`_WHERE_MEASURED` left out when None)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["kinds"] = list(self.kinds)
        out["param_grad_norms"] = dict(self.param_grad_norms)
        for name in _WHERE_MEASURED:
            if out[name] is None:
                del out[name]
        return out

    @classmethod
    def from_json(cls, raw: Any, *, where: str = "events.json") -> Event:
        """An events.json object (format 1 or 2: the same keys); an unknown field or a missing
        step is one line."""
        check_fields(cls, raw, where, "event")
        if not isinstance(raw.get("step"), int) or isinstance(raw.get("step"), bool):
            raise ConfigError(f"{where}: an event needs its step (an integer), was {raw.get('step')!r}")
        values = dict(raw)
        if values.get("kinds") is None:
            values["kinds"] = ()
        if values.get("param_grad_norms") is None:
            values["param_grad_norms"] = {}
        return cls(**values)

    def replace(self, **changes: Any) -> Event:
        return dataclasses.replace(self, **changes)


def events_to_json(events: list[Event]) -> list[dict[str, Any]]:
    return [e.to_json() for e in events]


def events_from_json(raw: Any, *, where: str = "events.json") -> list[Event]:
    """The events of an events.json (a JSON array of event objects)."""
    if not isinstance(raw, list):
        raise ConfigError(f"{where} must be a JSON array of events, was {type(raw).__name__}")
    return [Event.from_json(e, where=f"{where}[{i}]") for i, e in enumerate(raw)]
