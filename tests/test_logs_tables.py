"""CSV tables the reader used to refuse, and names in any case (pytest_spikecheck.records.logs:
csv_log and names): ``Step,Loss``, a header that repeats a name, a wide W&B export with ``/`` in
its names and a step spread over several rows, and the aliases of other tools."""

from __future__ import annotations

import pytest

from pytest_spikecheck.cli.commands import main
from pytest_spikecheck.records.logs import read_log
from pytest_spikecheck.records.logs.names import KNOWN_NAMES, key, rename


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_step_loss_in_capitals(tmp_path, capsys):
    path = write(tmp_path, "loss.csv", "Step,Loss\n" + "".join(f"{s},{2.0 + 0.001 * s}\n" for s in range(10, 310, 10)))
    record = read_log(path)
    assert record.metrics["step"][:2].tolist() == [10, 20] and "loss" in record.metrics and "Loss" not in record.metrics
    assert main(["check", str(path)]) == 0
    assert "OK: no spike in loss" in capsys.readouterr().out


def test_a_repeated_header_name_is_read_as_name_dot_1(tmp_path):
    path = write(tmp_path, "metrics.csv", "step,hidden_parameter_norm,loss,hidden_parameter_norm\n1,3.0,2.0,4.0\n2,3.1,1.9,4.1\n")
    record = read_log(path)
    assert record.metrics["hidden_parameter_norm"].tolist() == [3.0, 3.1]
    assert record.metrics["hidden_parameter_norm.1"].tolist() == [4.0, 4.1]
    assert record.notes == ("column 4 repeats the name 'hidden_parameter_norm' (column 2): read as 'hidden_parameter_norm.1'",)


def test_a_wide_wandb_export_with_a_step_spread_over_rows(tmp_path):
    # W&B's history export: one row per wandb.log call, train and eval rows apart, names with "/"
    text = (
        "_step,train/global_step,train/loss,train/grad_norm,eval/loss,train/learning_rate\n"
        "0,10,2.5,1.1,,0.0001\n1,10,,,2.7,\n2,20,2.4,1.0,,0.0001\n3,30,2.3,0.9,,0.0001\n4,30,,,2.6,\n"
    )
    record = read_log(write(tmp_path, "history.csv", text))
    assert record.metrics["step"].tolist() == [10, 20, 30]
    assert record.metrics["loss"].tolist() == [2.5, 2.4, 2.3] and record.metrics["grad_norm"].tolist() == [1.1, 1.0, 0.9]
    assert record.series("eval_loss")[0].tolist() == [10, 30] and record.metrics["lr"][0] == 0.0001


@pytest.mark.parametrize(
    ("column", "ours"),
    [
        ("train/loss", "loss"),
        ("train_loss", "loss"),
        ("loss/train", "loss"),
        ("Loss", "loss"),
        ("lm loss", "loss"),
        ("LM_Loss", "loss"),
        ("grad norm", "grad_norm"),
        ("total_norm", "grad_norm"),
        ("global_norm", "grad_norm"),
        ("gradient_norm", "grad_norm"),
        ("Grad_Norm", "grad_norm"),
        ("val_loss", "eval_loss"),
        ("learning rate", "lr"),
        ("loss scale", "loss_scale"),
    ],
)
def test_other_tools_names_are_ours_in_any_case(tmp_path, column, ours):
    assert rename(tmp_path, ["step_x", column], {}) == {"step_x": "step_x", column: ours}


def test_mapping_still_wins_and_our_own_name_is_not_replaced(tmp_path):
    assert rename(tmp_path, ["Loss", "train/loss"], {"loss": "train/loss"}) == {"Loss": "Loss", "train/loss": "loss"}
    assert rename(tmp_path, ["loss", "Loss"], {}) == {"loss": "loss", "Loss": "Loss"}
    assert key("LM_Loss") == key("lm loss") == "lm_loss" and key("train/loss") != key("train_loss")
    assert all(ours == key(ours) for ours in KNOWN_NAMES)
