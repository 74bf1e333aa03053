import contextlib
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
        ("preset: phase-19\noptimizer: {grad_clip: -1}\n", "grad_clip must be > 0"),
        ("preset: phase-19\noptimizer: {grad_clip: 0}\n", "use a tiny max_norm"),
        (
            "preset: phase-19\nsteps: 100\nbreaks: [{rare_token_burst: {at_step: 312}}]\n",
            "RareTokenBurst at step 312 is after the last step (100 steps)",
        ),
        ("# nothing but a comment\n", "config.yaml is empty (or only comments)"),
        ("preset: phase-19\nseed: 1\nseed: 2\n", "duplicate key 'seed'"),
        ("preset: phase-19\nsteps: 50\nmodel: {factory: 'no_such_pkg_here:make'}\n", "cannot import 'no_such_pkg_here'"),
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
    assert "--grad-clip must be > 0" in capsys.readouterr().err


def test_train_compare_diagnose(tmp_path, capsys):
    exp = _write(tmp_path, "preset: phase-19\nsteps: 80\nbreaks:\n  - rare_token_burst: {count: 3, at_step: 60}\n")
    assert main(["train", str(exp), "--quiet", "--out", str(tmp_path / "a")]) == 0
    assert main(["train", str(exp), "--quiet", "--grad-clip", "inf", "--out", str(tmp_path / "b")]) == 0
    for f in ("config.yaml", "metrics.jsonl", "batches.jsonl", "events.json", "run.json"):
        assert (tmp_path / "b" / f).is_file()
    rows = [json.loads(line) for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 80 and {"step", "loss", "grad_norm_pre", "grad_norm_post", "clip_factor", "lr", "eval_loss"} <= set(
        rows[0]
    )
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


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--steps", "100"], "RareTokenBurst at step 312 is after the last step (100 steps)"),
        (["--grad-clip", "0"], "use a tiny max_norm"),
        (["--out", "FILE"], "is an existing file; the run is a folder"),
    ],
)
def test_train_option_errors_are_one_line_exit_2(tmp_path, capsys, args, message):
    exp = _write(tmp_path, "preset: phase-19\nbreaks: [{rare_token_burst: {at_step: 312}}]\n")
    (tmp_path / "FILE").write_text("")
    args = [str(tmp_path / "FILE") if a == "FILE" else a for a in args]
    with pytest.raises(SystemExit) if args[0] == "--grad-clip" else contextlib.nullcontext():
        assert main(["train", str(exp), "--quiet", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_compare_tells_two_runs_of_one_name_apart():
    import numpy as np

    from pytest_spikecheck import Run, Scenario
    from pytest_spikecheck.report import compare

    ones = np.ones(30)
    metrics = {"step": np.arange(1, 31), "loss": ones, "grad_norm_pre": ones, "grad_norm_post": ones, "eval_loss": ones}
    run = Run(scenario=Scenario.preset("phase-19"), metrics=metrics)
    result = compare(run, run)
    assert result.names == ("A: phase-19", "B: phase-19")
    assert "final gap (B: phase-19 − A: phase-19)" in result.text()
    other = Run(scenario=Scenario.preset("phase-19").replace(seed=1), metrics=metrics)
    assert compare(run, other).names == ("phase-19", "phase-19+seed=1")


def test_a_device_or_backend_this_machine_cannot_run_is_one_line_exit_2(tmp_path, capsys):
    import torch

    from pytest_spikecheck.clipping import unavailable_reason

    exp = _write(tmp_path, "preset: phase-19\nsteps: 5\n")
    cases = ([(["--device", "cuda"], "device 'cuda' needs a CUDA device")] if not torch.cuda.is_available() else []) + (
        [(["--backend", "cupy"], "clipping backend 'cupy' cannot run here")] if unavailable_reason("cupy") else []
    )
    if not cases:
        pytest.skip("this machine runs CUDA and cupy: nothing to refuse")
    for args, message in cases:
        assert main(["train", str(exp), "--quiet", "--out", str(tmp_path / "run"), *args]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "run").exists()  # refused before training
