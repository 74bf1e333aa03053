"""High-learning-rate instabilities (issue 14): the model's qk-layernorm, z-loss and logit
soft-cap, the stats hook and its metric columns, the breaks, LR sweeps and their judgement.
Cheap: the trainings here are a few steps of the nano model."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pytest_spikecheck import (
    ConfigError,
    HighLR,
    LogitSoftcap,
    LRSweep,
    QKLayerNorm,
    Scenario,
    SpikeCheckError,
    ZLoss,
    assert_logits_bounded,
    assert_lr_sensitivity,
    assert_stable_up_to,
    diagnose,
    lr_sensitivity,
    lr_sweep,
    train,
)
from pytest_spikecheck.models.config import GPTConfig, model_preset
from pytest_spikecheck.models.gpt import GPT
from pytest_spikecheck.records.run import MODEL_STAT_KEYS, Run
from pytest_spikecheck.training.step import model_stats


def _tiny(*breaks, steps: int = 2) -> Scenario:
    return Scenario.preset("phase-19").replace(name="tiny", steps=steps, seed=0, model=model_preset("nano")).with_breaks(*breaks)


def _gpt(**options) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=11, **options))


# -- the model ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field,value", [("z_loss", -1e-4), ("z_loss", math.inf), ("logit_softcap", True), ("logit_softcap", math.nan)]
)
def test_bad_model_options_are_one_clear_line(field, value):
    with pytest.raises(ConfigError, match=f"model.{field} must be a finite number >= 0"):
        GPTConfig(**{field: value})


def test_the_attention_logit_stat_is_the_largest_q_dot_k():
    model = _gpt()
    model.record_stats = True
    idx = torch.randint(0, 11, (3, 8))
    model(idx, idx)
    torch.set_grad_enabled(False)  # restored by the fixture below
    attn = model.blocks[0].attn
    q, k, _ = attn.c_attn(model.blocks[0].ln_1(model.wte(idx) + model.wpe(torch.arange(8)))).split(16, dim=2)
    q, k = (t.view(3, 8, 2, 8).transpose(1, 2) for t in (q, k))
    logits = (q @ k.transpose(-2, -1)) / math.sqrt(8)
    stats = model_stats(model)
    assert stats["attn_logit_max"] == pytest.approx(float(logits.abs().max()), rel=1e-6)
    log_z = torch.logsumexp(model(idx)[0], dim=-1)
    assert stats["logz_mean"] == pytest.approx(float(log_z.mean()), rel=1e-5)
    assert stats["logz_absmax"] == pytest.approx(float(log_z.abs().max()), rel=1e-5)


def test_no_stats_unless_the_engine_asks():
    model = _gpt()
    idx = torch.randint(0, 11, (2, 8))
    model(idx, idx)
    assert model.spikecheck_stats == {}


@pytest.fixture(autouse=True)
def _grad_mode_restored():
    yield
    torch.set_grad_enabled(True)


@torch.no_grad()
def test_z_loss_is_added_to_the_loss_and_reported_apart():
    plain, with_z = _gpt(), _gpt(z_loss=1e-2)
    idx = torch.randint(0, 11, (2, 8))
    logits, loss = with_z(idx, idx)
    ce = F.cross_entropy(logits.view(-1, 11), idx.view(-1))
    term = 1e-2 * torch.logsumexp(logits, dim=-1).square().mean()
    assert float(with_z.spikecheck_stats["z_loss"]) == pytest.approx(float(term), rel=1e-6)
    assert float(loss) == pytest.approx(float(ce + term), rel=1e-6)
    assert float(plain(idx, idx)[1]) == pytest.approx(float(ce), rel=1e-6)  # same init: the same cross-entropy


def test_qk_layernorm_bounds_attention_logits_however_large_the_weights():
    model = _gpt(qk_layernorm=True)
    model.record_stats = True
    with torch.no_grad():
        model.blocks[0].attn.c_attn.weight.mul_(1e4)
    idx = torch.randint(0, 11, (2, 8))
    model(idx, idx)
    # |q̂·k̂| <= |q̂||k̂| = head_size with unit gains: / sqrt(8) gives <= sqrt(8)
    assert model_stats(model)["attn_logit_max"] <= math.sqrt(8) + 1e-4
    assert {"blocks.0.attn.q_ln.weight", "blocks.0.attn.k_ln.weight"} <= dict(model.named_parameters()).keys()


@torch.no_grad()
def test_logit_softcap_bounds_the_output_logits():
    model = _gpt(logit_softcap=2.0)
    with torch.no_grad():
        model.lm_head.weight.mul_(1e4)
    logits, _ = model(torch.randint(0, 11, (2, 8)))
    assert float(logits.abs().max()) <= 2.0


# -- the breaks -------------------------------------------------------------------------------


def test_breaks_set_the_switches_and_round_trip_through_yaml(tmp_path):
    scenario = _tiny(HighLR(lr=0.3), QKLayerNorm(), ZLoss(), LogitSoftcap(cap=30))
    r = scenario.resolved()
    assert (r.optimizer.lr, r.model.qk_layernorm, r.model.z_loss, r.model.logit_softcap) == (0.3, True, 1e-4, 30.0)
    path = tmp_path / "config.yaml"
    path.write_text("preset: phase-19\nbreaks:\n  - high_lr: {lr: 3e-1}\n  - qk_layernorm\n  - z_loss: {coefficient: 1e-4}\n")
    loaded = Scenario.from_yaml(path).resolved()
    assert (loaded.optimizer.lr, loaded.model.qk_layernorm, loaded.model.z_loss) == (0.3, True, 1e-4)
    assert Scenario.preset("phase-19").resolved().model.qk_layernorm is False  # presets unchanged


@pytest.mark.parametrize(
    "make", [lambda: HighLR(lr=0), lambda: ZLoss(coefficient=-1), lambda: LogitSoftcap(cap="x"), lambda: HighLR(lr=True)]
)
def test_bad_break_parameters_are_one_clear_line(make):
    with pytest.raises(ConfigError, match="must be a finite number > 0"):
        make()


def test_z_loss_with_several_ranks_is_refused_before_training():
    from pytest_spikecheck.training.distributed import check_distributed_scenario

    with pytest.raises(ConfigError, match="z-loss"):
        check_distributed_scenario(_tiny(ZLoss()).resolved(), 2)


# -- the engine's columns ---------------------------------------------------------------------


def test_runs_record_the_model_stats_and_the_loss_stays_the_cross_entropy(tmp_path):
    plain, with_z = train(_tiny(steps=1)), train(_tiny(ZLoss(coefficient=1e-2), steps=1))
    for run in (plain, with_z):
        assert {"attn_logit_max", "logz_mean", "logz_absmax"} <= run.metrics.keys()
    assert "z_loss" not in plain.metrics and with_z["z_loss"][0] > 1e-3
    # step 1 is the same forward (same init, same batch): the loss column is its cross-entropy
    assert with_z["loss"][0] == pytest.approx(plain["loss"][0], abs=1e-6)
    assert with_z["eval_loss"][0] == pytest.approx(plain["eval_loss"][0], abs=0.05)  # one update apart, no z term
    loaded = Run.load(with_z.save(tmp_path / "run"))
    assert set(MODEL_STAT_KEYS) <= loaded.metrics.keys()
    from pytest_spikecheck.report import write_comparison

    _, files = write_comparison(plain, with_z, tmp_path / "cmp")
    assert (tmp_path / "cmp" / "logits.png") in files and "![logits](logits.png)" in (
        tmp_path / "cmp" / "comparison.md"
    ).read_text()


def test_a_model_without_the_hook_gets_no_stat_columns():
    class Bare(torch.nn.Module):
        def __init__(self, vocab: int) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(vocab, vocab)

        def forward(self, idx, targets=None):
            logits = self.emb(idx)
            return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-100)

    run = train(_tiny(steps=1).replace(model_factory=Bare))
    assert not set(MODEL_STAT_KEYS) & run.metrics.keys()


# -- sweeps and their judgement (numbers, no training) ------------------------------------------


def test_lr_sensitivity_is_wortsmans_definition():
    sweep = LRSweep("recipe", lrs=(1e-3, 1e-2, 1e-1), final_losses=(1.0, 2.0, math.inf), initial=5.0)
    # mean(min(1, 5), min(2, 5), min(inf, 5)) - 1 = 8/3 - 1
    assert lr_sensitivity(sweep) == pytest.approx(8 / 3 - 1)
    assert assert_lr_sensitivity(sweep, max=1.7) == pytest.approx(5 / 3)
    with pytest.raises(SpikeCheckError, match="LR sensitivity 1.667 nats exceeds 1.5"):
        assert_lr_sensitivity(sweep, max=1.5)


def test_stable_up_to():
    sweep = LRSweep("recipe", lrs=(1e-3, 1e-2, 1e-1), final_losses=(1.1, 1.0, 3.0), initial=5.0)
    assert_stable_up_to(sweep, lr=1e-2)
    with pytest.raises(SpikeCheckError, match="lr 0.1 ends at 3.000 nats"):
        assert_stable_up_to(sweep, lr=1e-1)
    with pytest.raises(SpikeCheckError, match="lr 0.001"):
        assert_stable_up_to(sweep, lr=1e-2, within=0.05)
    with pytest.raises(ConfigError, match="no learning rate"):
        assert_stable_up_to(sweep, lr=1e-4)


def test_logits_bounded_on_arrays():
    record = {
        "step": [1, 2, 3],
        "loss": [3.0, 2.0, 1.0],
        "attn_logit_max": [5.0, 900.0, 40.0],
        "logz_absmax": [6.0, 7.0, math.nan],
    }
    assert_logits_bounded(record, attention=1000)
    with pytest.raises(SpikeCheckError, match="attention logit 900 exceeds 100 at step 2"):
        assert_logits_bounded(record, attention=100)
    with pytest.raises(SpikeCheckError, match=r"\|log Z\| nan exceeds 10 at step 3"):
        assert_logits_bounded(record, z=10)
    with pytest.raises(ConfigError, match="no attn_logit_max column"):
        assert_logits_bounded({"step": [1], "loss": [1.0]}, attention=1)


def test_diagnosis_names_attention_logit_growth():
    steps = np.arange(1, 101)
    grad = np.ones(100)
    grad[49] = 50.0
    grown = {"step": steps, "loss": np.full(100, 4.0), "grad_norm_pre": grad, "attn_logit_max": np.where(steps < 40, 5.0, 5200.0)}
    d = diagnose(grown)
    assert d.step == 50 and d.facts["attention_logit_growth"]
    assert "attention logits 5,200 at step 50 (×1,040 since step 10)" in d.text()
    assert "qk-layernorm contains it" in d.verdict
    healthy = dict(grown, attn_logit_max=np.full(100, 12.0))
    assert not diagnose(healthy).facts["attention_logit_growth"]
    # growing 40x but staying small (a healthy run's logits sharpen from ~0.5 early on) is not it either
    assert not diagnose(dict(grown, attn_logit_max=np.where(steps < 40, 0.5, 20.0))).facts["attention_logit_growth"]
    # large from the start is not growth (the rung reports the size; the verdict claims no growth)
    assert not diagnose(dict(grown, attn_logit_max=np.full(100, 5000.0))).facts["attention_logit_growth"]
    assert "qk-layernorm" not in diagnose(healthy).verdict


# -- lr_sweep trains (in this process, two steps each) -------------------------------------------
# Runs on spawned workers are the sweep engine's claim (tests/test_sweep_local.py: spawned workers
# train every point bit-identical to train alone); two workers here cost ~10 CPU-s of torch
# start-up for it again. What lr_sweep adds is checked here: each LR as train trains it, and
# ``processes`` handed to the local executor as its jobs.


def test_lr_sweep_trains_each_lr_as_train_does():
    scenario = _tiny(HighLR(lr=0.5), steps=2)
    sweep = lr_sweep(scenario, lrs=(1e-2, 1e-1), processes=1)
    assert sweep.lrs == (1e-2, 1e-1) and [r.scenario.optimizer.lr for r in sweep.runs] == [1e-2, 1e-1]
    alone = train(scenario.replace(breaks=()).replace(optimizer__lr=1e-1))
    np.testing.assert_array_equal(sweep.runs[1]["loss"], alone["loss"])  # bit-identical to a run of its own
    assert sweep.final_losses[1] == alone["eval_loss"][-1] and sweep.initial == alone["loss"][0]
    with pytest.raises(ConfigError, match="learning rates > 0"):
        lr_sweep(scenario, lrs=(0.0,))


def test_lr_sweep_runs_its_processes_as_the_local_executors_jobs(monkeypatch):
    from pytest_spikecheck.sweep import lr as lr_module

    real, asked = lr_module.sweep, {}

    def in_this_process(plan, **options):
        asked.update(options)
        return real(plan, **{**options, "jobs": 1})

    monkeypatch.setattr(lr_module, "sweep", in_this_process)
    lr_sweep(_tiny(steps=1), lrs=(1e-2, 1e-1), processes=3)
    assert (asked["executor"], asked["jobs"]) == ("local", 2)  # one worker per LR, at most
