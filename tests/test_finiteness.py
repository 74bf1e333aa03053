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
    return record(
        {at if skipped_at is None else skipped_at: "overflow"},
        loss=loss,
        grad_norm_pre=grad,
        clip_factor=np.where(np.isfinite(grad), 1.0, math.nan),
    )


def test_a_skipped_steps_gradient_norm_is_excused_and_counted():
    rec = overflow_run()
    finite = assert_finite(rec)
    assert finite.ok and finite.skipped_steps == (30,)  # the steps (a count would not say which)
    assert [(g.metric, g.decision, g.first_step, g.count) for g in finite.groups] == [
        ("grad_norm_pre", SKIPPED_STEP, 30, 1),
        ("clip_factor", SKIPPED_STEP, 30, 1),
    ]
    assert finite.groups[0].text() == (
        "grad_norm_pre = inf at step 30: a skipped step (overflow): the update was not applied, not a failure"
    )
    assert assert_finite(rec).excused["grad_norm_pre"].sum() == 1
    with pytest.raises(SpikeCheckError, match="expected the run to diverge"):
        assert_diverges(rec)  # a skipped step is no divergence


def test_strict_excuses_nothing():
    rec = overflow_run()
    with pytest.raises(SpikeCheckError, match=r"^non-finite grad_norm_pre at step 30 \(inf\)"):
        assert_finite(rec, strict=True)
    assert judge_finite(rec, strict=True).skipped_steps == ()


def test_the_loss_of_a_skipped_step_is_never_excused():
    rec = overflow_run(loss_at=math.nan)
    with pytest.raises(SpikeCheckError) as info:
        assert_finite(rec)
    head = str(info.value).split("\n\n")[0].splitlines()
    assert head == [
        "non-finite loss at step 30 (nan)",
        "(excused: grad_norm_pre = inf at step 30: a skipped step (overflow): the update was not applied, not a failure)",
        "(excused: clip_factor = nan at step 30: a skipped step (overflow): the update was not applied, not a failure)",
    ]
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
    assert len(report["finite"]["skipped_steps"]) == 1
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


# -- decisions per column and context, from logs ----------------------------------------------------

import json  # noqa: E402

from pytest_spikecheck.cli.commands import main  # noqa: E402
from pytest_spikecheck.judge.finiteness import EVALUATION, NOT_TRAINING, NOT_YET_COMPUTED, column_role  # noqa: E402
from pytest_spikecheck.records.logs import read_log  # noqa: E402


def hf_state(entries):
    return json.dumps({"global_step": entries[-1]["step"], "log_history": entries}, indent=2)


def fp16_run(nan_at=23, loss_at=None, tail_nan=False):
    """An fp16 HF run's log_history as the Trainer writes it: loss, grad_norm, learning_rate, epoch
    every 5 steps; at one logging step the loss scaler found an overflow (grad_norm NaN) and the
    loss stayed finite."""
    entries = []
    for k, step in enumerate(range(5, 205, 5)):
        grad = float("nan") if k == nan_at else 0.8 + 0.05 * ((k * 7) % 5)
        loss = 2.3 - 0.01 * k if not (tail_nan and k > nan_at) else float("nan")
        entries.append({"epoch": round(step / 400, 4), "grad_norm": grad, "learning_rate": 2e-5, "loss": loss, "step": step})
    return entries


def test_a_healthy_fp16_hf_run_with_a_one_step_nan_grad_norm_exits_0_with_the_skip_reported(tmp_path, capsys):
    path = tmp_path / "trainer_state.json"
    path.write_text(hf_state(fp16_run()))
    record = read_log(path)
    assert record.skipped == {120: "overflow (inferred: non-finite grad norm, finite loss, finite values after it)"}
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "grad_norm is non-finite at 1 step (120) where the loss, and the values after, stay finite" in out
    assert "  grad_norm = nan at step 120: a skipped step (overflow (inferred: non-finite grad norm, finite loss, " in out
    assert out.splitlines()[-1] == "OK: no spike in grad_norm, loss, no non-finite value that fails the run"
    assert main(["check", str(path), "--strict-finite"]) == 1  # today's behaviour, on request
    capsys.readouterr()


def test_sabotage_a_nan_grad_norm_followed_by_nan_losses_is_a_divergence(tmp_path):
    path = tmp_path / "trainer_state.json"
    path.write_text(hf_state(fp16_run(tail_nan=True)))
    assert read_log(path).skipped == {}
    with pytest.raises(SpikeCheckError, match="non-finite grad_norm at step 120"):
        assert_finite(path)
    two = fp16_run()
    two[24]["grad_norm"] = float("nan")  # two logging steps in a row: no loss scale logged, not one step
    path.write_text(hf_state(two))
    assert read_log(path).skipped == {}


def test_placeholders_evaluations_and_other_columns(tmp_path, capsys):
    rows = [
        {
            "step": s,
            "loss": 2.0 - 0.01 * s,
            "grad_norm": 1.0,
            "hidden_gradient_norm": float("nan") if s == 0 else 0.5,  # nothing computed yet at step 0
            "eval_loss": float("nan") if s == 20 else None,
            "lr": float("inf") if s == 30 else 1e-4,
        }
        for s in range(0, 40)
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    finite = assert_finite(path)
    assert [(g.metric, g.decision) for g in finite.groups] == [
        ("hidden_gradient_norm", NOT_YET_COMPUTED),
        ("eval_loss", EVALUATION),
        ("lr", NOT_TRAINING),
    ]
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "  hidden_gradient_norm = nan at step 0: before the column's first value (step 1): not yet computed" in out
    assert "  eval_loss = nan at step 20: an evaluation's result, not training: not a failure" in out
    assert "  lr = inf at step 30: neither a training loss nor a gradient norm: not a failure" in out
    with pytest.raises(SpikeCheckError, match="non-finite hidden_gradient_norm at step 0"):
        assert_finite(path, strict=True)


def test_sabotage_a_nan_after_the_first_value_is_no_placeholder():
    rec = record(loss=[2.0, 1.9, 1.8, 1.7], hidden_gradient_norm=[0.5, math.nan, 0.5, 0.5])
    with pytest.raises(SpikeCheckError, match="non-finite hidden_gradient_norm at step 2"):
        assert_finite(rec)
    assert judge_finite(record(loss=[math.nan] * 4)).first_failure.metric == "loss"  # no first value: every NaN fails


def test_a_skip_column_names_the_reason(tmp_path):
    # our metrics.jsonl's own column: the reason, or null
    rows = [
        {
            "step": s,
            "loss": 2.0,
            "grad_norm_pre": math.inf if s == 3 else 1.0,
            "skipped": "overflow" if s == 3 else None,
            "loss_scale": 65536.0 if s < 3 else 32768.0,
        }
        for s in range(1, 8)
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    record_ = read_log(path)
    assert record_.skipped == {3: "overflow"} and "skipped" not in record_.metrics
    assert len(assert_finite(path).skipped_steps) == 1


@pytest.mark.parametrize(
    ("name", "role"),
    [
        ("loss", "training loss"),
        ("z_loss", "training loss"),
        ("train/loss", "training loss"),
        ("eval_loss", "evaluation"),
        ("val/loss", "evaluation"),
        ("loss/val", "evaluation"),
        ("test_loss", "evaluation"),
        ("grad_norm", "gradient norm"),
        ("hidden_gradient_norm", "gradient norm"),
        ("clip_factor", "gradient norm"),
        ("loss_scale", "other"),
        ("lr", "other"),
        ("rewards/chosen", "other"),
    ],
)
def test_column_roles(name, role):
    assert column_role(name) == role


def test_an_fp16_runs_first_skipped_steps_are_skips_not_not_yet_computed():
    # Issue 35's new-user trial: an fp16 loop whose scaler skips its first two steps (NaN norms, the
    # log's skipped column says overflow) read them as "not yet computed".
    from pytest_spikecheck.judge.finiteness import SKIPPED_STEP, judge_finite
    from pytest_spikecheck.records import Record

    metrics = {"step": np.arange(1, 7), "loss": np.full(6, 2.0), "grad_norm_pre": np.r_[np.nan, np.nan, 1.0, 1.1, 0.9, 1.0]}
    rec = Record(metrics, None, "fp16", log_format="jsonl", skipped={1: "overflow", 2: "overflow"})
    decisions = [(g.metric, g.decision, g.count) for g in judge_finite(rec).groups]
    assert decisions == [("grad_norm_pre", SKIPPED_STEP, 2)]
