"""The sweep engine with the local executor: sweep files checked before anything trains, points
named after their content, runs bit-identical to train() alone, failing points recorded, the
run store resuming, Ctrl-C keeping what finished, and the outputs (tests/test_sweep_ray.py runs
the Ray executor on a two-node cluster).

Runs are nano Phase-19 for 20 steps (tests/sweep_points.py); one sweep on spawned workers is
trained once per module and shared."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from sweep_points import BROKEN, SWEEP_FILE, TINY

from pytest_spikecheck import ConfigError, QKLayerNorm, train
from pytest_spikecheck.cli import main
from pytest_spikecheck.progress import Progress, ProgressTask
from pytest_spikecheck.scenario.config import apply_config, dotted_config
from pytest_spikecheck.sweep import Sweep, SweepInterrupted, load_sweep, spread, sweep
from pytest_spikecheck.sweep.engine import STORE_DIR
from pytest_spikecheck.sweep.result import PointRow, SweepResult, row_for
from pytest_spikecheck.report.summary import Measures, measure, summarise
from pytest_spikecheck.sweep.summary import MEASURES, lr_sensitivities

ROOT = Path(__file__).resolve().parents[1]


def _write(tmp_path: Path, text: str, name: str = "sweep.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


# -- the sweep file: checked before anything trains --------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("grid: {optimizer.lrr: [0.1]}", "unknown key optimizer.lrr; expected one of name, lr,"),
        ("grid: {optimiser.lr: [0.1]}", "unknown field optimiser.lr; a path starts with one of"),
        ("grid: {seed: []}", "grid seed is empty: give it at least one value"),
        ("grid: {seed: 3}", "grid seed must be a list of values, was 3"),
        ("grid: {optimizer.lr: [0.1, fast]}", "optimizer.lr must be a number, was 'fast'"),
        ("grid: {seed: [0, 1.5]}", "seed must be an integer, was 1.5"),
        ("grid: {model.n_embd: [30]}", "model.n_embd (30) must be divisible by model.n_head (4)"),
        ("recipes: {qk: [qk_layrnorm]}", "recipes.qk: unknown break 'qk_layrnorm'; choose one of"),
        ("recipes: {qk: qk_layernorm}", "recipes.qk must be a list of breaks ([] for none)"),
        (
            "recipes: {fast: [{high_lr: {lr: 0.3}}]}\ngrid: {optimizer.lr: [0.01]}",
            "optimizer.lr=0.01 is overridden by recipe fast's breaks (the run would train optimizer.lr=0.3)",
        ),
        ("grid: {seed: [1, 1]}", "two points are the same scenario (seed=1 and seed=1"),
        ("grid: {breaks: [[no_clip]]}", "breaks are not an axis: sweep them as recipes"),
        ("gird: {seed: [1]}", "unknown key 'gird'; expected one of base, grid, points, recipes, name"),
        ("stepz: 10\ngrid: {seed: [1]}", "unknown key 'stepz'"),
        ("on: 1\ngrid: {seed: [1]}", "unknown key True; expected one of base"),  # YAML reads `on` as a bool
        ("optimizer: {yes: 1}\ngrid: {seed: [1]}", "unknown key optimizer.True; expected one of"),
        ("steps: -3\ngrid: {seed: [1]}", "steps must be a positive integer, was -3"),
        ("points: [{seed: 1}]\ngrid: {seed: [2]}", "seed is both a grid axis and set by points[0]"),
        ("points: []", "points is empty"),
        ("", "nothing to sweep: give a grid, points or recipes"),
    ],
)
def test_a_bad_sweep_file_is_one_line_naming_the_problem(tmp_path, body, message):
    path = _write(tmp_path, "base: {preset: phase-19}\n" + body + "\n")
    with pytest.raises(ConfigError) as info:
        load_sweep(path)
    text = str(info.value)
    assert message in text and "\n" not in text and text.startswith(str(path))


def test_the_cli_refuses_a_bad_sweep_file_before_anything_trains(tmp_path, capsys):
    path = _write(tmp_path, "base: experiments/19-control\ngrid: {seed: [0]}\nrecipes: {x: [no_clip], y: [qk_layrnorm]}\n")
    assert main(["sweep", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("spikecheck: error: ") and "unknown break 'qk_layrnorm'" in err and "\n" not in err
    assert not (tmp_path / "out").exists()
    missing = _write(tmp_path, "base: experiments/nope\ngrid: {seed: [0]}\n", "missing.yaml")
    assert main(["sweep", str(missing)]) == 2
    assert "no config file or experiment directory experiments/nope" in capsys.readouterr().err
    good = _write(tmp_path, "base: {preset: phase-19}\ngrid: {seed: [0]}\n", "good.yaml")
    assert main(["sweep", str(good), "--address", "auto", "--out", str(tmp_path / "out")]) == 2
    assert "--address joins a Ray cluster: use it with --executor ray" in capsys.readouterr().err
    assert main(["sweep", str(tmp_path / "absent.yaml")]) == 2
    assert "no such sweep file" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_sweep_file_expands_through_the_yaml_codec(tmp_path, monkeypatch):
    # The base by path (beside the file first, then the current directory), overrides as in a
    # config.yaml, a dotted path coerced as the codec coerces it (YAML reads 3e-2 as a string),
    # model.preset taking its shape before the other model fields, explicit points x grid x recipes.
    path = _write(
        tmp_path,
        """\
        base: experiments/19-control
        steps: 400
        optimizer: {weight_decay: 0.0}
        points:
          - {model.preset: nano}
          - {model.preset: mini, model.n_layer: 2}
        grid:
          optimizer.lr: [1e-2, 3e-2]
        recipes:
          baseline: []
          qk-layernorm: [qk_layernorm]
        """,
    )
    monkeypatch.chdir(ROOT)  # the base is not beside the file: found from the current directory
    plan = load_sweep(path)
    points = plan.expand()
    assert plan.name == "sweep" and plan.axes == ("recipe", "model.preset", "model.n_layer", "optimizer.lr")
    assert len(points) == 8 and len({p.name for p in points}) == 8
    first, last = points[0], points[-1]
    assert first.recipe == "baseline" and first.value("optimizer.lr") == 0.01 and first.value("model.n_layer") is None
    assert last.recipe == "qk-layernorm" and last.value("optimizer.lr") == pytest.approx(0.03)
    trained = last.scenario.resolved()
    assert (trained.model.n_embd, trained.model.n_layer, trained.model.qk_layernorm) == (128, 2, True)
    assert trained.steps == 400 and trained.optimizer.weight_decay == 0.0 and trained.optimizer.lr == 0.03
    assert trained.sampler.bursts[0].count == 8  # the base's own break is kept
    assert first.name.startswith("phase-19+steps=400+model=na") and first.name.endswith(
        "burst(8×greek@312)~" + first.scenario.content_hash()[:8]
    )


def test_dotted_paths_are_the_codecs_fields():
    assert dotted_config("sampler.mixture.concentration", 0.5) == {"sampler": {"mixture": {"concentration": 0.5}}}
    assert apply_config(TINY, dotted_config("sampler.batch_size", 4)).sampler.batch_size == 4
    with pytest.raises(ConfigError, match="seed has no fields"):
        dotted_config("seed.value", 1)
    with pytest.raises(ConfigError, match="model.kwargs needs a model.factory"):
        apply_config(TINY, {"model": {"kwargs": {"width": 8}}})


def test_sweep_takes_a_grid_or_a_list_of_points():
    from pytest_spikecheck.sweep.engine import _plan

    crossed = _plan(TINY, {"seed": [1, 2], "optimizer.lr": [0.01, 0.02]}, None, None).expand()
    listed = _plan(TINY, [{"seed": 1, "optimizer.lr": 0.01}, {"seed": 2}], {"qk": [QKLayerNorm()]}, None).expand()
    assert len(crossed) == 4 and [p.scenario.seed for p in crossed] == [1, 1, 2, 2]
    assert [(p.recipe, p.value("seed"), p.value("optimizer.lr")) for p in listed] == [("qk", 1, 0.01), ("qk", 2, None)]
    with pytest.raises(ConfigError, match="sweep\\(\\) takes a Scenario or a Sweep, was str"):
        sweep("phase-19", {"seed": [0]})


def test_a_sweep_refuses_a_grid_beside_a_sweep_that_has_its_own():
    plan = Sweep(TINY, grid={"seed": [0]})
    with pytest.raises(ConfigError, match="a Sweep carries its own grid and recipes"):
        sweep(plan, {"seed": [1]})
    with pytest.raises(ConfigError, match="a Sweep carries its own grid and recipes"):
        sweep(plan, recipes={"qk": [QKLayerNorm()]})


def test_axes_some_points_leave_unset_hold_the_base_value_and_every_value_is_plain(tmp_path):
    # One point sets the learning rate and a burst list, the other neither: rows name every axis
    # with what the run trained (the base's lr; its bursts), sweep.json takes them, the summaries
    # sort by lr. Before, the unset lr was None (summaries could not sort it) and the burst a
    # BurstSpec (sweep.json could not hold it), both after every point had trained.
    bursts = [{"at_step": 3, "count": 2, "content": "greek"}]
    plan = Sweep(TINY.replace(steps=4), points=[{"optimizer.lr": 0.02, "sampler.bursts": bursts}, {"seed": 1}])
    assert dict(plan.expand()[0].values)["sampler.bursts"] == bursts
    result = sweep(plan, jobs=1, out=tmp_path / "out", progress=False)
    assert [r["optimizer.lr"] for r in result.rows] == [0.02, TINY.optimizer.lr]
    assert [r["sampler.bursts"] for r in result.rows] == [bursts, []]
    assert json.loads((tmp_path / "out" / "sweep.json").read_text())["rows"][1]["optimizer.lr"] == TINY.optimizer.lr


# -- training: spawned workers, bit-identical, failures recorded, resumed ----------------------


@pytest.fixture(scope="module")
def first_sweep(tmp_path_factory):
    """The sweep file's six points on two spawned workers: four train, two cannot build their model."""
    folder = tmp_path_factory.mktemp("sweep")
    path = folder / "tiny.yaml"
    path.write_text(SWEEP_FILE)
    plan = load_sweep(path)
    return plan, sweep(plan, jobs=2, out=folder / "out", progress=False), folder / "out"


def test_spawned_workers_train_every_point_bit_identical_to_train_alone(first_sweep):
    plan, result, _ = first_sweep
    assert [r["status"] for r in result.rows] == ["done"] * 4 + ["failed"] * 2
    for point, run in zip(result.points[:4], result.runs[:4]):
        assert run.rows() == train(point.scenario).rows()  # every metric of every step
    assert result.executor == "local, 2 jobs" and all(":" in r["where"] for r in result.rows)  # host:pid


def test_a_lost_local_worker_is_replaced_and_its_point_trained_again(tmp_path):
    # The workers run a stand-in that needs no torch; job 1 kills its worker the first time.
    from sweep_points import dies_once

    from pytest_spikecheck.sweep.local import LocalExecutor
    from pytest_spikecheck.sweep.worker import PointJob

    jobs = [PointJob(i, TINY, "torch", "cpu", 1, str(tmp_path / f"job-{i}")) for i in range(4)]
    for i in (0, 2, 3):
        (tmp_path / f"job-{i}").write_text("")
    back = []
    LocalExecutor(jobs=2, work=dies_once).run(jobs, back.append)
    killed = (tmp_path / "job-1").read_text()
    assert sorted(o.index for o in back) == [0, 1, 2, 3] and all(o.ok for o in back)  # each exactly once
    assert next(o for o in back if o.index == 1).where != killed  # trained again by a new worker
    (tmp_path / "job-1").unlink()
    back = []
    LocalExecutor(jobs=2, max_retries=0, work=dies_once).run(jobs, back.append)  # no retry left
    failed = {o.index: o.error for o in back if not o.ok}
    assert sorted(o.index for o in back) == [0, 1, 2, 3] and 1 in failed
    assert failed[1] == "the local worker pool broke once while this point trained (a worker killed, or out of memory?)"


def test_a_failing_point_is_recorded_in_one_line_and_the_others_go_on(first_sweep):
    _, result, out = first_sweep
    failed = result.rows[4]
    assert failed["status"] == "failed" and failed["error"] == BROKEN and result.runs[4] is None
    assert result.counts == {"done": 4, "failed": 2}
    data = json.loads((out / "sweep.json").read_text())
    assert data["rows"][4]["error"] == BROKEN and data["counts"] == {"done": 4, "failed": 2}
    assert "| failed |" in (out / "sweep.md").read_text() and BROKEN in (out / "sweep.md").read_text()


def test_the_outputs_hold_every_point(first_sweep):
    _, result, out = first_sweep
    trained = [p.name for p in result.points[:4]]
    assert sorted(p.name for p in (out / "runs").iterdir()) == sorted(trained)
    assert [r["run"] for r in result.rows] == [f"runs/{f}" for f in trained] + [None, None]
    lines = (out / "sweep.csv").read_text().splitlines()
    assert lines[0].startswith("point,seed,model.factory,optimizer.lr,status,final_eval_loss,initial_loss")
    assert len(lines) == 7
    md = (out / "sweep.md").read_text()
    assert "## LR sensitivity" in md and "![final_loss_vs_lr](final_loss_vs_lr.png)" in md
    assert (out / "final_loss_vs_lr.png").stat().st_size > 10_000
    summary = result.summaries()[0]  # seeds 0 and 1 at lr 0.01
    finals = [r["final_eval_loss"] for r in result.rows if r["optimizer.lr"] == 0.01 and r["model.factory"] is None]
    assert summary["points"] == 2 and summary["final_eval_loss"] == spread(finals, ".3f")


def test_a_second_invocation_trains_nothing(first_sweep):
    plan, first, out = first_sweep
    plan = dataclasses.replace(plan, points=plan.points[:2])  # four of the points that trained
    again = sweep(plan, jobs=2, out=out, progress=False)
    assert again.counts == {"cached": 4}
    for a, b in zip(first.runs, again.runs):
        np.testing.assert_array_equal(a["loss"], b["loss"])
    assert (out / STORE_DIR).is_dir()
    fresh = sweep(plan, jobs=1, out=out, fresh=True, progress=False)  # the store ignored: all trained again
    assert fresh.counts == {"done": 4}


class _InterruptAfter(Progress):
    """Progress that presses Ctrl-C once ``after`` points have come back."""

    def __init__(self, after: int) -> None:
        super().__init__(mode="quiet")
        self.after = after

    def task(self, name, total=None, unit="step"):
        after = self.after

        class Task(ProgressTask):
            def update(self, n=1, *, outcome=None, **shown):
                super().update(n, outcome=outcome, **shown)
                if self.done >= after:
                    raise KeyboardInterrupt

        return Task(self, name, total, unit)


def test_ctrl_c_stops_cleanly_and_keeps_what_finished(tmp_path):
    plan = Sweep(TINY, grid={"seed": [0, 1, 2]})
    with pytest.raises(SweepInterrupted) as info:
        sweep(plan, jobs=1, out=tmp_path, progress=_InterruptAfter(1))
    kept = info.value.result
    assert kept.interrupted and sorted(kept.counts.items()) == [("done", 1), ("not run", 2)]
    assert len(list((tmp_path / "runs").iterdir())) == 1 and "interrupted" in (tmp_path / "sweep.md").read_text()
    resumed = sweep(plan, jobs=1, out=tmp_path, progress=False)
    assert sorted(resumed.counts.items()) == [("cached", 1), ("done", 2)]


def test_ctrl_c_on_the_cli_exits_130_and_says_what_it_kept(tmp_path, monkeypatch, capsys):
    from pytest_spikecheck.sweep import engine

    monkeypatch.setattr(engine, "_progress", lambda progress: _InterruptAfter(1))  # Ctrl-C after the first point
    path = _write(tmp_path, "base: {preset: phase-19, model: {preset: nano}}\nsteps: 20\ngrid: {seed: [0, 1, 2]}\n")
    assert main(["sweep", str(path), "--jobs", "1", "--out", str(tmp_path / "out")]) == 130
    assert capsys.readouterr().err.strip() == f"spikecheck: interrupted: kept 1 done, 2 not run → {tmp_path / 'out'}"
    assert json.loads((tmp_path / "out" / "sweep.json").read_text())["counts"] == {"done": 1, "not run": 2}


def test_ctrl_c_stops_the_spawned_workers_mid_point(tmp_path):
    # The driver's Ctrl-C (here: raised as the first point comes back) ends the workers still
    # training, at once; a stand-in for run_point that needs no torch takes 1.5 s a point.
    from sweep_points import sleeper

    from pytest_spikecheck.sweep.local import LocalExecutor
    from pytest_spikecheck.sweep.worker import PointJob

    jobs = [PointJob(i, TINY, "torch", "cpu", 1, str(tmp_path / f"job-{i}")) for i in range(4)]
    back = []

    def deliver(outcome):
        back.append(outcome)
        raise KeyboardInterrupt

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        LocalExecutor(jobs=2, work=sleeper).run(jobs, deliver)
    assert len(back) == 1 and multiprocessing.active_children() == []  # no worker left behind
    assert time.monotonic() - started < 10  # the other worker's point was not waited for to its end


def test_spawned_workers_ignore_ctrl_c_the_driver_decides(tmp_path):
    # A terminal's Ctrl-C reaches every process of the group; a worker that took it would die
    # mid-point. Here a worker gets SIGINT while it trains and finishes its point all the same.
    from sweep_points import sleeper

    from pytest_spikecheck.sweep.local import LocalExecutor
    from pytest_spikecheck.sweep.worker import PointJob

    marker = tmp_path / "job-0"
    jobs = [PointJob(0, TINY, "torch", "cpu", 1, str(marker)), PointJob(1, TINY, "torch", "cpu", 1, str(tmp_path / "job-1"))]

    def interrupt_the_worker():
        deadline = time.monotonic() + 60
        while not marker.exists() or not marker.read_text():
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
        os.kill(int(marker.read_text()), signal.SIGINT)

    thread = threading.Thread(target=interrupt_the_worker)
    thread.start()
    back = []
    LocalExecutor(jobs=2, work=sleeper).run(jobs, back.append)
    thread.join()
    assert sorted(o.index for o in back) == [0, 1] and all(o.ok for o in back), [o.error for o in back]


def test_a_script_without_a_main_guard_is_told_why_its_workers_died(tmp_path):
    # Issue 28: spawned workers re-import the main module; unguarded, it starts the sweep again
    # in each of them. One line says so, instead of a BrokenProcessPool traceback.
    script = tmp_path / "unguarded.py"
    script.write_text(
        "from pytest_spikecheck import Scenario, lr_sweep\n"
        "lr_sweep(Scenario.preset('phase-19').replace(steps=2), lrs=(1e-2, 1e-1), processes=2)\n"
    )
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "pytest_spikecheck.sweep.local.WorkersCouldNotStart: the local executor's worker processes exited before they could start"
    )
    assert f"re-imports the main module ({script})" in last and 'under `if __name__ == "__main__":`' in last
    assert "BrokenProcessPool" not in result.stderr and "bootstrapping phase" not in result.stderr


# -- summaries and panels, on rows (no training) -------------------------------------------------


def _result(rows_by_point, recipes=None):
    plan = Sweep(TINY, grid={"optimizer.lr": [0.01, 0.1], "model.preset": ["nano", "micro"], "seed": [0, 1]}, recipes=recipes)
    points = plan.expand()
    rows = []
    for point in points:
        final, initial = rows_by_point(point)
        rows.append(
            row_for(
                point,
                "done" if final is not None else "failed",
                Measures(
                    final_eval_loss=final,
                    initial_loss=initial,
                    max_attn_logit=None,
                    largest_spike_ratio=None,
                    spike_step=None,
                    is_spike=False,
                    recovery=None,
                    diverged=False,
                    seconds=None,
                    skipped_steps=None,
                    loss_scale_min=None,
                ),
            )
        )
    return SweepResult("fake", plan.axes, points, rows, [None] * len(points))


def test_lr_sensitivity_is_wortsmans_per_seed_and_leaves_out_a_seed_with_a_failed_point():
    # final losses: nano flat (1.0 at both LRs), micro 1.0 at 0.01 and 3.0 (above the initial 2.5) at 0.1
    def numbers(point):
        lr, width, seed = point.value("optimizer.lr"), point.value("model.preset"), point.value("seed")
        if width == "micro" and seed == 1 and lr == 0.1:
            return None, None  # failed
        return (3.0 if width == "micro" and lr == 0.1 else 1.0 + 0.01 * seed), 2.5

    found = {s["model.preset"]: s for s in lr_sensitivities(_result(numbers).rows, _result(numbers).axes)}
    assert found["nano"]["lr_sensitivity_values"] == [0.0, 0.0]
    # micro seed 0: mean(min(1.0, 2.5), min(3.0, 2.5)) - 1.0 = 0.75; seed 1 left out (a failed point)
    assert found["micro"]["lr_sensitivity_values"] == [0.75] and found["micro"]["incomplete"] == 1
    assert found["micro"]["lr_sensitivity"] == "0.750"


def test_the_width_panel_is_drawn_when_the_width_varies(tmp_path):
    result = _result(lambda p: (1.0 + p.value("optimizer.lr"), 2.5), recipes={"baseline": [], "qk": [QKLayerNorm()]})
    files = result.write(tmp_path)
    assert {f.name for f in files} >= {"final_loss_vs_lr.png", "lr_sensitivity_vs_width.png", "sweep.md"}
    assert "![lr_sensitivity_vs_width](lr_sensitivity_vs_width.png)" in (tmp_path / "sweep.md").read_text()
    assert spread([3.0, 1.0, 2.0]) == "2.0 [1.0–3.0]" and spread([None, float("nan")]) == "—"


def test_the_sweep_layer_imports_neither_torch_nor_ray_until_it_trains():
    code = (
        "import sys\nfrom pytest_spikecheck.sweep import load_sweep, sweep\nimport pytest_spikecheck.cli.sweep\n"
        "load_sweep('experiments/sweeps/lr-sensitivity-by-width.yaml').expand()\n"
        "print(sorted(m for m in ('torch', 'ray', 'matplotlib') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_without_ray_the_ray_executor_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails as if not installed
    with pytest.raises(ConfigError) as info:
        sweep(Sweep(TINY, grid={"seed": [0]}), executor="ray", progress=False)
    assert str(info.value) == "the ray executor needs Ray: pip install 'pytest-spikecheck[ray]'"
    with pytest.raises(ConfigError, match="unknown executor 'dask'; choose one of local, ray"):
        sweep(Sweep(TINY, grid={"seed": [0]}), executor="dask", progress=False)


def test_a_worker_whose_code_differs_from_the_drivers_fails_its_point_instead_of_storing_it():
    from pytest_spikecheck.sweep.worker import PointJob, run_point
    from pytest_spikecheck.training.store import run_key

    key = run_key(TINY, backend="torch", device="cpu", threads=1).tag
    stale = key.replace("-src", "-srcdeadbeef")  # as if the driver ran another version of the package
    outcome = run_point(PointJob(0, TINY, "torch", "cpu", 1, stale))
    assert not outcome.ok and outcome.run is None
    assert outcome.error.startswith(f"this worker's code differs from the driver's (run key {key} here, {stale} there)")


def test_lr_sweep_says_which_learning_rate_failed():
    from pytest_spikecheck import lr_sweep

    with pytest.raises(ConfigError, match=r"lr_sweep: lr 0.01 failed: RuntimeError: this model cannot be built"):
        lr_sweep(TINY.replace(model_factory="sweep_points:broken_model"), lrs=(1e-2,), processes=1)


def test_the_plugins_rows_and_the_sweeps_rows_are_filled_from_one_typed_measure(short_runs):
    """measure() gives one typed row of measures (report.summary.Measures); the plugin's
    ScenarioRow and a sweep's point row both take theirs from it (no training: a session run)."""
    run = short_runs[0]
    measured = measure(run)
    assert isinstance(measured, Measures)
    point = Sweep(TINY, grid={"seed": [0]}).expand()[0]
    swept = row_for(point, "done", measured)
    assert isinstance(swept, PointRow) and swept.measures == measured  # the same typed measures, not a copy in a dict
    assert {k: swept[k] for k in MEASURES if k in measured.to_json()} == {
        k: v for k, v in measured.to_json().items() if k in MEASURES
    }
    scenario_row = summarise(run)
    assert (
        scenario_row.max_attn_logit,
        scenario_row.final_eval_loss,
        scenario_row.skipped_steps,
        scenario_row.loss_scale_min,
    ) == (measured.max_attn_logit, measured.final_eval_loss, measured.skipped_steps, measured.loss_scale_min)
    assert swept["final_eval_loss"] == scenario_row.final_eval_loss and swept["max_attn_logit"] == scenario_row.max_attn_logit


def test_every_point_is_named_by_every_axis_even_at_the_presets_own_value():
    """A derived name lists what differs from the preset: the point at phase-19's own lr was
    named ``phase-19+steps=100``, beside ``phase-19+steps=100+lr=0.1``."""
    from pytest_spikecheck import Scenario
    from pytest_spikecheck.sweep import Sweep

    base = Scenario.preset("phase-19").replace(steps=100)
    own = base.optimizer.lr
    points = Sweep(base=base, grid={"optimizer.lr": [own, 0.1]}).expand()
    assert [p.name for p in points] == [f"phase-19+steps=100+lr={own:g}", "phase-19+steps=100+lr=0.1"]
    assert points[0].scenario.content_hash() == base.content_hash()  # the name is not the content
    models = Sweep(base=base, grid={"model.preset": ["micro", "mini"]}).expand()
    assert [p.name for p in models] == ["phase-19+steps=100+model=micro", "phase-19+steps=100+model=mini"]


#: A row of sweep.json as the code before typed rows wrote it (a plain dict, the same columns).
OLD_ROW = {
    "point": "p+lr=0.1",
    "recipe": "baseline",
    "optimizer.lr": 0.1,
    "seed": 0,
    "status": "done",
    "final_eval_loss": None,
    "initial_loss": 5.9,
    "max_attn_logit": 12.5,
    "largest_spike_ratio": 7.5,
    "spike_step": 41,
    "is_spike": True,
    "recovery": None,
    "diverged": True,
    "seconds": 1.5,
    "error": None,
    "content_hash": "abc",
    "where": "host:1",
    "run": "runs/p+lr=0.1",
}


def test_sweep_rows_are_typed_and_keep_the_files_columns_and_old_rows_read_back(tmp_path, monkeypatch):
    """A sweep's rows are PointRow (the plugin's Measures inside); as a mapping each is the flat
    row the files write, in the same columns and order; a row of an older sweep.json reads back."""
    result = _result(lambda p: (1.0 + p.value("optimizer.lr"), 2.5), recipes={"baseline": [], "qk": [QKLayerNorm()]})
    assert all(isinstance(r, PointRow) and isinstance(r.measures, Measures) for r in result.rows)
    assert list(result.rows[0]) == [
        "point",
        "recipe",
        "optimizer.lr",
        "model.preset",
        "seed",
        *MEASURES,
        "content_hash",
        "where",
        "run",
    ]
    monkeypatch.setattr("pytest_spikecheck.sweep.panels.draw_panels", lambda result, out: [])  # no matplotlib here
    result.write(tmp_path)
    written = json.loads((tmp_path / "sweep.json").read_text())["rows"]
    assert [PointRow.from_json(r).columns() for r in written] == written
    header = (tmp_path / "sweep.csv").read_text().splitlines()[0]
    assert header == ",".join(
        ["point", "recipe", "optimizer.lr", "model.preset", "seed", *MEASURES, "content_hash", "where", "run"]
    )
    old = PointRow.from_json(OLD_ROW)
    assert old.columns() == OLD_ROW and list(old) == list(OLD_ROW)
    assert (old.measures.largest_spike_ratio, old.measures.diverged, old["optimizer.lr"]) == (7.5, True, 0.1)
    failed = PointRow.from_json({**OLD_ROW, "status": "failed", "error": "RuntimeError: x"})
    assert failed.measures is None and failed["seconds"] == 1.5 and failed["final_eval_loss"] is None
    with pytest.raises(ConfigError, match="a sweep row needs status; it has point"):
        PointRow.from_json({"point": "p"})
