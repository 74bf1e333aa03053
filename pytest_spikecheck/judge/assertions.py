"""Assertions on training records, importable by any test suite.

Each takes a :class:`~pytest_spikecheck.records.run.Run`, a mapping of arrays
(``{"loss": [...], "grad_norm_pre": [...], "grad_norm_post": [...]}``) or a path to a log,
and raises :class:`~pytest_spikecheck.errors.SpikeCheckError` (an ``AssertionError``) whose
message carries the evidence: a capped table of the steps around the event, a sparkline,
the diagnosis, and the command that reproduces the run. numpy only (no torch).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pytest_spikecheck.judge.analysis import (
    BASELINE_WINDOW,
    CLIP_RTOL,
    RECOVERY_FACTOR,
    clip_limits,
    column,
    contained,
    largest_spike,
    overclipped,
    recovery_steps,
    spike_ratio,
)
from pytest_spikecheck.judge.baseline import MIN_BASELINE_POINTS
from pytest_spikecheck.judge.detectors import get_detector
from pytest_spikecheck.judge.diagnosis import LOSS_SCALE_LIKE
from pytest_spikecheck.judge.finiteness import Finiteness, is_gradient_norm, judge_finite, nonfinite_norm_cause
from pytest_spikecheck.judge.policy import judge_log, pick_metric
from pytest_spikecheck.errors import ConfigError, SpikeCheckError
from pytest_spikecheck.records import Record, as_record
from pytest_spikecheck.scenario.sections import check_max_norm
from pytest_spikecheck.judge.defences import clip_before_unscale
from pytest_spikecheck.judge.evidence import MAX_ROWS, fail, passed
from pytest_spikecheck.judge.text import fmt, fmt_compact, fmt_measure
from pytest_spikecheck.judge.verdict import Verdict, emit

__all__ = [
    "assert_clip_contains",
    "assert_diverges",
    "assert_finite",
    "assert_no_lockin",
    "assert_no_spike",
    "assert_recovers",
    "assert_spike",
]

_MAX_ROWS = MAX_ROWS


def _fail(headline: str, rec: Record, step: int | None, metric: str, *, assertion: str, **kwargs: Any) -> None:
    __tracebackhide__ = True
    fail(assertion, headline, rec, step, metric, **kwargs)


def _a(metric: str) -> str:
    """``a grad_norm_pre``, ``an attn_logit_max``."""
    return f"{'an' if metric[:1].lower() in 'aeiou' else 'a'} {metric}"


_pick_metric = pick_metric  # the one rule for "grad_norm" standing in for the pre-clip norm


def _default_metric(rec: Record) -> str:
    """The pre-clip gradient norm, else the loss: the fallback ``spikecheck check`` uses."""
    try:
        return pick_metric(rec, "grad_norm_pre")
    except SpikeCheckError:
        return pick_metric(rec, "loss")


def _log_policy_failure(rec: Record, report: dict) -> tuple[str, int | None, str] | None:
    """(headline, step, metric) of what fails the default policy on a log, else None."""
    for s in report["series"]:
        if s["spikes"]:
            first = s["spikes"][0]
            more = f" (and {len(s['spikes']) - 1} more)" if len(s["spikes"]) > 1 else ""
            return (
                f"the default policy flagged a {s['metric']} spike at step {first['step']}: "
                f"{fmt(first['value'], '.4g')} vs baseline {fmt(first['baseline'], '.4g')} "
                f"({', '.join(f'{d} {sc}' for d, sc in zip(first['detectors'], first['score_texts']))}){more}",
                first["step"],
                s["metric"],
            )
    bad = report["nonfinite"]
    if bad is not None:
        return f"non-finite {bad['metric']} at step {bad['step']} ({fmt(bad['value'])})", bad["step"], bad["metric"]
    return None


def _event_step(rec: Record, at: int | None, metric: str) -> int | None:
    if at is not None:
        return at
    if rec.run is not None and rec.run.declared_events:
        return rec.run.declared_events[0]
    return largest_spike(rec.metrics, metric)[0]


def assert_spike(
    run: Any,
    at: int | None = None,
    min_ratio: float | None = None,
    metric: str | None = None,
    window: int = BASELINE_WINDOW,
    kind: str | None = None,
) -> float:
    """Assert a spike of at least ``min_ratio`` (default 10) x the median of the ``window``
    steps before (widened to 10 logged points on a sparse log) in ``run`` (a
    :class:`~pytest_spikecheck.records.run.Run`, a run folder or training log, a record).

    With ``at``, the spike must be at that step; without, anywhere. Returns the ratio.

    On a training log (a path, or a record read from one) with neither ``min_ratio`` nor
    ``metric`` given, the spike is what ``spikecheck check`` finds: the default policy on the
    pre-clip grad norm and the loss (``kind`` as ``--kind``). Returns the spike's ratio to
    the spike baseline (NaN where it has none).
    """
    __tracebackhide__ = True
    rec = as_record(run)
    if rec.log_format is not None and min_ratio is None and metric is None:
        report = judge_log(rec, kind=kind)
        hits = [
            (h["step"], h["ratio"], s["metric"]) for s in report["series"] for h in s["spikes"] if at is None or h["step"] == at
        ]
        if not hits:
            where = f"at step {at}" if at is not None else "anywhere"
            status = "; ".join(f"{s['metric']}: {s['message']}" for s in report["series"])
            flagged = sorted({h["step"] for s in report["series"] for h in s["spikes"]})
            others = f"other steps ({', '.join(map(str, flagged[:6]))}{'…' if len(flagged) > 6 else ''})" if flagged else "none"
            _fail(
                f"expected the default policy to flag a spike {where}, but it flagged {others} ({status})",
                rec,
                at,
                _default_metric(rec),
                assertion="assert_spike",
            )
        step, ratio, metric = hits[0]
        passed(
            "assert_spike",
            f"the default policy flagged {_a(metric)} spike at step {step} ({fmt_measure(ratio, '.1f')}× its baseline)",
            rec,
            metric,
            measured=ratio,
            step=step,
        )
        return float(ratio)
    min_ratio = 10.0 if min_ratio is None else min_ratio
    metric = _pick_metric(rec, metric or "grad_norm_pre")
    if at is None:
        step, ratio = largest_spike(rec.metrics, metric, window)
    else:
        step, ratio = at, spike_ratio(rec.metrics, at, metric, window)
        if not np.any(np.asarray(rec.metrics["step"]) == at):
            _fail(
                f"no spike at step {at}: the record has no step {at} "
                f"(it covers {int(rec.metrics['step'][0]) if len(rec.metrics['step']) else '-'}"
                f"–{int(rec.metrics['step'][-1]) if len(rec.metrics['step']) else '-'})",
                rec,
                None,
                metric,
                assertion="assert_spike",
                limit=min_ratio,
            )
    if step is None and at is None:
        _fail(
            f"expected {_a(metric)} spike of ≥ {min_ratio:g}×, but no value has a baseline: "
            f"{rec.series(metric)[0].size} logged, fewer than the 10 earlier points a baseline needs",
            rec,
            None,
            metric,
            assertion="assert_spike",
            limit=min_ratio,
        )
    if step is None or not (ratio >= min_ratio):
        where = f"at step {at}" if at is not None else f"anywhere (largest: step {fmt(step)})"
        _fail(
            f"expected {_a(metric)} spike of ≥ {min_ratio:g}× {where}, got {fmt_measure(ratio, '.2f')}× "
            f"the median of the {window} steps before{_neighbour_hint(rec, at, min_ratio, metric, window)}",
            rec,
            step,
            metric,
            assertion="assert_spike",
            measured=ratio,
            limit=min_ratio,
        )
    passed(
        "assert_spike",
        f"{_a(metric)} spike of {fmt_measure(ratio, '.1f')}× ≥ {min_ratio:g}× at step {step}",
        rec,
        metric,
        measured=ratio,
        limit=min_ratio,
        step=step,
    )
    return ratio


def _neighbour_hint(rec: Record, at: int | None, min_ratio: float, metric: str, window: int) -> str:
    """When ``at=`` misses by one step and the neighbour holds the spike, say so (an array's
    Python index is one less than its step when the array has no step column)."""
    if at is None:
        return ""
    steps = np.asarray(rec.metrics["step"])
    earlier = int(np.count_nonzero(rec.series(metric)[0] < at))
    if math.isnan(spike_ratio(rec.metrics, at, metric, window)) and earlier < MIN_BASELINE_POINTS:
        return f"; step {at} has {earlier} earlier point{'s' if earlier != 1 else ''}, and a baseline needs {MIN_BASELINE_POINTS}"
    for near in (at + 1, at - 1):
        if np.any(steps == near) and spike_ratio(rec.metrics, near, metric, window) >= min_ratio:
            numbering = "; arrays without a step column are numbered from 1" if rec.numbered_from_one else ""
            return f"; the spike is at step {near}{numbering}"
    return ""


def assert_no_spike(
    run: Any,
    detector: Any = None,
    metric: str | None = None,
    strict: bool = False,
    kind: str | None = None,
    strict_finite: bool = False,
    **params: Any,
) -> Verdict:
    """Assert that ``detector`` (a name from :mod:`pytest_spikecheck.judge.detectors` or an
    instance; ``params`` configure it; default ``ratio``) flags no step of ``run`` (a
    :class:`~pytest_spikecheck.records.run.Run`, a run folder or training log, a record) on ``metric``
    (default: the pre-clip grad norm, else the loss).

    On a training log (a path, or a record read from one) with neither ``detector`` nor
    ``metric`` given, this is ``spikecheck check``'s judgement: the default policy on the
    pre-clip grad norm and the loss, and no non-finite value in any column (``kind`` as
    ``--kind``). With ``strict``, as ``--strict``, a series too short to be judged fails too;
    ``strict_finite``, as ``--strict-finite``, fails every non-finite value.
    """
    __tracebackhide__ = True
    rec = as_record(run)
    if rec.log_format is not None and detector is None and metric is None and not params:
        report = judge_log(rec, kind=kind, strict_finite=strict_finite)
        failure = _log_policy_failure(rec, report)
        if failure is not None:
            _fail(failure[0], rec, failure[1], failure[2], assertion="assert_no_spike")
        if strict and (report["not_judged"] or not report["judged"]):
            status = "; ".join(f"{s['metric']}: {s['message']}" for s in report["series"] if s["status"] != "judged")
            _fail(f"not judged (strict): {status}", rec, None, _default_metric(rec), assertion="assert_no_spike")
        return passed(
            "assert_no_spike",
            "the default policy flagged no spike and found no non-finite value",
            rec,
            ", ".join(s["metric"] for s in report["series"]) or None,
        )
    metric = _pick_metric(rec, metric) if metric is not None else _default_metric(rec)
    det = get_detector(detector or "ratio", **params)
    hits = det.detect(*rec.series(metric))
    if hits:
        first = hits[0]
        more = (
            f" (and {len(hits) - 1} more: steps {', '.join(str(h.step) for h in hits[1:6])}{'…' if len(hits) > 6 else ''})"
            if len(hits) > 1
            else ""
        )
        _fail(
            f"{det.describe()} flagged {_a(metric)} spike at step {first.step}: {fmt(first.value, '.4g')} vs baseline "
            f"{fmt_measure(first.baseline, '.4g')} (score {fmt_measure(first.score, '.2f')}{det.unit}){more}",
            rec,
            first.step,
            metric,
            assertion="assert_no_spike",
            measured=first.score,
        )
    return passed("assert_no_spike", f"{det.describe()} flagged no {metric} step", rec, metric)


#: How far torch's own float32 clip can overshoot on the CPU, where its norm of one large tensor
#: drifts (measured, torch 2.13: 1.1e-5 at 2**20 elements, 9.5e-5 at 2**22, 7.5e-4 at 2**24).
FLOAT32_NORM_DRIFT = 1e-3


def assert_clip_contains(
    run: Any, max_norm: float | None = None, rtol: float = CLIP_RTOL, allow_overclip: bool = False
) -> Verdict:
    """Assert the clip did its job at every step: the post-clip gradient norm never exceeds the
    limit·(1 + rtol) (and is finite where the pre-clip norm was), and the clip never scaled too
    far: post-clip ≥ min(pre-clip, limit)·(1 − rtol) (less torch's 1e-6 epsilon), the over-clip
    of a clip on loss-scaled gradients. The limit is ``max_norm``; without it, the record's own
    (its per-step ``clip_limit``, which every engine and recorded run writes, else its facts'
    max_norm: a run recorded from a Trainer with ``max_grad_norm=0.5`` is judged against 0.5).
    An adaptive clip's record carries its limit per step; the over-clip side judges against it.
    ``allow_overclip=True`` keeps only the upper bound. Steps whose update was skipped
    (``Record.skipped``) hand the optimizer nothing and are left out. A record with no finite
    norm at all fails: it shows nothing. The default ``rtol`` (1e-5) holds for float32 clips
    whose norm is accurate (our backends, torch on a GPU); torch's CPU clip of a model with
    tensors of millions of elements overshoots by up to ~1e-3 (the failure says so), so pass
    ``rtol=1e-3`` there. Returns the :class:`~pytest_spikecheck.judge.verdict.Verdict`."""
    __tracebackhide__ = True
    rec = as_record(run)
    metric = _pick_metric(rec, "grad_norm_post")
    if max_norm is not None:
        max_norm = check_max_norm(max_norm, "assert_clip_contains(max_norm=...)")
        if max_norm is None:
            raise ConfigError(
                "assert_clip_contains(max_norm=inf): no limit to contain the gradient under; "
                "pass a finite max_norm, or none to judge against the record's own"
            )
    own = clip_limits(rec)
    limits = clip_limits(rec, max_norm) if max_norm is not None else own
    if limits is None or not np.isfinite(limits).any():
        said = "says it had no clip" if limits is not None else "does not say what the clip limit was"
        raise ConfigError(f"assert_clip_contains: the record {said} (no clip_limit column, no facts.clip): pass max_norm=")
    steps = np.asarray(rec.metrics["step"])
    post = np.asarray(rec.metrics[metric], dtype=float)
    pre = np.asarray(rec.metrics["grad_norm_pre"], dtype=float) if "grad_norm_pre" in rec.metrics else None
    shown = max_norm if max_norm is not None else float(np.nanmax(np.where(np.isfinite(limits), limits, np.nan)))
    if not np.isfinite(post).any() and (pre is None or not np.isfinite(pre).any()):
        # Nothing finite before or after the clip: no value shows the clip held (or that it broke).
        _fail(
            f"no finite {metric} in the record ({post.size} step{'s' if post.size != 1 else ''}), and no finite "
            f"grad_norm_pre either: nothing shows whether the clip held",
            rec,
            None,
            metric,
            max_norm=shown,
            assertion="assert_clip_contains",
            limit=shown,
        )
    applied = ~np.isin(steps, np.fromiter(rec.skipped, dtype=np.int64, count=len(rec.skipped)))
    bad = np.flatnonzero(~contained(post, limits, rtol) & ~np.isnan(post) & applied)
    nans = np.flatnonzero(np.isnan(post) & applied)
    if nans.size and pre is not None:
        # NaN post-clip where the pre-clip norm was finite means the clip itself broke something.
        bad = np.union1d(bad, nans[np.isfinite(pre[nans])]).astype(int)
    if bad.size:
        i = int(bad[0])
        worst = int(bad[np.nanargmax(np.where(np.isfinite(post[bad]), post[bad], np.inf))])
        rounding = (
            f"; an overshoot of at most {FLOAT32_NORM_DRIFT:g} is float32 rounding in the clip's own norm "
            f"(torch's CPU norm of one tensor of millions of elements drifts that much): pass "
            f"rtol={FLOAT32_NORM_DRIFT:g} if that is what you see"
            if contained(post[worst], limits[worst], FLOAT32_NORM_DRIFT)
            else ""
        )
        _fail(
            f"the clip did not contain the gradient: post-clip norm {fmt(float(post[i]), '.4g')} > max_norm "
            f"{float(limits[i]):g} at step {int(steps[i])} ({bad.size} step{'s' if bad.size > 1 else ''} over; worst "
            f"{fmt(float(post[worst]), '.4g')} at step {int(steps[worst])}){rounding}",
            rec,
            int(steps[worst]),
            metric,
            max_norm=float(limits[worst]),
            assertion="assert_clip_contains",
            measured=float(post[worst]),
            limit=float(limits[worst]),
        )
    finite_post = post[applied & np.isfinite(post)]
    largest = float(finite_post.max()) if finite_post.size else None
    held = passed(
        "assert_clip_contains",
        f"the gradient-norm clip held: post-clip norm ≤ {shown:g} at every step (max {fmt(largest, '.4g')})",
        rec,
        metric,
        measured=largest,
        limit=shown,
        step=None if largest is None else int(steps[applied & (post == largest)][0]),
    )
    if allow_overclip or pre is None:
        return held
    judged = limits if own is None else np.minimum(own, limits)
    under = np.flatnonzero(overclipped(pre, post, judged, rtol) & applied)
    if under.size:
        i = int(under[0])
        expected = min(float(pre[i]), float(judged[i]))
        times = expected / post[i] if post[i] > 0 else math.inf
        more = f" ({under.size} steps over-clipped)" if under.size > 1 else ""
        _fail(
            f"over-clipped at step {int(steps[i])}: the optimizer received {fmt_compact(float(post[i]))} for pre-clip "
            f"{fmt_compact(float(pre[i]))} and max_norm {float(limits[i]):g} (×{fmt_compact(times)} too small){more}: "
            f"{_overclip_cause(rec, times)}",
            rec,
            int(steps[i]),
            metric,
            max_norm=float(limits[i]),
            assertion="assert_clip_contains",
            measured=float(post[i]),
            limit=expected,
        )
    warned = clip_before_unscale(rec)
    if warned is not None:
        # The recorder saw the clip act on loss-scaled gradients (ClipBeforeUnscaleWarning), or the
        # facts declare it: a failure even where no step shows the over-clip yet (a scale of 1,
        # every step skipped).
        _fail(
            f"the clip ran before the loss scaler's unscale at step {warned} (ClipBeforeUnscaleWarning): it saw "
            f"the loss-scaled gradients; call scaler.unscale_(optimizer) before clipping",
            rec,
            warned,
            metric,
            max_norm=shown,
            assertion="assert_clip_contains",
            limit=shown,
        )
    return held


def _overclip_cause(rec: Record, times: float) -> str:
    """What a too-far clip most likely is: the record's own declaration, else a guess."""
    if clip_before_unscale(rec) is not None:
        return "clipped before unscaling (the clip saw the loss-scaled gradients)"
    if times >= LOSS_SCALE_LIKE:
        return "clipped before unscaling? (a loss scale between the clip and the optimizer shrinks it this much)"
    return "a clip that scales below min(pre-clip, max_norm) breaks the update it guards"


def assert_recovers(
    run: Any,
    within: int = 50,
    factor: float = RECOVERY_FACTOR,
    reference: Any = None,
    at: int | None = None,
    metric: str = "eval_loss",
) -> int:
    """Assert ``metric`` is back within ``factor`` x its pre-event mean within ``within`` steps
    of the event (``at``, else the declared burst, else the largest spike) and stays there.

    With ``reference`` (another run or record), "back" means within ``factor`` x the
    reference's value at the same steps. Returns the recovery time in steps.
    """
    __tracebackhide__ = True
    rec = as_record(run)
    if metric not in rec.metrics or not np.isfinite(np.asarray(rec.metrics[metric], dtype=float)).any():
        metric = "loss"
    spike_metric = (
        _pick_metric(rec, "grad_norm_pre") if ("grad_norm_pre" in rec.metrics or "grad_norm" in rec.metrics) else metric
    )
    step = _event_step(rec, at, spike_metric)
    if step is None:
        _fail(
            "no event to recover from: no declared burst and no spike in the record",
            rec,
            None,
            metric,
            assertion="assert_recovers",
            limit=within,
        )
    if reference is not None:
        ref = as_record(reference)
        rsteps, rvalues = column(ref.metrics, metric)
        ssteps, svalues = column(rec.metrics, metric)
        level = np.interp(ssteps, rsteps, rvalues)
        after = (ssteps >= step) & (ssteps <= step + within)
        bad = after & ~(svalues <= factor * level)
        took = 0 if not bad.any() else None
        if bad.any():
            last = int(np.flatnonzero(bad)[-1])
            took = int(ssteps[last + 1] - step) if last + 1 < ssteps.size and ssteps[last + 1] <= step + within else None
    else:
        took = recovery_steps(rec.metrics, step, factor=factor, name=metric, horizon=within)
    if took is None or took > within:
        level_text = "the reference run" if reference is not None else "its pre-event mean"
        _fail(
            f"{metric} did not recover within {within} steps of step {step}: not back within {factor:g}× {level_text}",
            rec,
            step,
            metric,
            assertion="assert_recovers",
            limit=within,
        )
    passed(
        "assert_recovers",
        f"{metric} back within {factor:g}× {'the reference' if reference is not None else 'its pre-event mean'} "
        f"{took} steps after step {step} (limit {within})",
        rec,
        metric,
        measured=took,
        limit=within,
        step=step,
    )
    return int(took)


def assert_diverges(run: Any, within: int | None = None, at: int | None = None) -> int:
    """Assert the run reaches a non-finite loss or gradient norm (within ``within`` steps of
    the event, if given). Returns the first non-finite step.

    ``run``: a :class:`~pytest_spikecheck.records.run.Run`, a run folder or training log (a
    path), or a record. The event is ``at``, else the run's first declared event, else its
    largest pre-clip gradient-norm spike. Raises ``AssertionError`` (a
    :class:`~pytest_spikecheck.judge.verdict.SpikeCheckError`) naming the step."""
    __tracebackhide__ = True
    rec = as_record(run)
    # A skipped step's non-finite gradient norm is no divergence: the update was not applied.
    failure = judge_finite(rec, [k for k in ("loss", "grad_norm_pre", "grad_norm") if k in rec.metrics]).first_failure
    first = None if failure is None else (failure.first_step, failure.metric)
    metric = "loss" if "loss" in rec.metrics else next(iter(k for k in rec.metrics if k != "step"), "loss")
    if first is None:
        _fail(
            "expected the run to diverge (a NaN or inf loss or gradient norm), but every value is finite",
            rec,
            _event_step(rec, at, _pick_metric(rec, "grad_norm_pre")) if "grad_norm_pre" in rec.metrics else None,
            metric,
            assertion="assert_diverges",
            limit=within,
        )
    if within is not None:
        step = _event_step(rec, at, _pick_metric(rec, "grad_norm_pre"))
        if step is not None and first[0] - step > within:
            _fail(
                f"the run diverged at step {first[0]}, more than {within} steps after the event at step {step}",
                rec,
                first[0],
                metric,
                diagnose_step=False,
                assertion="assert_diverges",
                measured=first[0] - step,
                limit=within,
            )
    passed("assert_diverges", f"non-finite {first[1]} at step {first[0]}", rec, first[1], step=first[0], limit=within)
    return first[0]


def assert_finite(run: Any, strict: bool = False) -> Finiteness:
    """Assert every recorded value of ``run`` (a :class:`~pytest_spikecheck.records.run.Run`, a
    run folder or training log, a record) is finite, except what the finiteness decisions excuse
    (:mod:`pytest_spikecheck.judge.finiteness`: the gradient norm of a step the optimizer
    skipped, never its loss). ``strict=True`` excuses nothing (``--strict-finite``). A failure
    names the first bad step and, for engine runs, the module where the first non-finite
    tensor appeared. Returns the decisions (``.skipped_steps``, ``.excused_groups()``)."""
    __tracebackhide__ = True
    rec = as_record(run)
    finite = judge_finite(rec, strict=strict)
    first = finite.first_failure
    if first is not None:
        step, name = first.first_step, first.metric
        where = ""
        if rec.run is not None and rec.run.meta.get("first_nonfinite"):
            info = rec.run.meta["first_nonfinite"]
            where = f"; first non-finite tensor: {info.get('tensor', '?')} in {info.get('module', '?')} at step {info.get('step', step)}"
        cause = nonfinite_norm_cause(rec, step) if is_gradient_norm(name) else None
        where = f"; {cause}{where}" if cause else where
        excused = "".join(f"\n(excused: {g.text()})" for g in finite.excused_groups())
        _fail(
            f"non-finite {name} at step {step} ({fmt(first.first_value)}){where}{excused}",
            rec,
            step,
            name,
            diagnose_step=False,
            assertion="assert_finite",
            measured=first.first_value,
        )
    skipped = len(finite.skipped_steps)
    passed(
        "assert_finite",
        "every recorded value is finite"
        + (f" (the gradient norm of {skipped} skipped step{'s' if skipped != 1 else ''} excused)" if skipped else ""),
        rec,
        None,
    )
    return finite


def assert_no_lockin(run: Any, max_top_share: float = 0.5, min_distinct_2: float = 0.1) -> Verdict:
    """Assert the trained model is not in repetition lock-in: in its greedy samples (16 eval
    prompts spread over the eval set, recorded by the engine at the end of a run) no single
    token takes more than ``max_top_share`` of the output, and distinct bigrams are at least
    ``min_distinct_2`` of all bigrams. Healthy Phase-19 and Seed B runs measure a top share
    of ~0.08 and distinct-2 of ~0.3-0.4 (docs/fidelity.md); a locked-in model repeats one
    token whatever the prompt (share near 1, distinct-2 near 0)."""
    __tracebackhide__ = True
    rec = as_record(run)
    stats = rec.run.meta.get("lockin") if rec.run is not None else None
    if stats is None:
        facts = getattr(rec.run, "facts", None)
        arch = facts.model.arch if facts is not None and facts.source == "engine" else None
        custom = arch if arch not in (None, "gpt", "llama") else None
        reason = (
            "the run stopped early"
            if rec.run is not None and rec.run.stopped_early
            else f"the engine records greedy samples for the built-in GPT only, and this run trained your own "
            f"model ({custom}); sample it yourself and check the output"
            if custom
            else "it has no greedy samples (only runs trained by the engine do)"
        )
        verdict = emit(
            Verdict(
                "assert_no_lockin",
                False,
                f"cannot check lock-in: {reason}",
                metric="top_token_share",
                limit=max_top_share,
                scenario=getattr(rec.run, "name", None),
            )
        )
        raise SpikeCheckError(f"cannot check lock-in on {rec.source}: {reason}", verdict=verdict)
    problems = []
    if stats["top_token_share"] > max_top_share:
        problems.append(
            f"token {stats['top_token']!r} is {stats['top_token_share']:.0%} of the greedy output (limit {max_top_share:.0%})"
        )
    if stats["distinct_2"] < min_distinct_2:
        problems.append(f"distinct-2 is {stats['distinct_2']:.3f} (limit {min_distinct_2:g})")
    scenario = getattr(rec.run, "name", None)
    if problems:
        samples = "\n".join(f"  {s!r}" for s in stats["samples"])
        verdict = emit(
            Verdict(
                "assert_no_lockin",
                False,
                f"repetition lock-in: {'; '.join(problems)}",
                metric="top_token_share",
                measured=float(stats["top_token_share"]),
                limit=max_top_share,
                scenario=scenario,
            )
        )
        raise SpikeCheckError(
            f"repetition lock-in: {'; '.join(problems)}\n\ngreedy samples:\n{samples}\n\nrecord: {rec.source}", verdict=verdict
        )
    return emit(
        Verdict(
            "assert_no_lockin",
            True,
            f"no lock-in: top token {stats['top_token_share']:.0%} of the greedy "
            f"output (limit {max_top_share:.0%}), distinct-2 {stats['distinct_2']:.3f}",
            metric="top_token_share",
            measured=float(stats["top_token_share"]),
            limit=max_top_share,
            scenario=scenario,
        )
    )
