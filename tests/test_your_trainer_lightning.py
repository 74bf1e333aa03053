"""A Lightning run recorded by ``integrations.lightning.SpikecheckCallback``: the micro GPT in a
LightningModule on our corpus with a Greek burst injected at step 30, once with Lightning's
own clip (gradient_clip_val=1) and once without (gradient_clip_val=None, Lightning's NoClip),
and with accumulate_grad_batches=2 at micro-batch 4 (the same data order). Three 40-step runs
(a few seconds each)."""

from __future__ import annotations


import numpy as np
import pytest

pytest.importorskip("lightning", reason="the [lightning] extra is not installed")

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.utilities import grad_norm  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from trainer_data import BATCH, BURST_STEP, MAX_NORM, STEPS, catalog, corpus, one_thread, stream  # noqa: E402

from pytest_spikecheck import (  # noqa: E402
    Run,
    SpikeCheckError,
    assert_accumulation_invariant,
    assert_clip_contains,
    assert_spike,
    diagnose,
    inject_burst,
)
from pytest_spikecheck.errors import ConfigError  # noqa: E402
from pytest_spikecheck.integrations.lightning import SpikecheckCallback  # noqa: E402
from pytest_spikecheck.scenario import Scenario  # noqa: E402
from pytest_spikecheck.training.build import build_model  # noqa: E402
from pytest_spikecheck.training.optimizers import build_optimizer  # noqa: E402
from pytest_spikecheck.training.schedule import lr_at  # noqa: E402

pytestmark = [
    # Lightning's advice for real workloads, irrelevant to a 40-step in-memory run
    pytest.mark.filterwarnings("ignore:.*does not have many workers:UserWarning"),
    # Lightning 2.6.6 still uses torch's LeafSpec, which torch 2.13 deprecates (theirs to fix)
    pytest.mark.filterwarnings("ignore:.*isinstance\\(treespec, LeafSpec\\).*:FutureWarning"),
]


class TinyLM(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        data, _ = corpus()
        self.scenario = Scenario.preset("phase-19")
        torch.manual_seed(0)
        self.gpt = build_model(self.scenario, data.tokenizer.vocab_size, pad_token_id=data.tokenizer.pad_id)
        self.lightning_grad_norm: list[float] = []  # Lightning's own utility, as its docs use it

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits, loss = self.gpt(x, y)
        return {"loss": loss, "logits": logits.detach(), "targets": y}

    def on_before_optimizer_step(self, optimizer):
        self.lightning_grad_norm.append(float(grad_norm(self, norm_type=2)["grad_2.0_norm_total"]))

    def configure_optimizers(self):
        optimizer = build_optimizer(self.gpt, self.scenario)
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda k: lr_at(k + 1, base_lr=1.0, total_steps=STEPS, spec=self.scenario.schedule)
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def _rows():
    data, _ = corpus()
    return [(torch.from_numpy(data.train.inputs[i]), torch.from_numpy(data.train.targets[i])) for i in range(len(data.pool))]


def accumulated_stream(accumulation: int):
    _, burst = corpus()
    return inject_burst(
        _rows(),
        samples=burst,
        at_step=BURST_STEP,
        count=3,
        batch_size=BATCH // accumulation,
        steps=STEPS,
        seed=0,
        accumulation=accumulation,
    )


def lightning_trainer(callback, clip: float | None = MAX_NORM, **options) -> pl.Trainer:
    return pl.Trainer(
        **{
            "max_steps": STEPS,
            "gradient_clip_val": clip,
            "accelerator": "cpu",
            "devices": 1,
            "logger": False,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "callbacks": [callback],
            **options,
        }
    )


def train_lightning(out, clip: float | None, accumulation: int = 1):
    callback = SpikecheckCallback(out, catalog=catalog(), stream=accumulated_stream(accumulation), name="lightning")
    module = TinyLM()
    lightning_trainer(callback, clip, accumulate_grad_batches=accumulation).fit(
        module, DataLoader(callback.stream, batch_size=BATCH // accumulation)
    )
    return Run.load(out), np.array(module.lightning_grad_norm)


@pytest.fixture(scope="module")
def lightning_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("lightning")
    with one_thread():
        return {
            "clip": train_lightning(out / "clip", MAX_NORM),
            "no_clip": train_lightning(out / "no_clip", None),
            "accumulate_2": train_lightning(out / "accumulate_2", MAX_NORM, accumulation=2),
        }


@pytest.mark.parametrize("kind", ["clip", "no_clip", "accumulate_2"])
def test_pre_clip_norm_matches_lightnings_grad_norm(lightning_runs, kind):
    run, reference = lightning_runs[kind]
    assert len(run) == STEPS
    np.testing.assert_allclose(run["grad_norm_pre"], reference, rtol=1e-5)


def test_clipped_twin_is_contained_by_lightnings_clip(lightning_runs):
    run, _ = lightning_runs["clip"]
    assert run.scenario is None and run.facts.max_norm == MAX_NORM and run.facts.source == "lightning"
    assert run.facts.optimizer == "adamw" and run.facts.amp_dtype == "float32" and run.facts.world_size == 1
    assert_clip_contains(run, MAX_NORM)
    over = run["grad_norm_pre"] > MAX_NORM
    assert over[BURST_STEP - 1]
    np.testing.assert_allclose(run["grad_norm_post"][over], MAX_NORM, rtol=1e-5)


def test_unclipped_run_spikes_at_the_burst_and_names_the_injected_samples(lightning_runs):
    run, _ = lightning_runs["no_clip"]
    assert run.facts.clip.kind == "none" and run.facts.max_norm is None
    np.testing.assert_allclose(run["grad_norm_post"], run["grad_norm_pre"], rtol=1e-5)  # measured: untouched
    assert np.all(run["clip_factor"] == 1.0)
    assert_spike(run, at=BURST_STEP, min_ratio=5)
    d = diagnose(run)
    data, burst = corpus()
    assert d.step == BURST_STEP
    assert sorted(d.facts["injected"]) == sorted(data.pool[i].id for i in burst)
    assert d.facts["rare_loss_share"] > 0.5 and "no clip" in d.verdict


def test_accumulate_grad_batches_is_recorded_per_optimizer_step(lightning_runs):
    run, _ = lightning_runs["accumulate_2"]
    assert len(run) == STEPS and run.meta["recorded"]["accumulation"] == 2 and run.meta["trainer"] == "lightning"
    batch = run.batch_at(BURST_STEP)
    assert len(batch["samples"]) == BATCH and batch["burst_samples"] == 3  # both micro-batches of the step
    assert_clip_contains(run, MAX_NORM)
    d = diagnose(run)
    data, burst = corpus()
    assert d.step == BURST_STEP and sorted(d.facts["injected"]) == sorted(data.pool[i].id for i in burst)


def test_lightning_accumulates_the_mean_of_the_micro_batch_means(lightning_runs):
    """Measured: Lightning divides each micro-batch's mean loss by accumulate_grad_batches, so
    with micro-batches of different token counts (padding) its step is not accumulation 1's:
    step 1's gradient norm differs by ~0.7 %, far beyond float rounding. The invariance
    assertion catches what HF's num_items_in_batch normalisation avoids."""
    two, one = lightning_runs["accumulate_2"][0], lightning_runs["clip"][0]
    assert 1e-3 < abs(two["grad_norm_pre"][0] / one["grad_norm_pre"][0] - 1) < 3e-2
    assert 1e-5 < abs(two["loss"][0] / one["loss"][0] - 1) < 1e-3  # the loss it backpropagated: the mean of means
    with pytest.raises(
        SpikeCheckError,
        match=r"^accumulation changed the step-1 loss: \S+ \(accumulation 2\) vs \S+ "
        r"\(accumulation 1\), \S+ apart \(rtol 0\.0001",
    ):
        assert_accumulation_invariant(two, one)
    with pytest.raises(SpikeCheckError, match=r"^accumulation changed the step-1 grad_norm_pre: "):
        assert_accumulation_invariant(two, one, rtol=1e-3)  # the loss within 1e-3, the gradient not


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"accumulate_grad_batches": 2}, "accumulate_grad_batches is 2 but the burst stream plans 1 micro-batch(es)"),
        ({"max_steps": STEPS + 5}, f"max_steps is {STEPS + 5} but the burst stream plans {STEPS} optimizer steps"),
        ({"max_steps": -1, "max_epochs": 2}, "give the Trainer max_steps (at most the burst stream's 40) or max_epochs=1"),
    ],
)
def test_a_stream_trainer_mismatch_is_refused_before_training(options, message):
    callback = SpikecheckCallback(catalog=catalog(), stream=stream(_rows()))
    module = TinyLM()
    trainer = lightning_trainer(callback, **options)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        trainer.fit(module, DataLoader(callback.stream, batch_size=BATCH))
    assert trainer.global_step == 0 and module.lightning_grad_norm == []  # nothing trained
