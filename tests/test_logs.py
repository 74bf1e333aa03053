"""Reading other tools' training logs (pytest_spikecheck.records.logs) and asserting on them.

The example logs in tests/data/logs/ are written by scripts/make_example_logs.py from the
project's own runs; its docstring says what each shows. Edge cases use small inline logs.
"""

import json
import math
import shutil
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pytest

from pytest_spikecheck import (
    ConfigError,
    SpikeCheckError,
    assert_clip_contains,
    assert_diverges,
    assert_finite,
    assert_no_spike,
    assert_spike,
)
from pytest_spikecheck.judge.detectors import get_detector
from pytest_spikecheck.records.logs import TENSORBOARD_EXTRA, detect_format, find_logs, read_log
from pytest_spikecheck.records import as_record

LOGS = Path(__file__).parent / "data" / "logs"
BURST = 90  # the step of the rare-token burst in the example runs

needs_tensorboard = pytest.mark.skipif(
    find_spec("tensorboard") is None, reason=f"the tensorboard extra is not installed: {TENSORBOARD_EXTRA}"
)


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def flagged(record, metric, detector="ratio"):
    return [hit.step for hit in get_detector(detector).detect(*record.series(metric))]


# -- the example logs ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "fmt", "logged", "first", "last"),
    [
        ("hf/trainer_state.json", "hf-trainer", 24, 5, 120),
        ("hf/trainer_state_diverged.json", "hf-trainer", 29, 1, 29),
        ("lightning/metrics.csv", "lightning", 60, 1, 119),
        pytest.param("tensorboard", "tensorboard", 120, 1, 120, marks=needs_tensorboard),
        ("wandb/history.csv", "csv", 120, 1, 120),
        ("jsonl/metrics.jsonl", "jsonl", 120, 1, 120),
    ],
)
def test_each_example_log_reads_on_its_own_step_axis(name, fmt, logged, first, last):
    record = read_log(LOGS / name)
    steps = record.metrics["step"]
    assert record.log_format == fmt
    assert (steps.size, steps[0], steps[-1]) == (logged, first, last)
    assert np.all(np.diff(steps) > 0), "steps are sorted and unique"
    assert {"loss", "eval_loss", "lr"} <= set(record.metrics)
    assert "grad_norm" in record.metrics or "grad_norm_pre" in record.metrics


def test_hf_trainer_state_merges_eval_entries_and_skips_the_summary():
    record = read_log(LOGS / "hf" / "trainer_state.json")
    steps = record.metrics["step"]
    assert list(steps) == list(range(5, 121, 5))  # logging_steps=5; eval entries share those steps
    eval_steps, _ = record.series("eval_loss")
    assert list(eval_steps) == [20, 40, 60, 80, 100, 120]
    assert set(record.metrics) == {"step", "epoch", "loss", "grad_norm", "lr", "eval_loss"}  # learning_rate -> lr
    # The end-of-training summary's train_loss is the mean over the run, not a step's loss.
    assert "train_loss" not in record.metrics and "train_runtime" not in record.metrics
    assert flagged(record, "grad_norm") == [BURST]


def test_hf_non_finite_values_are_values_and_null_is_missing(tmp_path):
    record = read_log(LOGS / "hf" / "trainer_state_diverged.json")
    _, grad_norm = record.series("grad_norm")
    assert math.isinf(grad_norm[-2]) and math.isnan(grad_norm[-1])  # steps 28 and 29, as HF spells them
    assert assert_diverges(LOGS / "hf" / "trainer_state_diverged.json") == 28
    with pytest.raises(SpikeCheckError, match="non-finite grad_norm at step 28"):
        assert_finite(LOGS / "hf" / "trainer_state_diverged.json")

    path = write(
        tmp_path,
        "trainer_state.json",
        '{"log_history": [{"step": 1, "loss": 1.0, "grad_norm": NaN},'
        ' {"step": 2, "loss": -Infinity, "grad_norm": null}, {"step": 3, "loss": 2.0}]}',
    )
    record = read_log(path)
    np.testing.assert_array_equal(record.missing["grad_norm"], [False, True, True])
    assert math.isnan(record.metrics["grad_norm"][0]) and record.metrics["loss"][1] == -math.inf
    assert "loss" not in record.missing


def test_lightning_sparse_rows_on_lightnings_zero_based_steps():
    record = read_log(LOGS / "lightning" / "metrics.csv")
    # Lightning's names are read as ours; its step counts the optimizer steps before the batch.
    assert {"loss", "eval_loss", "lr", "grad_norm", "train_loss_epoch", "epoch"} <= set(record.metrics)
    assert flagged(record, "grad_norm") == [BURST - 1]
    # The epoch end: a train row, a validation row and an epoch row at one step, merged.
    for name in ("loss", "eval_loss", "train_loss_epoch"):
        assert 59 in record.series(name)[0], name
    assert record.missing["train_loss_epoch"].sum() == record.metrics["step"].size - 4  # 4 epochs
    assert record.notes == ()


def test_wandb_export_uses_the_training_step_not_the_log_call_counter():
    record = read_log(LOGS / "wandb" / "history.csv")
    assert list(record.metrics["step"]) == list(range(1, 121))  # train/global_step; _step counts 196 calls
    assert "_step" not in record.metrics
    assert set(flagged(record, "grad_norm")) == set(flagged(record, "loss")) == {BURST}
    by_calls = read_log(LOGS / "wandb" / "history.csv", mapping={"step": "_step"})
    assert by_calls.metrics["step"][-1] > 120  # what a reader keyed on _step would see


@needs_tensorboard
def test_tensorboard_folder_with_a_restart_keeps_the_resumed_run():
    record = read_log(LOGS / "tensorboard")
    assert any("restart" in note and "from 81" in note for note in record.notes)
    # The first file's steps 81-100 (the spike at 90) were recomputed by the resumed run.
    assert flagged(record, "grad_norm") == []
    first_file_only = read_log(sorted((LOGS / "tensorboard").iterdir())[0])
    assert flagged(first_file_only, "grad_norm") == [BURST]
    assert {"loss", "grad_norm", "lr", "eval_loss"} <= set(record.metrics)  # HF's TensorBoardCallback tags


# -- detection from content, not names ------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("hf/trainer_state.json", "hf-trainer"),
        ("lightning/metrics.csv", "lightning"),
        ("wandb/history.csv", "csv"),
        ("jsonl/metrics.jsonl", "jsonl"),
        ("tensorboard/events.out.tfevents.1800000000.example", "tensorboard"),
    ],
)
def test_format_is_detected_from_the_content(tmp_path, name, fmt):
    renamed = tmp_path / "log.dat"
    shutil.copy(LOGS / name, renamed)
    assert detect_format(renamed) == fmt
    if fmt != "tensorboard" or find_spec("tensorboard"):
        assert read_log(renamed).log_format == fmt


def test_compact_trainer_state_and_one_line_jsonl(tmp_path):
    compact = write(tmp_path, "a", json.dumps({"log_history": [{"step": 1, "loss": 2.0}]}))
    one_row = write(tmp_path, "b", json.dumps({"step": 1, "loss": 2.0}))
    assert detect_format(compact) == "hf-trainer" and detect_format(one_row) == "jsonl"


# -- names, mapping ---------------------------------------------------------------------------------


def test_mapping_renames_and_replaces(tmp_path):
    path = write(tmp_path, "log.csv", "iteration,train/loss,loss,gn\n10,2.0,9.0,1.0\n20,2.1,9.0,1.1\n")
    record = read_log(path, mapping={"step": "iteration", "loss": "train/loss", "grad_norm_pre": "gn"})
    assert list(record.metrics["step"]) == [10, 20]
    np.testing.assert_array_equal(record.metrics["loss"], [2.0, 2.1])  # the mapped column wins over "loss"
    assert set(record.metrics) == {"step", "loss", "grad_norm_pre"}


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        ({"loss": "nope"}, "cannot map loss=nope: the log has no 'nope' column"),
        ({"loss": "gn", "grad_norm_pre": "gn"}, "column 'gn' is mapped twice"),
        ({"step": "nope"}, "no 'nope' column; expected a step column"),
    ],
)
def test_mapping_errors_name_the_column(tmp_path, mapping, message):
    path = write(tmp_path, "log.csv", "step,loss,gn\n1,2.0,1.0\n")
    with pytest.raises(ConfigError, match=message):
        read_log(path, mapping=mapping)


def test_a_log_without_a_step_column_is_numbered(tmp_path):
    record = read_log(write(tmp_path, "log.csv", "loss\n3.0\n2.5\n2.0\n"))
    assert list(record.metrics["step"]) == [1, 2, 3]
    assert "numbered 1, 2, 3" in record.notes[0]


# -- irregular steps --------------------------------------------------------------------------------


def jsonl(rows):
    return "\n".join(json.dumps(r) for r in rows) + "\n"


def test_gaps_keep_the_real_step_axis(tmp_path):
    # Every step to 50, then every 10th step to 300; a spike at step 250.
    steps = [*range(1, 51), *range(60, 301, 10)]
    rows = [{"step": s, "grad_norm": 10.0 if s == 250 else 1.0 + 0.01 * (s % 3)} for s in steps]
    record = read_log(write(tmp_path, "log.jsonl", jsonl(rows)))
    # Windows are steps, not rows: 100 steps before 250 hold 10 logged values; 30 steps hold 3,
    # so that window widens to the 5 logged values min_history asks for (steps 200-240).
    assert flagged(record, "grad_norm", get_detector("ratio", window=100, min_history=5)) == [250]
    assert flagged(record, "grad_norm", get_detector("ratio", window=30, min_history=5)) == [250]
    judgement = get_detector("ratio", window=30, min_history=30).judge(*record.series("grad_norm"))
    assert [h.step for h in judgement.detections] == [250] and judgement.judged == record.series("grad_norm")[0].size - 30
    assert assert_spike(record, at=250, min_ratio=5) == pytest.approx(10 / 1.01, rel=0.02)


def test_a_restart_replaces_the_rolled_back_steps(tmp_path):
    # Logged every step to 30; resumed from the step-20 checkpoint, logging every other step.
    path = write(
        tmp_path,
        "restart.jsonl",
        jsonl([{"step": s, "loss": 5.0} for s in range(1, 31)] + [{"step": s, "loss": 2.0} for s in range(21, 41, 2)]),
    )
    record = read_log(path)
    steps, loss = record.series("loss")
    # Steps 21-30 of the first attempt are gone, including the even ones the resumed run
    # did not log again: the model never went through them on the way to step 40.
    assert list(steps) == [*range(1, 21), *range(21, 41, 2)]
    assert set(loss[steps > 20]) == {2.0}
    assert record.notes == (
        "steps go back from 30 to 21 at line 31: read as a restart from a checkpoint "
        "(10 earlier logged steps from 21 on replaced)",
    )


@pytest.mark.parametrize("restart", [False, True], ids=["no-restart", "after-a-restart"])
def test_a_word_in_a_numeric_column_is_one_error_also_after_a_restart(tmp_path, restart):
    # The text cell is in a row the restart keeps (the resumed step 3): it must still be named.
    rows = [{"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.5}, {"step": 3, "loss": 2.4}]
    rows += (
        [{"step": 2, "loss": 2.6}, {"step": 3, "loss": "oops"}]
        if restart
        else [{"step": 4, "loss": 2.3}, {"step": 5, "loss": "oops"}]
    )
    path = write(tmp_path, "log.jsonl", jsonl(rows))
    with pytest.raises(ConfigError, match=r"line 5: 'loss' holds 'oops', not a number \(the column is numeric elsewhere\)"):
        read_log(path)


def test_rows_at_one_step_merge_and_null_does_not_erase(tmp_path):
    path = write(
        tmp_path,
        "log.jsonl",
        jsonl(
            [
                {"step": 1, "loss": 3.0},
                {"step": 2, "loss": 2.0},
                {"step": 2, "eval_loss": 2.5, "loss": None},
                {"step": 3, "loss": 1.0},
                {"step": 3, "loss": 1.5},
            ]
        ),
    )
    record = read_log(path)
    np.testing.assert_array_equal(record.metrics["loss"], [3.0, 2.0, 1.5])  # the later of two values wins
    np.testing.assert_array_equal(record.missing["eval_loss"], [True, False, True])
    assert record.notes == ()


def test_text_and_bookkeeping_columns_are_not_metrics(tmp_path):
    path = write(tmp_path, "log.csv", "step,run,loss,_runtime,eval_samples_per_second\n1,a,2.0,0.1,9\n2,a,1.0,0.2,9\n")
    assert set(read_log(path).metrics) == {"step", "loss"}


# -- wrong and corrupt files ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("empty.json", "  \n", "empty file; expected"),
        (
            "trainer_state.json",
            '{\n  "log_history": [\n    {"step": 1, "loss": 2.0},\n',
            "not valid JSON .* expected a Hugging Face trainer_state.json",
        ),
        ("config.json", '{\n  "lr": 0.1\n}\n', r"no log_history list \(it has lr\); expected a Hugging Face trainer_state.json"),
        ("trainer_state.json", '{"log_history": [{"loss": 2.0}]}', r"log_history\[0\] has no step, and no other entry does"),
        ("log.jsonl", '{"step": 1, "loss": 2}\n{"step": 2, "loss": \n', "line 2 is not valid JSON"),
        ("log.jsonl", '{"step": 1, "loss": 2}\n[1, 2]\n', "line 2 is a JSON list, not an object"),
        ("log.csv", "step,loss\n1,2.0\n2,2.0,7\n", "line 3 has 3 cells but the header has 2"),
        ("log.csv", "step,loss\n1,2.0\n2,abc\n", "line 3: 'loss' holds 'abc', not a number"),
        ("log.csv", "step,loss\n1.5,2.0\n", "line 2: 'step' holds '1.5', expected a step number"),
        ("log.csv", "step,loss\n", "no logged steps; expected a CSV log"),
        ("notes.txt", "just some words\nand more words\n", r"no line of a known training-log form \(tried Megatron-LM, "),
        ("metrics.csv", "epoch,loss\n0,2.0\n", None),  # a CSV without Lightning's step column reads as generic CSV
        ("image.png", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR", "a binary file that is not a TensorBoard event file"),
    ],
)
def test_wrong_or_corrupt_files_raise_one_line_errors_naming_the_file(tmp_path, name, content, message):
    path = write(tmp_path, name, content)
    if message is None:
        assert read_log(path).log_format == "csv"
        return
    with pytest.raises(ConfigError, match=message) as info:
        read_log(path)
    assert str(info.value).startswith(str(path)) and "\n" not in str(info.value)


def test_forced_format_that_does_not_fit(tmp_path):
    with pytest.raises(ConfigError, match="no 'step' column; expected a Lightning metrics.csv"):
        read_log(write(tmp_path, "m.csv", "epoch,loss\n0,2.0\n"), format="lightning")
    with pytest.raises(ConfigError, match="not a TensorBoard event file"):
        read_log(LOGS / "wandb" / "history.csv", format="tensorboard")


def test_folders(tmp_path):
    with pytest.raises(ConfigError, match="a folder with no training log"):
        read_log(tmp_path)
    shutil.copy(LOGS / "hf" / "trainer_state.json", tmp_path)
    assert read_log(tmp_path).log_format == "hf-trainer"  # an HF checkpoint folder
    shutil.copy(LOGS / "lightning" / "metrics.csv", tmp_path)
    with pytest.raises(ConfigError, match="holds several logs"):
        read_log(tmp_path)
    with pytest.raises(ConfigError, match="no such log file or folder"):
        read_log(tmp_path / "nope.json")


# -- TensorBoard event files written by other writers -----------------------------------------------


def write_events(path, events, style="simple_value"):
    """A TensorBoard event file as TF1/tensorboardX (simple_value) or TF2 (tensor, with the
    plugin metadata on a tag's first value only) write it, plus a histogram to be ignored."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.record_writer import RecordWriter
    from tensorboard.util import tensor_util

    seen = set()
    with open(path, "wb") as f:
        writer = RecordWriter(f)
        writer.write(event_pb2.Event(wall_time=0.0, file_version="brain.Event:2").SerializeToString())
        for step, values in events:
            summary = summary_pb2.Summary()
            for tag, x in values.items():
                if style == "simple_value":
                    summary.value.add(tag=tag, simple_value=x)
                else:
                    value = summary.value.add(tag=tag, tensor=tensor_util.make_tensor_proto(np.float32(x)))
                    if tag not in seen:
                        value.metadata.plugin_data.plugin_name = "scalars"
                        seen.add(tag)
            summary.value.add(tag="weights", histo=summary_pb2.HistogramProto(min=0, max=1, num=1))
            writer.write(event_pb2.Event(step=step, wall_time=float(step), summary=summary).SerializeToString())
    return path


@needs_tensorboard
@pytest.mark.parametrize("style", ["simple_value", "tensor"])
def test_tensorboard_writers_old_and_new(tmp_path, style):
    events = [(s, {"loss": 2.0, "grad_norm": 30.0 if s == 40 else 1.0}) for s in range(0, 60)]
    events[50] = (50, {"loss": math.inf, "grad_norm": math.nan})
    record = read_log(write_events(tmp_path / "run.tfevents", events, style))
    assert set(record.metrics) == {"step", "loss", "grad_norm"}  # the histogram is no scalar
    assert list(record.metrics["step"]) == list(range(60))
    assert flagged(record, "grad_norm") == [40, 50]  # the NaN is the worst spike
    with pytest.raises(SpikeCheckError, match="non-finite loss at step 50"):
        assert_finite(record)


@needs_tensorboard
def test_tensorboard_truncated_and_corrupt_files(tmp_path):
    data = write_events(tmp_path / "whole.tfevents", [(s, {"loss": 1.0}) for s in range(1, 21)]).read_bytes()
    truncated = write(tmp_path, "truncated.tfevents", data[:-10])
    record = read_log(truncated)
    assert record.metrics["step"][-1] == 19  # the writer died while writing step 20
    assert "partly written record" in record.notes[0]
    record_starts = [0]
    while record_starts[-1] < len(data):  # frame: length (8 bytes), its CRC (4), event, its CRC (4)
        record_starts.append(record_starts[-1] + 16 + int.from_bytes(data[record_starts[-1] : record_starts[-1] + 8], "little"))
    for where, offset in (("event", 12), ("length", 0)):  # a flipped bit in record 11's event or length field
        corrupt = bytearray(data)
        corrupt[record_starts[10] + offset] ^= 0x01
        with pytest.raises(ConfigError, match=r"record 11 (of 21 )?is corrupt") as info:
            read_log(write(tmp_path, f"corrupt-{where}.tfevents", bytes(corrupt)))
        assert "\n" not in str(info.value)


def test_missing_tensorboard_extra_is_named(monkeypatch):
    for module in [m for m in sys.modules if m == "tensorboard" or m.startswith("tensorboard.")] + ["tensorboard"]:
        monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    with pytest.raises(ConfigError, match=r"needs the tensorboard package: pip install 'pytest-spikecheck\[tensorboard\]'"):
        read_log(LOGS / "tensorboard")


# -- the assertions take a path to any of these logs --------------------------------------------------


def test_assertions_accept_log_paths():
    assert assert_spike(LOGS / "hf" / "trainer_state.json", at=BURST, min_ratio=10) > 10  # grad_norm = pre-clip
    assert_no_spike(LOGS / "hf" / "trainer_state_healthy.json")
    assert_finite(LOGS / "lightning" / "metrics.csv")
    assert assert_spike(LOGS / "lightning" / "metrics.csv", min_ratio=10) > 10
    assert_clip_contains(LOGS / "jsonl" / "metrics.jsonl", max_norm=1.0)
    with pytest.raises(SpikeCheckError, match="flagged a loss spike at step 90"):
        assert_no_spike(LOGS / "wandb" / "history.csv", metric="loss")
    if find_spec("tensorboard"):
        assert_no_spike(LOGS / "tensorboard")


def test_our_run_folders_still_load_as_runs(tmp_path):
    shutil.copy(LOGS / "jsonl" / "metrics.jsonl", tmp_path)
    record = as_record(tmp_path)
    assert record.run is not None and record.log_format is None
    direct = as_record(tmp_path / "metrics.jsonl")
    for name in record.metrics:
        np.testing.assert_array_equal(record.metrics[name], direct.metrics[name])


def test_reading_logs_imports_numpy_only():
    code = (
        "import sys, pytest_spikecheck.records.logs as logs; logs.read_log(sys.argv[1]); "
        "print(sorted(m for m in ('torch', 'pandas', 'tensorboard') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(LOGS / "hf" / "trainer_state.json")], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


# -- the logs people have (issue 12) -----------------------------------------------------------------


def hf_state(entries, **extra):
    return json.dumps({"global_step": entries[-1].get("step", 0) if entries else 0, **extra, "log_history": entries})


def test_hf_rows_without_a_step_are_skipped_with_a_note(tmp_path):
    # trainer.predict() appends rows with no step (predict_loss, predict_runtime, ...).
    rows = [{"step": 10, "loss": 2.0}, {"predict_loss": 1.9, "predict_runtime": 3.0}, {"step": 20, "loss": 1.8}]
    record = read_log(write(tmp_path, "trainer_state.json", hf_state(rows)))
    assert record.series("loss")[0].tolist() == [10, 20]
    assert record.notes == ("1 log_history entry without a step skipped (log_history[1])",)


@pytest.mark.parametrize("name", ["trainer_state.json", "metrics.csv", "events.out.tfevents.1.host"])
def test_a_git_lfs_pointer_is_named_as_such(tmp_path, name):
    pointer = (
        "version https://git-lfs.github.com/spec/v1\n"
        "oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\nsize 12345\n"
    )
    path = write(tmp_path, name, pointer)
    with pytest.raises(ConfigError, match=r"a Git LFS pointer, not the log: run `git lfs pull`"):
        read_log(path)
    with pytest.raises(ConfigError, match="a Git LFS pointer"):  # inside a TensorBoard folder too
        read_log(tmp_path, format="tensorboard") if name.startswith("events") else read_log(path)


def test_trainer_state_without_log_history_says_so(tmp_path):
    with pytest.raises(ConfigError, match=r"no log_history list \(it has global_step\)"):
        read_log(write(tmp_path, "state.json", '{"global_step": 10}'))
    with pytest.raises(
        ConfigError, match=r"log_history is empty: the trainer logged nothing \(global_step 6, logging_steps 50\)"
    ):
        read_log(write(tmp_path, "trainer_state.json", json.dumps({"global_step": 6, "logging_steps": 50, "log_history": []})))


def _state_in(folder, losses):
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(hf_state([{"step": 10 * (i + 1), "loss": v} for i, v in enumerate(losses)]))


def test_folders_are_searched_one_level_down(tmp_path):
    # An HF output_dir holding only checkpoints: the latest one (by number, not by name order).
    _state_in(tmp_path / "out" / "checkpoint-500", [2.0])
    _state_in(tmp_path / "out" / "checkpoint-1000", [2.0, 1.9])
    assert find_logs(tmp_path / "out") == [tmp_path / "out" / "checkpoint-1000" / "trainer_state.json"]
    assert read_log(tmp_path / "out").series("loss")[0].tolist() == [10, 20]
    # lightning_logs/: every version_*; one log must be named for a Record, the CLI checks each.
    for version in ("version_0", "version_1"):
        (tmp_path / "lightning_logs" / version).mkdir(parents=True)
        shutil.copy(LOGS / "lightning" / "metrics.csv", tmp_path / "lightning_logs" / version / "metrics.csv")
    assert [p.parent.name for p in find_logs(tmp_path / "lightning_logs")] == ["version_0", "version_1"]
    with pytest.raises(ConfigError, match=r"holds 2 logs \(version_0/metrics.csv, version_1/metrics.csv\); name one"):
        read_log(tmp_path / "lightning_logs")
    # runs/: every run folder of event files.
    (tmp_path / "runs" / "Jan01").mkdir(parents=True)
    shutil.copy(LOGS / "tensorboard" / "events.out.tfevents.1800000000.example", tmp_path / "runs" / "Jan01")
    assert find_logs(tmp_path / "runs") == [tmp_path / "runs" / "Jan01"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"a folder with no training log; .* or one level down"):
        read_log(tmp_path / "empty")


def test_llamafactory_current_steps_is_the_step(tmp_path):
    rows = [{"current_steps": 10 * i, "total_steps": 30, "loss": 2.0 - 0.1 * i, "percentage": 33.3 * i} for i in (1, 2, 3)]
    record = read_log(write(tmp_path, "trainer_log.jsonl", "\n".join(map(json.dumps, rows))))
    assert record.series("loss")[0].tolist() == [10, 20, 30] and set(record.metrics) == {"step", "loss"}


def test_no_spike_on_a_log_without_grad_norm_falls_back_to_the_loss(tmp_path):
    rows = [{"step": 10 * i, "loss": 2.0} for i in range(1, 21)]
    rows[15]["loss"] = 6.0  # +4 nats
    path = write(tmp_path, "trainer_state.json", hf_state(rows))
    with pytest.raises(SpikeCheckError, match="the default policy flagged a loss spike at step 160"):
        assert_no_spike(path)
    with pytest.raises(SpikeCheckError, match=r"ratio\(.*\) flagged a loss spike at step 160"):
        assert_no_spike(path, detector="ratio", threshold=2.0, min_history=5)


# -- trainer_state.json: every message and note, word for word ---------------------------------

HF_EXPECTED = "expected a Hugging Face trainer_state.json (an object with a log_history list)"


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ([1, 2], f"no log_history list (it has a JSON list); {HF_EXPECTED}"),
        ({"log_history": [], "max_steps": 9}, f"log_history is empty: the trainer logged nothing (max_steps 9); {HF_EXPECTED}"),
        ({"log_history": []}, f"log_history is empty: the trainer logged nothing; {HF_EXPECTED}"),
        (
            {"log_history": [{"loss": 1}, {"loss": 2}, {"loss": 3}]},
            f"no log_history entry has a step (log_history[0] and 2 more); {HF_EXPECTED}",
        ),
        (
            {"log_history": [{"loss": 1}, {"loss": 2}]},
            f"no log_history entry has a step (log_history[0] and 1 more); {HF_EXPECTED}",
        ),
        (
            {"log_history": [{"step": 1.5, "loss": 2.0}]},
            "log_history[0]: 'step' holds 1.5, expected a step number (a whole number >= 0)",
        ),
        (
            {"log_history": [{"step": 3, "loss": 2.0}, {"step": -1, "loss": 2.0}]},
            "log_history[1]: 'step' holds -1, expected a step number (a whole number >= 0)",
        ),
        ({"log_history": [{"step": 3, "loss": 2.0}, 5]}, f"log_history[1] is not an object; {HF_EXPECTED}"),
    ],
)
def test_trainer_state_errors_word_for_word(tmp_path, state, message):
    path = write(tmp_path, "trainer_state.json", json.dumps(state))
    with pytest.raises(ConfigError) as info:
        read_log(path, format="hf-trainer")
    assert str(info.value) == f"{path}: {message}"


@pytest.mark.parametrize(
    ("stepless", "note"),
    [
        (1, "1 log_history entry without a step skipped (log_history[1])"),
        (2, "2 log_history entries without a step skipped (log_history[1], log_history[2])"),
        (3, "3 log_history entries without a step skipped (log_history[1], log_history[2], log_history[3])"),
        (4, "4 log_history entries without a step skipped (log_history[1], log_history[2], log_history[3], ...)"),
    ],
)
def test_trainer_state_rows_without_a_step_are_counted_in_the_note(tmp_path, stepless, note):
    # the end-of-training summary (train_runtime) is skipped silently, and reading goes on after it
    rows = (
        [{"step": 1, "loss": 2.0}]
        + [{"predict_loss": 1.0}] * stepless
        + [{"step": 2, "train_runtime": 5.0, "train_loss": 9.0}, {"step": 3, "loss": 1.5}]
    )
    record = read_log(write(tmp_path, "trainer_state.json", hf_state(rows)))
    assert record.notes == (note,)
    assert record.metrics["step"].tolist() == [1, 3] and record.metrics["loss"].tolist() == [2.0, 1.5]
    assert "train_loss" not in record.metrics and "step" not in [k for k in record.metrics if k != "step"]


# -- CSV and JSONL: messages, notes and what is read, word for word ------------------------------

_THIRTEEN = ",".join(f"c{i}" for i in range(13))


@pytest.mark.parametrize(
    ("name", "content", "kwargs", "message"),
    [
        (
            "log.csv",
            f"{_THIRTEEN}\n{','.join('1' * 13)}\n",
            {"mapping": {"loss": "zz"}},
            "cannot map loss=zz: the log has no 'zz' column (it has c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, ... (1 more))",
        ),
        (
            "log.csv",
            f"{_THIRTEEN[:-4]}\n{','.join('1' * 12)}\n",
            {"mapping": {"loss": "zz"}},
            "cannot map loss=zz: the log has no 'zz' column (it has c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11)",
        ),
        (
            "log.csv",
            "step,loss\n,2\n,3\n",
            {},
            "line 2: 'step' holds nothing, expected a step number (a whole number >= 0)",
        ),  # empty in every row
        (
            "log.csv",
            "it,loss\n1,2\n1.5,3\n",
            {"mapping": {"step": "it"}},
            "line 3: 'it' holds '1.5', expected a step number (a whole number >= 0)",
        ),
        (
            "log.csv",
            'step,note,loss\n1,"two\nlines",2.0\nx,y,1.5\n',
            {},  # a quoted newline is inside the cell
            "line 4: 'step' holds 'x', expected a step number (a whole number >= 0)",
        ),
        ("log.csv", "", {"format": "csv"}, "no logged steps; expected a CSV log with a header row"),
        (
            "log.csv",
            "step,loss,lr\n1,2.0,0.1\n2,1.9\n",
            {},
            "line 3 has 2 cells but the header has 3; expected a CSV log with a header row",
        ),
        ("latin.csv", b"step,loss\n1,\xff\n", {}, "not UTF-8 text; expected a CSV log with a header row"),
    ],
)
def test_csv_errors_word_for_word(tmp_path, name, content, kwargs, message):
    path = write(tmp_path, name, content)
    with pytest.raises(ConfigError) as info:
        read_log(path, **kwargs)
    assert str(info.value) == f"{path}: {message}"


def test_csv_and_jsonl_edge_cases_read_as_written(tmp_path):
    record = read_log(write(tmp_path, "log.csv", "a,b\n1,2\n3,4\n"))
    assert record.notes == ("no step column: rows are numbered 1, 2, 3, ... (name one with --map step=COLUMN)",)
    assert record.metrics["step"].tolist() == [1, 2] and record.metrics["b"].tolist() == [2.0, 4.0]
    # a byte-order mark (Excel's CSV, some JSONL writers) is no part of the first column's name
    bom = "\ufeff".encode()
    assert read_log(write(tmp_path, "bom.csv", bom + b"step,loss\n7,2.0\n")).metrics["step"].tolist() == [7]
    assert read_log(write(tmp_path, "bom.jsonl", bom + b'{"step": 7, "loss": 2.0}\n')).metrics["loss"].tolist() == [2.0]
    # blank lines and rows of empty cells are skipped
    assert read_log(write(tmp_path, "gaps.csv", "step,loss\n\n1,2.0\n  ,  \n2,1.0\n")).metrics["loss"].tolist() == [2.0, 1.0]


def _jsonl(tmp_path, name, rows):
    return write(tmp_path, name, "\n".join(json.dumps(r) for r in rows))


def test_the_default_policy_headlines_on_a_log(tmp_path):
    def headline(call, *args, **kwargs):
        with pytest.raises(SpikeCheckError) as info:
            call(*args, **kwargs)
        return str(info.value).split("\n\n")[0]

    two = _jsonl(
        tmp_path, "two.jsonl", [{"step": s, "loss": 2.0, "grad_norm": 40.0 if s in (30, 45) else 1.0} for s in range(1, 60)]
    )
    assert headline(assert_no_spike, two) == (
        "the default policy flagged a grad_norm spike at step 30: 40 vs baseline 1 (grad-ratio 40×) (and 1 more)"
    )
    assert assert_spike(two, at=45) == 40.0
    one = _jsonl(tmp_path, "one.jsonl", [{"step": s, "loss": 2.0, "grad_norm": 40.0 if s == 30 else 1.0} for s in range(1, 60)])
    assert headline(assert_no_spike, one).endswith("(grad-ratio 40×)")
    lr = _jsonl(tmp_path, "lr.jsonl", [{"step": s, "loss": 2.0, "lr": math.inf if s == 30 else 0.1} for s in range(1, 60)])
    assert_no_spike(lr)  # a learning rate is neither a training loss nor a gradient norm: reported, no failure
    assert headline(assert_no_spike, lr, strict_finite=True) == "non-finite lr at step 30 (inf)"
    short = _jsonl(tmp_path, "short.jsonl", [{"step": s, "loss": 2.0} for s in range(1, 4)])
    assert_no_spike(short)  # too short to judge is no failure, unless strict
    assert headline(assert_no_spike, short, strict=True).startswith("not judged (strict): loss: not judged: 3 points")
    # with a detector or a metric named, the log is judged as any record is
    assert headline(assert_spike, LOGS / "hf" / "trainer_state.json", metric="loss") == (
        "expected a loss spike of ≥ 10× anywhere (largest: step 90), got 3.57× the median of the 50 steps before"
    )
    assert headline(assert_spike, LOGS / "hf" / "trainer_state.json", at=95) == (
        "expected the default policy to flag a spike at step 95, but it flagged other steps (90) "
        "(grad_norm: judged 14 of 24 points; loss: judged 21 of 24 points)"
    )
    assert headline(assert_spike, LOGS / "hf" / "trainer_state_healthy.json").startswith(
        "expected the default policy to flag a spike anywhere, but it flagged none ("
    )


@pytest.mark.parametrize(
    ("name", "content", "fmt"),
    [
        ("log.jsonl", '{"global_step": 10}', "hf-trainer"),  # a compact trainer state: any of its keys tells it
        ("log.jsonl", '{"max_steps": 10, "loss": 2.0}', "hf-trainer"),
        ("log.jsonl", '{"logging_steps": 5, "loss": 2.0}', "hf-trainer"),
        ("log.jsonl", '{"log_history": []}', "hf-trainer"),
        ("trainer_state.json", '{"loss": 2.0}', "hf-trainer"),  # so named: a trainer state without those keys
        ("log.jsonl", '{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}', "jsonl"),
        ("log.jsonl", '{\n  "log_history": []\n}', "hf-trainer"),  # an indented object: its first line is no JSON
        ("log.csv", "step,epoch\n1,0\n", "lightning"),  # exactly the Lightning columns
        ("log.csv", "epoch,loss\n0,2.0\n", "csv"),
        ("log.csv", "\ufeffstep,epoch,loss\r\n1,0,2.0\r\n", "lightning"),  # a BOM and CRLF do not hide the header
        ("log.csv", '\ufeff\n  {"step": 1}', "jsonl"),  # the BOM is a prefix, then blank space before the object
    ],
)
def test_format_sniffing_details(tmp_path, name, content, fmt):
    assert detect_format(write(tmp_path, name, content)) == fmt


def test_bookkeeping_columns_are_left_out_and_restarts_are_noted(tmp_path):
    columns = [
        "step",
        "loss",
        "_runtime",
        "eval_runtime",
        "train_samples_per_second",
        "total_flos",
        "total_steps",
        "percentage",
        "global_step",
        "_step",
        "mystep",
    ]
    text = ",".join(columns) + "\n" + "\n".join(",".join(str(s) for _ in columns) for s in (1, 2, 3)) + "\n"
    record = read_log(write(tmp_path, "log.csv", text))
    assert [k for k in record.metrics] == ["step", "loss", "mystep"]
    assert record.source == str(tmp_path / "log.csv") and record.metrics["step"].dtype == np.int64
    one = read_log(write(tmp_path, "one.csv", "step,loss\n1,2\n2,2\n5,2\n3,1\n"))
    assert one.notes == (
        "steps go back from 5 to 3 at line 5: read as a restart from a checkpoint (1 earlier logged step from 3 on replaced)",
    )
    two = read_log(write(tmp_path, "two.csv", "step,loss\n1,2\n2,2\n3,2\n2,1\n"))
    assert two.notes == (
        "steps go back from 3 to 2 at line 5: read as a restart from a checkpoint (2 earlier logged steps from 2 on replaced)",
    )
    assert two.metrics["loss"].tolist() == [2.0, 1.0]


def test_kind_and_strict_on_a_log(tmp_path):
    loss_spike = _jsonl(tmp_path, "loss.jsonl", [{"step": s, "loss": 9.0 if s == 40 else 2.0} for s in range(1, 60)])
    with pytest.raises(SpikeCheckError) as info:
        assert_no_spike(loss_spike)
    headline, table = str(info.value).split("\n\n")[:2]
    assert headline == "the default policy flagged a loss spike at step 40: 9 vs baseline 2 (loss-jump +7 nats)"
    assert "→ 40  9" in table.splitlines()  # the evidence is framed on the flagged step
    assert_no_spike(loss_spike, kind="rl")  # an RL loss is no likelihood: the loss rules step aside
    # strict: one series judged and one not is still a failure, naming the one not judged
    sparse = _jsonl(
        tmp_path,
        "sparse.jsonl",
        [{"step": s, "loss": 2.0, **({"grad_norm": 1.0} if s in (10, 20, 30) else {})} for s in range(1, 60)],
    )
    assert_no_spike(sparse)
    with pytest.raises(SpikeCheckError) as info:
        assert_no_spike(sparse, strict=True)
    assert str(info.value).split("\n\n")[0] == (
        "not judged (strict): grad_norm: not judged: 3 points, interval 10 steps, needs grad-ratio 10 earlier logged "
        "points (over at least 10 steps)"
    )


def test_folder_and_mapping_messages(tmp_path):
    for i in range(7):
        (tmp_path / "runs" / f"r{i}").mkdir(parents=True)
        (tmp_path / "runs" / f"r{i}" / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    with pytest.raises(ConfigError) as info:
        read_log(tmp_path / "runs")
    shown = ", ".join(f"r{i}/metrics.jsonl" for i in range(6))
    assert str(info.value) == f"{tmp_path / 'runs'}: holds 7 logs ({shown}, ...); name one (`spikecheck check` checks each)"
    # a metrics.csv without Lightning's columns (a W&B export so named) is read as a plain CSV
    (tmp_path / "wandb").mkdir()
    (tmp_path / "wandb" / "metrics.csv").write_text("_step,loss\n1,2.0\n2,1.9\n")
    assert read_log(tmp_path / "wandb").log_format == "csv"
    with pytest.raises(ConfigError, match="trainer_state.json entries carry their own step; mapping step= applies to CSV"):
        read_log(LOGS / "hf" / "trainer_state.json", mapping={"step": "epoch"})
    jsonl = tmp_path / "runs" / "r0" / "metrics.jsonl"
    with pytest.raises(ConfigError) as info:
        read_log(jsonl, mapping={"step": "it"})
    assert str(info.value) == f"{jsonl}: no 'it' column; expected a step column (it has step, loss)"


@needs_tensorboard
def test_a_tensorboard_log_refuses_a_step_mapping():
    with pytest.raises(ConfigError, match="a TensorBoard event carries its own step; mapping step= applies to CSV"):
        read_log(LOGS / "tensorboard", mapping={"step": "x"})


@pytest.mark.parametrize(
    "name, bookkeeping",
    [
        ("theta_grad_norm", False),
        ("beta", False),
        ("zeta_loss", False),
        ("loss_meta", False),
        ("split/score", False),
        ("memory_loss", False),
        ("eta", True),
        ("train/eta", True),
        ("elapsed time per iteration (ms)", True),
        ("tokens per sec", True),
        ("tok/s", True),
        ("it/s", True),
        ("max memory allocated", True),
        ("train_samples_per_second", True),
        ("consumed samples", True),
        ("grad_norm", False),
        ("lr", False),
    ],
)
def test_bookkeeping_words_match_whole_words_and_never_a_loss_or_norm(name, bookkeeping):
    from pytest_spikecheck.records.logs.names import is_bookkeeping

    assert is_bookkeeping(name) is bookkeeping
