"""Which non-finite values fail a run (pytest_spikecheck.judge.finiteness): ``Record.skipped``
excuses a skipped step's gradient norm, never its loss; ``strict`` excuses nothing."""

import math

import numpy as np
import pytest

from pytest_spikecheck import SpikeCheckError, assert_diverges, assert_finite
from pytest_spikecheck.cli.check import _check_text, check_record, exit_status
from pytest_spikecheck.judge.finiteness import FAILS, SKIPPED_STEP, judge_finite
from pytest_spikecheck.judge.policy import judge_log
from pytest_spikecheck.records import Record
from pytest_spikecheck.records.series import columns_from_mapping


def record(skipped=None, **columns) -> Record:
    metrics, missing = columns_from_mapping(columns)
    return Record(metrics, None, "arrays", missing=missing, log_format="jsonl", skipped=skipped or {})


def overflow_run(n=60, at=30, loss_at=2.0, skipped_at=None):
    grad = np.full(n, 1.0) + 0.01 * np.arange(n) % 0.05
    grad[at - 1] = math.inf
    loss = np.full(n, 2.0)
    loss[at - 1] = loss_at
    return record({at if skipped_at is None else skipped_at: "overflow"}, loss=loss, grad_norm_pre=grad,
                  clip_factor=np.where(np.isfinite(grad), 1.0, math.nan))


def test_a_skipped_steps_gradient_norm_is_excused_and_counted():
    rec = overflow_run()
    finite = assert_finite(rec)
    assert finite.ok and finite.skipped_steps == 1
    assert [(g.metric, g.decision, g.first_step, g.count) for g in finite.groups] == [
        ("grad_norm_pre", SKIPPED_STEP, 30, 1), ("clip_factor", SKIPPED_STEP, 30, 1)]
    assert finite.groups[0].text() == ("grad_norm_pre = inf at step 30: a skipped step (overflow): "
                                       "the update was not applied, not a failure")
    assert assert_finite(rec).excused["grad_norm_pre"].sum() == 1
    with pytest.raises(SpikeCheckError, match="expected the run to diverge"):
        assert_diverges(rec)  # a skipped step is no divergence


def test_strict_excuses_nothing():
    rec = overflow_run()
    with pytest.raises(SpikeCheckError, match=r"^non-finite grad_norm_pre at step 30 \(inf\)"):
        assert_finite(rec, strict=True)
    assert judge_finite(rec, strict=True).skipped_steps == 0


def test_the_loss_of_a_skipped_step_is_never_excused():
    rec = overflow_run(loss_at=math.nan)
    with pytest.raises(SpikeCheckError) as info:
        assert_finite(rec)
    head = str(info.value).split("\n\n")[0].splitlines()
    assert head == ["non-finite loss at step 30 (nan)",
                    "(excused: grad_norm_pre = inf at step 30: a skipped step (overflow): the update was not applied, "
                    "not a failure)",
                    "(excused: clip_factor = nan at step 30: a skipped step (overflow): the update was not applied, "
                    "not a failure)"]
    assert assert_diverges(rec) == 30


def test_sabotage_a_skip_listed_at_another_step_excuses_nothing():
    # The record says step 31 was skipped, but the inf is at step 30: the inf fails the run.
    rec = overflow_run(skipped_at=31)
    failure = judge_finite(rec).first_failure
    assert (failure.metric, failure.first_step, failure.decision) == ("grad_norm_pre", 30, FAILS)
    with pytest.raises(SpikeCheckError, match="non-finite grad_norm_pre at step 30"):
        assert_finite(rec)
    assert assert_diverges(rec) == 30


def test_the_check_reports_the_skip_and_leaves_it_out_of_the_rules():
    rec = overflow_run()
    report = judge_log(rec)
    assert report["ok"] and report["nonfinite"] is None
    assert report["finite"]["skipped_steps"] == 1
    assert "1 step skipped by the optimizer" in report["notes"][-1]
    grad = next(s for s in report["series"] if s["metric"] == "grad_norm_pre")
    assert grad["logged"] == 59 and not grad["spikes"]  # the skipped value is neither a level nor a spike
    text = _check_text(check_record(rec), strict=False)
    assert "non-finite values: none that fails the run (--strict-finite fails every one)" in text
    assert "  grad_norm_pre = inf at step 30: a skipped step (overflow): the update was not applied, not a failure" in text
    assert text.splitlines()[-1] == "OK: no spike in grad_norm_pre, loss, no non-finite value that fails the run"
    strict = check_record(rec, strict_finite=True)
    assert exit_status(strict, strict=False) == 1 and strict["nonfinite"]["step"] == 30
    assert any(h["step"] == 30 for s in strict["series"] for h in s["spikes"])  # today's behaviour: flagged
