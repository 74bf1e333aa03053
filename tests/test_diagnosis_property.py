"""Every line of a diagnosis says only what the record shows.

Hypothesis draws records as users and logs have them — with and without a loss column, a
post-clip norm, a clip factor, a known max_norm; real NaN/inf values; entries that were not
logged — around a planted spike that a clip handled well, not at all, or badly. An oracle
written here, from the definitions and not from the diagnosis code, recomputes each claim
(clipped, contained, non-finite, not logged) and every verdict line must agree with it.

``test_every_claim_matches_the_record`` runs three times the profile's examples, at most 1,000:
300 under the ``ci`` profile (its 100 would leave the rare verdicts, a leak or a contained clip,
a handful of examples each) and 1,000 under ``pytest --hypothesis-profile dev`` (about 9 s of CPU: too slow
for every run of the suite on two shared cores). docs/testing.md records the last such run.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import event, given, settings
from hypothesis import strategies as st

from pytest_spikecheck import diagnose
from pytest_spikecheck.judge.analysis import CLIP_RTOL
from pytest_spikecheck.judge.diagnosis import CLIPPED_RTOL, SPIKE_VERDICT_RATIO
from pytest_spikecheck.judge.text import fmt
from pytest_spikecheck.records import Record

#: What a clip did at the spike: scaled it to max_norm, nothing, scaled it too little (a leak),
#: or a value unrelated to the pre-clip norm.
CLIP_OUTCOMES = ("contained", "none", "leak", "random")


@st.composite
def records(draw):
    """(Record, step to diagnose or None, max_norm passed to diagnose or None)."""
    n = draw(st.integers(12, 90))
    # The bulk of each series comes from a drawn seed: drawing 90 floats one by one would make
    # generation, not the diagnosis, the cost of this test.
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    steps = np.cumsum(rng.integers(1, 4, n)) if draw(st.booleans()) else np.arange(1, n + 1)
    level = draw(st.floats(0.05, 5.0))
    noise = rng.uniform(0.8, 1.25, n)
    pre = level * noise
    spike_at = draw(st.integers(n // 2, n - 1))
    pre[spike_at] *= draw(st.sampled_from([40.0, 10.0, 1e4, 3.5, 2.0, 1.0]))
    max_norm = draw(st.floats(0.01, 10.0))
    outcome = draw(st.sampled_from(CLIP_OUTCOMES))
    post = np.minimum(pre, max_norm)
    if outcome == "none":
        post = pre.copy()
    elif outcome == "leak":
        # just past the tolerance, or plainly over
        post[spike_at] = max_norm * draw(st.sampled_from([1 + 2 * CLIP_RTOL, 1 + CLIP_RTOL / 2, 1.5, 3.0]))
    elif outcome == "random":
        post[spike_at] = draw(st.floats(0.0, 1e4))
    factor = np.where(pre > 0, np.minimum(1.0, post / pre), 1.0)
    cols = {
        "loss": 2.0 * noise,
        draw(st.sampled_from(["grad_norm_pre", "grad_norm"])): pre,
        "grad_norm_post": post,
        "clip_factor": factor,
    }
    # The gradient norm is always there; each other column is left out now and then.
    cols = {k: v for k, v in cols.items() if k in ("grad_norm_pre", "grad_norm") or draw(st.integers(0, 3))}
    # Real non-finite values and entries that were not logged, often right at the spike.
    missing: dict[str, np.ndarray] = {}
    for name in list(cols):
        values, gone = cols[name].astype(np.float64), np.zeros(n, bool)
        for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):
            i = spike_at if draw(st.integers(0, 3)) == 0 else draw(st.integers(0, n - 1))
            kind = draw(st.sampled_from(["nan", "inf", "missing"]))
            if kind == "missing":
                values[i], gone[i] = math.nan, True
            else:
                values[i] = math.nan if kind == "nan" else math.inf
        cols[name] = values
        if gone.any() or draw(st.booleans()):
            missing[name] = gone
    where = draw(st.sampled_from(["planted spike", "largest spike", "planted spike", "any step"]))
    step = (
        None
        if where == "largest spike"
        else int(steps[spike_at])
        if where == "planted spike"
        else int(draw(st.sampled_from(steps)))
    )
    return (
        Record({"step": steps, **cols}, None, "drawn", missing=missing),
        step,
        (None if draw(st.integers(0, 3)) == 0 else max_norm),
    )


def _oracle_logged(rec: Record, name: str, step: int) -> float | None:
    if name not in rec.metrics or step not in rec.metrics["step"]:
        return None
    i = int(np.flatnonzero(rec.metrics["step"] == step)[-1])
    return None if name in rec.missing and rec.missing[name][i] else float(rec.metrics[name][i])


def _oracle_ratio(rec: Record, name: str, step: int, value: float) -> float:
    s, v = rec.metrics["step"], rec.metrics[name]
    window = v[(s >= step - 50) & (s < step) & np.isfinite(v)]
    if window.size < 10 or not np.median(window) > 0:  # a baseline needs 10 finite values
        return math.nan
    return value / float(np.median(window))


@settings(max_examples=min(1000, 3 * settings.default.max_examples))
@given(records())
def test_every_claim_matches_the_record(drawn):
    rec, step, max_norm = drawn
    d = diagnose(rec, step, max_norm=max_norm)
    if d.step is None:
        event("no spike found")
        assert d.verdict == "no spike"
        return
    step = d.step
    grad = "grad_norm_pre" if "grad_norm_pre" in rec.metrics else "grad_norm"
    loss, pre = _oracle_logged(rec, "loss", step), _oracle_logged(rec, grad, step)
    post, factor = _oracle_logged(rec, "grad_norm_post", step), _oracle_logged(rec, "clip_factor", step)
    finite = lambda v: v is not None and math.isfinite(v)  # noqa: E731

    clipped = (
        post < pre * (1 - CLIPPED_RTOL)
        if finite(post) and finite(pre)
        else factor < 1 - CLIPPED_RTOL
        if post is None and finite(factor)
        else None
    )
    contained = post <= max_norm * (1 + CLIP_RTOL) if finite(post) and max_norm is not None else None
    nonfinite = sorted(
        name for name, v in (("loss", loss), (grad, pre), ("grad_norm_post", post)) if v is not None and not math.isfinite(v)
    )
    assert (d.facts["clipped"], d.facts["contained"], sorted(d.facts["nonfinite"])) == (clipped, contained, nonfinite)

    lines = dict(d.lines)
    loss_line, grad_line, verdict = lines["1 loss"], lines["2 grad norm"], d.verdict
    # rung 1 and 2: each value is shown as logged, or said not to be
    assert ("train loss not logged" in loss_line) == (loss is None)
    if loss is not None:
        assert f"train loss {fmt(loss, '.3f')}" in loss_line
    assert ("pre-clip not logged" in grad_line) == (pre is None)
    assert ("post-clip norm not logged" in grad_line) == (post is None)
    if post is not None:
        assert fmt(post, ".3g") in grad_line
    assert ("NOT clipped" in grad_line) == (clipped is False)
    assert ("clipped to" in grad_line or "clipped ×" in grad_line) == (clipped is True)
    assert ("within max_norm" in grad_line) == (contained is True)
    assert ("ABOVE max_norm" in grad_line) == (contained is False)
    for v in (pre, post, loss):
        if v is not None and not math.isfinite(v):
            assert fmt(v) in ("nan", "inf", "-inf") and "—" not in fmt(v)

    # the verdict: one claim, and it holds
    ratio = _oracle_ratio(rec, grad, step, pre) if finite(pre) else math.nan
    spike = finite(ratio) and ratio >= SPIKE_VERDICT_RATIO
    assert ("non-finite values" in verdict) == bool(nonfinite)
    if nonfinite:
        event("verdict: non-finite")
        assert all(name in verdict for name in nonfinite)
        return
    if pre is None:
        event("verdict: pre-clip not logged")
        assert "cannot be told" in verdict
        return
    # over-clipped (the optimizer received less than min(pre-clip, max_norm)): the verdict says so,
    # spike or none, as assert_clip_contains fails on it
    over = finite(pre) and finite(post) and max_norm is not None and post < min(pre, max_norm) * (1 - CLIP_RTOL) - 1e-6
    assert ("over-clipped" in verdict) == over
    if over:
        event("verdict: over-clipped")
        assert "OVER-CLIPPED" in grad_line
        return
    assert verdict.startswith("no clear spike") == (not spike)
    if not spike:
        event("verdict: no clear spike")
        return
    event(f"verdict: clipped={clipped} contained={contained}")
    assert ("the clip contained it" in verdict) == (clipped is True and contained is True)
    assert ("LEAKED" in verdict) == (clipped is True and contained is False)
    assert ("unclipped" in verdict or "no clip" in verdict) == (clipped is False)
    assert ("cannot be told" in verdict) == (clipped is None or (clipped is True and contained is None))
