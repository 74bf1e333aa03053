"""MLflow's file store (pytest_spikecheck.records.logs.mlflow): a run folder, an experiment, the
mlruns root, a single metric file; rows in the order they were logged. The real run is the
corpus's tests/data/reallogs/mlflow/swahili-ctc (provenance in corpus.yaml)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_spikecheck import ConfigError
from pytest_spikecheck.cli.commands import main
from pytest_spikecheck.records.logs import detect_format, find_logs, read_log

MLRUNS = Path(__file__).parent / "data" / "reallogs" / "mlflow" / "swahili-ctc" / "mlruns"
RUN = MLRUNS / "1" / "ed05f9cd599442fe9a0c9222184710b8"


def test_a_real_run_from_its_folder_its_experiment_and_the_root(capsys):
    record = read_log(RUN)
    assert record.log_format == "mlflow" and record.metrics["step"].tolist() == list(range(10))
    assert record.metrics["loss"][0] == 332.6841735839844 and record.metrics["loss"][-1] == 234.7978057861328
    assert find_logs(MLRUNS) == [RUN] and find_logs(MLRUNS / "1") == [RUN]
    assert read_log(MLRUNS).metrics["loss"].tolist() == record.metrics["loss"].tolist()
    assert detect_format(RUN / "metrics" / "loss") == "mlflow"  # one metric file: its lines tell
    assert read_log(RUN / "metrics" / "loss").metrics["loss"].size == 10
    assert main(["check", str(MLRUNS)]) == 0
    assert "mlflow, 10 logged steps (0–9)" in capsys.readouterr().out


def run_folder(root: Path, metrics: dict[str, str], params: dict[str, str] | None = None, deleted: bool = False) -> Path:
    run = root / "0" / "abc123"
    (root / "0").mkdir(parents=True, exist_ok=True)
    (root / "0" / "meta.yaml").write_text("experiment_id: '0'\nlifecycle_stage: active\nname: Default\n")
    (run / "metrics").mkdir(parents=True)
    (run / "meta.yaml").write_text(f"run_id: abc123\nlifecycle_stage: {'deleted' if deleted else 'active'}\n")
    for name, lines in metrics.items():
        (run / "metrics" / name).parent.mkdir(parents=True, exist_ok=True)
        (run / "metrics" / name).write_text(lines)
    for name, value in (params or {}).items():
        (run / "params").mkdir(exist_ok=True)
        (run / "params" / name).write_text(value)
    return run


def test_nested_names_merge_by_step_in_logged_order(tmp_path):
    # "train/loss" is the nested file metrics/train/loss; a resumed run logs steps 3-4 again later
    run = run_folder(
        tmp_path,
        {
            "train/loss": "1000 3.0 1\n1010 2.5 2\n1020 2.4 3\n1030 9.9 4\n1100 2.3 3\n1110 2.2 4\n",
            "grad_norm": "1001 1.0 1\n1011 0.9 2\n1021 0.8 3\n1031 40.0 4\n1101 0.8 3\n1111 0.7 4\n",
        },
    )
    record = read_log(run)
    assert record.metrics["step"].tolist() == [1, 2, 3, 4]
    assert record.metrics["loss"].tolist() == [3.0, 2.5, 2.3, 2.2]  # train/loss is the loss; the rolled-back 9.9 is gone
    assert record.metrics["grad_norm"].tolist() == [1.0, 0.9, 0.8, 0.7]
    assert "read as a restart from a checkpoint" in " ".join(record.notes)


def test_params_say_fp16_and_an_overflow_step_is_a_skip(tmp_path):
    # HF's MLflowCallback logs every training argument as a param: fp16 True
    run = run_folder(
        tmp_path,
        {
            "loss": "".join(f"{1000 + s} {2.0 + 0.01 * s} {s}\n" for s in range(1, 21)),
            "grad_norm": "".join(f"{1000 + s} {'nan' if s == 12 else 1.0} {s}\n" for s in range(1, 21)),
        },
        params={"fp16": "True"},
    )
    record = read_log(run)
    assert record.skipped == {12: "overflow (inferred: non-finite grad norm, finite loss, fp16 run)"}


def test_deleted_runs_and_bad_lines(tmp_path):
    run_folder(tmp_path / "a", {"loss": "1000 2.0 1\n"}, deleted=True)
    with pytest.raises(ConfigError, match="a folder with no training log"):
        find_logs(tmp_path / "a")
    run = run_folder(tmp_path / "b", {"loss": "1000 2.0 1\nnot a line\n"})
    with pytest.raises(ConfigError, match=r"metrics/loss: line 2 is not 'timestamp value step'"):
        read_log(run)
    empty = run_folder(tmp_path / "c", {})
    with pytest.raises(ConfigError, match="an MLflow run with no metrics"):
        read_log(empty)
    with pytest.raises(ConfigError, match="an MLflow value carries its own step"):
        read_log(RUN, mapping={"step": "x"})


def test_the_params_are_the_records_facts(tmp_path):
    """HF's MLflowCallback logs the TrainingArguments: the record's facts say what they say
    (clip, accumulation, seed, optimizer, precision) and nothing else (unknown stays None)."""
    from pytest_spikecheck.judge.analysis import clip_limits

    run = run_folder(
        tmp_path,
        {"loss": "1000 2.0 1\n1001 2.1 2\n"},
        params={
            "max_grad_norm": "0.5",
            "gradient_accumulation_steps": "4",
            "seed": "42",
            "optim": "adamw_torch",
            "learning_rate": "0.0003",
            "bf16": "True",
        },
    )
    facts = read_log(run).facts
    assert (facts.source, facts.max_norm, facts.accumulation, facts.seed, facts.optimizer, facts.amp_dtype) == (
        "log",
        0.5,
        4,
        42,
        "adamw",
        "bfloat16",
    )
    assert facts.optimizers[0].lr == 3e-4 and facts.model.arch is None and facts.world_size is None
    assert clip_limits(read_log(run)).tolist() == [0.5, 0.5]
    unclipped = run_folder(tmp_path / "b", {"loss": "1000 2.0 1\n"}, params={"max_grad_norm": "0.0"})
    assert read_log(unclipped).facts.clip.kind == "none"
    assert read_log(run_folder(tmp_path / "c", {"loss": "1000 2.0 1\n"})).facts is None  # no params: says nothing
