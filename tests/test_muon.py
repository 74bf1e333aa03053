"""``optimizer.name: adamw | muon | sgd`` (pytest_spikecheck.training.optimizers): the role rule that
decides Muon's matrices, q/k/v orthogonalised separately, the one optimizer object the engine
gets, the schedule on both parts, and every path that trains through it (the CLI, probes,
lr_sweep). Cheap: the trainings here are a few steps of the nano shapes."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from pytest_spikecheck import ConfigError, QKClip, Scenario, lr_sweep, train
from pytest_spikecheck.cli import main
from pytest_spikecheck.models.config import GPTConfig
from pytest_spikecheck.models.gpt import GPT
from pytest_spikecheck.models.llama import Llama
from pytest_spikecheck.training.optimizers import OptimizerSet, build_optimizer, muon_matrices, set_learning_rate
from pytest_spikecheck.training.probe import Probe, _torch_threads


def _nano(arch: str = "gpt", **optimizer) -> Scenario:
    return Scenario.preset("phase-19").replace(
        name=f"nano-{arch}",
        steps=3,
        seed=0,
        model=GPTConfig(arch=arch, n_layer=2, n_head=2, n_embd=32),
        **{f"optimizer__{k}": v for k, v in {"name": "muon", "lr": 0.2, "weight_decay": 0.0, **optimizer}.items()},
    )


def _model(arch: str) -> torch.nn.Module:
    torch.manual_seed(0)
    config = GPTConfig(arch=arch, n_layer=2, n_head=2, n_embd=32, block_size=8, vocab_size=50)
    return (Llama if arch == "llama" else GPT)(config)


# -- the role rule ---------------------------------------------------------------------------


def test_muon_takes_the_gpts_hidden_matrices_and_splits_the_fused_qkv():
    chosen = {m.name: m.blocks for m in muon_matrices(_model("gpt"), _nano())}
    assert chosen == {
        f"blocks.{i}.{n}": (3 if n == "attn.c_attn.weight" else 1)
        for i in (0, 1)
        for n in ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
    }


def test_muon_takes_the_llamas_projections_never_embeddings_head_or_norms():
    chosen = {m.name for m in muon_matrices(_model("llama"), _nano("llama"))}
    assert chosen == {
        f"blocks.{i}.{n}.weight"
        for i in (0, 1)
        for n in ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
    }


@pytest.mark.parametrize(
    "arch, vocab",
    [("gpt", 96), ("gpt", 128), ("llama", 32)],
    ids=["gpt-vocab-of-qkv-rows", "gpt-vocab-of-mlp-rows", "llama-vocab-of-the-width"],
)
def test_a_hidden_matrix_as_tall_as_the_vocabulary_stays_muons(arch, vocab):
    # The head is the layer that makes the logits, not any matrix with a vocabulary-sized side:
    # at vocabulary 96 the GPT's fused q/k/v (96 x 32) has as many rows, at 128 its MLP's c_fc,
    # at 32 every square matrix of the Llama.
    torch.manual_seed(0)
    config = GPTConfig(arch=arch, n_layer=2, n_head=2, n_embd=32, block_size=8, vocab_size=vocab)
    model = (Llama if arch == "llama" else GPT)(config)
    expected = {m.name for m in muon_matrices(_model(arch), _nano(arch))}
    assert {m.name for m in muon_matrices(model, _nano(arch))} == expected


class _Custom(torch.nn.Module):
    """A custom model: raw-parameter embedding, tied head, one hidden matrix."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(vocab, 16) * 0.02)
        self.hidden = torch.nn.Linear(16, 16)
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, idx):
        return self.norm(self.hidden(self.table[idx])) @ self.table.T


def test_the_role_rule_finds_a_custom_models_head_structurally_and_the_pattern_overrides_it():
    run = train(_nano().replace(model_factory=_Custom))  # the engine builds it: vocab from the tokenizer
    assert run.meta["parameters"] > 0 and not run.stopped_early
    from pytest_spikecheck.training.model_contract import build_custom_model

    model = build_custom_model(_nano().replace(model_factory=_Custom).resolved(), 50, -1)
    assert [m.name for m in muon_matrices(model, _nano())] == ["hidden.weight"]  # not the vocab-sized table
    with pytest.raises(ConfigError, match=r"muon_params 'hidden.bias' matches hidden.bias of shape \(16,\): Muon takes 2-D"):
        muon_matrices(model, _nano(muon_params="hidden.bias"))
    with pytest.raises(ConfigError, match="muon_params 'nothing' matches no trainable parameter"):
        muon_matrices(model, _nano(muon_params="nothing"))
    assert [m.name for m in muon_matrices(model, _nano(muon_params="table"))] == ["table"]


def test_a_model_where_the_rule_finds_nothing_is_one_line():
    class OnlyEmbedding(torch.nn.Module):
        def __init__(self, vocab: int) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(vocab, vocab)

        def forward(self, idx):
            return self.emb(idx)

    with pytest.raises(ConfigError, match="the role rule found no hidden 2-D matrix in OnlyEmbedding .* optimizer.muon_params"):
        train(_nano().replace(model_factory=OnlyEmbedding))


# -- the optimizer object ----------------------------------------------------------------------


def test_q_k_and_v_are_orthogonalised_separately():
    """One Muon step from zero momentum: each block of the fused c_attn moves as torch's Muon moves
    that block alone, not as the orthogonalised fused matrix would."""
    model = _model("gpt")
    optimizer = build_optimizer(model, _nano().resolved())
    assert isinstance(optimizer, OptimizerSet) and set(optimizer.parts) == {"muon", "adamw"}
    weight = model.blocks[0].attn.c_attn.weight
    torch.manual_seed(1)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    before, grad = weight.detach().clone(), weight.grad.clone()
    optimizer.step()
    for rows in (slice(0, 32), slice(32, 64), slice(64, 96)):
        alone = torch.nn.Parameter(before[rows].clone())
        alone.grad = grad[rows].clone()
        torch.optim.Muon([alone], lr=0.2, weight_decay=0.0).step()
        torch.testing.assert_close(weight.detach()[rows], alone.detach(), rtol=0, atol=0)
    fused = torch.nn.Parameter(before.clone())
    fused.grad = grad.clone()
    torch.optim.Muon([fused], lr=0.2, weight_decay=0.0).step()
    assert not torch.allclose(weight.detach(), fused.detach(), atol=1e-4)
    optimizer.zero_grad()
    assert weight.grad is None and all(p.grad is None for p in model.parameters())


def test_the_schedule_scales_both_parts_and_the_state_is_one_mapping():
    model = _model("llama")
    optimizer = build_optimizer(model, _nano("llama", adamw_lr=3e-3).resolved())
    set_learning_rate(optimizer, 0.1)  # half of Muon's peak 0.2: the AdamW part gets half of its 3e-3
    lrs = {name: sorted({g["lr"] for g in part.param_groups}) for name, part in optimizer.parts.items()}
    assert lrs == {"muon": [0.1], "adamw": [pytest.approx(1.5e-3)]}
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    optimizer.step()
    assert all(p in optimizer.state for p in model.parameters())
    assert "momentum_buffer" in optimizer.state[model.blocks[0].attn.q_proj.weight]
    assert "exp_avg_sq" in optimizer.state[model.wte.weight] and optimizer.state[torch.zeros(1)] == {}
    loaded = build_optimizer(model, _nano("llama").resolved())
    loaded.load_state_dict(optimizer.state_dict())
    assert set(loaded.state_dict()) == {"muon", "adamw"}


def test_the_default_optimizer_is_the_plain_adamw_it_always_was():
    optimizer = build_optimizer(_model("gpt"), Scenario.preset("phase-19").resolved())
    assert type(optimizer) is torch.optim.AdamW and len(optimizer.param_groups) == 2


@pytest.mark.parametrize("arch", ["gpt", "llama"])
@pytest.mark.parametrize("name", ["muon", "sgd"])
def test_every_optimizer_trains_both_models(arch, name):
    run = train(_nano(arch, name=name, lr=0.2 if name == "muon" else 0.5, momentum=0.9))
    assert np.isfinite(run["loss"]).all() and run["loss"][-1] < run["loss"][0]
    assert run.scenario.optimizer.name == name
    # Σv is the AdamW part's under Muon, none under SGD
    assert (run["adam_v_norm"] > 0).all() if name == "muon" else (run["adam_v_norm"] == 0).all()


def test_spikecheck_train_of_a_llama_with_muon_records_attention_logits(tmp_path, capsys):
    config = tmp_path / "config.yaml"
    config.write_text(
        "preset: phase-19\nsteps: 3\nmodel: {arch: llama, n_embd: 32, n_head: 2}\n"
        "optimizer: {name: muon, lr: 0.2, weight_decay: 0}\n"
    )
    assert main(["train", str(config), "--out", str(tmp_path / "run"), "--quiet"]) == 0
    rows = [line for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if line]
    assert len(rows) == 3 and all('"attn_logit_max": ' in row for row in rows)
    assert "arch: llama" in (tmp_path / "run" / "config.yaml").read_text()


@pytest.mark.parametrize(
    "yaml,message",
    [
        ("optimizer: {name: lion}", "optimizer.name must be one of adamw, muon, sgd, was 'lion'"),
        (
            "optimizer: {name: muon, adjust_lr_fn: foo}",
            "optimizer.adjust_lr_fn must be one of original, match_rms_adamw, was 'foo'",
        ),
        ("optimizer: {momentum: 1.0}", r"optimizer.momentum must be in \[0, 1\), was 1.0"),
        ("optimizer: {adamw_lr: 0}", "optimizer.adamw_lr must be in \\(0, 1e\\+06\\], was 0.0"),
        ("optimizer: {muon_params: '(unclosed'}", r"optimizer.muon_params '\(unclosed' is not a regular expression"),
        ("breaks: [{qk_clip: {tau: 0}}]", "QKClip tau must be a finite number > 0, was 0"),
        ("breaks: [{qk_clip: {tau: .nan}}]", "QKClip tau must be a finite number > 0, was nan"),
        ("breaks: [{qk_clip: {tau: -5}}]", "QKClip tau must be a finite number > 0, was -5"),
        ("breaks: [{qk_clip: {alpha: 2}}]", r"QKClip alpha must be a number in \[0, 1\], was 2"),
        ("optimizer: {qk_clip: 0}", "optimizer.qk_clip must be in \\(0, 1e\\+30\\], was 0.0"),
        ("model: {arch: llama, n_kv_head: 3}", r"model.n_kv_head \(3\) must divide model.n_head \(4\)"),
        ("model: {arch: llama, pos_embedding: learned}", "model.pos_embedding learned does not go with arch llama"),
    ],
)
def test_bad_optimizer_and_model_input_is_one_line_before_training(tmp_path, capsys, yaml, message):
    config = tmp_path / "config.yaml"
    config.write_text(f"preset: phase-19\n{yaml}\n")
    assert main(["train", str(config), "--out", str(tmp_path / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(message, err), err
    assert not (tmp_path / "run").exists()


def test_the_yaml_round_trip_keeps_the_new_fields_and_breaks(tmp_path):
    from pytest_spikecheck import GatedAttention

    scenario = (
        _nano("llama", adjust_lr_fn="match_rms_adamw", adamw_lr=3e-3)
        .replace(model__n_kv_head=1)
        .with_breaks(QKClip(tau=30, per_head=False), GatedAttention())
    )
    path = tmp_path / "c.yaml"
    path.write_text(scenario.to_yaml())
    loaded = Scenario.from_yaml(path)
    assert loaded.content_hash() == scenario.content_hash()
    r = loaded.resolved()
    assert (r.optimizer.qk_clip, r.optimizer.qk_clip_per_head, r.model.attn_gate, r.model.n_kv_head) == (30.0, False, True, 1)
    named = Scenario.preset("phase-19").with_breaks(QKClip(tau=30, per_head=False), GatedAttention())
    assert named.name == "phase-19+qk_clip(30,per-layer)+gated_attention"


# -- every path that trains: probes, lr_sweep --------------------------------------------------


@pytest.mark.parametrize("arch,name", [("gpt", "muon"), ("llama", "muon"), ("llama", "sgd")])
def test_the_probe_replays_a_step_with_qk_clip_bit_for_bit(arch, name):
    scenario = _nano(arch, name=name, lr=0.4).replace(steps=6).with_breaks(QKClip(tau=1e-3))  # it clips every step
    seen = {}

    def at_step_5(ctx) -> None:
        if ctx.step == 5:
            seen["weights"] = [p.detach().clone() for p in ctx.model.parameters()]

    run = train(scenario, callbacks=[at_step_5])
    probe = Probe(scenario, at_step=5)
    result = probe(probe.real_batch)
    assert result.loss == run["loss"][4] and result.grad_norm_pre == run["grad_norm_pre"][4]
    assert run["qk_clipped_heads"][4] > 0
    # the probe restored step 4's state; replay step 5 once more (one thread, as the engine) and compare the weights
    batch = list(probe.real_batch)
    with _torch_threads(probe.threads):
        probe._trainer.forward_backward_clip(
            5, batch, probe._inputs[batch], probe._targets[batch], lr=probe.lr, max_norm=probe.scenario.max_norm
        )
        probe._trainer.update()
    for after, expected in zip(probe.model.parameters(), seen["weights"]):
        assert torch.equal(after.detach(), expected)
    probe._restore()
    assert probe(probe.real_batch) == result  # and the probe still restores the momenta and AdamW's moments


def test_lr_sweep_sweeps_muons_lr_on_the_llama():
    sweep = lr_sweep(_nano("llama").replace(steps=2), lrs=(0.05, 0.2), processes=1)
    assert [r.scenario.optimizer.lr for r in sweep.runs] == [0.05, 0.2]
    assert {r.scenario.optimizer.adamw_lr for r in sweep.runs} == {1e-2}  # the AdamW part keeps its own lr
    assert all(math.isfinite(x) for x in sweep.final_losses)


def test_the_diagnosis_of_an_sgd_run_says_there_are_no_adam_moments():
    from pytest_spikecheck import RareTokenBurst, diagnose

    run = train(_nano(name="sgd", lr=0.5).replace(steps=4).with_breaks(RareTokenBurst(count=3, at_step=3)))
    lines = dict(diagnose(run, step=3).lines)
    assert lines["6 Adam v"] == "the optimizer keeps no Adam moments (SGD)"
    per_head = np.asarray(run.event_at(3).attn_logit_max_per_head)  # the event records the per-head logits
    assert per_head.shape == (2, 2) and per_head.max() == pytest.approx(run["attn_logit_max"][2], rel=1e-6)


def test_a_loss_scaler_unscales_the_stacked_matrices_muon_reads_at_its_step():
    """GradScaler.unscale_ walks the optimizer's groups before the step: the fused c_attn, which
    Muon reads through views only at the step, must be among them, unscaled once."""
    model = _model("gpt")
    optimizer = build_optimizer(model, _nano().resolved())
    idx = torch.randint(0, 50, (2, 8))
    _, loss = model(idx, idx)
    loss.backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    optimizer.zero_grad()
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    _, loss = model(idx, idx)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-5, atol=1e-8, msg=name)


def test_muon_trains_under_fp16_loss_scaling_and_accumulation():
    run = train(
        _nano("llama")
        .replace(steps=3, sampler__accumulation=2, amp__dtype="float16", amp__loss_scale="dynamic")
        .with_breaks(QKClip(tau=1e-3))
    )
    assert np.isfinite(run["loss"]).all() and "loss_scale" in run.metrics and run["qk_clipped_heads"].max() > 0
