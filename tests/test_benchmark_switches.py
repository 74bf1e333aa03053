"""The benchmark scripts' switches do what their numbers claim.

``bench_phase19.py --itemise`` reports what each per-step measurement costs by patching it out;
if a patch stopped reaching the code the engine runs (a renamed method, a measurement moved
elsewhere), the harness would keep measuring and the table would credit a cost to nothing.
Each test trains a short run with one switch and checks that the measurement is really gone,
and that the same run without the switch has it.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

from pytest_spikecheck import RareTokenBurst, Scenario, train

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
BURST = 6  # the last step: one event record, in a run of a fraction of a second


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # bench_phase19 imports bench_recorder by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench():
    _load("bench_recorder")
    return _load("bench_phase19")


@pytest.fixture(scope="module")
def scenario():
    return (
        Scenario.preset("phase-19")
        .replace(name="switches", steps=BURST)
        .with_breaks(RareTokenBurst(count=3, at_step=BURST, content="greek"))
    )


@pytest.fixture(scope="module")
def measured(scenario):
    return train(scenario, threads=1)


def test_without_model_statistics(bench, scenario, measured):
    assert math.isfinite(measured.metrics["attn_logit_max"][-1])
    with bench._without(("model statistics",)):
        run = train(scenario, threads=1)
    assert "attn_logit_max" not in run.metrics


def test_without_the_post_clip_norm(bench, scenario, measured):
    assert measured.metrics["grad_norm_post"][-1] > 0
    with bench._without(("post-clip norm",)):
        run = train(scenario, threads=1)
    assert (run.metrics["grad_norm_post"] == 0).all()


def test_without_sum_of_v(bench, scenario, measured):
    assert measured.metrics["adam_v_norm"][-1] != 1.0
    with bench._without(("sum of v",)):
        run = train(scenario, threads=1)
    assert (run.metrics["adam_v_norm"] == 1.0).all()


def test_without_the_pre_clip_norms(bench, scenario, measured):
    assert max(measured.events[-1].param_grad_norms.values()) > 0
    with bench._without(("pre-clip per-tensor norms",)):
        run = train(scenario, threads=1)
    assert run.events[-1].step == BURST
    assert set(run.events[-1].param_grad_norms.values()) == {0.0}


def test_the_switches_are_undone(bench, scenario, measured):
    with bench._without(bench.ITEMS):
        pass
    run = train(scenario, threads=1)
    assert run.metrics["grad_norm_post"].tolist() == measured.metrics["grad_norm_post"].tolist()
    assert run.metrics["adam_v_norm"].tolist() == measured.metrics["adam_v_norm"].tolist()
    assert "attn_logit_max" in run.metrics
