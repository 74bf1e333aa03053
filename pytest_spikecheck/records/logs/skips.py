"""Steps whose optimizer update was skipped (``Record.skipped``): from what the log says, or
inferred from the values.

**Said by the log**: a ``skipped`` column (our metrics.jsonl writes the reason, "overflow"), or
Megatron's ``number of skipped iterations`` counter above 0 at a logged iteration.

**Inferred** (the overflow rule): a loss scaler (fp16's GradScaler, DeepSpeed, Megatron) that
finds an inf or NaN gradient skips the update and lowers its scale; the log then shows a
non-finite gradient norm at that step while the loss stays finite. Applying a NaN gradient
instead would make every later loss NaN, so a non-finite gradient norm is read as a skipped
update when all of these hold:

- it is one logged step (several in a row only when the log has a loss scale column: a
  scaler halves its scale once per skipped step);
- the next logged gradient norm is finite;
- the loss is logged, and every loss logged from that step to the next finite norm is finite;
- the log does not say the run is bf16/fp32 (an argument dump with ``fp16 False`` and no loss
  scale column): without a scaler nothing skips an update.

The reason names the evidence: ``loss scale logged``, ``fp16 run`` (the log's own arguments
say so), or ``finite values after it`` (only the values). numpy only.
"""

from __future__ import annotations

import numpy as np

#: The gradient-norm columns the overflow rule reads (after renaming to our names).
GRAD_COLUMNS = ("grad_norm_pre", "grad_norm")
#: Megatron's per-interval counters, as the text reader names them.
MEGATRON_SKIPPED = "skipped_iterations"


def _logged(metrics: dict[str, np.ndarray], missing: dict[str, np.ndarray], name: str) -> tuple[np.ndarray, np.ndarray]:
    steps, values = metrics["step"], metrics[name]
    if name in missing:
        return steps[~missing[name]], values[~missing[name]]
    return steps, values


def infer(
    metrics: dict[str, np.ndarray], missing: dict[str, np.ndarray], skipped: dict[int, str], fp16: bool | None
) -> tuple[dict[int, str], list[str]]:
    """``skipped`` (step -> reason, from the log) with Megatron's counter and the overflow
    rule added, and a note per inference."""
    skipped = dict(skipped)
    notes: list[str] = []
    if MEGATRON_SKIPPED in metrics:
        steps, counts = _logged(metrics, missing, MEGATRON_SKIPPED)
        for s, k in zip(steps[counts > 0], counts[counts > 0]):
            skipped.setdefault(
                int(s),
                f"overflow (Megatron counted {int(k)} skipped iteration{'s' if k != 1 else ''} "
                f"in the interval logged at this step)",
            )
    if "loss" not in metrics:
        return skipped, notes
    has_scale = "loss_scale" in metrics and bool((~missing.get("loss_scale", np.zeros(1, bool))).any())
    if fp16 is False and not has_scale:
        return skipped, notes
    evidence = "loss scale logged" if has_scale else "fp16 run" if fp16 else "finite values after it"
    loss_steps, loss = _logged(metrics, missing, "loss")
    for name in GRAD_COLUMNS:
        if name not in metrics:
            continue
        steps, norms = _logged(metrics, missing, name)
        bad = np.flatnonzero(~np.isfinite(norms))
        if bad.size == 0:
            continue
        inferred = []
        for run in np.split(bad, np.flatnonzero(np.diff(bad) > 1) + 1):
            first, last = int(run[0]), int(run[-1])
            if (run.size > 1 and not has_scale) or last + 1 >= norms.size or any(int(steps[i]) in skipped for i in run):
                continue
            window = (loss_steps >= steps[first]) & (loss_steps <= steps[last + 1])
            if not window.any() or not np.isfinite(loss[window]).all():
                continue
            for i in run:
                skipped[int(steps[i])] = f"overflow (inferred: non-finite grad norm, finite loss, {evidence})"
                inferred.append(int(steps[i]))
        if inferred:
            shown = ", ".join(map(str, inferred[:5])) + (", ..." if len(inferred) > 5 else "")
            notes.append(
                f"{name} is non-finite at {len(inferred)} step{'s' if len(inferred) != 1 else ''} ({shown}) "
                f"where the loss, and the values after, stay finite: read as updates a loss scaler skipped "
                f"(overflow, {evidence}), not a divergence (--strict-finite fails them)"
            )
    return skipped, notes
