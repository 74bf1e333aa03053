"""``spikecheck check LOG``: exit 0 clean, 1 on a spike / non-finite value / uncontained clip,
2 on a wrong log or option, 3 with --strict on a series too short to judge; ``--json`` for machines."""

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_spikecheck.cli.commands import main
from pytest_spikecheck.judge.policy import POLICY

LOGS = Path(__file__).parent / "data" / "logs"


def check(capsys, *argv):
    code = main(["check", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def check_json(capsys, *argv):
    code, out, err = check(capsys, *argv, "--json")

    def strict(constant):
        raise AssertionError(f"--json wrote the non-standard constant {constant}")

    return code, json.loads(out, parse_constant=strict)


def test_healthy_log_exits_0(capsys):
    code, out, _ = check(capsys, LOGS / "hf" / "trainer_state_healthy.json")
    assert code == 0
    assert out.splitlines()[-1] == "OK: no spike in grad_norm, loss, every value finite"
    assert "hf-trainer, 24 logged steps (5–120)" in out.splitlines()[0]


def test_spike_exits_1_with_the_step_value_and_ratio(capsys):
    code, out, _ = check(capsys, LOGS / "hf" / "trainer_state.json")
    assert code == 1
    row = next(line.split() for line in out.splitlines() if line.strip().startswith("90 "))
    # step, value, baseline, then the rule and its score
    assert row[0] == "90" and float(row[1]) > 50 and float(row[1]) / float(row[2]) > 30 and row[3] == "grad-ratio"
    # The loss goes 1.02 -> 3.64 there: +2.6 nats, a spike in nats though only 3.6x (the ratio rule missed it).
    assert out.splitlines()[-1] == "FOUND spikes in grad_norm, loss (exit 1)"


def test_non_finite_value_exits_1(capsys):
    code, out, _ = check(capsys, LOGS / "hf" / "trainer_state_diverged.json", "--metric", "eval_loss")
    assert code == 1  # eval_loss (one value, at step 20) is clean: the exit comes from grad_norm = inf
    assert "eval_loss  ▁\n  not judged: 1 point, needs loss-jump" in out
    assert "non-finite values: grad_norm = inf at step 28 (the first)" in out
    assert out.splitlines()[-1] == "FOUND a non-finite value (exit 1)"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["nope.json"], "no such log file or folder"),
        (["{logs}/hf/trainer_state.json", "--metric", "perplexity"], "no 'perplexity' series"),
        (["{logs}/wandb/history.csv", "--map", "loss=nope"], "cannot map loss=nope"),
        (["{logs}/wandb/history.csv", "--format", "tensorboard"], "not a TensorBoard event file"),
        (["{logs}/lightning/metrics.csv", "--map", "epoch=epoch", "--metric", "x"], "no 'x' series"),
    ],
)
def test_wrong_log_or_option_exits_2_with_one_line(capsys, argv, message):
    code, out, err = check(capsys, *(a.format(logs=LOGS) for a in argv))
    assert code == 2 and out == ""
    assert err.startswith("spikecheck: error: ") and message in err and err.count("\n") == 1


def test_log_without_loss_or_grad_norm_exits_2(tmp_path, capsys):
    (tmp_path / "log.csv").write_text("step,accuracy\n1,0.5\n2,0.6\n")
    code, _, err = check(capsys, tmp_path / "log.csv")
    assert code == 2 and "no loss or gradient-norm series (it has accuracy); name one with --metric" in err


@pytest.mark.parametrize("argv", [["--map", "loss"], ["--max-norm", "-1"], ["--detector", "nope"]])
def test_bad_flag_values_exit_2(capsys, argv):
    with pytest.raises(SystemExit) as info:
        main(["check", str(LOGS / "hf" / "trainer_state.json"), *argv])
    assert info.value.code == 2


def test_json_report(capsys):
    code, report = check_json(capsys, LOGS / "hf" / "trainer_state.json")
    assert code == 1 and report["ok"] is False
    assert (report["format"], report["steps"]) == ("hf-trainer", {"logged": 24, "first": 5, "last": 120})
    assert report["policy"] == "default" and report["detectors"] == sorted(POLICY["loss"] + POLICY["grad_norm"])
    grad_norm, loss = report["series"]
    assert (grad_norm["metric"], loss["metric"]) == ("grad_norm", "loss")
    assert grad_norm["status"] == loss["status"] == "judged" and report["not_judged"] == []
    (spike,) = grad_norm["spikes"]
    assert spike["step"] == 90 and spike["detectors"] == ["grad-ratio"] and spike["ratio"] > 30
    assert [(h["step"], h["detectors"]) for h in loss["spikes"]] == [(90, ["loss-jump"])]
    assert report["nonfinite"] is None and report["clip"] is None


def test_json_spells_non_finite_values_as_strings(capsys):
    code, report = check_json(capsys, LOGS / "hf" / "trainer_state_diverged.json")
    assert code == 1
    assert report["nonfinite"] == {"step": 28, "metric": "grad_norm", "value": "Infinity"}
    last = report["series"][0]["spikes"][-1]
    assert (last["step"], last["value"]) == (29, "NaN")


def test_detectors_that_agree_are_listed_together(capsys):
    # The W&B export logs every step, so the windowed detectors have enough history.
    code, report = check_json(
        capsys,
        LOGS / "wandb" / "history.csv",
        "--detector",
        "ratio",
        "--detector",
        "olmo-core",
        "--detector",
        "zclip",
        "--detector",
        "megatron",
    )
    assert code == 1
    for series in report["series"]:
        (spike,) = series["spikes"]
        # Megatron compares with the max of the first 100 steps, which include the early high values.
        assert spike["step"] == 90 and spike["detectors"] == ["ratio", "olmo-core", "zclip"]
    code, out, _ = check(capsys, LOGS / "wandb" / "history.csv", "--detector", "megatron")
    assert code == 0 and "policy: named detectors (megatron)" in out


def test_max_norm_checks_the_post_clip_series(capsys):
    log = LOGS / "jsonl" / "metrics.jsonl"  # clip 1.0: the pre-clip norm spikes, the post-clip norm is held
    _, report = check_json(capsys, log, "--max-norm", "1.0")
    assert report["clip"] == {
        "max_norm": 1.0,
        "checked": True,
        "ok": True,
        "message": "post-clip grad norm <= 1 at every logged step",
    }
    _, report = check_json(capsys, log, "--max-norm", "0.5", "--metric", "grad_norm_post")
    assert report["clip"]["ok"] is False and "post-clip norm 1 > max_norm 0.5" in report["clip"]["message"]
    assert report["ok"] is False and all(not s["spikes"] for s in report["series"])
    _, report = check_json(capsys, LOGS / "hf" / "trainer_state.json", "--max-norm", "1.0")
    assert report["clip"]["checked"] is False and "no grad_norm_post series" in report["clip"]["message"]


def test_map_and_format_flags(tmp_path, capsys):
    history = LOGS / "wandb" / "history.csv"
    with open(history, newline="") as f:
        call_at_burst = next(int(r["_step"]) for r in csv.DictReader(f) if r["train/global_step"] == "90")
    _, report = check_json(capsys, history, "--map", "step=_step", "--metric", "grad_norm")
    assert [s["step"] for s in report["series"][0]["spikes"]] == [call_at_burst]  # steps are what --map says
    renamed = tmp_path / "export.txt"
    shutil.copy(LOGS / "lightning" / "metrics.csv", renamed)
    _, report = check_json(capsys, renamed, "--format", "csv")
    assert report["format"] == "csv" and report["series"][-1]["spikes"][0]["step"] == 89


def test_restart_note_is_printed(capsys):
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    code, out, _ = check(capsys, LOGS / "tensorboard")
    assert code == 0 and "note: steps go back from 100 to 81" in out


def test_ci_one_liner_exit_status():
    # `spikecheck check trainer_state.json || exit 1` in a CI job: the process exit status.
    run = subprocess.run(
        [sys.executable, "-m", "pytest_spikecheck.cli", "check", str(LOGS / "hf" / "trainer_state.json")],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 1 and "FOUND spikes in grad_norm" in run.stdout and run.stderr == ""


# -- never silently blind (issue 12) -----------------------------------------------------------------


def _sparse_state(tmp_path, n, every, **entry):
    rows = [{"step": every * (i + 1), "loss": 2.0 - 0.01 * i, "grad_norm": 1.0 + 0.01 * (i % 3), **entry} for i in range(n)]
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps({"global_step": every * n, "log_history": rows}))
    return path


def test_a_series_too_short_is_not_judged_never_no_spike(tmp_path, capsys):
    path = _sparse_state(tmp_path, 2, 500)  # HF's default logging_steps: 2 points in 1,000 steps
    code, out, _ = check(capsys, path)
    assert code == 0 and "no spike" not in out
    assert "  not judged: 2 points, interval 500 steps, needs grad-ratio 10 earlier logged points" in out
    assert (
        "  not judged: 2 points, interval 500 steps, needs loss-jump 5 earlier logged points (over at least 50 "
        "steps); loss-sustained 1 earlier logged point and 2 later ones" in out
    )
    assert out.splitlines()[-1].endswith("NOT JUDGED: grad_norm, loss (exit 0; --strict makes it exit 3)")
    code, report = check_json(capsys, path, "--strict")
    assert code == 3 and report["judged"] is False and report["not_judged"] == ["grad_norm", "loss"]
    assert report["series"][0]["rules"][0] == {
        "name": "grad-ratio",
        "rule": report["series"][0]["rules"][0]["rule"],
        "judged": 0,
        "needs": "10 earlier logged points (over at least 10 steps)",
        "flags": 0,
    }


def test_sparse_logs_are_judged_on_logged_points(tmp_path, capsys):
    path = _sparse_state(tmp_path, 30, 10)  # every 10 steps: a 10-step window holds 1 point, widened to 10
    code, report = check_json(capsys, path, "--strict")
    # grad-ratio: all but the first 10 points; loss: loss-sustained judges all but the first and last 2
    assert code == 0 and [s["judged"] for s in report["series"]] == [20, 27]


def test_a_single_entry_gets_a_caveat(tmp_path, capsys):
    code, out, _ = check(capsys, _sparse_state(tmp_path, 1, 10))
    assert code == 0 and "note: a single logged entry: nothing to compare it with" in out


def test_rl_logs_set_the_loss_rules_aside_unless_told(tmp_path, capsys):
    path = _sparse_state(tmp_path, 30, 1, kl=0.01, reward=0.5)
    rows = json.loads(path.read_text())
    for i, row in enumerate(rows["log_history"]):
        row["loss"] = 0.0 if i != 20 else -0.5  # a surrogate: 0 and negative
    path.write_text(json.dumps(rows))
    code, report = check_json(capsys, path)
    assert code == 0 and report["kind"] == "rl" and "it logs kl, reward" in report["notes"][0]
    grad_norm, loss = report["series"]
    assert grad_norm["status"] == "judged" and loss["status"] == "skipped"
    code, report = check_json(capsys, path, "--kind", "sft")
    assert report["kind"] == "sft" and report["series"][1]["status"] == "judged"


def test_a_folder_of_versions_checks_each(tmp_path, capsys):
    for version in ("version_0", "version_1"):
        (tmp_path / version).mkdir()
        shutil.copy(LOGS / "lightning" / "metrics.csv", tmp_path / version / "metrics.csv")
    code, out, _ = check(capsys, tmp_path)
    assert out.startswith(f"{tmp_path}: 2 logs found one level down: version_0/metrics.csv, version_1/metrics.csv")
    assert out.count("FOUND spikes") == 2 and code == 1
