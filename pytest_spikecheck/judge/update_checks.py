"""Assertions on the update the optimizer applied: defence bugs that leave the gradient right and
the step wrong (docs/defence-bugs.md).

- :func:`assert_muon_update_scale`: Muon's orthogonalised update has a known size, its adjusted
  lr times the RMS of an orthogonal matrix (``muon_update_ratio``, recorded by the engine's
  update recorder: about 0.9 on the nano GPT); a run whose Muon matrices moved far less (or far
  more) than that has something scaling Muon's step. DeepSpeed issue 8439's clip of the
  orthogonalised update (``ClipMuonUpdate``) divides it by the update's own norm and fails it.
- :func:`assert_optimizer_steps`: the optimizer's own count of the steps it applied (``step``
  in its state, what Adam's bias correction reads; the ``optimizer_steps`` column) must equal
  the steps the run applied (its steps less those skipped). OLMo-core's SkipStepAdamW whose
  counter never advanced (PR 317, ``SkipStepCounter``) fails it at step 1.

numpy only; records as every assertion takes them (a Run, a run folder, arrays, a log).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.judge.evidence import fail, passed
from pytest_spikecheck.judge.text import fmt
from pytest_spikecheck.records import Record, as_record

__all__ = ["assert_muon_update_scale", "assert_optimizer_steps"]

#: The band of RMS(ΔW) / Muon's expected RMS a healthy run stays in: Newton-Schulz's five
#: iterations leave singular values between about 0.7 and 1.2 (Keller Jordan's coefficients);
#: measured 0.87-0.90 on the nano GPT (docs/defence-bugs.md). Weight decay adds lr x wd x |W|.
MUON_RATIO_BAND = (0.5, 2.0)


def _column(rec: Record, name: str, what: str) -> tuple[np.ndarray, np.ndarray]:
    if name not in rec.metrics:
        raise ConfigError(
            f"the record has no {name!r} column ({what}); the engine records it "
            f"(training/recorders.py, UpdateRecorder) where it applies"
        )
    steps, values = rec.series(name)
    return np.asarray(steps, dtype=np.int64), np.asarray(values, dtype=np.float64)


def assert_muon_update_scale(run: Any, band: tuple[float, float] = MUON_RATIO_BAND) -> dict[str, float]:
    """Assert every applied step of ``run`` (a :class:`~pytest_spikecheck.records.run.Run`, a
    run folder, a record) moved Muon's matrices by about Muon's own scale: the recorded
    ``muon_update_ratio`` (median over Muon's matrices of RMS(ΔW) over the adjusted lr /
    sqrt(max(rows, cols)), torch.optim.Muon's ``adjust_lr`` rule) within ``band``. Returns
    ``{"min": ..., "max": ..., "median": ...}`` over the steps. A skipped step (no update) and a
    step without the column are not judged."""
    __tracebackhide__ = True
    rec = as_record(run)
    low, high = band
    if not 0 < low < 1 < high:
        raise ConfigError(f"band must be (low, high) with 0 < low < 1 < high, was {band!r}")
    steps, ratio = _column(rec, "muon_update_ratio", "RMS of Muon's update over its expected scale")
    keep = np.isfinite(ratio) & ~np.isin(steps, list(rec.skipped))
    if not keep.any():
        raise ConfigError("no step with a recorded Muon update to judge (every step skipped, or none recorded)")
    steps, ratio = steps[keep], ratio[keep]
    worst = int(np.argmax(np.maximum(low / ratio, ratio / high)))
    if not low <= ratio[worst] <= high:
        step, r = int(steps[worst]), float(ratio[worst])
        why = ""
        if "update_clip_norm" in rec.metrics:
            clip_steps, clip_norm = rec.series("update_clip_norm")
            at = np.flatnonzero(np.asarray(clip_steps) == step)
            if at.size and math.isfinite(clip_norm[at[0]]):
                why = (
                    f"; the clip was taken over Muon's update and divided it by {fmt(float(clip_norm[at[0]]))} "
                    f"(update_clip_norm), the norm of the update itself: clip the gradient, not the update "
                    f"(DeepSpeed issue 8439)"
                )
        fail(
            "assert_muon_update_scale",
            f"Muon's update at step {step} was {fmt(r)}x its expected scale (allowed "
            f"{fmt(low)}-{fmt(high)}x): the step was {'attenuated' if r < low else 'amplified'} "
            f"{fmt(1 / r if r < low else r)}x by something other than the lr{why}",
            rec,
            step,
            "muon_update_ratio",
            measured=r,
            limit=low if r < low else high,
            diagnose_step=False,
        )
    passed(
        "assert_muon_update_scale",
        f"Muon's update stayed within {fmt(low)}-{fmt(high)}x its expected scale "
        f"at every applied step (worst {fmt(float(ratio[worst]))}x)",
        rec,
        "muon_update_ratio",
        measured=float(ratio[worst]),
        step=int(steps[worst]),
    )
    return {"min": float(ratio.min()), "max": float(ratio.max()), "median": float(np.median(ratio))}


def assert_optimizer_steps(run: Any) -> dict[str, int]:
    """Assert the optimizer counted the steps it applied: at each step the recorded
    ``optimizer_steps`` (the largest ``step`` in its state) equals the run's steps so far less
    those whose update was skipped (``Record.skipped``: SkipSpikes, a loss scaler's overflow).
    Returns ``{"applied": ..., "counted": ...}`` at the last step."""
    __tracebackhide__ = True
    rec = as_record(run)
    steps, counted = _column(rec, "optimizer_steps", "the optimizer's own step count")
    all_steps = np.asarray(rec.metrics["step"], dtype=np.int64)
    skipped = np.isin(all_steps, list(rec.skipped))
    applied = dict(zip(all_steps.tolist(), np.cumsum(~skipped).tolist()))
    for step, count in zip(steps.tolist(), counted.tolist()):
        if not math.isfinite(count):
            continue
        expected = applied[step]
        if int(count) != expected:
            stuck = (
                " (it never advanced: Adam's bias correction stays that of its first step; OLMo-core PR 317)"
                if count == 0 or count == 1 < expected
                else ""
            )
            fail(
                "assert_optimizer_steps",
                f"at step {step} the optimizer counted {fmt(count)} steps but {expected} "
                f"were applied ({int(skipped[all_steps <= step].sum())} skipped){stuck}",
                rec,
                step,
                "optimizer_steps",
                measured=count,
                limit=expected,
                diagnose_step=False,
            )
    last = int(steps[-1]) if steps.size else 0
    passed(
        "assert_optimizer_steps",
        f"the optimizer counted every applied step ({int(applied.get(last, 0))})",
        rec,
        "optimizer_steps",
        measured=float(counted[-1]) if steps.size else None,
        step=last or None,
    )
    return {"applied": int(applied.get(last, 0)), "counted": int(counted[-1]) if steps.size else 0}
