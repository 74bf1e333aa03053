"""Runs that prove they are whole (issue 37): a run folder is written aside and moved into place,
its run.json carries a manifest, and every reader that reuses a run checks it. A damaged cache
entry is one warning line and a retrain; a damaged user folder is one line of refusal. Nothing
here trains: the runs are made from arrays."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pytest_spikecheck import ConfigError, Scenario
from pytest_spikecheck.cli import main
from pytest_spikecheck.records.integrity import DamagedRunError, is_whole
from pytest_spikecheck.records.events import Event
from pytest_spikecheck.records.run import Run
from pytest_spikecheck.training.store import RunKey, RunStore

KEY = RunKey("abc123-torch-cpu-t1")


def _run(name: str = "made", steps: int = 200, seed: int = 42, events: bool = True) -> Run:
    s = np.arange(1, steps + 1)
    loss = np.linspace(3.0, 0.7, steps)
    run = Run(
        scenario=Scenario.preset("phase-19").replace(name=name, steps=steps, seed=seed),
        metrics={
            "step": s,
            "loss": loss,
            "grad_norm_pre": np.ones(steps),
            "grad_norm_post": np.ones(steps),
            "eval_loss": loss + 0.01,
        },
        batches=[],
        events=[Event(step=3, loss=float(seed))] if events else [],
        meta={"content_hash": f"h{seed}", "seconds": 1.5},
    )
    return run


def _cut_lines(path: Path, keep: int) -> None:
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:keep]))


def _store_with_entry(tmp_path: Path) -> tuple[RunStore, Path, list[str]]:
    said: list[str] = []
    store = RunStore(tmp_path / "store", session="s1", warn=said.append)
    return store, store.put(KEY, _run()), said


# -- the cache: a damaged entry is one warning and a retrain --------------------------------------


@pytest.mark.parametrize(
    "damage", ["cut-at-a-line", "cut-mid-line", "run.json-edited", "no-manifest", "events-of-another-run", "run.json-not-json"]
)
def test_a_damaged_store_entry_is_trained_again_after_one_warning(tmp_path, damage):
    store, entry, said = _store_with_entry(tmp_path)
    if damage == "cut-at-a-line":  # 50 of 200 steps: was served as a whole run (final eval loss 1.180)
        _cut_lines(entry / "metrics.jsonl", 50)
    elif damage == "cut-mid-line":  # was a ConfigError that stopped the whole sweep
        (entry / "metrics.jsonl").write_bytes((entry / "metrics.jsonl").read_bytes()[:-37])
    elif damage == "run.json-edited":  # content hash zeroed, seconds -1: was reused
        meta = json.loads((entry / "run.json").read_text())
        meta.update(content_hash="0" * 12, seconds=-1)
        (entry / "run.json").write_text(json.dumps(meta))
    elif damage == "no-manifest":
        meta = json.loads((entry / "run.json").read_text())
        del meta["manifest"]
        (entry / "run.json").write_text(json.dumps(meta))
    elif damage == "events-of-another-run":
        (entry / "events.json").write_text(json.dumps([{"step": 3, "loss": 7.0}], indent=1))
    else:
        (entry / "run.json").write_text('{"manifest": ')
    assert store.get(KEY) is None
    assert len(said) == 1 and "\n" not in said[0] and "is not whole" in said[0] and "training it again" in said[0]
    made = []
    run, provenance = store.get_or_make(KEY, lambda: made.append(1) or _run())
    assert made == [1] and provenance is None and len(run) == 200 and len(said) == 2  # one line per look
    assert store.get(KEY)[0].meta["content_hash"] == "h42" and len(said) == 2  # the retrain replaced the entry


def test_a_whole_store_entry_is_reused_without_a_word(tmp_path):
    store, entry, said = _store_with_entry(tmp_path)
    run, _ = store.get(KEY)
    assert len(run) == 200 and said == [] and is_whole(entry)
    assert run.meta["manifest"]["steps"] == 200 and set(run.meta["manifest"]["files"]) == {
        "metrics.jsonl",
        "events.json",
        "batches.jsonl",
        "config.yaml",
    }


def test_the_plugin_session_retrains_a_cut_disk_cache_entry(tmp_path, monkeypatch):
    """A cache entry cut from 60 to 30 steps was '2 from the disk cache': a spike check on a run cut
    before its spike passed."""
    from pytest_spikecheck.plugin.session import Settings, SpikecheckSession

    trained = []

    def fake_train(self, scenario):
        trained.append(scenario.name)
        return _run(scenario.name, steps=60)

    monkeypatch.setattr(SpikecheckSession, "_train", fake_train)
    monkeypatch.setattr(SpikecheckSession, "_write_report", lambda self, run: None)
    monkeypatch.setattr(SpikecheckSession, "backend", property(lambda self: "torch"))
    scenario = Scenario.preset("phase-19").replace(name="cut", steps=60)
    first = SpikecheckSession(Settings(enabled=True, report_dir=tmp_path / "report"))
    assert len(first.run(scenario)) == 60 and trained == ["cut"]
    (entry,) = [p for p in (tmp_path / "report" / ".cache").iterdir() if not p.name.startswith(".")]
    _cut_lines(entry / "metrics.jsonl", 30)
    second = SpikecheckSession(Settings(enabled=True, report_dir=tmp_path / "report"))
    lines = []
    monkeypatch.setattr(SpikecheckSession, "_warn", lambda self, message: lines.append(message))
    assert len(second.run(scenario)) == 60 and trained == ["cut", "cut"] and second.counts["disk"] == 0
    assert len(lines) == 1 and "metrics.jsonl holds" in lines[0]


# -- a user's folder: a damaged one is one line of refusal -----------------------------------------


def test_a_cut_run_folder_is_refused_by_diagnose_check_and_compare(tmp_path, capsys):
    folder = _run().save(tmp_path / "run")
    _cut_lines(folder / "metrics.jsonl", 49)  # a kill during a non-atomic save left 49 of 200 steps
    with pytest.raises(DamagedRunError, match="metrics.jsonl holds .* bytes, its manifest says"):
        Run.load(folder)
    for argv in (
        ["diagnose", str(folder)],
        ["check", str(folder)],
        ["compare", str(folder), str(folder), "--out", str(tmp_path / "cmp")],
    ):
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("spikecheck: error: run folder") and "is damaged" in err and "\n" not in err


def test_a_folder_without_a_manifest_is_read_as_it_is(tmp_path):
    """Older and hand-written run folders have none: metrics.jsonl alone is a run."""
    folder = tmp_path / "hand"
    folder.mkdir()
    (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "loss": 1.0}) + "\n" for i in (1, 2, 3)))
    assert len(Run.load(folder)) == 3
    with pytest.raises(DamagedRunError, match="no manifest"):
        Run.load(folder, require_manifest=True)


# -- saving is atomic and never mixes two runs -------------------------------------------------------


def test_a_save_over_an_older_run_leaves_only_the_new_run(tmp_path):
    """train --out DIR over an older run left one seed's config and metrics beside another's
    events.json and run.json."""
    folder = _run(seed=1).save(tmp_path / "run")
    _run(seed=2, steps=20, events=False).save(folder)
    loaded = Run.load(folder)
    assert (loaded.scenario.seed, len(loaded), loaded.events, loaded.meta["content_hash"]) == (2, 20, [], "h2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no temp folder left


def test_a_save_that_dies_midway_leaves_the_older_run_whole(tmp_path, monkeypatch):
    folder = _run(seed=1).save(tmp_path / "run")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    def dies(self):
        raise KeyboardInterrupt  # stands for a kill after metrics.jsonl was opened

    monkeypatch.setattr(Run, "rows", dies)
    with pytest.raises(KeyboardInterrupt):
        _run(seed=2).save(folder)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before and is_whole(folder)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_save_refuses_a_folder_holding_a_users_files(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match=r"holds files that are not a run's \(notes.txt\)"):
        _run().save(folder)
    assert (folder / "notes.txt").read_text() == "keep me" and sorted(p.name for p in folder.iterdir()) == ["notes.txt"]


# -- a sweep's resume ----------------------------------------------------------------------------


class _MadeRuns:
    """A stand-in executor: each point's run made from arrays (no torch), counted."""

    name = "made"

    def __init__(self) -> None:
        self.trained: list[int] = []

    def describe(self) -> str:
        return "made"

    def run(self, jobs, deliver) -> None:
        from pytest_spikecheck.sweep.worker import Outcome

        for job in jobs:
            self.trained.append(job.index)
            deliver(Outcome(job.index, run=_run(job.scenario.name, steps=30, seed=job.scenario.seed)))


def test_a_sweep_resume_retrains_a_damaged_point_and_rewrites_a_damaged_copy(tmp_path):
    from pytest_spikecheck.sweep import Sweep, sweep
    from pytest_spikecheck.sweep.engine import STORE_DIR

    plan = Sweep(Scenario.preset("phase-19").replace(steps=30), grid={"seed": [0, 1]})
    first = _MadeRuns()
    result = sweep(plan, executor=first, out=tmp_path, progress=False)
    assert first.trained == [0, 1] and result.counts == {"done": 2}
    entries = sorted(p for p in (tmp_path / STORE_DIR).iterdir() if not p.name.startswith("."))
    copies = sorted((tmp_path / "runs").iterdir())
    _cut_lines(entries[0] / "metrics.jsonl", 10)  # a store entry cut mid-way: that point trains again
    (copies[1] / "events.json").unlink()  # a copy missing a file (a cut copy of the store's files)
    again = _MadeRuns()
    result = sweep(plan, executor=again, out=tmp_path, progress=False)
    assert len(again.trained) == 1 and sorted(result.counts.items()) == [("cached", 1), ("done", 1)]
    assert all(is_whole(c) and len(Run.load(c)) == 30 for c in copies)  # the damaged copy was written again


def test_a_sweep_stores_each_run_once_on_disk(tmp_path):
    """Each run was written twice, to .store/ and to runs/: runs/<point>/ now holds the store
    entry's files under a second name (hard links)."""
    from pytest_spikecheck.sweep import Sweep, sweep
    from pytest_spikecheck.sweep.engine import STORE_DIR

    sweep(
        Sweep(Scenario.preset("phase-19").replace(steps=30), grid={"seed": [0, 1]}),
        executor=_MadeRuns(),
        out=tmp_path,
        progress=False,
    )
    entries = {p.name for p in (tmp_path / STORE_DIR).iterdir() if not p.name.startswith(".")}
    for copy in (tmp_path / "runs").iterdir():
        store_json = __import__("json").loads((copy / "store.json").read_text())
        assert store_json["name"] == copy.name
        (entry,) = [
            tmp_path / STORE_DIR / e
            for e in entries
            if (tmp_path / STORE_DIR / e / "metrics.jsonl").samefile(copy / "metrics.jsonl")
        ]
        assert all((copy / f).samefile(entry / f) for f in ("metrics.jsonl", "events.json", "run.json"))


def test_train_never_overwrites_the_config_it_was_read_from(tmp_path, capsys):
    exp = tmp_path / "exp"
    exp.mkdir()
    text = "# my notes\npreset: phase-19\nsteps: 2\n"
    (exp / "config.yaml").write_text(text)
    for argv in (["train", str(exp), "--out", str(exp)], ["train", str(exp / "config.yaml"), "--out", str(exp)]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert "is the folder of the config it trains" in err and "\n" not in err
    assert (exp / "config.yaml").read_text() == text


# -- no deletion outside what we own ---------------------------------------------------------------


def _session_with_made_runs(monkeypatch, report: Path):
    from pytest_spikecheck.plugin.session import Settings, SpikecheckSession

    import pytest_spikecheck.report as report_module

    monkeypatch.setattr(SpikecheckSession, "_train", lambda self, scenario: _run(scenario.name, steps=30))
    monkeypatch.setattr(SpikecheckSession, "backend", property(lambda self: "torch"))
    for panel in ("plot_loss", "plot_grad_norm"):  # the folder's writing is tested, not matplotlib
        monkeypatch.setattr(report_module, panel, lambda runs, path, *a, **k: Path(path).write_bytes(b"png"))
    return SpikecheckSession(Settings(enabled=True, report_dir=report))


@pytest.mark.parametrize("name", ["", "index.html", "INDEX.md"])
def test_no_scenario_name_deletes_the_report_or_its_page(tmp_path, monkeypatch, name):
    """A scenario named "" removed the whole --spikecheck-report folder (a user's files in it too);
    one named index.html ended the session with IsADirectoryError."""
    from pytest_spikecheck.plugin.outputs import write_index

    report = tmp_path / "report"
    report.mkdir()
    (report / "notes.txt").write_text("mine")
    session = _session_with_made_runs(monkeypatch, report)
    session.run(Scenario.preset("phase-19").replace(steps=30), name=name)
    write_index(report, {n: r.to_json() for n, r in session.rows.items()}, {n: "pass" for n in session.rows}, [])
    assert (report / "notes.txt").read_text() == "mine" and (report / "index.html").is_file()
    assert (report / "index.md").is_file()
    (folder,) = [p for p in report.iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert (folder / "summary.json").is_file() and folder.name.lower() not in ("index.html", "index.md")


def test_a_users_folder_named_like_a_scenario_is_never_replaced(tmp_path, monkeypatch):
    report = tmp_path / "report"
    (report / "mine").mkdir(parents=True)
    (report / "mine" / "data.csv").write_text("1,2")
    session = _session_with_made_runs(monkeypatch, report)
    with pytest.raises(ConfigError, match="was not written by spikecheck"):
        session.run(Scenario.preset("phase-19").replace(steps=30), name="mine")
    assert (report / "mine" / "data.csv").read_text() == "1,2"


def test_atomic_dir_write_refuses_the_root_and_outside_it(tmp_path):
    from pytest_spikecheck.training.store import atomic_dir_write

    (tmp_path / "keep").write_text("x")
    for target in (tmp_path / "", tmp_path / "a" / "b", tmp_path / ".."):
        with pytest.raises(ConfigError, match="not a folder inside"):
            atomic_dir_write(target, lambda folder: None, within=tmp_path)
    assert (tmp_path / "keep").read_text() == "x"


def test_two_sweeps_on_one_out_train_each_point_once(tmp_path):
    """Two sweeps on one --out each trained every point (12 trainings for 6 points): a point one
    sweep has claimed, the other waits for and takes from the store."""
    import threading
    import time

    from pytest_spikecheck.sweep import Sweep, sweep

    class Slow(_MadeRuns):
        def run(self, jobs, deliver):
            for job in jobs:
                time.sleep(0.2)
                super().run([job], deliver)

    plan = Sweep(Scenario.preset("phase-19").replace(steps=30), grid={"seed": [0, 1, 2]})
    executors, results = [Slow(), Slow()], [None, None]

    def one(i):
        results[i] = sweep(plan, executor=executors[i], out=tmp_path, progress=False)

    threads = [threading.Thread(target=one, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
        time.sleep(0.05)
    for t in threads:
        t.join(timeout=60)
    assert sorted(executors[0].trained + executors[1].trained) == [0, 1, 2]  # each point trained once
    assert all(len(r.runs) == 3 and None not in r.runs for r in results)
    assert not list((tmp_path / ".store" / ".locks").glob("*.claim"))  # every claim released


DRIVER = """
import sys
sys.path.insert(0, sys.argv[2])
from sweep_points import TINY, sleeper
from pytest_spikecheck.sweep.local import LocalExecutor
from pytest_spikecheck.sweep.worker import PointJob

if __name__ == "__main__":
    jobs = [PointJob(i, TINY, "torch", "cpu", 1, f"{sys.argv[1]}/job-{i}") for i in range(4)]
    LocalExecutor(jobs=2, work=sleeper).run(jobs, lambda outcome: None)
"""


def test_workers_die_with_their_driver(tmp_path):
    """After kill -9 of a --jobs 2 sweep's driver its two workers lived on, idle, under pid 1."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    driver = subprocess.Popen([sys.executable, str(script), str(tmp_path), str(Path(__file__).parent)])
    try:
        deadline = time.monotonic() + 60
        markers = [tmp_path / "job-0", tmp_path / "job-1"]
        while not all(m.exists() and m.read_text() for m in markers):
            assert time.monotonic() < deadline and driver.poll() is None, "the workers never started"
            time.sleep(0.05)
        workers = [int(m.read_text()) for m in markers]
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()

        def alive(pid):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
            status = Path(f"/proc/{pid}/status")  # a zombie nobody reaped yet has ended
            return not (status.is_file() and "\nState:\tZ" in status.read_text())

        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [pid for pid in workers if alive(pid)]
        for pid in left:  # leave nothing behind, even when the test fails
            os.kill(pid, signal.SIGKILL)
        assert left == [], f"workers {left} outlived their driver"
    finally:
        if driver.poll() is None:
            driver.kill()


def test_a_recorders_out_is_checked_before_training(tmp_path):
    """The callbacks check their ``out`` when made (check_target), not when training ends."""
    from pytest_spikecheck.records.integrity import check_target

    (tmp_path / "checkpoint-10").mkdir()
    with pytest.raises(ConfigError, match=r"holds files that are not a run's \(checkpoint-10\)"):
        check_target(tmp_path)
    check_target(tmp_path / "new")  # a new folder, or one holding a run, is fine
