"""The Ray executor on a local two-node Ray cluster (``ray.cluster_utils.Cluster``, one CPU per
node; one cluster for the module: Ray's start-up is the slow part): points spread over both
nodes, every run bit-identical to ``train()`` alone and to the local executor's, a failing point
recorded while the others finish, a second invocation training nothing, and a node lost
mid-point whose point Ray trains again elsewhere, once, to the same metrics.

Ray is the ``ray`` extra (in the dev extra, so CI runs this module)."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest
from sweep_points import BROKEN, SWEEP_FILE, TINY

ray = pytest.importorskip("ray", reason="the ray executor's tests need Ray: pip install 'pytest-spikecheck[ray]'")

from pytest_spikecheck import train  # noqa: E402
from pytest_spikecheck.cli import main  # noqa: E402
from pytest_spikecheck.progress import Progress, ProgressTask  # noqa: E402
from pytest_spikecheck.records import Run  # noqa: E402
from pytest_spikecheck.sweep import Sweep, sweep  # noqa: E402

TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    worker = nodes.add_node(num_cpus=1)
    nodes.wait_for_nodes()
    # The workers import the tests' model factories (tests/sweep_points.py) from here.
    ray.init(address=nodes.address, runtime_env={"env_vars": {"PYTHONPATH": str(TESTS)}}, logging_level="WARNING")
    nodes.worker = worker
    yield nodes
    ray.shutdown()
    nodes.shutdown()


@pytest.fixture(scope="module")
def ray_sweep(cluster, tmp_path_factory):
    """The sweep file trained on the cluster through the CLI: four points train, two fail."""
    folder = tmp_path_factory.mktemp("ray-sweep")
    path = folder / "tiny.yaml"
    path.write_text(SWEEP_FILE)
    code = main(["sweep", str(path), "--executor", "ray", "--address", cluster.address, "--out", str(folder / "ray")])
    return path, folder, code, json.loads((folder / "ray" / "sweep.json").read_text())


def test_points_spread_over_both_nodes_and_a_failing_point_does_not_stop_the_others(cluster, ray_sweep):
    _, _, code, data = ray_sweep
    assert code == 1  # a point failed; the others trained and the outputs are written
    assert [r["status"] for r in data["rows"]] == ["done"] * 4 + ["failed"] * 2
    assert {r["error"] for r in data["rows"][4:]} == {BROKEN}
    nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert {r["where"] for r in data["rows"][:4]} == nodes and len(nodes) == 2  # both nodes trained points


def test_ray_and_local_runs_are_identical_and_bit_identical_to_train(ray_sweep):
    path, folder, _, data = ray_sweep
    assert main(["sweep", str(path), "--jobs", "1", "--out", str(folder / "local")]) == 1
    for row in data["rows"][:4]:
        on_ray, here = (folder / side / "runs" / row["point"] / "metrics.jsonl" for side in ("ray", "local"))
        assert on_ray.read_bytes() == here.read_bytes()
    run = Run.load(folder / "ray" / "runs" / data["rows"][0]["point"])
    assert run.rows() == train(run.scenario).rows()


def test_a_second_invocation_trains_nothing_on_ray(ray_sweep, capsys):
    path, folder, _, _ = ray_sweep
    trained = path.with_name("trained.yaml")  # the four points that trained (a failed point is tried again)
    trained.write_text(SWEEP_FILE.replace('  - {seed: 0, model.factory: "sweep_points:broken_model"}\n', ""))
    assert main(["sweep", str(trained), "--executor", "ray", "--out", str(folder / "ray")]) == 0
    again = json.loads((folder / "ray" / "sweep.json").read_text())
    assert again["counts"] == {"cached": 4}
    assert "4 points (4 cached) in " in capsys.readouterr().out


class _OnFirstPoint(Progress):
    """Progress that calls ``hook`` when the first point comes back (in the driver)."""

    def __init__(self, hook) -> None:
        super().__init__(io.StringIO(), mode="quiet")
        self.hook = hook

    def task(self, name, total=None, unit="step"):
        hook = self.hook

        class Task(ProgressTask):
            def update(self, n=1, *, outcome=None, **shown):
                super().update(n, outcome=outcome, **shown)
                if self.done == 1:
                    hook()

        return Task(self, name, total, unit)


def test_a_node_lost_mid_sweep_and_every_point_still_finishes_once_with_the_same_metrics(cluster, tmp_path):
    # Last to use the cluster: it has one node left afterwards. The model hangs on the worker node
    # once it has started there (the marker says so) and waits for that on the head; the first
    # point back (from the head) removes the worker node, killing its point in flight, which Ray
    # then trains on the head.
    worker = cluster.worker.node_id
    marker = tmp_path / "started-on-the-lost-node"
    base = TINY.replace(
        model_factory="sweep_points:nano_gpt", model_kwargs={"hang_on_node": worker, "started_marker": str(marker)}
    )

    def lose_the_worker_node():
        deadline = time.monotonic() + 120
        while not marker.exists():  # a point is running there
            assert time.monotonic() < deadline, "no point ever started on the worker node"
            time.sleep(0.1)
        cluster.remove_node(cluster.worker, allow_graceful=False)

    result = sweep(
        Sweep(base, grid={"seed": [0, 1, 2]}),
        executor="ray",
        address=cluster.address,
        progress=_OnFirstPoint(lose_the_worker_node),
    )
    assert [r["status"] for r in result.rows] == ["done"] * 3  # each point exactly once
    head = cluster.head_node.node_id
    assert marker.read_text() == worker and {r["where"] for r in result.rows} == {head}
    for point, run in zip(result.points, result.runs):
        assert run.rows() == train(point.scenario).rows()  # every metric of every step


def test_the_executor_starts_or_joins_ray_itself_and_leaves_what_it_started(monkeypatch):
    # Without a cluster: Ray's own calls are recorded (the cluster tests above join a connected Ray).
    from pytest_spikecheck.sweep.ray_executor import RayExecutor

    calls = []

    class FakeRay:
        initialized = False

        def is_initialized(self):
            return self.initialized

        def init(self, address=None, **options):
            calls.append(("init", address, options))
            self.initialized = True

        def shutdown(self):
            calls.append(("shutdown",))

        def remote(self, **options):
            calls.append(("remote", options))
            return lambda function: function

    executor = RayExecutor(address="ray://head:10001", max_retries=5, runtime_env={"pip": ["x"]})
    executor.ray = FakeRay()
    executor.run([], lambda outcome: None)
    init, remote, shutdown = calls
    assert init[:2] == ("init", "ray://head:10001") and init[2]["runtime_env"] == {"pip": ["x"]}
    assert remote == ("remote", {"num_cpus": 1, "max_retries": 5, "retry_exceptions": False}) and shutdown == ("shutdown",)
    local = RayExecutor(jobs=3)
    local.ray = FakeRay()
    calls.clear()
    assert local._connect() and calls[0][1] is None and calls[0][2]["num_cpus"] == 3  # a local Ray of 3 CPUs
    assert not local._connect() and len(calls) == 1  # connected already: used as it is, left running


def test_a_local_ray_starts_without_its_token_notice_and_keeps_every_other_warning(caplog):
    """Ray 2.60 logs "Token authentication is enabled ..." at every start of a local instance: a
    notice a user cannot act on. The executor drops that one record while it starts a local Ray
    (token authentication stays on); Ray's other warnings, and the notice when joining a cluster
    someone else runs, still show."""
    import logging

    from pytest_spikecheck.sweep.ray_executor import TOKEN_NOTICE_LOGGER, _without_token_notice

    logger = logging.getLogger(TOKEN_NOTICE_LOGGER)
    notice = "Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled to opt out."
    with caplog.at_level(logging.WARNING, logger=TOKEN_NOTICE_LOGGER):
        with _without_token_notice(local=True):
            logger.warning(notice)
            logger.warning("another warning of Ray's")
        with _without_token_notice(local=False):
            logger.warning(notice)
        logger.warning(notice)  # after the start: the filter is gone
    assert [r.getMessage() for r in caplog.records] == ["another warning of Ray's", notice, notice]
