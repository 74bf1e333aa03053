"""Shapes and line forms real logs have that the reader refused or misread (issue 35). Real lines
are quoted with the public file they come from; where only the printing statement is public, the
lines are what that statement prints, said so beside them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pytest_spikecheck.cli.commands import main
from pytest_spikecheck.judge.policy import judge_log
from pytest_spikecheck.records.logs import detect_format, read_log, read_runs

REAL = Path(__file__).parent / "data" / "reallogs"

# Two runs of build-nanogpt's train_gpt2.py printed into one file (python, then torchrun), real lines
# from a public file in the index (id 42602160812), 3 steps of each of its 11 kept here.
BUILD_NANOGPT = """\
(vp1) omer@verapulse build-nanogpt % python train_gpt2.py
using fused AdamW: True
step    0| loss: 10.938572 | lr: 6.0000e-05 | norm: 27.0145  | dt: 3663.01ms | tok/sec: 143130.26
step    1| loss: 9.649529 | lr: 1.2000e-04 | norm: 9.5134  | dt: 2713.86ms | tok/sec: 193189.05
step    2| loss: 9.224648 | lr: 1.8000e-04 | norm: 5.6872  | dt: 2713.59ms | tok/sec: 193208.23
(vp1) omer@verapulse build-nanogpt % torchrun --standalone --nproc_per_node=1 train_gpt2.py
step    0| loss: 10.938571 | lr: 6.0000e-05 | norm: 27.0146  | dt: 6437.43ms | tok/sec: 81443.69
step    1| loss: 9.649517 | lr: 1.2000e-04 | norm: 9.5133  | dt: 2815.50ms | tok/sec: 186214.98
validation loss: 9.4312
step    2| loss: 9.224654 | lr: 1.8000e-04 | norm: 5.6877  | dt: 2815.18ms | tok/sec: 186236.17
"""
# ("validation loss: 9.4312" is the form of train_gpt2.py's print(f"validation loss: {...:.4f}"), which
# carries no step: train_gpt2.py prints it at the top of a step's iteration, so it belongs to the step
# line after it; tests/test_logs_public.py reads the form on real lines.)


def test_build_nanogpt_lines_norm_and_a_stepless_validation_line(tmp_path):
    path = tmp_path / "train.log"
    path.write_text(BUILD_NANOGPT)
    first, second = read_runs(path)
    assert first.metrics["step"].tolist() == [0, 1, 2] and second.metrics["step"].tolist() == [0, 1, 2]
    assert first.metrics["grad_norm"].tolist() == [27.0145, 9.5134, 5.6872]  # build-nanogpt's "norm"
    assert second.metrics["eval_loss"][2] == 9.4312 and second.missing["eval_loss"].tolist() == [True, True, False]


def test_a_utf16_crlf_log_from_powershell_is_text(tmp_path):
    # Windows PowerShell's `python train_gpt2.py > train.log` writes UTF-16 LE with CRLF line ends.
    path = tmp_path / "train.log"
    path.write_bytes(BUILD_NANOGPT.replace("\n", "\r\n").encode("utf-16"))
    assert detect_format(path) == "text"
    runs = read_runs(path)
    assert [r.metrics["loss"][0] for r in runs] == [10.938572, 10.938571]
    assert runs[0].notes[0] == "read as text: 6 key=value / key: value lines, 1 stepless validation line"


def test_rows_with_no_step_are_left_out_not_the_log(tmp_path):
    # A JSONL whose first line is the run's config; a CSV whose global_step is empty on some rows.
    jsonl = tmp_path / "metrics.jsonl"
    jsonl.write_text(
        '{"model": "gpt2", "lr": 0.0006, "batch_size": 8}\n'
        + "".join(json.dumps({"step": s, "loss": 3 - 0.1 * s}) + "\n" for s in range(1, 8))
    )
    rec = read_log(jsonl)
    assert rec.metrics["step"].tolist() == list(range(1, 8)) and sorted(rec.metrics) == ["loss", "step"]
    assert rec.notes[0].startswith("1 row with no 'step' (first at line 1) left out")
    assert rec.notes[0].endswith("so are the columns only they hold (model, lr, batch_size)")  # no series of nothing
    # A column the training rows log as null and the config line does not hold is theirs, unknown
    # at every step: it stays (a series not judged), and the note does not say the config line held it.
    jsonl.write_text(
        '{"model": "gpt2", "seed": 1}\n'
        + "".join(json.dumps({"step": s, "loss": 3 - 0.1 * s, "grad_norm": None}) + "\n" for s in range(1, 8))
    )
    rec = read_log(jsonl)
    assert sorted(rec.metrics) == ["grad_norm", "loss", "step"] and rec.missing["grad_norm"].all()
    assert rec.notes[0].endswith("so are the columns only they hold (model, seed)")
    csv = tmp_path / "metrics.csv"
    csv.write_text("global_step,loss,eval_loss\n1,3.0,\n2,2.9,\n,,2.95\n3,2.8,\n")
    rec = read_log(csv)
    assert rec.metrics["step"].tolist() == [1, 2, 3] and rec.notes[0].startswith("1 row with no 'global_step' (first at line 4)")


def test_loss_names_of_lightning_and_deepspeed_chat(tmp_path):
    csv = tmp_path / "metrics.csv"
    csv.write_text("epoch,step,train/nll_loss\n" + "".join(f"0,{s},{3 - 0.01 * s}\n" for s in range(1, 30)))
    assert "loss" in read_log(csv).metrics
    # The lines of DeepSpeed-Chat's step-1 (SFT) and step-3 (PPO) print_rank_0 calls
    # (microsoft/DeepSpeedExamples, applications/DeepSpeed-Chat/training/step{1,3}_*/main.py).
    sft = tmp_path / "sft.log"
    sft.write_text("".join(f"Epoch: 0, Step: {s}, Rank: 0, loss = {2.5 - 0.01 * s}\n" for s in range(1, 30)))
    rec = read_log(sft)
    assert sorted(k for k in rec.metrics if k != "step") == ["Epoch", "loss"] and rec.metrics["step"][0] == 1
    ppo = tmp_path / "ppo.log"
    ppo.write_text(
        "".join(f"epoch: 0|step: {s}|ppo_ep: 1|act_loss: {0.1 * (-1) ** s}|cri_loss: 0.2|unsuper_loss: 0.0\n" for s in range(30))
    )
    report = judge_log(read_log(ppo))
    assert report["kind"] == "rl" and report["ok"] and report["series"][0]["status"] == "skipped"


def test_python_logging_lines(tmp_path):
    path = tmp_path / "train.log"
    path.write_text(
        "".join(f"INFO:root:Epoch 1, Global Batch {120 * k}, Training Loss: {3.2 - 0.05 * k:.3f}\n" for k in range(1, 12))
    )
    rec = read_log(path)
    assert rec.metrics["step"].tolist() == [120 * k for k in range(1, 12)] and rec.metrics["loss"][0] == 3.15
    # logger.info(f"Epoch {epoch}: {metrics}") with a dict per epoch (no public log of it was found:
    # docs/logs.md's issue 35 section): read in order, one row per dict, the dict's loss the loss
    per_epoch = tmp_path / "epochs.log"
    per_epoch.write_text("".join(f"INFO:__main__:Epoch {e}: {{'loss': {3.1 - 0.5 * e}, 'accuracy': 0.4}}\n" for e in (1, 2, 3)))
    rec = read_log(per_epoch)
    assert rec.metrics["loss"].tolist() == [2.6, 2.1, 1.6] and rec.metrics["step"].tolist() == [1, 2, 3]


def nanochat_phases() -> str:
    # The forms of nanochat's base_train.py ("step 00000/21400 (0.00%) | loss: ...", counting from 0)
    # and mid_train.py ("step 00001 (0.15%) | loss: ...", counting from 1) printed into one log.
    base = [
        f"step {s:05d}/00300 ({s / 3:.2f}%) | loss: {10 - 5 * s / 300:.6f} | lrm: 1.00 | dt: 100.00ms | "
        f"tok/sec: 5,000 | mfu: 40.00 | total time: 0.10m"
        for s in range(301)
    ]
    mid = [
        f"step {s:05d} ({s / 0.4:.2f}%) | loss: {2.5 - 0.2 * s / 40:.6f} | lrm: 1.00 | dt: 100.00ms | "
        f"tok/sec: 5,000 | mfu: 40.00 | total time: 0.10m"
        for s in range(1, 41)
    ]
    return "\n".join(base + mid) + "\n"


def test_a_second_phase_counting_from_one_is_a_second_series_not_a_restart(tmp_path):
    path = tmp_path / "nanochat.log"
    path.write_text(nanochat_phases())
    base, mid = read_runs(path)
    assert base.metrics["step"].size == 301 and mid.metrics["step"].tolist() == list(range(1, 41))
    assert "2 runs or phases in one file" in base.notes[-1]


def test_a_short_restart_on_a_short_log_is_still_a_checkpoint_restart(tmp_path):
    path = tmp_path / "one.csv"
    path.write_text("step,loss\n1,2\n2,2\n5,2\n3,1\n")
    assert read_log(path).metrics["step"].tolist() == [1, 2, 3]


def test_a_validation_only_log_is_judged_as_what_it_is(tmp_path, capsys):
    # nanochat's print0(f"Step {step:05d} | Validation bpb: {val_bpb:.4f}"), every 250 steps; a jump at 2000.
    bpb = [3.3, 1.25, 1.1, 1.05, 1.02, 1.0, 0.99, 0.98, 1.9, 0.97]
    path = tmp_path / "val.log"
    path.write_text("".join(f"Step {250 * k:05d} | Validation bpb: {v:.4f}\n" for k, v in enumerate(bpb)))
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert "the validation series (eval_bpb) judged by the loss rules" in out and "2000" in out


def test_golden_values_a_nan_string_in_a_timing_series_fails_nothing():
    path = REAL / "golden" / "megatron-gpt3-fim" / "golden_values_dev_dgx_h100.json"
    assert detect_format(path) == "golden-values"
    rec = read_log(path)
    assert rec.metrics["step"].tolist() == list(range(1, 51)) and rec.metrics["loss"][0] == 10.93336
    assert "iteration-time" not in rec.metrics  # bookkeeping, as elapsed time is
    report = judge_log(rec)
    assert report["ok"] and report["judged"] and report["nonfinite"] is None
    from pytest_spikecheck.records.logs import golden_values

    timing = golden_values.read(path).columns["iteration-time"]
    assert np.isnan(timing.values[0]) and not timing.missing[0] and timing.values[1] == 3.30126  # "nan": a value


def test_seeds_concatenated_with_echoed_last_lines_are_separate_runs(tmp_path, capsys):
    # Three seeds printed into one file, "step N | loss X" lines (no colon), each block ending with its
    # last three lines printed again: three runs, the echoes read once, nothing flagged.
    lines = []
    for seed in range(3):
        block = [f"step {s} | loss {2 + 3 * np.exp(-s / 15) + 0.3 * seed + 0.02 * (-1) ** s:.4f}" for s in range(1, 61)]
        lines += [f"=== seed {seed} ===", *block, "final:", *block[-3:]]
    path = tmp_path / "seeds.log"
    path.write_text("\n".join(lines) + "\n")
    runs = read_runs(path)
    assert [r.metrics["step"].tolist() for r in runs] == [list(range(1, 61))] * 3
    assert any(n.startswith("3 rows repeat earlier rows exactly (first at line 63, step 58)") for n in runs[0].notes)
    assert not any("restart from a checkpoint" in n for n in runs[0].notes)
    assert main(["check", str(path)]) == 0
    assert capsys.readouterr().out.startswith(f"{path}: 3 runs in one file")


def test_pytorch_word_language_model_lines():
    # pytorch/examples' word_language_model stdout (corpus files, provenance in corpus.yaml): the batch
    # counts within its epoch, so the step is (epoch - 1) x 2983 + the count; the end-of-epoch
    # validation sits at the epoch's last line.
    rec = read_log(REAL / "text" / "wlm-lstm-wikitext2" / "train.log")
    steps = rec.metrics["step"]
    assert steps[:2].tolist() == [200, 400] and steps[14] == 2983 + 200 and steps.size == 84
    assert rec.metrics["loss"][0] == 7.49 and rec.metrics["eval_loss"][13] == 5.48
    nan = judge_log(read_log(REAL / "text" / "wlm-rnn-relu-nan" / "train.log"))
    assert not nan["ok"] and nan["nonfinite"] == {"step": 200, "metric": "loss", "value": nan["nonfinite"]["value"]}
