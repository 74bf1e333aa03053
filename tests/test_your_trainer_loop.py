"""A plain training loop recorded with ``pytest_spikecheck.record``: the burst injected into its
data spikes, the recorder measures the norms itself, and the run folder is diagnosed and
asserted on like an engine run. Two 40-step runs of the micro GPT (about 1 s)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader
from trainer_data import BATCH, BURST_STEP, MAX_NORM, STEPS, catalog, corpus, one_thread, stream

from pytest_spikecheck import Run, assert_clip_contains, assert_spike, diagnose, record
from pytest_spikecheck.cli import main as cli
from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.scenario import Scenario
from pytest_spikecheck.training.build import build_model
from pytest_spikecheck.training.optimizers import build_optimizer
from pytest_spikecheck.training.schedule import lr_at


def _rows():
    data, _ = corpus()
    return [(torch.from_numpy(data.train.inputs[i]), torch.from_numpy(data.train.targets[i])) for i in range(len(data.pool))]


def train_plain_loop(max_norm: float | None):
    """The user's loop: their model, optimizer, schedule and clip; four recorder calls."""
    data, _ = corpus()
    scenario = Scenario.preset("phase-19")
    torch.manual_seed(0)
    model = build_model(scenario, data.tokenizer.vocab_size, pad_token_id=data.tokenizer.pad_id)
    optimizer = build_optimizer(model, scenario)
    burst = stream(_rows())
    rec = record(model, optimizer, max_norm=max_norm, catalog=catalog(), stream=burst, name="plain-loop")
    reference = []  # torch's own pre-clip norm (clip_grad_norm_ returns it; max_norm inf: no clip)
    for step, (x, y) in enumerate(DataLoader(burst, batch_size=BATCH), 1):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, base_lr=1e-2, total_steps=STEPS, spec=scenario.schedule)
        logits, loss = model(x, y)
        loss.backward()
        with rec.clipping():
            reference.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm or math.inf)))
        optimizer.step()
        rec.step(loss=loss, logits=logits, targets=y)
        optimizer.zero_grad(set_to_none=True)
    return rec.run(), np.array(reference)


@pytest.fixture(scope="module")
def loop_runs():
    with one_thread():
        return {"clip": train_plain_loop(MAX_NORM), "no_clip": train_plain_loop(None)}


@pytest.mark.parametrize("kind", ["clip", "no_clip"])
def test_pre_clip_norm_is_measured_and_matches_torch(loop_runs, kind):
    run, reference = loop_runs[kind]
    assert len(run) == STEPS
    np.testing.assert_allclose(run["grad_norm_pre"], reference, rtol=1e-5)


def test_clipped_run_is_contained_and_post_clip_is_measured(loop_runs):
    run, _ = loop_runs["clip"]
    assert_clip_contains(run, MAX_NORM)
    over = run["grad_norm_pre"] > MAX_NORM
    assert over[BURST_STEP - 1]
    np.testing.assert_allclose(run["grad_norm_post"][over], MAX_NORM, rtol=1e-5)
    np.testing.assert_allclose(run["grad_norm_post"][~over], run["grad_norm_pre"][~over], rtol=1e-5)
    assert np.all(run["clip_factor"][~over] == 1.0) and np.all(run["clip_factor"][over] < 1.0)


def test_unclipped_run_spikes_at_the_burst_and_is_diagnosed(loop_runs, tmp_path, capsys):
    run, _ = loop_runs["no_clip"]
    np.testing.assert_allclose(run["grad_norm_post"], run["grad_norm_pre"], rtol=1e-5)  # measured: untouched
    assert np.all(run["clip_factor"] == 1.0)
    assert_spike(run, at=BURST_STEP, min_ratio=5)
    with pytest.raises(AssertionError, match="did not contain"):
        assert_clip_contains(run, MAX_NORM)
    run.save(tmp_path / "run")
    loaded = Run.load(tmp_path / "run")
    d = diagnose(loaded)
    data, burst = corpus()
    assert d.step == BURST_STEP
    assert sorted(d.facts["injected"]) == sorted(data.pool[i].id for i in burst)
    assert d.facts["burst_samples"] == 3 and d.facts["rare_loss_share"] > 0.5
    assert "no clip" in d.verdict
    event = loaded.event_at(BURST_STEP)
    assert event["kinds"][0] == "burst" and event["adam_surprise"]["share"] > 0
    assert {w["sample"] for w in event["token_losses"]["worst"][:3]} <= set(d.facts["injected"])
    assert cli(["diagnose", str(tmp_path / "run")]) == 0
    assert f"diagnosis at step {BURST_STEP}" in capsys.readouterr().out


def test_inject_burst_plans_the_burst_and_holds_its_samples_out():
    data, burst = corpus()
    planned = stream(_rows())
    batch = planned.batch_at(BURST_STEP)
    assert sorted(i for i in batch if i in burst) == sorted(burst) == sorted(planned.burst_ids)
    elsewhere = [i for k, b in enumerate(planned.plan, 1) if k != BURST_STEP for i in b]
    assert not set(elsewhere) & set(burst)
    assert all(len(b) == BATCH for b in planned.plan) and len(planned.plan) == STEPS
    assert list(planned.sampler()) == planned.indices()


@pytest.mark.parametrize("kwargs, message", [
    ({"samples": [10_000]}, "sample index 10000 is outside the dataset"),
    ({"samples": [1, 2], "count": 3}, "count <= min(len(samples), batch_size)"),
    ({"samples": [1], "at_step": 99}, "1 <= at_step <= steps"),
])
def test_inject_burst_rejects_bad_input_in_one_line(kwargs, message):
    from pytest_spikecheck import inject_burst

    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        inject_burst(list(range(50)), **{"at_step": 5, "batch_size": 8, "steps": 20, **kwargs})


def test_recorder_rejects_a_negative_max_norm():
    with pytest.raises(ConfigError, match="max_norm must be >= 0"):
        record(torch.nn.Linear(2, 2), max_norm=-1.0)
