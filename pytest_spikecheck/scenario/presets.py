"""Named scenarios. One source of truth for Seed A's Phase-19 set-up (the experiments'
YAML files start from ``preset: phase-19`` and add only their breaks)."""

from __future__ import annotations

from pytest_spikecheck.models.config import model_preset
from pytest_spikecheck.scenario.preset_registry import register_preset
from pytest_spikecheck.scenario.sections import DataSpec, OptimizerSpec, SamplerSpec, ScheduleSpec
from pytest_spikecheck.scenario.spec import Scenario

#: The step at which Seed A's break spikes; the Phase-19 bursts are placed there.
PHASE19_BURST_STEP = 312


@register_preset("phase-19")
def _phase19() -> Scenario:
    return Scenario(
        name="phase-19",
        model=model_preset("micro"),
        data=DataSpec(corpus="phase19", n_sentences=240, eval_sentences=96, vocab_size=384),
        sampler=SamplerSpec(kind="shuffle", batch_size=8),
        optimizer=OptimizerSpec(name="adamw", lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1, grad_clip=1.0),
        schedule=ScheduleSpec(name="cosine", warmup_steps=20, min_lr_ratio=0.1),
        steps=500,
        seed=42,
    )


@register_preset("seed-b")
def _seed_b() -> Scenario:
    """Seed B's set-up at our scale: the three-source mixture (docs, prose, Q&A; 80 samples
    each) with fixed uniform weights, Seed A's model and optimizer. Add ``MixtureShift`` for
    the bandit."""
    return _phase19().replace(name="seed-b", data__corpus="mixture", sampler__kind="mixture")
