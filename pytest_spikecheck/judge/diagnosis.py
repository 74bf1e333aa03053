"""Seed A's diagnostic ladder, walked for the user at any spike.

1. loss: how far the loss jumped at the step (train loss; eval loss before/after);
2. grad norm: pre- and post-clip, their ratio to the baseline, the clip factor;
3. batch composition: which samples, which sources, how many rare samples and tokens;
4. per-token losses: the worst tokens with their strings; how much of the loss rare pieces carry;
5. where the gradient sits: the parameter tensors with the largest share of the norm;
6. Adam's memory: how much the second moment ``v`` jumped and how long it takes to fade,
   and the share of weights whose gradient dwarfs sqrt(v̂) (near-maximal Adam steps);
7. the verdict in one sentence.

Rung 7 (``7 logits``, :func:`attention_logit_rung`) reads the attention-logit and log-Z
columns where the model records them; on an engine run it names the layer and head of the
largest logit, and under Muon (or with QK-Clip on) what QK-Clip did. Steps 3-6 need a Run recorded by the engine (events, batches); a bare log gets 1, 2 and 7.
numpy only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from pytest_spikecheck.judge.analysis import (
    CLIP_RTOL,
    baseline,
    clip_limits,
    largest_spike,
    loss_jump,
    overclipped,
    recovery_steps,
    spike_ratio,
    value_at,
)
from pytest_spikecheck.judge.analysis import contained as contained_by
from pytest_spikecheck.records import Record, as_record
from pytest_spikecheck.judge.defences import QK_CLIP_FACTOR
from pytest_spikecheck.judge.escape import markdown_text
from pytest_spikecheck.judge.text import fmt, fmt_compact, fmt_measure, fmt_scale, table


#: "Clipped" means the post-clip norm is below the pre-clip norm by more than this (relative):
#: a clip that did nothing leaves them equal up to float rounding.
CLIPPED_RTOL = 1e-6
#: The verdict calls a step a spike from this ratio to the baseline on.
SPIKE_VERDICT_RATIO = 3.0
#: An over-clip this many times too small looks like a loss scale between the clip and the
#: optimizer (dynamic scales are 2^k, 65536 by default): the verdict asks "clipped before unscaling?".
LOSS_SCALE_LIKE = 100.0


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
        """The diagnosis as Markdown (:func:`diagnosis_markdown`, the one renderer)."""
        return diagnosis_markdown({"step": self.step, "lines": self.lines, "verdict": self.verdict})


def diagnosis_markdown(diagnosis: Mapping[str, Any] | None) -> str:
    """A diagnosis (:class:`Diagnosis`, or its JSON form in a summary row: step, lines, verdict)
    as Markdown: the one renderer of ``diagnosis.md``, the job summary and :meth:`Diagnosis.markdown`.
    Its text is escaped (:mod:`~pytest_spikecheck.judge.escape`): the Adam rung's |g|/√v̂ stays in
    its cell, a token string opens no tag."""
    if not diagnosis or diagnosis.get("step") is None:
        return "No spike found in this record.\n"
    rows = table(["rung", "finding"], [[str(r), str(f)] for r, f in diagnosis["lines"]], markdown=True)
    return f"**Diagnosis at step {diagnosis['step']}**\n\n{rows}\n\n**Verdict:** {markdown_text(diagnosis['verdict'])}\n"


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


def _logged(rec: Record, name: str, step: int) -> float | None:
    """The value of ``name`` at ``step``; None where it was not logged (no such column, no such
    step, or the record marks it missing). A NaN that was logged is returned as NaN."""
    m = rec.metrics
    if name not in m:
        return None
    idx = np.flatnonzero(np.asarray(m["step"]) == step)
    if not idx.size:
        return None
    i = int(idx[-1])
    if name in rec.missing and bool(rec.missing[name][i]):
        return None
    return float(np.asarray(m[name], dtype=np.float64)[i])


def _max_norm_of(rec: Record, step: int, max_norm: float | None) -> float | None:
    """The clip limit at ``step``: the caller's, else the record's own ``clip_limit`` column,
    else the event the engine recorded at that step (a format-1 run's only record of an
    adaptive limit), else the facts' fixed limit
    (:func:`~pytest_spikecheck.judge.analysis.clip_limits`); None where the record does not say
    or says there was no clip."""
    if max_norm is not None:
        return float(max_norm)
    event = rec.run.event_at(step) if rec.run is not None and hasattr(rec.run, "event_at") else None
    if "clip_limit" not in rec.metrics and event is not None and event.max_norm is not None:
        return float(event.max_norm)
    limits = clip_limits(rec)
    at = np.flatnonzero(np.asarray(rec.metrics["step"]) == step)
    limit = float(limits[at[-1]]) if limits is not None and at.size else math.nan
    return limit if math.isfinite(limit) else None


def clip_claims(
    pre: float | None, post: float | None, factor: float | None, max_norm: float | None, rtol: float = CLIP_RTOL
) -> tuple[bool | None, bool | None]:
    """(clipped, contained) as the numbers show them; None where they cannot tell.

    clipped: the post-clip norm is below the pre-clip norm by more than rounding
    (post < pre·(1 − CLIPPED_RTOL)); without a post-clip norm, the backend's clip factor is
    below 1 by as much. contained: the post-clip norm is at most max_norm·(1 + rtol); it needs a
    finite post-clip norm and a finite max_norm (no limit, no containment to claim).
    """
    finite = lambda v: v is not None and math.isfinite(v)  # noqa: E731
    if finite(post) and finite(pre):
        clipped: bool | None = post < pre * (1 - CLIPPED_RTOL)
    elif post is None and finite(factor):
        clipped = factor < 1 - CLIPPED_RTOL
    else:
        clipped = None
    contained = bool(contained_by(post, max_norm, rtol)) if finite(post) and finite(max_norm) else None
    return clipped, contained


def _declared_event(rec: Record, metric: str) -> int | None:
    """The engine run's declared event with the largest spike ratio (the first when none has one)."""
    declared = [int(s) for s in (getattr(rec.run, "declared_events", None) or ()) if s in set(rec.metrics["step"].tolist())]
    if not declared:
        return None
    ratios = [spike_ratio(rec.metrics, s, metric) for s in declared]
    finite = [(r, s) for r, s in zip(ratios, declared) if np.isfinite(r)]
    return max(finite)[1] if finite else declared[0]


def _clip_failure_step(rec: Record, max_norm: float | None) -> int | None:
    """The first applied step at which the clip broke the update (scaled it below min(pre-clip,
    max_norm): an over-clip, e.g. a clip before unscaling) or let more than max_norm through:
    the step ``assert_clip_contains`` names. None without both norms or a fixed limit."""
    m = rec.metrics
    if "grad_norm_pre" not in m or "grad_norm_post" not in m:
        return None
    steps = np.asarray(m["step"])
    limit = max_norm if max_norm is not None else (_max_norm_of(rec, int(steps[0]), None) if steps.size else None)
    if limit is None or not math.isfinite(limit):
        return None
    pre, post = np.asarray(m["grad_norm_pre"], dtype=np.float64), np.asarray(m["grad_norm_post"], dtype=np.float64)
    applied = ~np.isin(steps, np.fromiter(rec.skipped, dtype=np.int64, count=len(rec.skipped)))
    with np.errstate(invalid="ignore"):
        bad = applied & (overclipped(pre, post, limit) | (np.isfinite(post) & (post > limit * (1 + CLIP_RTOL))))
    for i in np.flatnonzero(bad):  # each confirmed against its own step's limit (an event records it)
        own = _max_norm_of(rec, int(steps[i]), max_norm)
        if own is not None and (overclipped(pre[i], post[i], own) or post[i] > own * (1 + CLIP_RTOL)):
            return int(steps[i])
    return None


def _largest_applied_spike(rec: Record, metric: str) -> int | None:
    """The largest spike of ``metric`` among the steps whose update was applied (a step the
    loss scaler skipped has the overflow's norm, not the data's)."""
    m = rec.metrics
    if not rec.skipped or metric not in m:
        return largest_spike(m, metric)[0]
    values = np.asarray(m[metric], dtype=np.float64).copy()
    values[np.isin(np.asarray(m["step"]), np.fromiter(rec.skipped, dtype=np.int64, count=len(rec.skipped)))] = np.nan
    step, _ = largest_spike({**m, metric: values}, metric)
    return step if step is not None else largest_spike(m, metric)[0]


def default_step(rec: Record, max_norm: float | None = None) -> int | None:
    """The step the ladder is walked at by default, the worst finding of any kind: a step at
    which the clip broke the update (over-clipped it, or let more than max_norm through: the step
    ``assert_clip_contains`` fails at), else the run's declared event (a burst, a new source)
    with the largest spike ratio, else the largest pre-clip grad-norm spike of an applied step."""
    m = rec.metrics
    metric = "grad_norm_pre" if "grad_norm_pre" in m else ("grad_norm" if "grad_norm" in m else "loss")
    for find in (
        lambda: _clip_failure_step(rec, max_norm),
        lambda: _declared_event(rec, metric),
        lambda: _largest_applied_spike(rec, metric),
    ):
        step = find()
        if step is not None:
            return step
    return None


@dataclass(frozen=True)
class _GradRung:
    """What rung 2 read at the step, for the verdict."""

    pre: float | None
    post: float | None
    ratio: float
    limit: float | None
    clipped: bool | None
    contained: bool | None
    over: bool
    overflow: bool  # the step was skipped for a loss scaler's overflow
    skip_text: str


def diagnose(record: Any, step: int | None = None, max_norm: float | None = None) -> Diagnosis:
    """Walk the ladder at ``step`` (default: :func:`default_step`, the worst finding: a step at
    which the clip broke the update, else the run's declared event — a burst, a new source —
    with the largest spike ratio, since that is the event the scenario is about, else the
    largest pre-clip grad-norm spike of a step whose update was applied).

    ``max_norm`` is the clip limit to judge containment against; a Run recorded by the engine
    carries its own. Every claim is computed from the record: what it does not hold is said to
    be "not logged" or "cannot be told", never inferred."""
    rec: Record = as_record(record)
    m = rec.metrics
    metric = "grad_norm_pre" if "grad_norm_pre" in m else ("grad_norm" if "grad_norm" in m else "loss")
    if step is None:
        step = default_step(rec, max_norm)
    d = Diagnosis(step)
    if step is None:
        d.verdict = "no spike"
        return d
    run = rec.run
    if getattr(run, "facts", None) is not None:  # how it was trained, where the record says
        d.facts.update(zip(("optimizer", "qk_clip_tau"), _optimizer_facts(run)))
    loss_now, loss_base = _loss_rung(d, rec, step)
    grad = _grad_norm_rung(d, rec, step, metric, max_norm)
    event = run.event_at(step) if run is not None else None
    batch = run.batch_at(step) if run is not None else None
    if batch is not None:
        _batch_rung(d, batch)
    if event is not None:
        _token_loss_rung(d, event)
        _tensor_rung(d, event)
        _adam_rung(d, rec, step, event)
    logits = attention_logit_rung(m, step, run)
    if logits is not None:
        d.lines.append(logits[0])
        d.facts.update(logits[1])
    d.verdict = _verdict(d, rec, step, metric, loss_now, loss_base, grad)
    return d


def _loss_rung(d: Diagnosis, rec: Record, step: int) -> tuple[float | None, float]:
    """Rung 1: the train loss against its median before, the eval loss's jump and recovery."""
    m = rec.metrics
    loss_now = _logged(rec, "loss", step)
    loss_base = baseline(m, "loss", step) if "loss" in m else math.nan
    eval_text = ""
    if "eval_loss" in m and np.isfinite(np.asarray(m["eval_loss"], dtype=float)).any():
        jump = loss_jump(m, step)
        rec_steps = recovery_steps(m, step)
        d.facts.update(eval_jump=jump, recovery=rec_steps)
        back = (
            f"is back within 1.10× in {fmt(rec_steps)} steps"
            if rec_steps is not None
            else "is not back within 1.10× in the 50 steps after"
        )
        eval_text = (
            f"; eval loss jumps {fmt_measure(jump, '+.3f')} and {back}"
            if np.isfinite(jump)
            else "; the eval loss around this step was not logged"
        )
    loss_text = (
        "train loss not logged"
        if loss_now is None
        else f"train loss {fmt(loss_now, '.3f')} vs median {fmt_measure(loss_base, '.3f')} over the 50 steps before"
    )
    d.lines.append(("1 loss", f"{loss_text}{eval_text}"))
    d.facts.update(loss=loss_now, loss_baseline=loss_base)
    return loss_now, loss_base


def _grad_norm_rung(d: Diagnosis, rec: Record, step: int, metric: str, max_norm: float | None) -> _GradRung:
    """Rung 2: the pre-clip norm against its baseline, what the clip did, against which limit."""
    m = rec.metrics
    pre = _logged(rec, metric, step) if metric != "loss" else None
    base = baseline(m, metric, step)
    ratio = spike_ratio(m, step, metric) if pre is not None or metric == "loss" else math.nan
    post = _logged(rec, "grad_norm_post", step)
    factor = _logged(rec, "clip_factor", step)
    limit = _max_norm_of(rec, step, max_norm)
    clipped, contained = clip_claims(pre, post, factor, limit)
    d.facts.update(
        grad_norm_pre=pre,
        baseline=base,
        ratio=ratio,
        grad_norm_post=post,
        clip_factor=factor,
        max_norm=limit,
        clipped=clipped,
        contained=contained,
    )
    pre_text = (
        "pre-clip not logged"
        if pre is None
        else f"pre-clip {fmt(pre, '.3g')} = {fmt_measure(ratio, '.1f')}× the baseline {fmt_measure(base, '.3g')}"
    )
    clip_text = _clip_text(pre, post, factor, clipped)
    over = (
        pre is not None
        and post is not None
        and limit is not None
        and bool(overclipped(pre, post, limit))
        and step not in rec.skipped
    )
    d.facts.update(overclipped=over)
    if over:  # rung 2 says what the optimizer received against the limit, as assert_clip_contains does
        within = f"; within max_norm {limit:g} but" if contained is True else ";"
        clip_text += (
            f"{within} OVER-CLIPPED: ×{fmt_compact(min(pre, limit) / post if post > 0 else math.inf)} below "
            f"min(pre-clip, max_norm {limit:g})"
            + (
                ""
                if _declared_bug(rec.run) != "before_unscale"
                else ": the clip saw the loss-scaled gradients (clipped before unscaling)"
            )
        )
    elif contained is True:
        clip_text += f"; within max_norm {limit:g}"
    elif contained is False:
        clip_text += f"; ABOVE max_norm {limit:g}"
    skip_text = _skip_text(rec, step)
    d.facts.update(skipped=rec.skipped.get(step))
    overflow = str(rec.skipped.get(step, "")).startswith("overflow")
    if overflow:  # the norm measures the overflow, not the data: nothing was clipped, nothing applied
        pre_text = "pre-clip not logged" if pre is None else f"pre-clip {fmt(pre, '.3g')}"
        clip_text = f"{skip_text}: nothing reached the optimizer"
    elif skip_text:
        clip_text += f"; {skip_text}"
    d.lines.append(("2 grad norm", f"{pre_text}; {clip_text}"))
    return _GradRung(pre, post, ratio, limit, clipped, contained, over, overflow, skip_text)


def _clip_text(pre: float | None, post: float | None, factor: float | None, clipped: bool | None) -> str:
    """What the clip did at the step, from the norms and the factor the record holds."""
    factor_text = f", clip factor ×{fmt(factor, '.3g')}" if factor is not None else ""
    if clipped is True and post is not None:
        return f"clipped to {fmt(post, '.3g')}{factor_text}"
    if clipped is True:
        return f"clipped ×{fmt(factor, '.3g')} by the clip factor (post-clip norm not logged)"
    if clipped is False and post is not None:
        same = abs(post - pre) <= CLIPPED_RTOL * abs(pre)
        return (
            f"NOT clipped: post-clip {fmt(post, '.3g')} "
            + ("= pre-clip" if same else f"≥ pre-clip {fmt(pre, '.3g')}")
            + factor_text
        )
    if clipped is False:
        return f"NOT clipped: clip factor ×{fmt(factor, '.3g')} (post-clip norm not logged)"
    if post is None:
        return f"post-clip norm not logged{factor_text}"
    return f"post-clip {fmt(post, '.3g')}{factor_text}: whether it was clipped cannot be told"


def _batch_rung(d: Diagnosis, batch: Mapping[str, Any]) -> None:
    """Rung 3: the batch's samples, sources, rare samples and tokens, what a burst injected."""
    sources = ", ".join(f"{n} {s}" for s, n in batch["sources"].items())
    d.lines.append(
        (
            "3 batch",
            f"{len(batch['samples'])} samples ({sources}); {batch['rare_samples']} with rare tokens "
            f"({batch['rare_tokens']} rare-token occurrences); {batch['burst_samples']} injected by a burst"
            + (f": {', '.join(batch['injected'])}" if batch.get("injected") else ""),
        )
    )
    d.facts.update(
        rare_samples=batch["rare_samples"], burst_samples=batch["burst_samples"], injected=list(batch.get("injected") or [])
    )


def _token_loss_rung(d: Diagnosis, event: Any) -> None:
    """Rung 4: the worst tokens and the share of the loss rare and never-seen tokens carry."""
    tl = event.token_losses
    if tl is None:  # a recorder in someone else's loop that was given no logits
        d.lines.append(("4 token losses", "not recorded (the recorder got no logits and targets at this step)"))
        return
    worst = tl["worst"][:5]
    rare_share, novel_share = tl["rare_loss_share"], tl["novel_loss_share"]
    tokens = ", ".join(f"{w['token']!r} {w['loss']:.1f}" + ("†" if w["novel"] else "*" if w["rare"] else "") for w in worst)
    d.lines.append(
        (
            "4 token losses",
            f"mean {tl['mean']:.2f}, p90 {tl['p90']:.2f}, max {tl['max']:.2f} nats; "
            f"worst: {tokens} (* rare, † never trained on before); rare tokens carry "
            f"{rare_share:.0%} of the batch loss, {tl['novel_tokens']} never-seen tokens {novel_share:.0%}",
        )
    )
    d.facts.update(rare_loss_share=rare_share, novel_loss_share=novel_share, worst_tokens=[w["token"] for w in worst])


def _tensor_rung(d: Diagnosis, event: Any) -> None:
    """Rung 5: the parameter tensors with the largest share of the squared gradient norm."""
    norms = event.param_grad_norms
    total_sq = sum(v * v for v in norms.values()) or math.nan
    top = list(norms.items())[:3]
    finite_total = math.isfinite(total_sq)
    share = (lambda v: f"{v * v / total_sq:.0%} of ‖g‖²") if finite_total else (lambda v: "—")
    why = "" if finite_total else " (no shares: the step's gradient norm is not finite)"
    d.lines.append(("5 tensors", "; ".join(f"{n} {v:.3g} ({share(v)})" for n, v in top) + why))
    d.facts.update(top_tensor=top[0][0] if top else None)


def _adam_rung(d: Diagnosis, rec: Record, step: int, event: Any) -> None:
    """Rung 6: how far Adam's second moment jumped, how long it takes to fade, the near-maximal steps."""
    m = rec.metrics
    surprise = event.adam_surprise or {}
    if "share" in surprise and surprise["share"] is not None and not math.isfinite(surprise["share"]):
        d.lines.append(("6 Adam v", "the optimizer keeps no Adam moments (SGD)"))
        d.facts.update(v_jump=None, v_fade=None, adam_surprise=None)
        return
    v_jump = value_at(m, "adam_v_norm", step) / value_at(m, "adam_v_norm", step - 1) if "adam_v_norm" in m else math.nan
    fade = _fade_steps(m, step)
    fade_text = f"back within 1.10× after {fade} steps" if fade is not None else "not back within 1.10× by the end of the run"
    share = surprise.get("share", math.nan)
    share = math.nan if share is None else share
    share_text = (
        f"{share:.1%} of weights have |g|/√v̂ > {surprise.get('threshold', 10):g}"
        if math.isfinite(share)
        else f"— of weights have |g|/√v̂ > {surprise.get('threshold', 10):g} (not measured: "
        + ("the step was skipped" if step in rec.skipped else "the step's gradient is not finite")
        + ")"
    )
    d.lines.append(("6 Adam v", f"sqrt(Σv) jumps ×{fmt_measure(v_jump, '.2f')}, {fade_text}; {share_text}"))
    d.facts.update(v_jump=v_jump, v_fade=fade, adam_surprise=surprise.get("share"))


def _verdict(d: Diagnosis, rec: Record, step: int, metric: str, loss_now: float | None, loss_base: float, g: _GradRung) -> str:
    """Rung 7: the verdict in one sentence, from what the rungs found."""
    run = rec.run
    logged = {"loss": loss_now, metric: g.pre, "grad_norm_post": g.post}
    excused = step in rec.skipped  # a skipped step's gradient norm may be non-finite (an overflow); never its loss
    nonfinite = [
        name for name, v in logged.items() if v is not None and not math.isfinite(v) and not (excused and name != "loss")
    ]
    d.facts.update(nonfinite=nonfinite)
    rare_batch = d.facts.get("rare_samples", 0) >= 2 or d.facts.get("burst_samples", 0) >= 2
    cause = "rare tokens concentrated in one batch" if rare_batch else "an outlier batch"
    declared = _declared_bug(run)
    pre, post, ratio, limit = g.pre, g.post, g.ratio, g.limit
    if g.overflow and not nonfinite:
        loss_ratio = loss_now / loss_base if loss_now is not None and loss_base and math.isfinite(loss_base) else math.nan
        data = (
            f"{cause} (train loss {fmt_measure(loss_ratio, '.1f')}× its median)"
            if rare_batch or loss_ratio >= SPIKE_VERDICT_RATIO
            else "no data spike in the batch"
        )
        verdict = f"{g.skip_text}: the update was not applied, not a numeric break; the data: {data}"
    elif g.over:
        received = f"the optimizer received ‖g‖ = {fmt_compact(post)} for max_norm {limit:g}"
        if declared == "before_unscale":
            verdict = f"clipped before unscaling: {received}"
        else:
            times = min(pre, limit) / post if post > 0 else math.inf
            guess = (
                "clipped before unscaling?" if times >= LOSS_SCALE_LIKE else "a clip that scales below min(pre-clip, max_norm)"
            )
            verdict = f"over-clipped: {received} and pre-clip {fmt_compact(pre)} (×{fmt_compact(times)} too small): {guess}"
        if math.isfinite(ratio) and ratio >= SPIKE_VERDICT_RATIO:
            verdict = f"{cause}; {verdict}"
    elif nonfinite:
        verdict = (
            f"non-finite values at step {step} ({', '.join(f'{n} {fmt(logged[n])}' for n in nonfinite)}): "
            f"a numeric break (overflow, 0/0), not a data spike"
        )
    elif pre is None:
        verdict = f"no {metric if metric != 'loss' else 'gradient norm'} logged at step {step}: whether it spiked cannot be told"
    elif not math.isfinite(ratio) or ratio < SPIKE_VERDICT_RATIO:
        verdict = f"no clear spike (ratio {fmt_measure(ratio, '.1f')}×)"
    elif g.clipped is True and g.contained is True:
        verdict = f"{cause}; the clip contained it (post-clip {fmt(post, '.3g')} ≤ max_norm {limit:g})"
    elif g.clipped is True and g.contained is False:
        verdict = f"{cause}; the clip LEAKED: post-clip {fmt(post, '.3g')} > max_norm {limit:g} reached the optimizer"
    elif g.clipped is True:
        why = "the post-clip norm is not logged" if post is None else "the record does not say what max_norm was"
        verdict = f"{cause}; clipped, but {why}, so whether it was contained cannot be told"
    elif g.clipped is False and rare_batch:
        verdict = "rare tokens + concentrated batch + no clip = one-step destabilisation"
    elif g.clipped is False:
        verdict = f"a {fmt(ratio, '.0f')}× gradient spike reached the optimizer unclipped"
    else:
        verdict = (
            f"a {fmt(ratio, '.0f')}× gradient spike; the record has no post-clip norm, so whether a "
            f"clip contained it cannot be told"
        )
    return verdict + _verdict_suffix(d, rec, step, declared, g)


def _verdict_suffix(d: Diagnosis, rec: Record, step: int, declared: str | None, g: _GradRung) -> str:
    """What the verdict adds: a non-overflow skip, a declared defence bug, an attention-logit explosion."""
    suffix = ""
    if step in rec.skipped and not str(rec.skipped[step]).startswith("overflow"):
        suffix += f"; {g.skip_text}"
    if declared == "per_microbatch" and g.contained is False:
        suffix += (
            ": each micro-batch was clipped on its own and the clipped parts summed (ClipEachMicrobatch): "
            "clip the accumulated gradient once"
        )
    elif declared == "accumulate_sum":
        k = rec.run.facts.accumulation
        suffix += f"; the {k} micro-batch losses are summed, not averaged (AccumulateSum): loss and gradient ×{k}"
    if d.facts.get("attention_logit_growth") and d.facts.get("optimizer") == "muon":
        suffix += (
            "; a max-logit explosion under Muon: QK-Clip or qk-norm contains it"
            if d.facts.get("qk_clip_tau") is None
            else f"; a max-logit explosion under Muon that QK-Clip (τ {d.facts['qk_clip_tau']:g}) did not contain"
        )
    elif d.facts.get("attention_logit_growth"):
        suffix += "; attention logits grew beyond control (attention-logit growth: qk-layernorm contains it)"
    return suffix


def _declared_bug(run: Any) -> str | None:
    """The defence bug the run's facts declare or its recorder saw: ``before_unscale``
    (ClipBeforeUnscale, or a recorder that found the gradients still scaled at the clip),
    ``per_microbatch`` (ClipEachMicrobatch), ``accumulate_sum`` (AccumulateSum); None otherwise."""
    if run is None:
        return None
    if (getattr(run, "meta", None) or {}).get("clip_before_unscale_at"):
        return "before_unscale"
    facts = getattr(run, "facts", None)
    if facts is None:
        return None
    if facts.clip is not None and facts.clip.when != "after_unscale":
        return facts.clip.when
    return "accumulate_sum" if facts.accumulate == "sum" else None


def _skip_text(rec: Record, step: int) -> str:
    """Why the update of ``step`` was not applied, in words ("" where it was applied)."""
    why = rec.skipped.get(step)
    if why is None:
        return ""
    if why == "skip_spikes":
        return "SkipSpikes skipped the update"
    if not str(why).startswith("overflow"):
        return f"the update was skipped ({why})"
    scale, after = _logged(rec, "loss_scale", step), _logged(rec, "loss_scale", step + 1)
    change = ""
    if scale is not None and after is not None and math.isfinite(scale) and math.isfinite(after):
        change = (
            "; scale halved" if after == scale / 2 else "; scale kept" if after == scale else f"; scale now {fmt_scale(after)}"
        )
    at = f" at scale {fmt_scale(scale)}" if scale is not None and math.isfinite(scale) else ""
    return f"GradScaler skipped this step (overflow{at}{change})"


#: A largest |attention logit| above this, and ATTENTION_GROWTH_FACTOR x its value at step 10,
#: is attention-logit growth. Measured (docs/fidelity.md, Wortsman section): healthy Phase-19
#: runs stay below ~20 (qk-layernorm runs at lr 0.1 too); lr 0.1 without it reaches thousands.
ATTENTION_LOGIT_LIMIT = 100.0
ATTENTION_GROWTH_FACTOR = 10.0


def attention_logit_rung(m: dict[str, Any], step: int, run: Any = None) -> tuple[tuple[str, str], dict[str, Any]] | None:
    """The rung on the attention logits (the ``attn_logit_max`` column, when the model reports
    it): their size at ``step``, growth since step 10, the run's largest, and whether that is
    attention-logit growth. None without the column.

    On an engine run (``run``) it also names the layer and head of the run's largest logit (the
    engine keeps that step's per-head logits; layers and heads counted from 0, as the parameter
    names count them), and under Muon, or with QK-Clip on, it leads with the max logit and says
    what QK-Clip did: on how many heads at ``step``, on how many steps in all, and the last."""
    if "attn_logit_max" not in m:
        return None
    steps, values = np.asarray(m["step"]), np.asarray(m["attn_logit_max"], dtype=np.float64)
    if not np.isfinite(values).any():
        return None
    now, early = value_at(m, "attn_logit_max", step), value_at(m, "attn_logit_max", 10)
    worst = int(np.nanargmax(values))
    growth = now / early if math.isfinite(early) and early > 0 else math.nan
    optimizer, tau = _optimizer_facts(run)
    # With QK-Clip on, logits up to QK_CLIP_FACTOR x tau are what it allows (its containment bound)
    limit = ATTENTION_LOGIT_LIMIT if tau is None else max(ATTENTION_LOGIT_LIMIT, QK_CLIP_FACTOR * tau)
    grew = bool(values[worst] > limit and math.isfinite(early) and values[worst] >= ATTENTION_GROWTH_FACTOR * early)
    facts: dict[str, Any] = {
        "attn_logit_max": now,
        "attn_logit_growth": growth,
        "attention_logit_growth": grew,
        "optimizer": optimizer,
        "qk_clip_tau": tau,
    }
    where = _largest_head(run)
    at = f" in layer {where[0]} head {where[1]}" if where is not None else ""
    if where is not None:
        facts.update(max_logit_layer=where[0], max_logit_head=where[1])
    if optimizer == "muon" or tau is not None:
        largest_growth = values[worst] / early if math.isfinite(early) and early > 0 else math.nan
        finding = (
            f"attention max logit {fmt(values[worst], ',.0f')} at step {int(steps[worst])} (×"
            f"{fmt(largest_growth, ',.0f')} since step 10){at}"
            + (" under Muon" if optimizer == "muon" else "")
            + f"; {fmt(now, ',.0f')} at step {step}; "
            + _qk_clip_activity(m, step, tau, facts)
        )
    else:
        finding = (
            f"attention logits {fmt(now, ',.0f')} at step {step} (×{fmt(growth, ',.0f')} since step 10); largest "
            f"{fmt(values[worst], ',.0f')} at step {int(steps[worst])}{at}"
        )
    if "logz_mean" in m:
        finding += f"; output log Z {fmt(value_at(m, 'logz_mean', step), '.1f')}"
    if grew and tau is not None:
        finding += f": the logits grew past {QK_CLIP_FACTOR:g} × QK-Clip's τ {tau:g}"
    elif grew:
        finding += (
            ": a max-logit explosion; QK-Clip or qk-norm contains it"
            if optimizer == "muon"
            else ": attention-logit growth; qk-layernorm contains it"
        )
    return ("7 logits", finding), facts


def _optimizer_facts(run: Any) -> tuple[str | None, float | None]:
    """(the run's optimizer in one word, QK-Clip's tau) from its facts; None where unknown or off."""
    facts = getattr(run, "facts", None)
    if facts is None:
        return None, None
    return facts.optimizer, facts.qk_clip.tau if facts.qk_clip is not None else None


def _largest_head(run: Any) -> tuple[int, int] | None:
    """(layer, head) of the run's largest attention logit, from the engine's record of that step."""
    largest = (getattr(run, "meta", None) or {}).get("largest_attn_logit")
    if not largest or not largest.get("per_head"):
        return None
    heads = np.asarray(largest["per_head"], dtype=np.float64)
    if heads.ndim != 2 or not np.isfinite(heads).any():
        return None
    layer, head = np.unravel_index(int(np.nanargmax(heads)), heads.shape)
    return int(layer), int(head)


def _qk_clip_activity(m: dict[str, Any], step: int, tau: float | None, facts: dict[str, Any]) -> str:
    """What QK-Clip did (the ``qk_clipped_heads`` column): at ``step``, and over the run."""
    if tau is None or "qk_clipped_heads" not in m:
        facts.update(qk_clip_heads=None, qk_clip_steps=None)
        return "QK-Clip off"
    clipped = np.asarray(m["qk_clipped_heads"], dtype=np.float64)
    active = np.flatnonzero(np.nan_to_num(clipped) > 0)
    heads_now = value_at(m, "qk_clipped_heads", step)
    facts.update(
        qk_clip_heads=heads_now,
        qk_clip_steps=int(active.size),
        qk_clip_last=int(np.asarray(m["step"])[active[-1]]) if active.size else None,
    )
    text = f"QK-Clip (τ {tau:g}) active on {fmt(heads_now, '.0f')} heads at step {step}, on {active.size} of {clipped.size} steps"
    return text + (f", last at step {facts['qk_clip_last']}" if active.size else "")
