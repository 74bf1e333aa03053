"""Training logs printed to stdout (pytest_spikecheck.records.logs.text): one test per line form,
each built from real public lines. Where the lines are a corpus file, the file is read as it is
(tests/data/reallogs, provenance in its corpus.yaml); other real lines are quoted below with the
public file they come from; tests/data/logs/text/ holds the stdout of a real Hugging Face Trainer
run and a real Lightning run (scripts/make_stdout_examples.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from pytest_spikecheck import ConfigError, SpikeCheckError, assert_finite
from pytest_spikecheck.cli.commands import main
from pytest_spikecheck.records.logs import detect_format, read_log, read_runs
from pytest_spikecheck.records.logs.text import fp16_of
from pytest_spikecheck.records.logs.text_forms import number

REAL = Path(__file__).parent / "data" / "reallogs" / "text"
TEXT = Path(__file__).parent / "data" / "logs" / "text"


def write(tmp_path: Path, text: str, name: str = "train.log") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_megatron_lines_argument_dump_and_counters():
    record = read_log(REAL / "megatron-gpt2-345m-lambada" / "finetune.log")
    assert record.log_format == "text" and record.metrics["step"].tolist() == list(range(1, 48))
    # "lm loss" is the loss, "grad norm" the grad norm, "learning rate" lr, "loss scale" loss_scale;
    # elapsed time, consumed samples and the batch size are bookkeeping
    assert sorted(k for k in record.metrics if k != "step") == [
        "grad_norm",
        "loss",
        "loss_scale",
        "lr",
        "nan_iterations",
        "skipped_iterations",
    ]
    assert record.metrics["loss"][0] == 3.010825 and record.metrics["grad_norm"][-1] == 0.852
    assert record.notes[0] == "read as text: 47 Megatron-LM lines" and record.skipped == {}


# Real lines of two Megatron-LM fp16 runs (7B GPT-3 on 1 node, then 2 nodes), from a public
# Megatron-LM tutorial page in the file index (id 66011901751): the loss scaler skips every
# iteration of the first interval (no loss, no grad norm printed), 5 of the next, 1 at iteration 50.
MEGATRON_FP16 = """\
[before the start of training step] datetime: 2024-09-03 15:52:43
 [2024-09-03 15:54:54] iteration       10/  500000 | consumed samples:        10240 | elapsed time per iteration (ms): 13035.3 | throughput per GPU (TFLOP/s/GPU): 812.5 | learning rate: 0.000000E+00 | global batch size:  1024 | loss scale: 8388608.0 | number of skipped iterations:  10 | number of nan iterations:   0 |
Number of parameters in transformer layers in billions:  6.02
 [2024-09-03 15:56:55] iteration       20/  500000 | consumed samples:        20480 | elapsed time per iteration (ms): 12137.8 | throughput per GPU (TFLOP/s/GPU): 872.5 | learning rate: 6.976744E-07 | global batch size:  1024 | lm loss: 1.064275E+01 | loss scale: 262144.0 | grad norm: 47.021 | number of skipped iterations:   5 | number of nan iterations:   0 |
[Rank 0] (after 20 iterations) memory (MB) | allocated: 48465.275390625 | max allocated: 75078.4326171875 | reserved: 75682.0 | max reserved: 75682.0
 [2024-09-03 15:58:56] iteration       30/  500000 | consumed samples:        30720 | elapsed time per iteration (ms): 12068.8 | throughput per GPU (TFLOP/s/GPU): 877.5 | learning rate: 2.093023E-06 | global batch size:  1024 | lm loss: 8.995420E+00 | loss scale: 262144.0 | grad norm: 6.042 | number of skipped iterations:   0 | number of nan iterations:   0 |
 [2024-09-03 16:00:56] iteration       40/  500000 | consumed samples:        40960 | elapsed time per iteration (ms): 12036.3 | throughput per GPU (TFLOP/s/GPU): 879.9 | learning rate: 3.488372E-06 | global batch size:  1024 | lm loss: 8.519848E+00 | loss scale: 262144.0 | grad norm: 5.818 | number of skipped iterations:   0 | number of nan iterations:   0 |
 [2024-09-03 16:02:57] iteration       50/  500000 | consumed samples:        51200 | elapsed time per iteration (ms): 12056.1 | throughput per GPU (TFLOP/s/GPU): 878.5 | learning rate: 4.744186E-06 | global batch size:  1024 | lm loss: 8.219823E+00 | loss scale: 131072.0 | grad norm: 35.929 | number of skipped iterations:   1 | number of nan iterations:   0 |
 [2024-09-03 16:04:57] iteration       60/  500000 | consumed samples:        61440 | elapsed time per iteration (ms): 12072.4 | throughput per GPU (TFLOP/s/GPU): 877.3 | learning rate: 6.139535E-06 | global batch size:  1024 | lm loss: 7.748981E+00 | loss scale: 131072.0 | grad norm: 13.307 | number of skipped iterations:   0 | number of nan iterations:   0 |
[before the start of training step] datetime: 2024-09-03 16:36:07
 [2024-09-03 16:38:39] iteration       10/  500000 | consumed samples:        10240 | elapsed time per iteration (ms): 15210.6 | throughput per GPU (TFLOP/s/GPU): 748.3 | learning rate: 0.000000E+00 | global batch size:  1024 | loss scale: 8388608.0 | number of skipped iterations:  10 | number of nan iterations:   0 |
 [2024-09-03 16:41:02] iteration       20/  500000 | consumed samples:        20480 | elapsed time per iteration (ms): 14351.0 | throughput per GPU (TFLOP/s/GPU): 793.1 | learning rate: 6.976744E-07 | global batch size:  1024 | lm loss: 1.062389E+01 | loss scale: 262144.0 | grad norm: 46.226 | number of skipped iterations:   5 | number of nan iterations:   0 |
 [2024-09-03 16:43:24] iteration       30/  500000 | consumed samples:        30720 | elapsed time per iteration (ms): 14197.6 | throughput per GPU (TFLOP/s/GPU): 801.7 | learning rate: 2.093023E-06 | global batch size:  1024 | lm loss: 9.001943E+00 | loss scale: 262144.0 | grad norm: 7.882 | number of skipped iterations:   0 | number of nan iterations:   0 |
"""


def test_megatron_fp16_skipped_iterations_and_two_runs_in_one_file(tmp_path, capsys):
    path = write(tmp_path, MEGATRON_FP16)
    runs = read_runs(path)
    # The iteration counter starts again at 10: two runs (1 node, then 2 nodes), not a restart.
    assert [r.metrics["step"].tolist() for r in runs] == [[10, 20, 30, 40, 50, 60], [10, 20, 30]]
    assert runs[0].source.endswith("(run 1 of 2)") and "2 runs or phases in one file" in runs[0].notes[-1]
    first = runs[0]
    assert sorted(first.skipped) == [10, 20, 50]
    assert first.skipped[10] == "overflow (Megatron counted 10 skipped iterations in the interval logged at this step)"
    assert first.missing["loss"].tolist() == [True, False, False, False, False, False]  # not printed, not NaN
    assert first.metrics["loss_scale"].tolist()[:2] == [8388608.0, 262144.0]
    code = main(["check", str(path)])
    out = capsys.readouterr().out
    assert code == 0 and out.startswith(f"{path}: 2 runs in one file")
    assert "3 steps skipped by the optimizer" in out


def test_megatron_nan_iterations_fail_the_run(tmp_path):
    # The counter a real line prints, set to 2: Megatron saw NaN losses in the interval.
    line = MEGATRON_FP16.splitlines()[5].replace("number of nan iterations:   0", "number of nan iterations:   2")
    path = write(tmp_path, line + "\n")
    for strict in (False, True):  # --strict-finite excuses less, never more
        with pytest.raises(SpikeCheckError, match=r"non-finite nan_iterations|nan_iterations at step 50"):
            assert_finite(path, strict=strict)


def test_torchtitan_lines_with_and_without_ansi_colours(tmp_path):
    # Real torchtitan line form, from JayAndJef/torchtitan-benchmarks
    # tests/fixtures/golden/runs/dp1-1b/titan_eager.log (commit 18f8c11).
    lines = [
        "[rank0]:[titan] 2026-09-26 10:00:01,000 - root - INFO - step:  1  loss: 11.88300  grad_norm:  3.7500  "
        "memory: 41.51GiB(29.69%)  tps: 7,266  tflops: 92.28  mfu: 9.30%",
        "[rank0]:[titan] 2026-09-26 10:00:02,000 - root - INFO - step:  2  loss: 11.76600  grad_norm:  3.6250  "
        "memory: 41.52GiB(29.70%)  tps: 21,794  tflops: 276.78  mfu: 27.90%",
    ]
    plain = read_log(write(tmp_path, "\n".join(lines) + "\n"))
    assert plain.metrics["loss"].tolist() == [11.883, 11.766] and plain.metrics["grad_norm"].tolist() == [3.75, 3.625]
    assert set(plain.metrics) == {"step", "loss", "grad_norm", "tps"}  # memory is no number; tflops and mfu bookkeeping
    assert plain.metrics["tps"].tolist() == [7266.0, 21794.0]  # thousands separators
    # torchtitan colours each field on a terminal (its Color class: \x1b[31m ... \x1b[39m)
    coloured = [
        "\x1b[31mstep:  1  \x1b[32mloss: 11.88300  \x1b[33mgrad_norm:  3.7500  \x1b[39m",
        "\x1b[31mstep:  2  \x1b[32mloss: 11.76600  \x1b[33mgrad_norm:  3.6250  \x1b[39m",
    ]
    ansi = read_log(write(tmp_path, "\n".join(coloured) + "\n", "ansi.log"))
    assert ansi.metrics["loss"].tolist() == plain.metrics["loss"].tolist()


def test_nanogpt_iterations_evaluations_and_a_nan(capsys):
    path = REAL / "nanogpt-kirin-nan" / "train.log"
    record = read_log(path)
    assert record.notes[0] == "read as text: 96 nanoGPT lines"
    assert record.series("eval_loss")[0].tolist() == [0, 100, 200, 300, 400]
    assert record.series("eval_loss")[1][0] == 4.2475 and record.series("eval_train_loss")[1][0] == 4.2367
    steps, loss = record.series("loss")
    assert steps[:3].tolist() == [0, 5, 10] and math.isnan(loss[steps.tolist().index(425)])
    assert main(["check", str(path)]) == 1
    assert "non-finite values: loss = nan at step 425 (the first)" in capsys.readouterr().out


def test_nanogpt_iterations_with_more_fields_before_the_time():
    # A nanoGPT MoE fork prints its router loss between the loss and the time: "iter 10: loss 10.8591,
    # aux_loss 0.0508, time 1054.93ms, ..." (corpus file; before issue 35's fourth held-out batch only its
    # one "step 0: train loss" line was read, and the run's 29 training losses were not judged).
    record = read_log(REAL / "nanogpt-moe-wandb-output" / "output.log")
    assert record.notes[0] == "read as text: 30 nanoGPT lines"
    steps, loss = record.series("loss")
    assert steps.tolist() == list(range(0, 281, 10)) and loss[0] == 11.0018 and loss[-1] == 6.1902
    assert record.series("aux_loss")[1][[0, 8]].tolist() == [0.0508, 0.0621]
    assert set(record.metrics) == {"step", "loss", "aux_loss", "eval_loss", "eval_train_loss"}


def test_llmc_stdout_and_main_log(tmp_path):
    # Real llm.c stdout lines of a GPT-2 124M reproduction, from a public README in the file
    # index (id 41996914691); the z-scores after the values are no part of them.
    stdout = (
        "step    1/19560 | loss 11.010252 (+nanz)| norm 15.1374 (+nanz)| lr 8.57e-07 | 4688.25 ms | 28.8% bf16 MFU | 111830 tok/s\n"
        "step 19559/19560 | loss 3.314194 (+0.19z)| norm 0.2776 (+3.74z)| lr 1.79e-11 | 4339.91 ms | 31.1% bf16 MFU | 124285 tok/s\n"
        "step 19560/19560 | loss 3.252871 (-1.21z)| norm 0.2281 (+0.02z)| lr 0.00e+00 | 4367.96 ms | 30.9% bf16 MFU | 124072 tok/s\n"
        "val loss 3.265413\n"
    )
    record = read_log(write(tmp_path, stdout))
    assert record.metrics["step"].tolist() == [1, 19559, 19560]
    assert record.metrics["loss"].tolist() == [11.010252, 3.314194, 3.252871]
    assert record.metrics["grad_norm"].tolist() == [15.1374, 0.2776, 0.2281] and record.metrics["lr"][-1] == 0.0
    # the -o main.log: trl is the train loss, tel the val loss, norm the grad norm
    main_log = read_log(REAL / "llmc-gpt2-124m-mainlog" / "main.log")
    assert main_log.metrics["step"].size == 301 and main_log.series("eval_loss")[1].tolist() == [11.0095, 6.1565]
    assert main_log.metrics["grad_norm"][0] == 14.96 and main_log.series("hellaswag_acc")[1].tolist() == [0.2437]


def test_olmo_step_blocks():
    record = read_log(REAL / "olmo-1b-continue" / "training.log")
    assert record.metrics["step"].tolist() == list(range(1, 21))
    assert (
        record.metrics["loss"][0] == 2.998 and record.metrics["grad_norm"][0] == 0.237
    )  # train/CrossEntropyLoss, optim/total_grad_norm
    assert "train/Perplexity" in record.metrics and not any(k.startswith(("throughput/", "System/")) for k in record.metrics)


def test_build_nanogpt_log_txt():
    record = read_log(REAL / "buildnanogpt-agndm" / "log" / "log.txt")
    assert record.metrics["step"].size == 95 and record.series("eval_loss")[1].tolist() == [10.931]
    assert record.metrics["loss"][:2].tolist() == [10.934416, 10.883945]


def test_key_value_and_key_colon_value_lines(tmp_path):
    colon = read_log(REAL / "mytorch-keyvalue" / "train.log")  # step: 0 | loss: 6.55436 | grad_norm: 4.26046 | ...
    assert colon.metrics["step"][:3].tolist() == [0, 5, 10] and colon.metrics["grad_norm"][0] == 4.26046
    assert "time" not in colon.metrics  # "5075ms" is no number
    leading = read_log(REAL / "llama-port-makemore" / "train.log")  # step     1/ 1000 | loss 3.3660 | avg50 3.3660 | ...
    assert leading.metrics["step"][:2].tolist() == [1, 2] and leading.metrics["loss"][0] == 3.366
    assert set(leading.metrics) == {"step", "loss", "avg50"}
    # key=value pairs, OLMo's continuation lines (real lines of tests/data/reallogs/text/olmo-1b-continue)
    equals = read_log(
        write(
            tmp_path,
            "[step=1/15000,epoch=0]\n    optim/total_grad_norm=0.2370\n"
            "    train/CrossEntropyLoss=2.998\nstep=2 train/CrossEntropyLoss=2.919 "
            "optim/total_grad_norm=0.2051\n",
        )
    )
    assert equals.metrics["loss"].tolist() == [2.998, 2.919] and equals.metrics["grad_norm"].tolist() == [0.237, 0.2051]


def test_hf_trainer_dicts_after_tqdm_bars_with_numbers_as_strings():
    # A real Trainer run's stdout (transformers 5 prints its numbers as strings, tqdm redraws with \r)
    path = TEXT / "hf_trainer_stdout.log"
    assert b"\r" in path.read_bytes() and b"{'loss': '" in path.read_bytes()
    record = read_log(path)
    kept = [e for e in json.loads((TEXT / "hf_trainer_stdout.trainer_state.json").read_text()) if "loss" in e]
    steps, loss = record.series("loss")
    # every training dict, in order, with the values the run kept (rounded as printed)
    assert loss.size == len(kept) and np.allclose(loss, [e["loss"] for e in kept], rtol=1e-3)
    assert np.all(np.diff(steps) > 0) and steps[-1] == 29  # at the bar's counts: the last dict after "29/30"
    assert record.series("eval_loss")[1].size == 3 and "train_loss" not in record.metrics  # the summary is skipped
    assert any("tqdm redraws" in note for note in record.notes)
    # A real dict of a Qwen3 LoRA run printed after its bar (AAssets/Qwen3-0.6B-Alpaca-LoRA train.log, line 27)
    line = (
        "  0%|          | 9/4854 [00:14<2:13:35,  1.65s/it]  0%|          | 10/4854 [00:16<2:14:42,  1.67s/it]"
        "                                                   {'loss': 1.5618, 'grad_norm': 1.2043813467025757, "
        "'learning_rate': 9.981458590852905e-05, 'entropy': 1.5958266109228134, 'num_tokens': 52034.0, "
        "'mean_token_accuracy': 0.6513763800263405, 'epoch': 0.01}"
    )
    from pytest_spikecheck.records.logs import text_forms

    assert text_forms.hf_dicts(line) == [
        {
            "loss": 1.5618,
            "grad_norm": 1.2043813467025757,
            "learning_rate": 9.981458590852905e-05,
            "entropy": 1.5958266109228134,
            "num_tokens": 52034.0,
            "mean_token_accuracy": 0.6513763800263405,
            "epoch": 0.01,
        }
    ]


def test_lightning_progress_bars():
    # A real Lightning run's stdout: TQDM bars with the logged values in the postfix, reset to 0 at each
    # epoch's start, the validation value repeated until the next validation
    record = read_log(TEXT / "lightning_stdout.log")
    assert record.metrics["step"].tolist() == list(range(1, 37))  # 3 epochs of 12 batches
    assert record.series("eval_loss")[0].tolist() == [12, 24, 36]
    assert record.metrics["loss"][-1] == 0.0928 and record.metrics["epoch"][12] == 1.0


def test_what_real_stdout_logs_hold(tmp_path):
    # numbers as the logs write them
    assert [number(t) for t in ("1.264354E+01", "'3.412'", "Infinity", "-inf", "2,097,152", "1/294", "30.1GiB")] == [
        12.64354,
        3.412,
        math.inf,
        -math.inf,
        2097152.0,
        None,
        None,
    ]
    assert math.isnan(number("nan"))
    # a traceback, an argument dump and a copy of the script between log lines are skipped
    noise = (
        'Traceback (most recent call last):\n  File "train.py", line 12, in <module>\n    loss = step(batch)\n'
        "  lr ............................................ 0.00015\n"
        "for step in range(10): print(f'step {step}: loss {loss:.4f}')\n"
        "iter 0: loss 4.2709, time 10268.08ms, mfu -100.00%\niter 5: loss 4.2082, time 1431.27ms, mfu 0.01%\n"
    )
    assert read_log(write(tmp_path, noise)).metrics["loss"].tolist() == [4.2709, 4.2082]
    # a file with none of the forms is one error naming the forms tried
    with pytest.raises(ConfigError) as info:
        read_log(write(tmp_path, "hello\nworld\n", "notes.txt"))
    assert "no line of a known training-log form (tried Megatron-LM, torchtitan, nanoGPT, llm.c" in str(info.value)
    assert "\n" not in str(info.value) and detect_format(tmp_path / "notes.txt") == "text"


@pytest.mark.parametrize(
    ("dump", "fp16"),
    [
        ("  fp16 ............................................ True\n", True),  # Megatron's argument dump
        ("  fp16 ............................................ False\n  bf16 ........ True\n", False),
        ("python train.py --fp16 --lr 1e-4\n", True),
        ("TrainingArguments(fp16=False, bf16=True)\n", False),
        ("dtype = 'float16'\n", True),  # nanoGPT's config
        ("TrainConfig(precision='amp_bf16')\n", False),  # OLMo
        ("nothing about precision\n", None),
    ],
)
def test_what_a_log_says_of_its_precision(dump, fp16):
    assert fp16_of(dump) is fp16


def test_a_one_step_overflow_in_an_fp16_stdout_log_is_a_skip(tmp_path, capsys):
    # nanoGPT's key: value form is not needed: a Megatron fp16 run's dump says fp16 True and its
    # one grad norm that overflowed (here inf at iteration 30) sits between finite losses.
    lines = MEGATRON_FP16.splitlines()[3:7]
    lines[2] = lines[2].replace("grad norm: 6.042", "grad norm: inf")
    path = write(tmp_path, "  fp16 ............................................ True\n" + "\n".join(lines) + "\n")
    record = read_log(path)
    assert record.skipped[30].startswith("overflow (inferred: non-finite grad norm, finite loss, loss scale logged)")
    assert main(["check", str(path)]) == 0
    assert "grad_norm = inf at step 30: a skipped step (overflow (inferred" in capsys.readouterr().out
    assert main(["check", str(path), "--strict-finite"]) == 1


def _epoch_lines(epochs: int, batches: int, spike_at: tuple[int, int] | None = None) -> str:
    """A loop that prints ``Epoch N | loss: X`` at every batch (no step): 0.01 nats of noise on a slow
    descent; at ``spike_at`` (epoch, batch) the loss is 9 nats."""
    rng = np.random.default_rng(0)
    out = []
    for e in range(1, epochs + 1):
        for b in range(batches):
            loss = 9.0 if (e, b) == spike_at else 3.0 - 0.1 * e - 0.001 * b + 0.01 * rng.standard_normal()
            out.append(f"Epoch {e} | loss: {loss:.4f}\n")
    return "".join(out)


def test_epoch_counted_lines_printed_each_batch_are_numbered_not_merged_into_the_epoch(tmp_path, capsys):
    # Read at the epoch, 40 lines an epoch would merge into one point (the last batch's): the spike at
    # epoch 2, batch 20 would vanish and the log pass. Numbered in order, every line is a point.
    path = tmp_path / "train.log"
    path.write_text(_epoch_lines(3, 40, spike_at=(2, 20)))
    (rec,) = read_runs(path)
    assert rec.metrics["step"].tolist() == list(range(1, 121)) and rec.metrics["loss"][60] == 9.0
    assert rec.metrics["epoch"][[0, 40, 119]].tolist() == [1.0, 2.0, 3.0]
    assert any("several log one metric in an epoch (epoch 1): numbered 1, 2, 3" in n for n in rec.notes)
    assert main(["check", str(path)]) == 1
    assert "  61    9" in capsys.readouterr().out  # the spike, at its line's number
    # two runs printed one after another: numbered again from 1 where the epoch goes back
    path.write_text(_epoch_lines(2, 10) + _epoch_lines(2, 10))
    assert [r.metrics["step"].tolist() for r in read_runs(path)] == [list(range(1, 21))] * 2
    # one line an epoch (simple-nmt's): still read at the epoch
    path.write_text("".join(f"Epoch {e} - loss={3 - 0.1 * e:.4f} ppl=20.1\n" for e in range(1, 9)))
    (rec,) = read_runs(path)
    assert rec.metrics["step"].tolist() == list(range(1, 9)) and "epoch" not in rec.metrics
    # a training and a validation line an epoch name different metrics: one row an epoch, both in it
    path.write_text(
        "".join(f"Epoch {e} - loss={3 - 0.1 * e:.4f}\nEpoch {e} - val_loss={3.1 - 0.1 * e:.4f}\n" for e in range(1, 9))
    )
    (rec,) = read_runs(path)
    assert rec.metrics["step"].tolist() == list(range(1, 9)) and rec.metrics["eval_loss"][0] == 3.0
