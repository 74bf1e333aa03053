"""A Hugging Face ``Trainer`` run recorded by ``integrations.hf.SpikecheckCallback``: a tiny
GPT2LMHeadModel (built from a config, nothing downloaded) on our corpus with a Greek burst
injected at step 30, once clipped by the Trainer (max_grad_norm=1) and once not
(max_grad_norm=0, the Trainer's NoClip). Two 40-step runs (a few seconds)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers", reason="the [hf] extra (transformers, accelerate) is not installed")

import torch  # noqa: E402
from trainer_data import (  # noqa: E402
    BATCH, BURST_STEP, MAX_NORM, STEPS, catalog, causal_lm_rows, corpus, one_thread, stream,
)
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

from pytest_spikecheck import Run, assert_clip_contains, assert_spike, diagnose  # noqa: E402
from pytest_spikecheck.errors import ConfigError  # noqa: E402
from pytest_spikecheck.integrations.hf import SpikecheckCallback  # noqa: E402


def tiny_gpt2() -> GPT2LMHeadModel:
    data, _ = corpus()
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=data.tokenizer.vocab_size, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                        bos_token_id=data.tokenizer.eos_id, eos_token_id=data.tokenizer.eos_id,
                        pad_token_id=data.tokenizer.pad_id, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config)


def arguments(out, max_grad_norm: float, **changes) -> TrainingArguments:
    return TrainingArguments(**{
        "output_dir": str(out), "max_steps": STEPS, "per_device_train_batch_size": BATCH, "learning_rate": 1e-2,
        "weight_decay": 0.1, "warmup_steps": 10, "lr_scheduler_type": "cosine", "max_grad_norm": max_grad_norm,
        "logging_steps": 1, "save_strategy": "no", "report_to": "none", "use_cpu": True, "seed": 0,
        "disable_tqdm": True, "dataloader_num_workers": 0, **changes})


def train_hf(out, max_grad_norm: float) -> Run:
    callback = SpikecheckCallback(out / "run", catalog=catalog(), stream=stream(causal_lm_rows()), name="hf")
    trainer = Trainer(model=tiny_gpt2(), args=arguments(out, max_grad_norm), train_dataset=callback.stream,
                      callbacks=[callback])
    trainer.train()
    return Run.load(out / "run")


@pytest.fixture(scope="module")
def hf_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf")
    with one_thread():
        return {"clip": train_hf(out / "clip", MAX_NORM), "no_clip": train_hf(out / "no_clip", 0.0)}


@pytest.mark.parametrize("kind", ["clip", "no_clip"])
def test_pre_clip_norm_matches_the_trainers_own(hf_runs, kind):
    """The Trainer logs clip_grad_norm_'s return, computed by torch (float32), independently
    of our float64 measurement in backward: they agree, and the Trainer's number is pre-clip."""
    run = hf_runs[kind]
    logged = run.meta["trainer_grad_norm"]
    assert len(run) == STEPS and len(logged) == STEPS
    np.testing.assert_allclose(run["grad_norm_pre"], [logged[str(s)] for s in run["step"]], rtol=1e-5)


def test_clipped_twin_is_contained_on_measured_norms(hf_runs):
    run = hf_runs["clip"]
    assert_clip_contains(run, MAX_NORM)
    over = run["grad_norm_pre"] > MAX_NORM
    assert over[BURST_STEP - 1]
    np.testing.assert_allclose(run["grad_norm_post"][over], MAX_NORM, rtol=1e-5)
    assert diagnose(run, BURST_STEP).facts["clip_factor"] < 1


def test_unclipped_run_spikes_at_the_burst_and_names_the_injected_samples(hf_runs):
    run = hf_runs["no_clip"]
    np.testing.assert_allclose(run["grad_norm_post"], run["grad_norm_pre"], rtol=1e-5)  # measured: untouched
    assert np.all(run["clip_factor"] == 1.0)
    assert_spike(run, at=BURST_STEP, min_ratio=5)  # 8.0x measured
    d = diagnose(run)
    data, burst = corpus()
    assert d.step == BURST_STEP
    assert sorted(d.facts["injected"]) == sorted(data.pool[i].id for i in burst)
    assert d.facts["rare_loss_share"] > 0.5 and "no clip" in d.verdict
    worst = run.event_at(BURST_STEP)["token_losses"]["worst"]
    assert {w["sample"] for w in worst[:3]} <= set(d.facts["injected"])


def test_a_batch_size_other_than_the_streams_is_refused(tmp_path):
    callback = SpikecheckCallback(catalog=catalog(), stream=stream(causal_lm_rows()))
    trainer = Trainer(model=tiny_gpt2(), args=arguments(tmp_path, 1.0, per_device_train_batch_size=4),
                      train_dataset=callback.stream, callbacks=[callback])
    with pytest.raises(ConfigError, match="per_device_train_batch_size is 4 but the burst stream plans batches of 8"):
        trainer.train()
