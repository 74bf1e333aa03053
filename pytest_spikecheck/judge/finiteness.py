"""Which non-finite values fail a run: one decision per value, by column and context, said in
words (numpy only). ``spikecheck check``, ``assert_finite`` and ``assert_diverges`` read the
same decisions. By default:

- the **training loss** (``loss``, and any other training loss column: ``z_loss``, ``lm loss``)
  and the **gradient norms** (pre-/post-clip, HF's ``grad_norm``, per-layer norms, the clip
  factor) are the columns whose non-finite values fail a run, except:

  - a gradient norm at a **skipped step** (``Record.skipped``: a loss scaler found inf/NaN
    gradients and did not apply the update; the log says so, or the overflow rule of
    :mod:`pytest_spikecheck.records.logs.skips` inferred it), reported and counted; the loss at
    that step is never excused;
  - NaN **before a column's first real value** (``hidden_gradient_norm = nan`` at step 0):
    "not yet computed";

- an **evaluation** column (``eval_loss``, ``val/loss``, ``test_*``) that is NaN is an
  evaluation's result, not a training failure; **any other column** (the learning rate, a
  reward, an accuracy) is no training loss or gradient norm: both are reported, not failures;
- Megatron's ``nan_iterations`` counter above 0 fails: it counted iterations with a NaN loss.

``strict=True`` (``--strict-finite``) excuses nothing: every non-finite value in any column
fails.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from pytest_spikecheck.judge.analysis import clip_limits
from pytest_spikecheck.judge.text import fmt
from pytest_spikecheck.records import Record

#: The decisions a non-finite value can get (the ``decision`` of a :class:`NonFiniteGroup`).
FAILS = "fails"
SKIPPED_STEP = "skipped step"
NOT_YET_COMPUTED = "not yet computed"
EVALUATION = "evaluation"
NOT_TRAINING = "not training"
#: Megatron's count of iterations with a NaN loss in each logged interval (the text reader's name).
NAN_COUNTER = "nan_iterations"

_EVAL = re.compile(r"(^|[/_\-. ])(eval|evaluation|val|valid|validation|test|predict|dev)([/_\-. ]|$)", re.I)


def is_gradient_norm(name: str) -> bool:
    """A column measuring the gradient (pre-/post-clip norm, HF's ``grad_norm``, a per-layer
    ``hidden_gradient_norm``) or derived from it (``clip_factor``): the columns a skipped
    step's overflow shows in."""
    low = name.lower()
    return ("grad" in low and "norm" in low and "scale" not in low) or low == "clip_factor"


def column_role(name: str) -> str:
    """ "training loss", "gradient norm", "evaluation" or "other": what a column's non-finite
    value means."""
    low = name.lower()
    if _EVAL.search(low):
        return "evaluation"
    if is_gradient_norm(name):
        return "gradient norm"
    if "loss" in low and "scale" not in low:
        return "training loss"
    return "other"


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
    skipped_steps: tuple[int, ...] = ()  # the steps the record says were skipped (their updates not applied)
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
        return {
            "strict": self.strict,
            "skipped_steps": list(self.skipped_steps),
            "decisions": [
                {
                    "metric": g.metric,
                    "decision": g.decision,
                    "count": g.count,
                    "first_step": g.first_step,
                    "first_value": g.first_value,
                    "why": g.why,
                }
                for g in self.groups
            ],
        }


def judge_finite(rec: Record, names: list[str] | None = None, strict: bool = False) -> Finiteness:
    """The decision on every non-finite value of ``names`` (default: every column)."""
    steps = np.asarray(rec.metrics["step"])
    names = [k for k in rec.metrics if k != "step"] if names is None else [k for k in names if k in rec.metrics]
    skipped = {} if strict else dict(rec.skipped)
    at_skipped = np.isin(steps, np.fromiter(skipped, dtype=np.int64, count=len(skipped))) if skipped else None
    groups: list[NonFiniteGroup] = []
    excused: dict[str, np.ndarray] = {}

    def group(name: str, decision: str, mask: np.ndarray, values: np.ndarray, why: str) -> None:
        rows = np.flatnonzero(mask)
        groups.append(NonFiniteGroup(name, decision, int(steps[rows[0]]), float(values[rows[0]]), rows.size, why))
        if decision != FAILS:
            excused[name] = excused[name] | mask if name in excused else mask

    for name in names:
        values = np.asarray(rec.metrics[name], dtype=np.float64)
        logged = ~rec.missing[name] if name in rec.missing else np.ones(values.shape, dtype=bool)
        bad = ~np.isfinite(values) & logged
        role = column_role(name)
        if name == NAN_COUNTER:  # a count above 0 is a NaN loss, strict or not
            counted = logged & np.isfinite(values) & (values > 0)
            if counted.any():
                group(name, FAILS, counted, values, "Megatron counted iterations with a NaN loss: fails the run")
        if not bad.any():
            continue
        if strict:
            group(name, FAILS, bad, values, "fails the run (--strict-finite)")
            continue
        if role == "evaluation":
            group(name, EVALUATION, bad, values, "an evaluation's result, not training: not a failure")
            continue
        if role == "other":
            group(name, NOT_TRAINING, bad, values, "neither a training loss nor a gradient norm: not a failure")
            continue
        fails = bad
        # A step the log says was skipped is that, first: an fp16 run's first steps are often the
        # scaler finding its scale (inf norms, skipped), not a column "not yet computed".
        if at_skipped is not None and role == "gradient norm":
            skip = fails & at_skipped
            if skip.any():
                reasons = sorted({skipped[int(s)] for s in steps[skip]})
                group(
                    name,
                    SKIPPED_STEP,
                    skip,
                    values,
                    f"a skipped step ({'; '.join(reasons)}): the update was not applied, not a failure",
                )
                fails = fails & ~skip
        finite = np.flatnonzero(np.isfinite(values) & logged)
        if finite.size:
            early = fails & np.isnan(values) & (np.arange(values.size) < finite[0])
            if early.any():
                group(
                    name,
                    NOT_YET_COMPUTED,
                    early,
                    values,
                    f"before the column's first value (step {int(steps[finite[0]])}): not yet computed, not a failure",
                )
                fails = fails & ~early
        if fails.any():
            group(name, FAILS, fails, values, "fails the run")
    return Finiteness(strict, tuple(groups), tuple(sorted(int(s) for s in skipped)), excused)


def nonfinite_norm_cause(rec: Record, step: int) -> str | None:
    """Why the gradient norm at ``step`` is not finite, where the record's pre- and post-clip norms
    (``grad_norm_pre``, ``grad_norm_post``; the engine measures the second in float64 on the
    gradients the optimizer would receive) tell it; None where they do not.

    - an infinite pre-clip norm, then a NaN post-clip norm with no clip limit: between the two
      something multiplied every gradient by NaN (said only where the record states there was no
      clip: a real clip of an infinite norm gives NaN too, inf × 0); torch's ``clip_grad_norm_`` at ``max_norm=inf``
      does (its coefficient inf / (inf + 1e-6) = NaN), the call people make only to log the norm;
    - an infinite pre-clip norm and a finite post-clip norm: every gradient is finite, only the
      norm overflowed (torch sums the squares in the gradients' dtype: float32 overflows near 1.8e19)."""
    m = rec.metrics
    if "grad_norm_pre" not in m or "grad_norm_post" not in m:
        return None
    rows = np.flatnonzero(np.asarray(m["step"]) == step)
    if not rows.size:
        return None
    i = rows[0]
    pre, post = float(m["grad_norm_pre"][i]), float(m["grad_norm_post"][i])
    # the limit is a fact of the record (its clip_limit, null or inf: no clip; else its facts'); a
    # record that states neither (a log) leaves it unknown
    limits = clip_limits(rec)
    limit = float(limits[i]) if limits is not None else float("nan")
    if not np.isinf(pre):
        return None
    if np.isnan(post) and np.isinf(limit):
        return (
            "the gradient norm was inf and then every gradient NaN (the post-clip norm is NaN, with no clip): "
            "a clip coefficient max_norm / norm = inf / inf = NaN multiplied them, as "
            "torch.nn.utils.clip_grad_norm_(max_norm=inf) does when it is called only to log the norm; "
            "log it with torch.nn.utils.get_total_norm, which leaves the gradients alone"
        )
    if np.isfinite(post):
        return (
            f"every gradient is finite (their float64 norm is {fmt(post)}): only the norm overflowed, its squares "
            f"summed in the gradients' dtype (float32 overflows above ~1.8e19)"
        )
    return None
