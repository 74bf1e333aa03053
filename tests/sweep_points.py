"""What the sweep tests train: a tiny sweep, a point that fails, and a model that hangs on one
Ray node (to lose that node mid-point). A plain module next to the tests: spawned local workers
import it through the parent's sys.path, Ray workers through the PYTHONPATH the tests give them.
"""

from __future__ import annotations

import time
from pathlib import Path

from pytest_spikecheck import Scenario

#: Nano Phase-19 for 20 steps: ~0.3 s a run once torch is warm.
TINY = Scenario.preset("phase-19").replace(steps=20, model__n_layer=2, model__n_head=2, model__n_embd=32)
#: A sweep file of four such points (two LRs x two seeds) and one that cannot build its model.
SWEEP_FILE = """\
base: {preset: phase-19, model: {preset: nano}}
steps: 20
grid:
  optimizer.lr: [1e-2, 3e-2]
points:
  - {seed: 0}
  - {seed: 1}
  - {seed: 0, model.factory: "sweep_points:broken_model"}
"""
#: The failing point's error, as the table records it (one line).
BROKEN = "RuntimeError: this model cannot be built (a sweep point that fails on purpose)"


def broken_model(vocab_size: int):
    raise RuntimeError("this model cannot be built (a sweep point that fails on purpose)\nsecond line, not recorded")


def nano_gpt(vocab_size: int, hang_on_node: str = "", started_marker: str = ""):
    """The built-in GPT at the nano shape. In a Ray task on the node ``hang_on_node`` it writes
    ``started_marker`` and then hangs until that node is removed (its point is lost with it); in a
    Ray task on any other node it first waits for that marker, so that the lost node surely had a
    point in flight whatever Ray's placement (a point queued behind a busy node is moved to a free
    one). Outside a Ray task (``train()`` in the test) it just builds the model."""
    if hang_on_node:
        import ray

        if ray.is_initialized() and ray.get_runtime_context().get_task_id() is not None:
            if ray.get_runtime_context().get_node_id() == hang_on_node:
                Path(started_marker).write_text(hang_on_node)
                time.sleep(600)
            deadline = time.monotonic() + 120
            while not Path(started_marker).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
    from pytest_spikecheck.models.config import GPTConfig
    from pytest_spikecheck.models.gpt import GPT

    return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=vocab_size))


def dies_once(job):
    """A stand-in for ``run_point`` (no training, no torch): the first time a job's ``key``, here a
    file path, does not exist yet, it is created and the worker kills itself (as the kernel's
    out-of-memory killer would); otherwise the job comes back done, with the worker's pid."""
    import os
    import signal

    from pytest_spikecheck.sweep.worker import Outcome

    marker = Path(job.key)
    if not marker.exists():
        marker.write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    return Outcome(job.index, run="trained", where=str(os.getpid()))


def sleeper(job):
    """A stand-in for ``run_point`` (no torch) that writes its worker's pid to the path in the
    job's ``key``, then takes a second and a half over its point."""
    import os

    from pytest_spikecheck.sweep.worker import Outcome

    Path(job.key).write_text(str(os.getpid()))
    time.sleep(1.5)
    return Outcome(job.index, run="trained", where=str(os.getpid()))
