"""Seed A's diagnostic ladder, walked for the user at any spike.

1. loss: how far the loss jumped at the step (train loss; eval loss before/after);
2. grad norm: pre- and post-clip, their ratio to the baseline, the clip factor;
3. batch composition: which samples, which sources, how many rare samples and tokens;
4. per-token losses: the worst tokens with their strings; how much of the loss rare pieces carry;
5. where the gradient sits: the parameter tensors with the largest share of the norm;
6. Adam's memory: how much the second moment ``v`` jumped and how long it takes to fade,
   and the share of weights whose gradient dwarfs sqrt(v̂) (near-maximal Adam steps);
7. the verdict in one sentence.

Steps 3-6 need a Run recorded by the engine (events, batches); a bare log gets 1, 2 and 7.
numpy only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pytest_spikecheck.judge.analysis import (
    baseline, largest_spike, loss_jump, recovery_steps, spike_ratio, value_at,
)
from pytest_spikecheck.records import Record, as_record
from pytest_spikecheck.judge.text import fmt


@dataclass
class Diagnosis:
    step: int | None
    lines: list[tuple[str, str]] = field(default_factory=list)  # (rung, finding)
    verdict: str = ""
    facts: dict[str, Any] = field(default_factory=dict)

    def text(self) -> str:
        if self.step is None:
            return "diagnosis: no spike found in this record"
        width = max((len(r) for r, _ in self.lines), default=0)
        body = "\n".join(f"  {r.ljust(width)}  {f}" for r, f in self.lines)
        return f"diagnosis at step {self.step}:\n{body}\n  => {self.verdict}"

    def markdown(self) -> str:
        if self.step is None:
            return "No spike found in this record."
        rows = "\n".join(f"| {r} | {f} |" for r, f in self.lines)
        return f"**Diagnosis at step {self.step}**\n\n| rung | finding |\n|---|---|\n{rows}\n\n**Verdict:** {self.verdict}\n"


def _fade_steps(metrics, step: int, name: str = "adam_v_norm", factor: float = 1.10) -> int | None:
    """Steps after ``step`` until ``name`` falls back within ``factor`` x its value just before."""
    steps = np.asarray(metrics["step"])
    values = np.asarray(metrics.get(name, []), dtype=np.float64)
    if values.size == 0:
        return None
    before = value_at(metrics, name, step - 1)
    if not math.isfinite(before) or before <= 0:
        return None
    after = (steps >= step) & np.isfinite(values)
    for s, v in zip(steps[after], values[after]):
        if v <= factor * before:
            return int(s - step)
    return None


def diagnose(record: Any, step: int | None = None) -> Diagnosis:
    """Walk the ladder at ``step`` (default: the largest pre-clip grad-norm spike)."""
    rec: Record = as_record(record)
    m = rec.metrics
    metric = "grad_norm_pre" if "grad_norm_pre" in m else ("grad_norm" if "grad_norm" in m else "loss")
    if step is None:
        step, _ = largest_spike(m, metric)
    d = Diagnosis(step)
    if step is None:
        d.verdict = "no spike"
        return d
    run = rec.run

    # 1. loss
    loss_now = value_at(m, "loss", step) if "loss" in m else math.nan
    loss_base = baseline(m, "loss", step) if "loss" in m else math.nan
    eval_text = ""
    if "eval_loss" in m and np.isfinite(np.asarray(m["eval_loss"], dtype=float)).any():
        jump = loss_jump(m, step)
        rec_steps = recovery_steps(m, step)
        d.facts.update(eval_jump=jump, recovery=rec_steps)
        eval_text = (f"; eval loss jumps {fmt(jump, '+.3f')} and is back within 1.10× in "
                     f"{fmt(rec_steps)}{' steps' if rec_steps is not None else ' (not back within 50 steps)'}")
    d.lines.append(("1 loss", f"train loss {fmt(loss_now, '.3f')} vs median {fmt(loss_base, '.3f')} over the 50 steps before{eval_text}"))
    d.facts.update(loss=loss_now, loss_baseline=loss_base)

    # 2. grad norm
    pre = value_at(m, metric, step)
    base = baseline(m, metric, step)
    ratio = spike_ratio(m, step, metric)
    post = value_at(m, "grad_norm_post", step) if "grad_norm_post" in m else math.nan
    factor = value_at(m, "clip_factor", step) if "clip_factor" in m else math.nan
    clipped = math.isfinite(factor) and factor < 1.0
    d.facts.update(grad_norm_pre=pre, baseline=base, ratio=ratio, grad_norm_post=post, clip_factor=factor)
    clip_text = (f"clipped ×{fmt(factor, '.3g')} to {fmt(post, '.3g')}" if clipped else
                 (f"NOT clipped: post-clip {fmt(post, '.3g')} = pre-clip" if math.isfinite(post) else "post-clip norm not logged"))
    d.lines.append(("2 grad norm", f"pre-clip {fmt(pre, '.3g')} = {fmt(ratio, '.1f')}× the baseline {fmt(base, '.3g')}; {clip_text}"))

    event = run.event_at(step) if run is not None else None
    batch = run.batch_at(step) if run is not None else None
    # 3. batch composition
    if batch is not None:
        sources = ", ".join(f"{n} {s}" for s, n in batch["sources"].items())
        d.lines.append(("3 batch", f"{len(batch['samples'])} samples ({sources}); {batch['rare_samples']} with rare tokens "
                                   f"({batch['rare_tokens']} rare-token occurrences); {batch['burst_samples']} injected by a burst"
                                   + (f": {', '.join(batch['injected'])}" if batch.get("injected") else "")))
        d.facts.update(rare_samples=batch["rare_samples"], burst_samples=batch["burst_samples"],
                       injected=list(batch.get("injected") or []))
    if event is not None:
        # 4. per-token losses
        tl = event.get("token_losses")
        if tl is None:  # a recorder in someone else's loop that was given no logits
            d.lines.append(("4 token losses", "not recorded (the recorder got no logits and targets at this step)"))
        else:
            worst = tl["worst"][:5]
            rare_share, novel_share = tl["rare_loss_share"], tl["novel_loss_share"]
            tokens = ", ".join(f"{w['token']!r} {w['loss']:.1f}" + ("†" if w["novel"] else "*" if w["rare"] else "")
                               for w in worst)
            d.lines.append(("4 token losses", f"mean {tl['mean']:.2f}, p90 {tl['p90']:.2f}, max {tl['max']:.2f} nats; "
                                              f"worst: {tokens} (* rare, † never trained on before); rare tokens carry "
                                              f"{rare_share:.0%} of the batch loss, {tl['novel_tokens']} never-seen tokens {novel_share:.0%}"))
            d.facts.update(rare_loss_share=rare_share, novel_loss_share=novel_share, worst_tokens=[w["token"] for w in worst])
        # 5. which tensors
        norms = event["param_grad_norms"]
        total_sq = sum(v * v for v in norms.values()) or math.nan
        top = list(norms.items())[:3]
        d.lines.append(("5 tensors", "; ".join(f"{n} {v:.3g} ({v * v / total_sq:.0%} of ‖g‖²)" for n, v in top)))
        d.facts.update(top_tensor=top[0][0] if top else None)
        # 6. Adam memory
        surprise = event.get("adam_surprise") or {}
        v_jump = value_at(m, "adam_v_norm", step) / value_at(m, "adam_v_norm", step - 1) if "adam_v_norm" in m else math.nan
        fade = _fade_steps(m, step)
        fade_text = f"back within 1.10× after {fade} steps" if fade is not None else "not back within 1.10× by the end of the run"
        d.lines.append(("6 Adam v", f"sqrt(Σv) jumps ×{fmt(v_jump, '.2f')}, {fade_text}; "
                                    f"{surprise.get('share', math.nan):.1%} of weights have |g|/√v̂ > {surprise.get('threshold', 10):g}"))
        d.facts.update(v_jump=v_jump, v_fade=fade, adam_surprise=surprise.get("share"))

    # 7. verdict
    rare_batch = d.facts.get("rare_samples", 0) >= 2 or d.facts.get("burst_samples", 0) >= 2
    if not math.isfinite(pre) or not math.isfinite(loss_now):
        d.verdict = "non-finite values: a numeric break (overflow, 0/0), not a data spike"
    elif not math.isfinite(ratio) or ratio < 3:
        d.verdict = f"no clear spike (ratio {fmt(ratio, '.1f')}×)"
    elif clipped:
        cause = "rare tokens concentrated in one batch" if rare_batch else "an outlier batch"
        d.verdict = f"{cause}; the clip contained it (post-clip {fmt(post, '.3g')}, ×{fmt(factor, '.3g')})"
    elif not math.isfinite(post):
        d.verdict = (f"a {fmt(ratio, '.0f')}× gradient spike; the record has no post-clip norm, so whether a "
                     f"clip contained it cannot be told")
    elif rare_batch:
        d.verdict = "rare tokens + concentrated batch + no clip = one-step destabilisation"
    else:
        d.verdict = f"a {fmt(ratio, '.0f')}× gradient spike reached the optimizer unclipped"
    return d
