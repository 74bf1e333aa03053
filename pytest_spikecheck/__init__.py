"""pytest-spikecheck: reproduce gradient spikes on tiny language models and assert the defences hold.

Everything public is importable from here, lazily: ``import pytest_spikecheck`` costs
almost nothing, and the assertions on plain arrays never import torch, cupy or matplotlib.

>>> from pytest_spikecheck import Scenario, NoClip, RareTokenBurst, train, assert_spike  # doctest: +SKIP
>>> run = train(Scenario.preset("phase-19").with_breaks(NoClip(), RareTokenBurst(count=3, at_step=312)))  # doctest: +SKIP
>>> assert_spike(run, at=312, min_ratio=10)  # doctest: +SKIP

The layers, top to bottom (a module imports only from layers below it; ``lint-imports``
enforces this in the test command, see ``[tool.importlinter]`` in pyproject.toml and
docs/architecture.md):

    cli | plugin                  the spikecheck command; the pytest plugin, its session and fixtures
    fuzz | sweep | integrations   Hypothesis strategies, the worst-batch search; sweeps of many runs (local or Ray);
                                  recording your own trainer (plain loop, Hugging Face, Lightning) and bursts in your data
    training | report             the engine, probes, N ranks (torch), the run store; panels, comparisons, the
                                  summary's Markdown and the HTML page (matplotlib when drawing)
    judge                         detectors, analysis, diagnosis, assertions (numpy only)
    records                       Run, Record, log readers (numpy only)
    clipping | data               clipping backends (torch, cupy, emulator) and their conformance kit;
                                  corpus, tokenizer, samplers
    scenario                      Scenario, breaks, presets, YAML (no torch)
    models | kernels              the tiny GPT and its config; the CUDA sources
    errors | progress             exceptions; progress bars and lines

No module here uses a plain ``assert`` (checks raise ``SpikeCheckError`` or ``ConfigError`` with
their own messages), so the package asks pytest not to rewrite it: PYTEST_DONT_REWRITE. Without
that, whether pytest registered the package for rewriting before importing it depended on how
pytest was launched (an editable install is found through its metadata only when the source tree
is on ``sys.path``, as under ``python -m pytest``), and a pytester session run in process then
failed under ``filterwarnings = error`` with "Module already imported so cannot be rewritten".
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.2.0"

#: public name -> module that defines it (imported on first access)
_EXPORTS = {
    "Scenario": "pytest_spikecheck.scenario",
    "Break": "pytest_spikecheck.scenario",
    "NoClip": "pytest_spikecheck.scenario.breaks",
    "ClipAt": "pytest_spikecheck.scenario.breaks",
    "RareTokenBurst": "pytest_spikecheck.scenario.breaks",
    "StratifiedBatches": "pytest_spikecheck.scenario.breaks",
    "MixtureShift": "pytest_spikecheck.scenario.breaks",
    "BlankDocument": "pytest_spikecheck.scenario.breaks",
    "MaskPaddingKeys": "pytest_spikecheck.scenario.breaks",
    "LeftPadding": "pytest_spikecheck.scenario.breaks",
    "LayerNormEps0": "pytest_spikecheck.scenario.breaks",
    "HalfPrecision": "pytest_spikecheck.scenario.breaks",
    "NoWarmup": "pytest_spikecheck.scenario.breaks",
    "NoWeightDecay": "pytest_spikecheck.scenario.breaks",
    "SkipSpikes": "pytest_spikecheck.scenario.breaks",
    "AdaptiveClip": "pytest_spikecheck.scenario.breaks",
    "ShardLocalNorm": "pytest_spikecheck.scenario.breaks",
    "HighLR": "pytest_spikecheck.scenario.breaks",
    "QKLayerNorm": "pytest_spikecheck.scenario.breaks",
    "ZLoss": "pytest_spikecheck.scenario.breaks",
    "LogitSoftcap": "pytest_spikecheck.scenario.breaks",
    "QKClip": "pytest_spikecheck.scenario.breaks",
    "GatedAttention": "pytest_spikecheck.scenario.breaks",
    "ClipBeforeUnscale": "pytest_spikecheck.scenario.breaks",
    "ClipEachMicrobatch": "pytest_spikecheck.scenario.breaks",
    "AccumulateSum": "pytest_spikecheck.scenario.breaks",
    "ClipMuonUpdate": "pytest_spikecheck.scenario.breaks",
    "ClipInfToLog": "pytest_spikecheck.scenario.breaks",
    "SkipStepCounter": "pytest_spikecheck.scenario.breaks",
    "Run": "pytest_spikecheck.records.run",
    "train": "pytest_spikecheck.training.launch",
    "SpikeCheckError": "pytest_spikecheck.errors",
    "ConfigError": "pytest_spikecheck.errors",
    "ClipBeforeUnscaleWarning": "pytest_spikecheck.errors",
    "Verdict": "pytest_spikecheck.judge.verdict",
    "assert_spike": "pytest_spikecheck.judge.assertions",
    "assert_no_spike": "pytest_spikecheck.judge.assertions",
    "assert_clip_contains": "pytest_spikecheck.judge.assertions",
    "assert_recovers": "pytest_spikecheck.judge.assertions",
    "assert_diverges": "pytest_spikecheck.judge.assertions",
    "assert_finite": "pytest_spikecheck.judge.assertions",
    "assert_no_lockin": "pytest_spikecheck.judge.assertions",
    "assert_accumulation_invariant": "pytest_spikecheck.judge.setup_checks",
    "assert_overflow_skips": "pytest_spikecheck.judge.setup_checks",
    "assert_clip_keeps_finite": "pytest_spikecheck.judge.update_checks",
    "assert_muon_update_scale": "pytest_spikecheck.judge.update_checks",
    "assert_optimizer_steps": "pytest_spikecheck.judge.update_checks",
    "diagnose": "pytest_spikecheck.judge.diagnosis",
    "LRSweep": "pytest_spikecheck.judge.sweeps",
    "lr_sensitivity": "pytest_spikecheck.judge.sweeps",
    "assert_lr_sensitivity": "pytest_spikecheck.judge.sweeps",
    "assert_stable_up_to": "pytest_spikecheck.judge.sweeps",
    "assert_logits_bounded": "pytest_spikecheck.judge.qk_clip",
    "assert_qk_clip_contains": "pytest_spikecheck.judge.qk_clip",
    "lr_sweep": "pytest_spikecheck.sweep",
    "Sweep": "pytest_spikecheck.sweep",
    "SweepResult": "pytest_spikecheck.sweep",
    "get_detector": "pytest_spikecheck.judge.detectors",
    "clip_grad_norm_": "pytest_spikecheck.clipping",
    "SpikecheckBackendWarning": "pytest_spikecheck.clipping",
    "spikecheck_scenario": "pytest_spikecheck.plugin.fixtures",
    "IGNORE_INDEX": "pytest_spikecheck.models.config",
    "record": "pytest_spikecheck.integrations.recorder",
    "Recorder": "pytest_spikecheck.integrations.recorder",
    "SampleCatalog": "pytest_spikecheck.integrations.recorder",
    "inject_burst": "pytest_spikecheck.integrations.burst",
    "assert_preflight": "pytest_spikecheck.preflight.result",
    "PreflightResult": "pytest_spikecheck.preflight.result",
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_spikecheck' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # cache: the next access is a plain attribute lookup
    return value


def __dir__() -> list[str]:
    return __all__
