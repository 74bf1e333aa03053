"""Which non-finite values fail a run: one decision per value, said in words (numpy only).

``spikecheck check``, ``assert_finite`` and ``assert_diverges`` read the same decisions.
By default:

- a **gradient norm at a skipped step** (``Record.skipped``: a loss scaler found inf/NaN
  gradients and did not apply the update) is excused, and counted; the loss at that step is
  never excused;
- every other non-finite value fails the run.

``strict=True`` (``--strict-finite``) excuses nothing: every non-finite value in any column
fails, as before skipped steps were read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pytest_spikecheck.judge.text import fmt
from pytest_spikecheck.records import Record

#: The decisions a non-finite value can get (the ``decision`` of a :class:`NonFiniteGroup`).
FAILS = "fails"
SKIPPED_STEP = "skipped step"


def is_gradient_norm(name: str) -> bool:
    """A column measuring the gradient (pre-/post-clip norm, HF's ``grad_norm``, a per-layer
    ``hidden_gradient_norm``) or derived from it (``clip_factor``): the columns a skipped
    step's overflow shows in."""
    low = name.lower()
    return ("grad" in low and "norm" in low and "scale" not in low) or low == "clip_factor"


@dataclass(frozen=True)
class NonFiniteGroup:
    """The non-finite values of one column that got one decision."""

    metric: str
    decision: str  # FAILS, SKIPPED_STEP
    first_step: int
    first_value: float
    count: int
    why: str

    def text(self) -> str:
        where = f"step {self.first_step}" if self.count == 1 else f"{self.count} steps from step {self.first_step}"
        return f"{self.metric} = {fmt(self.first_value)} at {where}: {self.why}"


@dataclass(frozen=True)
class Finiteness:
    """Every non-finite value of a record, grouped by column and decision."""

    strict: bool
    groups: tuple[NonFiniteGroup, ...] = ()
    skipped_steps: int = 0  # how many steps the record says were skipped
    #: per column, True at the rows whose non-finite value is excused (left out of the judged series)
    excused: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def first_failure(self) -> NonFiniteGroup | None:
        failing = [g for g in self.groups if g.decision == FAILS]
        return min(failing, key=lambda g: g.first_step) if failing else None

    @property
    def ok(self) -> bool:
        return self.first_failure is None

    def excused_groups(self) -> list[NonFiniteGroup]:
        return [g for g in self.groups if g.decision != FAILS]

    def as_dict(self) -> dict:
        return {"strict": self.strict, "skipped_steps": self.skipped_steps,
                "decisions": [{"metric": g.metric, "decision": g.decision, "count": g.count,
                               "first_step": g.first_step, "first_value": g.first_value, "why": g.why}
                              for g in self.groups]}


def judge_finite(rec: Record, names: list[str] | None = None, strict: bool = False) -> Finiteness:
    """The decision on every non-finite value of ``names`` (default: every column)."""
    steps = np.asarray(rec.metrics["step"])
    names = [k for k in rec.metrics if k != "step"] if names is None else [k for k in names if k in rec.metrics]
    skipped = {} if strict else dict(rec.skipped)
    at_skipped = np.isin(steps, np.fromiter(skipped, dtype=np.int64, count=len(skipped))) if skipped else None
    groups: list[NonFiniteGroup] = []
    excused: dict[str, np.ndarray] = {}
    for name in names:
        values = np.asarray(rec.metrics[name], dtype=np.float64)
        bad = ~np.isfinite(values)
        if name in rec.missing:
            bad &= ~rec.missing[name]
        if not bad.any():
            continue
        fails = bad
        if at_skipped is not None and is_gradient_norm(name):
            skip = bad & at_skipped
            if skip.any():
                rows = np.flatnonzero(skip)
                reasons = sorted({skipped[int(s)] for s in steps[rows]})
                groups.append(NonFiniteGroup(name, SKIPPED_STEP, int(steps[rows[0]]), float(values[rows[0]]), rows.size,
                                             f"a skipped step ({'; '.join(reasons)}): the update was not applied, "
                                             f"not a failure"))
                excused[name] = skip
                fails = bad & ~skip
        if fails.any():
            rows = np.flatnonzero(fails)
            groups.append(NonFiniteGroup(name, FAILS, int(steps[rows[0]]), float(values[rows[0]]), rows.size,
                                         "fails the run"))
    return Finiteness(strict, tuple(groups), len(skipped), excused)
