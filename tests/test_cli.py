import json
import subprocess
import sys

import pytest

from pytest_spikecheck.cli import main


def _write(tmp_path, text, name="config.yaml"):
    d = tmp_path / "exp"
    d.mkdir(exist_ok=True)
    (d / name).write_text(text)
    return d


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("preset: phase-19\noptimizer: {grad_clip: -1}\n", "grad_clip must be >= 0"),
        ("preset: phase-19\nbreaks: [explode]\n", "unknown break 'explode'"),
        ("preset: phase-99\n", "unknown scenario preset 'phase-99'"),
        ("preset: phase-19\noptimiser: {}\n", "unknown key 'optimiser'"),
    ],
)
def test_train_config_errors_are_one_line_exit_2(tmp_path, capsys, config, message):
    exp = _write(tmp_path, config)
    assert main(["train", str(exp), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_missing_dirs_and_bad_flags(tmp_path, capsys):
    assert main(["train", str(tmp_path / "nope"), "--quiet"]) == 2
    assert "no such config file or experiment directory" in capsys.readouterr().err
    assert main(["compare", str(tmp_path), str(tmp_path)]) == 2
    assert "holds no run" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["train", "experiments/19-control", "--grad-clip", "-3"])
    assert info.value.code == 2
    assert "max_norm must be >= 0" in capsys.readouterr().err


def test_train_compare_diagnose(tmp_path, capsys):
    exp = _write(tmp_path, "preset: phase-19\nsteps: 80\nbreaks:\n  - rare_token_burst: {count: 3, at_step: 60}\n")
    assert main(["train", str(exp), "--quiet", "--out", str(tmp_path / "a")]) == 0
    assert main(["train", str(exp), "--quiet", "--grad-clip", "inf", "--out", str(tmp_path / "b")]) == 0
    for f in ("config.yaml", "metrics.jsonl", "batches.jsonl", "events.json", "run.json"):
        assert (tmp_path / "b" / f).is_file()
    rows = [json.loads(line) for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 80 and {"step", "loss", "grad_norm_pre", "grad_norm_post", "clip_factor", "lr", "eval_loss"} <= set(rows[0])
    assert "grad_clip: null" in (tmp_path / "b" / "config.yaml").read_text()
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "cmp")]) == 0
    out = capsys.readouterr().out
    assert "spike step" in out and "final gap" in out
    assert (tmp_path / "cmp" / "loss.png").stat().st_size > 1000 and (tmp_path / "cmp" / "grad_norm.png").is_file()
    assert main(["diagnose", str(tmp_path / "b")]) == 0
    assert "diagnosis at step 60" in capsys.readouterr().out
    assert main(["diagnose", str(tmp_path / "b"), "--step", "500"]) == 2


def test_default_out_is_the_experiment_run_folder(tmp_path):
    exp = _write(tmp_path, "preset: phase-19\nsteps: 5\n")
    assert main(["train", str(exp), "--quiet"]) == 0
    assert (exp / "run" / "metrics.jsonl").is_file()


def test_console_script_is_installed():
    out = subprocess.run([sys.executable, "-m", "pytest_spikecheck.cli", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("spikecheck ")
