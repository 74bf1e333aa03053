"""pytest-spikecheck: reproduce gradient spikes on tiny language models and assert the defences hold.

Everything public is importable from here, lazily: ``import pytest_spikecheck`` costs
almost nothing, and the assertions on plain arrays never import torch, cupy or matplotlib.

>>> from pytest_spikecheck import Scenario, NoClip, RareTokenBurst, train, assert_spike  # doctest: +SKIP
>>> run = train(Scenario.preset("phase-19").with_breaks(NoClip(), RareTokenBurst(count=3, at_step=312)))  # doctest: +SKIP
>>> assert_spike(run, at=312, min_ratio=10)  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: public name -> module that defines it (imported on first access)
_EXPORTS = {
    "Scenario": "pytest_spikecheck.scenario",
    "Break": "pytest_spikecheck.breaks",
    "NoClip": "pytest_spikecheck.breaks",
    "ClipAt": "pytest_spikecheck.breaks",
    "RareTokenBurst": "pytest_spikecheck.breaks",
    "StratifiedBatches": "pytest_spikecheck.breaks",
    "MixtureShift": "pytest_spikecheck.breaks",
    "BlankDocument": "pytest_spikecheck.breaks",
    "MaskPaddingKeys": "pytest_spikecheck.breaks",
    "LeftPadding": "pytest_spikecheck.breaks",
    "LayerNormEps0": "pytest_spikecheck.breaks",
    "HalfPrecision": "pytest_spikecheck.breaks",
    "NoWarmup": "pytest_spikecheck.breaks",
    "NoWeightDecay": "pytest_spikecheck.breaks",
    "SkipSpikes": "pytest_spikecheck.breaks",
    "AdaptiveClip": "pytest_spikecheck.breaks",
    "ShardLocalNorm": "pytest_spikecheck.breaks",
    "Run": "pytest_spikecheck.run",
    "train": "pytest_spikecheck.engine",
    "SpikeCheckError": "pytest_spikecheck.errors",
    "ConfigError": "pytest_spikecheck.errors",
    "assert_spike": "pytest_spikecheck.assertions",
    "assert_no_spike": "pytest_spikecheck.assertions",
    "assert_clip_contains": "pytest_spikecheck.assertions",
    "assert_recovers": "pytest_spikecheck.assertions",
    "assert_diverges": "pytest_spikecheck.assertions",
    "assert_finite": "pytest_spikecheck.assertions",
    "assert_no_lockin": "pytest_spikecheck.assertions",
    "diagnose": "pytest_spikecheck.diagnosis",
    "get_detector": "pytest_spikecheck.detectors",
    "clip_grad_norm_": "pytest_spikecheck.clipping",
    "spikecheck_scenario": "pytest_spikecheck.fixtures",
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
