"""A Hugging Face ``Trainer`` run recorded by ``integrations.hf.SpikecheckCallback``: a tiny
GPT2LMHeadModel (built from a config, nothing downloaded) on our corpus with a Greek burst
injected at step 30, once clipped by the Trainer (max_grad_norm=1) and once not
(max_grad_norm=0, the Trainer's NoClip); then as people run it: gradient_accumulation_steps=4
at micro-batch 2 (the same data order as batch 8), and bf16=True. Four 40-step runs (a few
seconds each), one module fixture."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("transformers", reason="the [hf] extra (transformers, accelerate) is not installed")

import torch  # noqa: E402
from trainer_data import (  # noqa: E402
    BATCH,
    BURST_STEP,
    MAX_NORM,
    STEPS,
    catalog,
    causal_lm_rows,
    corpus,
    one_thread,
    stream,
)
from run_schema import validate_run_folder  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

from pytest_spikecheck import (  # noqa: E402
    Run,
    assert_accumulation_invariant,
    assert_clip_contains,
    assert_finite,
    assert_spike,
    diagnose,
    inject_burst,
)
from pytest_spikecheck.cli import main as cli  # noqa: E402
from pytest_spikecheck.errors import ConfigError  # noqa: E402
from pytest_spikecheck.integrations.hf import SpikecheckCallback  # noqa: E402


def tiny_gpt2() -> GPT2LMHeadModel:
    data, _ = corpus()
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=data.tokenizer.vocab_size,
        n_positions=64,
        n_embd=64,
        n_layer=2,
        n_head=4,
        bos_token_id=data.tokenizer.eos_id,
        eos_token_id=data.tokenizer.eos_id,
        pad_token_id=data.tokenizer.pad_id,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return GPT2LMHeadModel(config)


def arguments(out, max_grad_norm: float, **changes) -> TrainingArguments:
    return TrainingArguments(
        **{
            "output_dir": str(out),
            "max_steps": STEPS,
            "per_device_train_batch_size": BATCH,
            "learning_rate": 1e-2,
            "weight_decay": 0.1,
            "warmup_steps": 10,
            "lr_scheduler_type": "cosine",
            "max_grad_norm": max_grad_norm,
            "logging_steps": 1,
            "save_strategy": "no",
            "report_to": "none",
            "use_cpu": True,
            "seed": 0,
            "disable_tqdm": True,
            "dataloader_num_workers": 0,
            **changes,
        }
    )


def accumulated_stream(accumulation: int):
    """The burst stream for micro-batches of BATCH / accumulation: the same optimizer-step batches
    (same seed, same plan) as the stream of batch BATCH."""
    _, burst = corpus()
    return inject_burst(
        causal_lm_rows(),
        samples=burst,
        at_step=BURST_STEP,
        count=3,
        batch_size=BATCH // accumulation,
        steps=STEPS,
        seed=0,
        accumulation=accumulation,
    )


def train_hf(out, max_grad_norm: float, accumulation: int = 1, **changes) -> Run:
    callback = SpikecheckCallback(out / "run", catalog=catalog(), stream=accumulated_stream(accumulation), name="hf")
    args = arguments(
        out, max_grad_norm, per_device_train_batch_size=BATCH // accumulation, gradient_accumulation_steps=accumulation, **changes
    )
    Trainer(model=tiny_gpt2(), args=args, train_dataset=callback.stream, callbacks=[callback]).train()
    return Run.load(out / "run")


@pytest.fixture(scope="module")
def hf_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf")
    with one_thread():
        return {
            "clip": train_hf(out / "clip", MAX_NORM),
            "no_clip": train_hf(out / "no_clip", 0.0),
            "ga4": train_hf(out / "ga4", MAX_NORM, accumulation=4),
            "bf16": train_hf(out / "bf16", MAX_NORM, bf16=True),
        }


def test_the_stream_of_batch_8_and_the_one_of_4_micro_batches_of_2_plan_the_same_steps():
    assert stream(causal_lm_rows()).plan == accumulated_stream(4).plan


@pytest.mark.parametrize("kind", ["clip", "no_clip", "ga4", "bf16"])
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
    worst = run.event_at(BURST_STEP).token_losses["worst"]
    assert {w["sample"] for w in worst[:3]} <= set(d.facts["injected"])


def test_a_batch_size_other_than_the_streams_is_refused(tmp_path):
    callback = SpikecheckCallback(catalog=catalog(), stream=stream(causal_lm_rows()))
    trainer = Trainer(
        model=tiny_gpt2(),
        args=arguments(tmp_path, 1.0, per_device_train_batch_size=4),
        train_dataset=callback.stream,
        callbacks=[callback],
    )
    with pytest.raises(ConfigError, match="per_device_train_batch_size is 4 but the burst stream plans batches of 8"):
        trainer.train()


def test_accumulation_4_records_the_same_steps_as_batch_8(hf_runs):
    """gradient_accumulation_steps=4 at micro-batch 2 against 1 at 8, on the same data order:
    the Trainer normalises by the step's tokens (num_items_in_batch), so step 1 is the same
    step within float rounding; one row per optimizer step, the burst at its optimizer step."""
    ga4, ga1 = hf_runs["ga4"], hf_runs["clip"]
    differences = assert_accumulation_invariant(ga4, ga1)
    assert differences["loss"] <= 1e-6 and differences["grad_norm_pre"] <= 1e-6
    assert len(ga4) == STEPS and ga4.batches == ga1.batches  # the batch log holds all 4 micro-batches
    assert_clip_contains(ga4, MAX_NORM)
    d = diagnose(ga4)
    data, burst = corpus()
    assert d.step == BURST_STEP and sorted(d.facts["injected"]) == sorted(data.pool[i].id for i in burst)
    assert {w["sample"] for w in ga4.event_at(BURST_STEP).token_losses["worst"][:3]} <= set(d.facts["injected"])


def test_bf16_is_recorded_and_autocast_changed_the_numbers(hf_runs):
    bf16, fp32 = hf_runs["bf16"], hf_runs["clip"]
    assert bf16.meta["recorded"]["precision"] == "bf16 (TrainingArguments)"
    assert bf16["loss"][0] != fp32["loss"][0] and bf16["loss"][0] == pytest.approx(fp32["loss"][0], rel=1e-2)
    assert_finite(bf16)
    assert_clip_contains(bf16, MAX_NORM)
    assert diagnose(bf16).step == BURST_STEP


def test_a_recorded_folder_says_what_it_is(hf_runs, tmp_path, capsys):
    folder = hf_runs["ga4"].folder
    assert not (folder / "config.yaml").exists()  # the engine's defaults would not be this run
    recorded = json.loads((folder / "run.json").read_text())["recorded"]
    assert {
        k: recorded[k] for k in ("trainer", "seed", "lr", "max_grad_norm", "accumulation", "micro_batch_size", "batch_size")
    } == {
        "trainer": "hf",
        "seed": 0,
        "lr": 1e-2,
        "max_grad_norm": MAX_NORM,
        "accumulation": 4,
        "micro_batch_size": 2,
        "batch_size": 8,
    }
    assert recorded["trainer_version"].startswith("transformers ")
    assert cli(["diagnose", str(folder)]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert header == (
        f"hf: recorded from a Hugging Face Trainer ({recorded['trainer_version']}): 40 steps, seed 0, "
        f"lr 0.01, max_grad_norm 1, batch 8 = 4 micro-batches of 2, precision fp32 (TrainingArguments); "
        f"burst at step {BURST_STEP} (3 samples)"
    )
    assert cli(["train", str(folder)]) == 2
    error = capsys.readouterr().err
    assert error == (
        f"spikecheck: error: {folder}: recorded from a Hugging Face Trainer run; retrain it with your "
        f"trainer (spikecheck train trains scenarios: a config.yaml or an experiment directory)\n"
    )


def test_compare_of_two_recorded_runs_labels_them_by_folder_and_says_not_evaluated(hf_runs):
    """What ``spikecheck compare`` prints (its table, without drawing the panels)."""
    from pytest_spikecheck.report import compare

    result = compare(hf_runs["ga4"], hf_runs["clip"])
    assert result.names == ("ga4", "clip")  # both runs are named "hf": told apart by their folders
    lines = result.text().splitlines()
    assert all(line.endswith("not evaluated") for line in lines[2:4])  # no train loss under "final eval loss"
    assert lines[-1] == ("final gap: not measured (ga4 and clip not evaluated; the loss jump and recovery are the train loss's)")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"gradient_accumulation_steps": 4, "per_device_train_batch_size": BATCH},
            "gradient_accumulation_steps is 4 but the burst stream plans 1 micro-batch(es) per optimizer step",
        ),
        ({"max_steps": STEPS + 1}, f"max_steps is {STEPS + 1} but the burst stream plans {STEPS} optimizer steps"),
    ],
)
def test_a_stream_trainer_mismatch_is_refused_before_training(tmp_path, changes, message):
    callback = SpikecheckCallback(catalog=catalog(), stream=stream(causal_lm_rows()))
    trainer = Trainer(
        model=tiny_gpt2(), args=arguments(tmp_path, 1.0, **changes), train_dataset=callback.stream, callbacks=[callback]
    )
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        trainer.train()
    assert trainer.state.global_step == 0  # nothing trained


def test_sabotage_pre_clip_norms_measured_on_the_first_micro_batch_differ_from_the_trainers(tmp_path, monkeypatch):
    """The taps armed for the first micro-batch's backward instead of the last: the recorded
    norm is no longer the accumulated gradient's, and the comparison with the Trainer's own
    grad_norm (the test above) fails."""
    original = SpikecheckCallback.on_train_begin

    def first_micro_batch_only(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.recorder._tap_armed = lambda: self.recorder.gathered == 1

    monkeypatch.setattr(SpikecheckCallback, "on_train_begin", first_micro_batch_only)
    with one_thread():
        callback = SpikecheckCallback(catalog=catalog(), stream=accumulated_stream(4))
        args = arguments(tmp_path, MAX_NORM, per_device_train_batch_size=2, gradient_accumulation_steps=4, max_steps=3)
        Trainer(model=tiny_gpt2(), args=args, train_dataset=callback.stream, callbacks=[callback]).train()
    run = callback.run()
    logged = np.array([run.meta["trainer_grad_norm"][str(s)] for s in run["step"]])
    assert np.abs(run["grad_norm_pre"] / logged - 1).min() > 1e-2


def test_the_trainer_writes_tensorboard_events_under_output_dir_runs(tmp_path):
    """Where the README says they are: ``output_dir/runs/<date>_<host>/`` (transformers 5.24's
    default logging dir), which ``spikecheck check output_dir/runs`` finds one level down."""
    pytest.importorskip("tensorboard", reason="the [tensorboard] extra is not installed")
    import socket

    from pytest_spikecheck.records import read_log

    with one_thread():
        args = arguments(tmp_path, MAX_NORM, max_steps=3, report_to="tensorboard")
        Trainer(model=tiny_gpt2(), args=args, train_dataset=stream(causal_lm_rows())).train()
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.endswith("_" + socket.gethostname()) and list(run_dir.glob("events.out.tfevents.*"))
    record = read_log(tmp_path / "runs")
    assert list(record.metrics["step"]) == [1, 2, 3] and "grad_norm" in record.metrics


# -- the run facts: what the callback observed is what the judges read ------------------------


def test_a_muon_run_recorded_from_the_trainer_is_diagnosed_as_muon_with_its_qk_clip(tmp_path):
    """torch.optim.Muon on GPT-2's hidden matrices (the rest frozen: Muon takes 2-D tensors
    only), QK-Clip's tau declared to the recorder: the facts say muon and tau, and so does the
    diagnosis (it reads the facts, not a made-up scenario)."""
    model = tiny_gpt2()
    hidden = [p for n, p in model.named_parameters() if p.ndim == 2 and ".h." in f".{n}"]
    for p in model.parameters():
        p.requires_grad_(any(p is h for h in hidden))
    callback = SpikecheckCallback(tmp_path / "run", catalog=catalog(), stream=accumulated_stream(1), name="muon", qk_clip=30.0)
    with one_thread():
        Trainer(
            model=model,
            args=arguments(tmp_path, MAX_NORM, max_steps=4),
            train_dataset=callback.stream,
            callbacks=[callback],
            optimizers=(torch.optim.Muon(hidden, lr=0.02), None),
        ).train()
    validate_run_folder(tmp_path / "run")  # a recorded folder is the published format too
    run = Run.load(tmp_path / "run")
    assert run.facts.source == "hf" and run.facts.optimizer == "muon"
    assert [(g.name, g.tensors) for g in run.facts.optimizers] == [("muon", len(hidden))]
    assert run.facts.qk_clip.tau == 30.0 and run.facts.max_norm == MAX_NORM
    d = diagnose(run, step=3)
    assert (d.facts["optimizer"], d.facts["qk_clip_tau"]) == ("muon", 30.0)


def test_a_recorded_adamw_run_is_judged_against_its_own_max_grad_norm(tmp_path):
    """max_grad_norm=0.5 in the TrainingArguments: assert_clip_contains needs no max_norm=."""
    with one_thread():
        run = train_hf(tmp_path / "half", 0.5, max_steps=4)
        unclipped = train_hf(tmp_path / "none", 0.0, max_steps=4)
    assert run.facts.optimizer == "adamw" and run.facts.max_norm == 0.5
    assert run["clip_limit"].tolist() == [0.5] * 4  # written at every step
    assert_clip_contains(run)  # against 0.5: the pre-clip norms are above it
    assert (run["grad_norm_pre"] > 0.5).all()
    with pytest.raises(ConfigError, match="the record says it had no clip"):
        assert_clip_contains(unclipped)
