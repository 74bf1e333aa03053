"""Issue 35 §3's classes on real public logs (tests/data/logs/public, provenance in its README):
each file is read as a user would give it, through ``spikecheck check`` and the reader API."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pathlib import Path

from pytest_spikecheck import ConfigError
from pytest_spikecheck.cli.commands import main
from pytest_spikecheck.judge.detectors import LossJump, SustainedLoss
from pytest_spikecheck.judge.policy import judge_log
from pytest_spikecheck.records.logs import detect_format, read_log, read_runs

PUBLIC = Path(__file__).parent / "data" / "logs" / "public"
NANOCHAT = PUBLIC / "nanochat-speedrun-crlf" / "speedrun.log"


def test_a_nanochat_speedrun_with_crlf_line_ends_is_two_phases(capsys):
    # chirag9127/nanochat's speedrun.log: CR LF line ends, the end of base training (steps
    # 21359-21400) then mid-training counting again from its validation at step 0.
    raw = NANOCHAT.read_bytes()
    assert raw.count(b"\r\n") == raw.count(b"\n") == 376 and b"\x00" not in raw
    assert detect_format(NANOCHAT) == "text"
    base, mid = read_runs(NANOCHAT)
    assert base.metrics["step"][[0, -1]].tolist() == [21359, 21400] and base.metrics["loss"][0] == 2.77358
    assert mid.metrics["step"][[0, -1]].tolist() == [0, 152] and mid.series("loss")[1][0] == 1.345409
    assert mid.series("Validation bpb")[1].tolist() == [0.7004, 0.4563]
    assert "2 runs or phases in one file" in base.notes[-1]
    assert not any("restart from a checkpoint" in n for r in (base, mid) for n in r.notes)
    # the config dicts nanochat's checkpoint manager prints are no Trainer log: no phantom run of
    # 'sequence_len'/'n_layer' between the phases (they made a third run, steps 1-3, before)
    assert not any("HF Trainer dict" in n for n in base.notes) and "n_layer" not in base.metrics
    assert main(["check", str(NANOCHAT)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{NANOCHAT}: 2 runs in one file") and "judged 149 of 152 points" in out


def test_deepspeed_chat_ppo_lines_and_their_inf_actor_loss(capsys):
    # DeepSpeedExamples issue #444: step-3 PPO lines whose actor and critic losses turn inf at 3184.
    path = PUBLIC / "deepspeed-chat-ppo-inf" / "step3.log"
    rec = read_log(path)
    assert rec.metrics["step"].tolist() == [3183, 3184, 3185]
    assert rec.metrics["loss"][0] == 30.921875 and math.isinf(rec.metrics["loss"][1])  # act_loss
    report = judge_log(rec)
    assert report["kind"] == "rl" and not report["ok"]
    assert report["nonfinite"]["step"] == 3184 and report["nonfinite"]["metric"] == "loss"
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert "an RL/preference loss: loss rules step aside" in out and "loss = inf at step 3184 (the first)" in out


VAL_ONLY = PUBLIC / "modded-nanogpt-val-only" / "c8cbdf48-220a-443b-b145-8ac6a32d4e07.txt"


def test_a_stdout_log_whose_only_series_is_validation_loss_is_judged_as_one(capsys):
    # A modded-nanogpt speedrun record (KellerJordan/modded-nanogpt): its training lines carry only
    # timings (step:1/1385 train_time:17555ms step_avg:nanms); the loss is val_loss every 125 steps.
    rec = read_log(VAL_ONLY)
    assert rec.series("eval_loss")[0].tolist() == [*range(0, 1376, 125), 1385]
    assert rec.series("eval_loss")[1][[0, -1]].tolist() == [10.8258, 3.2792] and "loss" not in rec.metrics
    assert main(["check", str(VAL_ONLY)]) == 0
    out = capsys.readouterr().out
    assert "the validation series (eval_loss) judged by the loss rules" in out and "judged 10 of 13 points" in out


def test_sabotage_without_the_validation_fallback_the_log_is_refused(monkeypatch):
    import pytest_spikecheck.judge.policy as policy

    monkeypatch.setattr(policy, "EVAL_METRICS", ())
    with pytest.raises(ConfigError, match="no loss or gradient-norm series"):
        judge_log(read_log(VAL_ONLY))


def test_build_nanogpt_validation_line_belongs_to_the_step_after_it():
    # Real stdout of build-nanogpt's train_gpt2.py, quoted in logbob0401/build-nanogpt practice.md: the
    # validation (and HellaSwag) at step 500 % 250 == 0 printed at the top of step 500, before its line.
    rec = read_log(PUBLIC / "build-nanogpt-validation" / "train.log")
    assert rec.metrics["step"].tolist() == [498, 499, 500, 501] and rec.metrics["grad_norm"][0] == 1.0096
    assert rec.series("eval_loss")[0].tolist() == [500] and rec.series("eval_loss")[1].tolist() == [5.3183]
    assert rec.notes[0] == "read as text: 4 key=value / key: value lines, 1 stepless validation line"


DESCENT = PUBLIC / "hf-sft-descent-jumps" / "trainer_state.json"


def test_jumps_of_nats_on_a_falling_noisy_loss_are_found(capsys):
    # A real 40-step HF trainer_state.json excerpt: the loss falls 3.71 -> 2.21 and jumps +1.9 nats at
    # step 7, +1.5 at 18-19 and +3.3 at 35; the spread of the falling history around its median hid all
    # but the first.
    assert main(["check", str(DESCENT)]) == 1
    out = capsys.readouterr().out
    for line in ("  7     5.524  3.599     loss-jump +1.92 nats", "  35    6.499  3.218     loss-jump +3.28 nats"):
        assert line in out
    steps, loss = read_log(DESCENT).series("loss")
    assert [d.step for d in LossJump().detect(steps, loss)] == [7, 18, 19, 35]
    assert [d.step for d in LossJump(detrend=False).detect(steps, loss)] == [7]  # sabotage


NLL = PUBLIC / "lightning-nll-loss" / "metrics.csv"


def test_a_lightning_csv_whose_loss_is_train_nll_loss_is_judged_on_it(capsys):
    # Eve-ning/opal-v2's lightning_logs/version_0/metrics.csv, whole (CR LF line ends): the loss is
    # `train/nll_loss` every 50 steps (0.0576 at step 49 falling to ~0.01 by step 700, then 0.0075-0.013),
    # `lr-Adam` on rows of its own (no epoch) at the same steps, `val/rmse_loss` once an epoch. A regression
    # model's likelihood loss, no RL: judged on that loss, and no spike (its largest move is under 0.01 nats).
    raw = NLL.read_bytes()
    assert raw.count(b"\r\n") == raw.count(b"\n") == 225 and raw.startswith(b"epoch,lr-Adam,step,train/nll_loss,")
    rec = read_log(NLL)
    steps, loss = rec.series("loss")
    assert rec.log_format == "lightning" and steps.tolist() == list(range(49, 5400, 50))
    assert loss[[0, -1]].tolist() == [0.0575530878690101, 0.010449534956721657]
    assert rec.series("lr")[0].tolist() == steps.tolist() and rec.series("lr")[1][0] == 0.00328141592920354
    assert rec.series("val/rmse_loss")[0].tolist() == [678, 1357, 2036, 2715, 3394, 4073, 4752, 5431]
    assert main(["check", str(NLL)]) == 0
    out = capsys.readouterr().out
    assert "kind sft/pretrain" in out and "judged 105 of 108 points" in out and "OK: no spike in loss" in out


def test_sabotage_val_as_an_rl_prefix_skips_the_lightning_loss(monkeypatch, tmp_path):
    # Before: any `val/` column marked a log RL (for TRL PPO's val/ratio), so the loss rules stepped aside.
    import pytest_spikecheck.judge.policy as policy

    ppo = tmp_path / "ppo.jsonl"  # TRL PPO's value-head keys by name still mark a log RL
    ppo.write_text("".join(f'{{"step": {s}, "loss": 0.5, "val/ratio": 1.0}}\n' for s in range(1, 20)))
    assert judge_log(read_log(ppo))["kind"] == "rl"
    monkeypatch.setattr(policy, "_RL_PREFIXES", (*policy._RL_PREFIXES, "val/"))
    report = judge_log(read_log(NLL))
    assert report["kind"] == "rl" and report["series"][0]["status"] == "skipped"


RUNS = PUBLIC / "gpt2-runs-one-file" / "log.md"


def test_six_runs_printed_into_one_log_are_six_runs_each_judged(capsys):
    # aakashvardhan/s21-gpt2's log.md: the stdout of six GPT-2 training runs pasted one after another
    # (an overfit of one batch, then five variants), each counting its steps from 0 again. Runs 5 and 6
    # (tf32, then tf32 at "high") print the same losses for 14 steps and other timings: six runs of 50
    # steps, no restart from a checkpoint, no echo, and no spike (+0.8 nats at step 46 of runs 5 and 6 is
    # within those runs' own batch-to-batch moves of up to 0.8).
    runs = read_runs(RUNS)
    assert [r.metrics["step"].tolist() for r in runs] == [list(range(50))] * 6
    last = [0.06201247125864029, 6.971785545349121, 6.827264785766602, 6.82475471496582, 7.082703590393066]
    assert [r.series("loss")[1][-1] for r in runs] == [*last, 7.094860076904297]
    five, six = (r.series("loss")[1] for r in runs[4:])
    assert (five[:14] == six[:14]).all() and five[14] != six[14]
    assert "6 runs or phases in one file" in runs[0].notes[-1]
    # runs 5 and 6 print `time: 644.64 ms, tokens/sec: 1588.47`: wall-clock and throughput, no columns
    assert all(sorted(r.metrics) == ["loss", "step"] for r in runs)
    assert not any("restart from a checkpoint" in n or "repeat earlier rows" in n for r in runs for n in r.notes)
    assert main(["check", str(RUNS)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{RUNS}: 6 runs in one file") and out.count("OK: no spike in loss") == 6


def test_sabotage_without_the_new_run_rule_the_six_runs_read_as_restarts():
    import pytest_spikecheck.records.logs.rules as rules

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rules, "_runs", lambda steps, columns, table: ([(0, steps.size)], None))
        (only,) = read_runs(RUNS)
    assert only.metrics["step"].tolist() == list(range(50))  # the first five runs replaced by the last
    assert sum("restart from a checkpoint" in n for n in only.notes) == 5


SNMT = PUBLIC / "simple-nmt-runs-one-file" / "rl-seq2seq-baseline-training-for-mybk-bkmy.log"


def test_epoch_counted_runs_printed_into_one_log_each_after_its_config(capsys):
    # ye-kyaw-thu/error-overflow quotes this stdout of kh-kim/simple-nmt's trainer: a run of 30 epochs,
    # then one of 40, each after its printed config (`{   'batch_size': 64,` ...) and model; a row per
    # epoch, `Epoch 5 - |param|=6.01e+02 |g_param|=1.80e+05 loss=4.3643e+00 ppl=78.59`, its loss the
    # epoch's mean, then `Validation - loss=3.8854e+00 ppl=48.69 best_loss=... best_ppl=...`. Refused
    # before: read as a CSV (its first line has a comma) and, as text, no line had a step.
    assert detect_format(SNMT) == "text"
    short, long = read_runs(SNMT)
    assert short.series("loss")[0].tolist() == list(range(1, 31)) and long.series("loss")[0].tolist() == list(range(1, 41))
    assert short.series("loss")[1][[0, -1]].tolist() == [4.9263, 2.8045] and long.series("loss")[1][-1] == 2.4891
    assert short.series("eval_loss")[1][[0, -1]].tolist() == [4.0864, 2.3833]  # at its epoch; best_* left out
    assert sorted(long.metrics) == ["eval_loss", "eval_ppl", "loss", "ppl", "step"]
    assert main(["check", str(SNMT)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{SNMT}: 2 runs in one file") and out.count("OK: no spike in loss") == 2


def test_sabotage_the_epoch_counter_and_the_validation_pairs_are_what_reads_the_log(monkeypatch):
    import re

    import pytest_spikecheck.records.logs.text_forms as forms
    from pytest_spikecheck.records.logs import csv_log

    head = SNMT.read_bytes()[:4096]
    assert csv_log.header_and_row(head) is None  # the comma line over `{   'batch_size': 64,` is no table
    never = re.compile(r"(?!)")
    monkeypatch.setattr(forms, "_EVAL_PAIRS", never)
    assert "eval_loss" not in read_runs(SNMT)[0].metrics
    monkeypatch.setattr(forms, "_LEADING_EPOCH", never)
    with pytest.raises(ConfigError, match="no line of a known training-log form"):
        read_runs(SNMT)


# -- trial runs: classes no public log was found for (docs/logs.md says what was searched) -----------

FP16 = Path(__file__).parent / "data" / "logs" / "trials" / "fp16-accumulation" / "metrics.jsonl"


def test_a_loss_spike_at_an_fp16_step_whose_grad_norm_is_inf_is_found(capsys):
    # experiments/fp16-accumulation trained once (tests/data/logs/trials/README.md): the Greek burst
    # at step 24 overflows the fp16 gradients (grad_norm_pre Infinity, the scaler skips the update)
    # and the loss jumps 2.38 -> 8.41 nats at that step.
    assert main(["check", str(FP16)]) == 1
    out = capsys.readouterr().out
    assert "  24    8.405  4.357     loss-jump +4.05 nats" in out
    assert "grad_norm_pre = inf at step 24: a skipped step (overflow)" in out


def test_sabotage_a_skip_that_excused_the_loss_too_misses_the_spike(monkeypatch):
    import pytest_spikecheck.judge.policy as policy

    judged = policy._judged_series

    def whole_step_excused(rec, name, excused):
        steps, values = judged(rec, name, excused)
        keep = ~np.isin(steps, list(rec.skipped))
        return steps[keep], values[keep]

    monkeypatch.setattr(policy, "_judged_series", whole_step_excused)
    report = judge_log(read_log(FP16))
    assert report["ok"] and not any(s["spikes"] for s in report["series"])


DIVERGED = Path(__file__).parent / "data" / "logs" / "trials" / "high-lr-300-divergence" / "metrics.jsonl"


def test_a_run_that_rises_from_its_second_step_and_ends_non_finite_fails(capsys):
    # Phase-19 at lr 300, no clip (tests/data/logs/trials/README.md): 8 steps, no baseline to speak of;
    # flagged where it starts (5.95 -> 5,720 at step 2) and at its non-finite gradient norm.
    assert main(["check", str(DIVERGED)]) == 1
    out = capsys.readouterr().out
    assert "non-finite values: grad_norm_pre = inf at step 8 (the first)" in out
    report = judge_log(read_log(DIVERGED))
    loss = next(s for s in report["series"] if s["metric"] == "loss")
    assert loss["spikes"][0]["step"] == 2 and loss["spikes"][0]["detectors"] == ["loss-sustained"]


SWEEP = Path(__file__).parent / "data" / "logs" / "trials" / "high-lr-1-sweep" / "metrics.jsonl"


def test_a_sparse_sweep_that_rises_at_its_third_point_is_flagged_there(capsys):
    # Phase-19 at lr 1.0, logged every 5 steps: 10.98, 9.98, then 18.42, 28.88, 31.2, ... 4.86.
    assert main(["check", str(SWEEP)]) == 1
    assert "  15    18.42  9.978     loss-sustained +18.9 nats" in capsys.readouterr().out


def test_sabotage_a_noise_floor_without_ceiling_flags_both_trials_late():
    # On a log that is mostly its event the second differences the noise is read from are the event's
    # own (3.7 nats of noise on the sweep, a bar of 11): without the ceiling the bar rises past the rise itself.
    late = {}
    for path in (DIVERGED, SWEEP):
        steps, loss = read_log(path).series("loss")
        rules = [LossJump(), SustainedLoss(ceiling=math.inf)]
        late[path.parent.name] = min(d.step for r in rules for d in r.detect(steps, loss))
    assert late == {"high-lr-300-divergence": 5, "high-lr-1-sweep": 20}


# -- the real-log corpus's own files for two classes (tests/data/reallogs, provenance in corpus.yaml) --

REAL = Path(__file__).parent / "data" / "reallogs"


def test_divergence_with_little_history_a_five_point_log_that_rises_and_stays(capsys):
    # hf/whisper-braj-rising: logged every 500 steps, 1.237 then 2.028, 2.157, 1.985, 1.787: the rise
    # at the 2nd point is judged with one earlier point, by the sustained rule (the jump needs 5).
    path = REAL / "hf" / "whisper-braj-rising" / "trainer_state.json"
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert "  1000  2.028  1.237     loss-sustained +0.791 nats" in out
