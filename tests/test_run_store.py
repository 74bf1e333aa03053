"""The run store: entries are whole and say who stored them; under the key's lock concurrent
processes make a run once; a holder that dies frees the lock; a wait that runs out (or a lock
kept by a process whose owner is gone) is one line naming the pid. Nothing here trains: the
runs are made from arrays, and the processes import the store without torch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from pytest_spikecheck import Scenario
from pytest_spikecheck.records.run import Run
from pytest_spikecheck.training.store import RunKey, RunStore, RunStoreLockError

KEY = RunKey("abc123-torch-cpu-t1")


def _run(name: str = "made") -> Run:
    steps = np.arange(1, 4)
    return Run(
        scenario=Scenario.preset("phase-19").replace(name=name, steps=3),
        metrics={"step": steps, "loss": np.array([3.0, 2.5, 2.25]), "grad_norm_pre": np.ones(3)},
    )


def test_an_entry_holds_the_run_and_who_stored_it(tmp_path):
    store = RunStore(tmp_path, session="s1", writer="gw0")
    assert store.get(KEY) is None
    store.put(KEY, _run("first"))
    run, provenance = store.get(KEY)
    assert run.name == "first" and list(run.metrics["loss"]) == [3.0, 2.5, 2.25]
    assert (provenance.session, provenance.writer, provenance.pid, provenance.name) == ("s1", "gw0", os.getpid(), "first")
    assert [p.name for p in tmp_path.iterdir()] == [KEY.tag]  # written aside, moved in whole: no leftovers


def test_get_or_make_makes_once_in_one_process(tmp_path):
    store, made = RunStore(tmp_path, session="s1"), []
    first = store.get_or_make(KEY, lambda: made.append(1) or _run())
    second = store.get_or_make(KEY, lambda: made.append(1) or _run())
    assert made == [1] and first[1] is None and second[1].session == "s1"


# A process that asks the store for KEY once both askers are ready (a barrier of two files): its
# make() sleeps (so the other process asks meanwhile) and appends a line to a count file. "nolock"
# is the sabotage: the lock does nothing.
ASKER = textwrap.dedent("""
    import contextlib, pathlib, sys, time
    import numpy as np
    from pytest_spikecheck import Scenario
    from pytest_spikecheck.records.run import Run
    from pytest_spikecheck.training.store import RunKey, RunStore

    root, count, mode = sys.argv[1:4]
    if mode == "nolock":
        RunStore.lock = lambda self, key: contextlib.nullcontext()

    def make():
        with open(count, "a") as f:
            f.write("made\\n")
        time.sleep(0.5)
        return Run(scenario=Scenario.preset("phase-19").replace(name="made", steps=1),
                   metrics={"step": np.arange(1, 2), "loss": np.ones(1)})

    store = RunStore(root, session="s", writer=mode)
    if mode == "hold":  # take the lock, say so, and keep it until killed
        with store.lock(RunKey("abc123-torch-cpu-t1")):
            print("holding", flush=True)
            time.sleep(60)
    ready = pathlib.Path(root).parent / "ready"
    ready.mkdir(exist_ok=True)
    (ready / str(time.time_ns())).touch()
    while len(list(ready.iterdir())) < 2:
        time.sleep(0.01)
    run, found = store.get_or_make(RunKey("abc123-torch-cpu-t1"), make)
    print("loaded" if found else "made", flush=True)
""")


def _ask(tmp_path: Path, mode: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", ASKER, str(tmp_path / "store"), str(tmp_path / "count"), mode], stdout=subprocess.PIPE, text=True
    )


@pytest.mark.parametrize("mode, made", [("lock", 1), ("nolock", 2)])
def test_two_processes_asking_at_once_make_the_run_once(tmp_path, mode, made):
    askers = [_ask(tmp_path, mode) for _ in range(2)]
    outputs = sorted(p.communicate(timeout=60)[0].strip() for p in askers)  # communicate closes the pipes
    assert (tmp_path / "count").read_text().count("made") == made  # with the lock sabotaged: twice
    if mode == "lock":
        assert outputs == ["loaded", "made"]


@pytest.fixture
def holder(tmp_path: Path):
    """A process holding KEY's lock until killed."""
    process = _ask(tmp_path, "hold")
    with process:
        assert process.stdout.readline().strip() == "holding"
        yield process
        process.kill()


def test_a_holder_that_dies_frees_the_lock(tmp_path, holder):
    store = RunStore(tmp_path / "store", lock_timeout=10)  # a lock left held would raise after 10 s
    holder.send_signal(signal.SIGKILL)  # no finally runs: the owner file stays behind
    holder.wait()
    run, found = store.get_or_make(KEY, _run)
    assert found is None and run.name == "made"


def test_a_wait_that_runs_out_names_the_holders_pid(tmp_path, holder):
    with pytest.raises(RunStoreLockError) as info:
        RunStore(tmp_path / "store", lock_timeout=0.5).get_or_make(KEY, _run)
    message = str(info.value)
    assert "\n" not in message and f"held by pid {holder.pid} (hold)" in message and "waited 0.5 s" in message


def test_a_lock_kept_after_its_owner_is_gone_is_one_line(tmp_path, holder, monkeypatch):
    """The lock is held (here by a live process) but the owner file names a pid that is gone,
    as when the holder died and a child it forked kept the lock's file open."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    owner = tmp_path / "store" / ".locks" / f"{KEY.tag}.owner"
    owner.write_text(owner.read_text().replace(f'"pid": {holder.pid}', f'"pid": {gone.pid}'))
    monkeypatch.setattr("pytest_spikecheck.training.store._DEAD_OWNER_GRACE_SECONDS", 0.3)
    with pytest.raises(RunStoreLockError, match=rf"still held, but pid {gone.pid} \(hold\) that took it is gone"):
        RunStore(tmp_path / "store", lock_timeout=30).get_or_make(KEY, _run)
