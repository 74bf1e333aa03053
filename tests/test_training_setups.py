"""The engine's step as people train: gradient accumulation (``sampler.accumulation``) and mixed
precision (``amp: {dtype, loss_scale}``), their declared bugs' switches, their records
(``loss_scale``, ``skipped``), probes through them, and the one-line errors of bad input.
Short runs of the nano model (a few tenths of a second each); the shipped scenarios
(``scenarios/test_accumulation.py``, ``scenarios/test_mixed_precision.py``) train Phase-19."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from pytest_spikecheck import (
    AccumulateSum,
    ClipBeforeUnscale,
    ClipEachMicrobatch,
    ConfigError,
    HalfPrecision,
    RareTokenBurst,
    Run,
    Scenario,
    SpikeCheckError,
    assert_accumulation_invariant,
    assert_clip_contains,
    assert_diverges,
    assert_finite,
    assert_overflow_skips,
    train,
)
from pytest_spikecheck.training.probe import probe_at
from pytest_spikecheck.training.step import TrainingStep
from pytest_spikecheck.scenario import ClipSpec

STEPS, BURST = 12, 9
NANO = (
    Scenario.preset("phase-19")
    .replace(name="nano", steps=STEPS, model=Scenario.preset("phase-19").model.__class__(n_layer=2, n_head=2, n_embd=32))
    .with_breaks(RareTokenBurst(count=8, at_step=BURST))
)


@pytest.fixture(scope="module")
def nano_runs():
    return {
        "k1": train(NANO),
        "k4": train(NANO.replace(sampler__accumulation=4)),
        "sum": train(NANO.replace(sampler__accumulation=4).with_breaks(AccumulateSum())),
        "bf16": train(NANO.replace(amp__dtype="bfloat16")),
        "fp16": train(NANO.replace(amp__dtype="float16", amp__loss_scale="dynamic")),
        "fp16_static_2^24": train(NANO.replace(amp__dtype="float16", amp__loss_scale=2.0**24)),
    }


def test_accumulation_is_the_same_step_in_micro_batches(nano_runs):
    one, four = nano_runs["k1"], nano_runs["k4"]
    assert len(four) == STEPS and four.batches == one.batches  # one row and one batch log per optimizer step
    differences = assert_accumulation_invariant(four, one)
    assert differences["loss"] <= 1e-6 and differences["grad_norm_pre"] <= 1e-6
    np.testing.assert_allclose(four["grad_norm_pre"], one["grad_norm_pre"], rtol=1e-4)


def test_accumulate_sum_makes_loss_and_gradient_k_times(nano_runs):
    summed, one = nano_runs["sum"], nano_runs["k1"]
    assert summed["loss"][0] / one["loss"][0] == pytest.approx(4, rel=0.05)
    assert summed["grad_norm_pre"][0] / one["grad_norm_pre"][0] == pytest.approx(4, rel=0.05)
    with pytest.raises(SpikeCheckError, match=r"a factor of 4, as when the micro-batch losses are summed"):
        assert_accumulation_invariant(summed, one)


def test_bf16_autocasts_the_forward_and_keeps_float32_weights(nano_runs):
    bf16, fp32 = nano_runs["bf16"], nano_runs["k1"]
    assert "loss_scale" not in bf16.metrics and not bf16.skipped  # no loss scaling
    assert bf16["loss"][0] != fp32["loss"][0]  # the forward ran in bfloat16 ...
    assert bf16["loss"][0] == pytest.approx(fp32["loss"][0], rel=1e-2)  # ... close to float32's
    assert_finite(bf16)
    assert_clip_contains(bf16, 1.0)


def test_fp16_records_the_loss_scale_and_marks_the_steps_it_skips(nano_runs, tmp_path):
    run = nano_runs["fp16"]
    scales = run["loss_scale"]
    assert scales[0] == 2**16  # torch's default init_scale
    for step, why in run.skipped.items():  # each skip halves the next step's scale
        assert why == "overflow" and not np.isfinite(run["grad_norm_pre"][step - 1])
        assert scales[step] == scales[step - 1] / 2 and run["grad_norm_post"][step - 1] == 0.0
    run.save(tmp_path / "run")
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all("loss_scale" in r and "skipped" in r for r in rows)  # a loss-scaled run says so at every step
    assert Run.load(tmp_path / "run").skipped == run.skipped


def test_a_static_scale_too_high_skips_every_step_and_is_caught(nano_runs):
    run = nano_runs["fp16_static_2^24"]
    assert set(run.skipped) == set(range(1, STEPS + 1)) and np.all(run["loss_scale"] == 2**24)  # static: it never backs off
    finite = assert_finite(run)  # the skipped steps' gradient norms are excused, the losses are finite
    assert len(finite.skipped_steps) == STEPS
    with pytest.raises(SpikeCheckError, match=r"expected the run to diverge"):
        assert_diverges(run)  # a skipped step is no divergence
    with pytest.raises(SpikeCheckError, match=rf"the loss scaler skipped {STEPS} of {STEPS} steps on overflow \(100%"):
        assert_overflow_skips(run)
    # sabotage: the same record without its skip marks fails finiteness at step 1
    unmarked = Run(run.scenario, run.metrics, run.batches, run.events, run.meta)
    with pytest.raises(SpikeCheckError, match=r"non-finite grad_norm_pre at step 1"):
        assert_finite(unmarked)


def test_the_float32_path_runs_no_autocast_and_no_scaler():
    """The default recipe's step is the one it was before accumulation and AMP existed (the
    byte-identity of the seed-42 Phase-19 metrics is checked in the report of issue 23)."""
    model = torch.nn.Linear(2, 2)
    step = TrainingStep(model, torch.optim.SGD(model.parameters(), lr=0.1), sharding=None, backend="torch", clip=ClipSpec())
    assert step.precision.is_float32 and step.accumulation == 1
    assert step.precision.current_scale() != step.precision.current_scale()  # NaN: nothing to read, no host sync
    assert step.precision.unscale(None) is False


def test_a_probe_of_the_real_batch_is_the_engines_step():
    """Through micro-batches and fp16 with a loss scaler: the probe runs the engine's step S."""
    scenario = NANO.replace(sampler__accumulation=2, amp__dtype="float16", amp__loss_scale="dynamic")
    at = 6
    probe = probe_at(scenario, at_step=at)
    run = train(scenario)
    result = probe(probe.real_batch)
    assert (result.loss, result.grad_norm_pre) == (run["loss"][at - 1], run["grad_norm_pre"][at - 1])
    assert probe(probe.real_batch) == result  # the scaler's state is restored with the rest


@pytest.mark.parametrize(
    ("changes", "breaks", "message"),
    [
        ({"sampler__accumulation": 3}, (), "sampler.batch_size 8 is not a multiple of sampler.accumulation 3"),
        ({"sampler__accumulation": 0}, (), "sampler.accumulation must be in \\[1, 65536\\], was 0"),
        ({"sampler__accumulate": "max"}, (), "sampler.accumulate must be mean or sum, was 'max'"),
        ({}, (AccumulateSum(),), "sampler.accumulate sum (AccumulateSum) needs sampler.accumulation >= 2"),
        ({}, (ClipEachMicrobatch(),), "optimizer.clip_when per_microbatch (ClipEachMicrobatch) needs sampler.accumulation >= 2"),
        ({"amp__dtype": "float8"}, (), "amp.dtype must be one of float32, bfloat16, float16, was 'float8'"),
        ({"amp__loss_scale": "dynamic"}, (), "amp.loss_scale needs amp.dtype float16"),
        ({"amp__dtype": "float16", "amp__loss_scale": -1.0}, (), "amp.loss_scale must be in (0, 1e"),
        ({"amp__dtype": "float16", "amp__loss_scale": "dyn"}, (), "amp.loss_scale must be 'dynamic', a number or None"),
        ({"amp__dtype": "bfloat16"}, (HalfPrecision(),), "amp keeps float32 master weights: model.dtype must be float32"),
        (
            {"optimizer__clip_when": "before_unscale"},
            (),
            "optimizer.clip_when before_unscale (ClipBeforeUnscale) needs a loss scale",
        ),
        (
            {"sampler__accumulation": 2, "amp__dtype": "float16", "amp__loss_scale": "dynamic"},
            (ClipEachMicrobatch(),),
            "optimizer.clip_when per_microbatch (ClipEachMicrobatch) is declared without loss scaling",
        ),
    ],
)
def test_bad_accumulation_and_amp_settings_are_one_line_errors(changes, breaks, message):
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        NANO.replace(**changes).with_breaks(*breaks).resolved()


def test_clip_before_unscale_turns_on_fp16_with_dynamic_scaling_unless_scaled_already():
    assert NANO.with_breaks(ClipBeforeUnscale()).resolved().amp.loss_scale == "dynamic"
    assert (
        NANO.replace(amp__dtype="bfloat16", amp__loss_scale=1024.0).with_breaks(ClipBeforeUnscale()).resolved().amp
        == NANO.replace(amp__dtype="bfloat16", amp__loss_scale=1024.0).amp
    )


@pytest.mark.parametrize(
    ("yaml", "message"),
    [
        ("amp: {dtype: float16, loss_scale: abc}", "amp.loss_scale must be 'dynamic', a number (a static scale) or null"),
        ("amp: {dtype: float16, scale: 2}", "unknown key amp.scale; expected one of dtype, loss_scale"),
        ("sampler: {accumulation: 2.5}", "sampler.accumulation must be an integer"),
    ],
)
def test_bad_yaml_is_one_line_naming_the_file(tmp_path, yaml, message):
    path = tmp_path / "config.yaml"
    path.write_text(f"preset: phase-19\n{yaml}\n")
    with pytest.raises(ConfigError, match=f"^{path}: {message.replace('(', '[(]').replace(')', '[)]')}"):
        Scenario.from_yaml(path)


def test_yaml_reads_a_static_scale_written_in_exponent_form(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("preset: phase-19\namp: {dtype: float16, loss_scale: 1e4}\nsampler: {accumulation: 4}\n")
    scenario = Scenario.from_yaml(path)
    assert scenario.amp.loss_scale == 10000.0 and scenario.sampler.accumulation == 4
    assert Scenario.from_yaml(_round_trip(scenario, tmp_path)) == scenario


def _round_trip(scenario, tmp_path):
    path = tmp_path / "again.yaml"
    path.write_text(scenario.to_yaml())
    return path


def test_assert_clip_contains_judges_an_adaptive_clip_against_its_own_limit():
    from pytest_spikecheck import AdaptiveClip

    run = train(NANO.replace(steps=30, sampler__bursts=()).with_breaks(AdaptiveClip()))
    limit, clipped = run["clip_limit"], run["clip_factor"] < 1
    assert clipped[25:].any()  # the EMA's own limit after its 25 warm-up steps (the fixed 1.0 before)
    np.testing.assert_allclose(run["grad_norm_post"][clipped], limit[clipped], rtol=1e-5)
    assert_clip_contains(run, 2.0)  # clipped to each step's own limit, below 2: not over-clipped
    sabotaged = {k: run[k] for k in ("step", "grad_norm_pre", "grad_norm_post")}  # the limit column lost
    with pytest.raises(SpikeCheckError, match=r"^over-clipped at step 1: "):
        assert_clip_contains(sabotaged, 2.0)


class _TwoOptimizers:
    """An optimizer object that is no ``torch.optim.Optimizer``: two of them behind ``param_groups``,
    ``step`` and ``zero_grad`` (as a Muon + AdamW pair is)."""

    def __init__(self, *parts):
        self.parts = parts

    @property
    def param_groups(self):
        return [group for part in self.parts for group in part.param_groups]

    def step(self):
        for part in self.parts:
            part.step()

    def zero_grad(self, set_to_none=True):
        for part in self.parts:
            part.zero_grad(set_to_none=set_to_none)


class _TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.head = torch.nn.Embedding(11, 8), torch.nn.Linear(8, 11)

    def forward(self, x, y):
        logits = self.head(self.embed(x))
        return logits, torch.nn.functional.cross_entropy(logits.float().view(-1, 11), y.view(-1))


@pytest.mark.parametrize(("scale", "skipped"), [(2.0**24, True), (1.0, False)])
def test_the_loss_scaler_works_with_any_optimizer_object(scale, skipped):
    from pytest_spikecheck.training.precision import Precision
    from pytest_spikecheck.training.sharding import SingleProcess

    torch.manual_seed(0)
    model = _TinyLM()
    optimizer = _TwoOptimizers(
        torch.optim.AdamW(model.embed.parameters(), lr=0.1), torch.optim.SGD(model.head.parameters(), lr=0.1)
    )
    precision = Precision(torch.float16, torch.amp.GradScaler("cpu", init_scale=scale), static_scale=scale)
    step = TrainingStep(
        model,
        optimizer,
        SingleProcess(list(model.parameters())),
        backend="torch",
        clip=ClipSpec(),
        accumulation=2,
        precision=precision,
    )
    x, y = torch.randint(0, 11, (4, 5)), torch.randint(0, 11, (4, 5))
    before = [p.detach().clone() for p in model.parameters()]
    outcome = step.forward_backward_clip(1, [0, 1, 2, 3], x, y, lr=0.1, max_norm=1.0)
    assert outcome.overflow is skipped and outcome.loss_scale == scale and math.isfinite(outcome.loss)
    step.update(skip=outcome.overflow)
    changed = [not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters())]
    assert changed == [not skipped] * 3  # both optimizers stepped, or neither
    assert precision.current_scale() == scale  # a static scale stays after the update


def test_every_optimizer_declares_what_it_needs_of_a_sharding():
    """The N-rank path asks each optimizer's OptimizerKind, never its name; an unknown name is one line."""
    from pytest_spikecheck.scenario.sections import OPTIMIZERS
    from pytest_spikecheck.training.optimizers import OPTIMIZER_KINDS, optimizer_kind

    assert tuple(OPTIMIZER_KINDS) == OPTIMIZERS
    assert [(k.elementwise is not None, k.whole_matrices is not None, k.adam_moments) for k in OPTIMIZER_KINDS.values()] == [
        (True, False, True),
        (False, True, True),
        (True, False, False),
    ]
    with pytest.raises(ConfigError, match="optimizer.name must be one of adamw, muon, sgd, was 'adam'"):
        optimizer_kind("adam")
