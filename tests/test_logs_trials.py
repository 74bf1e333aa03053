"""Issue 35 §3's classes that no public log was found for (docs/logs.md says what was searched), on
trial runs: real training on the project's corpus, each log written by the code a user writes for its
format (``scripts/make_trial_logs.py``; command, seed, CPU time and md5 in
tests/data/logs/trials/README.md). The logs are test data: nothing trains here. Each expected
judgement is read off the log's own numbers, quoted beside it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from pytest_spikecheck import ConfigError
from pytest_spikecheck.cli.commands import main
from pytest_spikecheck.judge.policy import judge_log
from pytest_spikecheck.records.logs import detect_format, read_log, read_runs

TRIALS = Path(__file__).parent / "data" / "logs" / "trials"


def spikes(rec, metric: str = "loss") -> list[int]:
    return [h["step"] for s in judge_log(rec)["series"] if s["metric"] == metric for h in s["spikes"]]


# -- a log of row means: the HF Trainer's loss at logging_steps=10 is the mean of those 10 steps ----------

ROW_MEANS = TRIALS / "hf-row-means" / "trainer_state.json"


def test_a_trainer_log_of_row_means_with_five_jumps_that_recover_is_found(capsys):
    # A real Trainer (tiny GPT2LMHeadModel, 300 steps, logging_steps 10, clip 1.0): three whole batches
    # of never-seen sentences at steps 75-77, 125-127, ... 275-277 (Greek, capitals, Greek, capitals,
    # Greek). The rows holding them rise +2.60, +2.22, +2.02, +1.89 and +0.91 nats (3.798 after 1.199,
    # ..., 1.488 after 0.581), each back the next row: jumps that shrink as the model learns the scripts.
    # From step 90 on, the other rows move by 0.003 to 0.16 nats row to row (0.05 at their median), so
    # even the last jump, +0.89 over the median of the five rows before (0.602), is a spike: the
    # model's perplexity 2.4x for ten steps.
    state = json.loads(ROW_MEANS.read_text())
    assert state["logging_steps"] == 10 and state["max_steps"] == 300
    rec = read_log(ROW_MEANS)
    steps, loss = rec.series("loss")
    assert steps.tolist() == list(range(10, 301, 10))
    rises = {int(s): round(float(d), 2) for s, d in zip(steps[1:], np.diff(loss)) if d > 0.05}
    assert rises == {80: 2.6, 130: 2.22, 180: 2.02, 230: 1.89, 280: 0.91}
    assert spikes(rec) == [80, 130, 180, 230, 280]
    assert main(["check", str(ROW_MEANS)]) == 1
    out = capsys.readouterr().out
    assert "  130   3.142  0.9552    loss-jump +2.19 nats" in out and "  280   1.488  0.6021    loss-jump +0.886 nats" in out


def test_sabotage_the_noise_read_at_the_40th_percentile_only_misses_the_last_jump(monkeypatch):
    # 17 of the log's 28 second differences are its jumps' and its first rows' fast descent: the 40th
    # percentile reads 0.23 nats of noise (a bar of 0.93), the 20th 0.078, which the noise now is.
    import pytest_spikecheck.judge.detectors as detectors

    plain = detectors.log_noise
    loss = read_log(ROW_MEANS).series("loss")[1]
    assert plain(loss) == pytest.approx(0.0779, abs=1e-4)
    monkeypatch.setattr(detectors, "_LOWEST_QUANTILE", 0.4)
    assert plain(loss) == pytest.approx(0.2326, abs=1e-4)
    assert spikes(read_log(ROW_MEANS)) == [80, 130, 180, 230]
    monkeypatch.setattr(detectors, "log_noise", lambda v: plain(v, quantile=0.5))  # the median, before issue 35
    assert spikes(read_log(ROW_MEANS)) == [130]


# -- a JSONL whose first line is the run's config -------------------------------------------------------

CONFIG_FIRST = TRIALS / "config-first-jsonl" / "metrics.jsonl"


def test_a_jsonl_whose_first_line_is_the_config_is_read_from_its_second(capsys):
    # The loop writes json.dumps(config) first, then one row per step: 60 steps, the loss falling 5.96 ->
    # ~1.1 and a batch of 8 Greek sentences at step 40 (11.10 after 1.13, grad norm 35.96 after 1.15).
    first = json.loads(CONFIG_FIRST.read_text().splitlines()[0])
    assert "step" not in first and first["lr"] == 0.01
    rec = read_log(CONFIG_FIRST)
    assert rec.metrics["step"].tolist() == list(range(1, 61)) and sorted(rec.metrics) == ["grad_norm", "loss", "lr", "step"]
    assert rec.metrics["lr"][0] == 0.0005  # the row's warm-up lr, not the config's
    assert rec.notes[0].startswith("1 row with no 'step' (first at line 1) left out")
    # the config's own keys go with it (before, seven series of nothing: model, n_layer, ..., seed)
    assert rec.notes[0].endswith("so are the columns only they hold (model, n_layer, n_embd, batch_size, steps, grad_clip, seed)")
    assert spikes(rec) == [40] and spikes(rec, "grad_norm") == [40]
    assert main(["check", str(CONFIG_FIRST)]) == 1
    assert "  40    11.1   2.876     loss-jump +8.22 nats" in capsys.readouterr().out


def stepless_rows_not_left_out(monkeypatch):
    import pytest_spikecheck.records.logs.rules as rules

    monkeypatch.setattr(rules, "_without_stepless_rows", lambda table, columns, column, name: (table, columns, column))


def test_sabotage_without_the_stepless_row_rule_the_config_line_refuses_the_log(monkeypatch):
    stepless_rows_not_left_out(monkeypatch)
    with pytest.raises(ConfigError, match=r"line 1: 'step' holds nothing, expected a step number"):
        read_log(CONFIG_FIRST)


# -- Python-logging lines --------------------------------------------------------------------------------

BATCHES = TRIALS / "python-logging" / "batches.log"
EPOCHS = TRIALS / "python-logging" / "epochs.log"


def test_python_logging_lines_of_global_batches_and_a_burst_among_them(capsys):
    # logger.info(f"Epoch {epoch}, Global Batch {step}, Training Loss: {loss:.4f}") every 10th batch of 8
    # epochs of 30; the batch of 8 Greek sentences is global batch 150: 12.96 after 0.80.
    assert BATCHES.read_text().splitlines()[14] == "INFO:batches:Epoch 5, Global Batch 150, Training Loss: 12.9598"
    rec = read_log(BATCHES)
    assert rec.metrics["step"].tolist() == list(range(10, 241, 10)) and rec.metrics["loss"][0] == 4.7079
    assert spikes(rec) == [150]
    assert main(["check", str(BATCHES)]) == 1
    assert "  150   12.96  0.8152    loss-jump +12.1 nats" in capsys.readouterr().out


def test_python_logging_lines_of_a_metrics_dict_per_epoch(capsys):
    # logger.info(f"Epoch {epoch}: {metrics}") at each epoch's end, the dict's loss the epoch's mean:
    # 3.684, 1.230, 0.981, ... 0.608, its eval_loss 1.549 ... 0.701: a falling loss, nothing to flag.
    assert EPOCHS.read_text().splitlines()[2] == "INFO:epochs:Epoch 3: {'loss': 0.981, 'eval_loss': 0.868, 'lr': 0.007933}"
    rec = read_log(EPOCHS)
    assert rec.metrics["step"].tolist() == list(range(1, 9)) and rec.metrics["loss"][[0, -1]].tolist() == [3.6842, 0.608]
    assert rec.metrics["eval_loss"][[0, -1]].tolist() == [1.5492, 0.7006]
    assert main(["check", str(EPOCHS)]) == 0
    assert "OK: no spike in loss" in capsys.readouterr().out


def test_sabotage_without_global_batch_as_a_step_or_the_loss_named_dict_both_logs_are_refused(monkeypatch):
    import pytest_spikecheck.records.logs.text_forms as forms

    monkeypatch.setattr(forms, "_WORD_STEP", re.compile(r"\b(?:step|iteration)\s+(\d+)\s*(?:\([^)]*\)\s*)?(?:[,|;]|$)", re.I))
    with pytest.raises(ConfigError, match="no line of a known training-log form"):
        read_log(BATCHES)
    hf_dicts = forms.hf_dicts  # a dict read as the Trainer's only when it has 'epoch' (these have not)
    monkeypatch.setattr(forms, "hf_dicts", lambda segment: [d for d in hf_dicts(segment) if "epoch" in d])
    with pytest.raises(ConfigError, match="no line of a known training-log form"):
        read_log(EPOCHS)


# -- a CSV whose global_step is empty on some rows --------------------------------------------------------

STEPLESS_CSV = TRIALS / "stepless-csv" / "log.csv"


def test_a_csv_whose_epoch_summary_rows_have_no_global_step(capsys):
    # csv.DictWriter rows: one per step (epoch, global_step, loss, grad_norm, lr), and at each epoch's end
    # its summary (epoch, mean loss, eval_loss) with global_step empty: 120 steps, 4 summaries. 8 capital-
    # letter sentences at step 100: 10.63 after 0.79, grad norm 24.44 after 0.98.
    lines = STEPLESS_CSV.read_text().splitlines()
    assert lines[0] == "epoch,global_step,loss,grad_norm,lr,eval_loss" and lines[31] == "1,,3.6842,,,1.5506"
    assert detect_format(STEPLESS_CSV) == "csv"
    rec = read_log(STEPLESS_CSV)
    assert rec.metrics["step"].tolist() == list(range(1, 121)) and rec.metrics["loss"][29] == 1.8404
    assert rec.notes[0].startswith("4 rows with no 'global_step' (first at line 32) left out")
    assert rec.notes[0].endswith("(eval_loss)") and "eval_loss" not in rec.metrics  # only the summaries had one
    assert spikes(rec) == [100] and spikes(rec, "grad_norm") == [100]
    assert main(["check", str(STEPLESS_CSV)]) == 1
    assert "  100   10.63  0.9012    loss-jump +9.72 nats" in capsys.readouterr().out


def test_sabotage_without_the_stepless_row_rule_the_summary_rows_refuse_the_csv(monkeypatch):
    stepless_rows_not_left_out(monkeypatch)
    with pytest.raises(ConfigError, match=r"line 32: 'global_step' holds nothing, expected a step number"):
        read_log(STEPLESS_CSV)


# -- several seeds in one stdout, each run's last lines echoed after it ------------------------------------

SWEEP = TRIALS / "seed-sweep-echoed" / "sweep.log"


def test_three_seeds_in_one_stdout_each_echoing_its_last_lines_are_three_runs(capsys):
    # A sweep printing each seed's training lines, then `tail -n 3` of that run's log: three blocks of
    # steps 1-60, each ending with its steps 58-60 again; the batch of 8 Greek sentences at step 45 of
    # every seed (9.57, 9.34, 9.79 after 1.09, 1.20, 0.99).
    text = SWEEP.read_text().splitlines()
    assert text[61] == "--- tail -n 3 run_0.log ---" and text[62:65] == text[58:61]
    runs = read_runs(SWEEP)
    assert [r.metrics["step"].tolist() for r in runs] == [list(range(1, 61))] * 3
    assert [r.metrics["loss"][44] for r in runs] == [9.5721, 9.3392, 9.7936]
    for run in runs:
        assert any(n.startswith("3 rows repeat earlier rows exactly") for n in run.notes)
        assert not any("restart from a checkpoint" in n for n in run.notes)
        assert spikes(run) == [45] and spikes(run, "grad_norm") == [45]
    assert main(["check", str(SWEEP)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{SWEEP}: 3 runs in one file") and out.count("FOUND spikes in grad_norm, loss") == 3


def test_sabotage_without_the_echo_rule_each_tail_reads_as_a_restart(monkeypatch):
    import pytest_spikecheck.records.logs.rules as rules

    monkeypatch.setattr(rules, "_echoes", lambda steps, columns: np.zeros(steps.size, dtype=bool))
    runs = read_runs(SWEEP)
    assert all(any("restart from a checkpoint" in n for n in r.notes) for r in runs)
