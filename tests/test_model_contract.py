"""Your own model (``Scenario(model_factory=...)``): given as a callable or an import path, it is
checked when built (one-line errors), model-level breaks reach it through its hook or are
refused, and a saved run records it so that ``spikecheck train run/config.yaml`` retrains it."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import torch

from pytest_spikecheck import (
    IGNORE_INDEX,
    ConfigError,
    GatedAttention,
    LayerNormEps0,
    LeftPadding,
    MaskPaddingKeys,
    NoClip,
    QKLayerNorm,
    Run,
    Scenario,
    SpikeCheckError,
    assert_no_lockin,
    train,
)
from pytest_spikecheck.cli import main
from pytest_spikecheck.training.build import build_model

TINY = Scenario.preset("phase-19").replace(steps=6)

MODELS = '''
import torch
import torch.nn.functional as F


class LogitsOnly(torch.nn.Module):
    """forward(idx) -> logits: the engine computes the loss."""

    def __init__(self, vocab_size, width=8):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab_size, width)
        self.head = torch.nn.Linear(width, vocab_size)

    def forward(self, idx):
        return self.head(self.emb(idx))


class NanoGPTStyle(LogitsOnly):
    """nanoGPT's loss: ignore_index=-1, so the engine's padding targets (-100) index out of range."""

    def forward(self, idx, targets=None):
        logits = super().forward(idx)
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


class WithHook(LogitsOnly):
    configured = None

    def spikecheck_configure(self, **settings):
        type(self).configured = settings


def make(vocab_size, width=8):
    return LogitsOnly(vocab_size, width)


def nano(vocab_size):
    return NanoGPTStyle(vocab_size)


def hooked(vocab_size):
    return WithHook(vocab_size)


def three_outputs(vocab_size):
    class Three(LogitsOnly):
        def forward(self, idx, targets=None):
            logits = super().forward(idx)
            return logits, None, None
    return Three(vocab_size)
'''


@pytest.fixture
def models(tmp_path, monkeypatch):
    (tmp_path / "my_models.py").write_text(textwrap.dedent(MODELS))
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib
    import sys

    sys.modules.pop("my_models", None)
    return importlib.import_module("my_models")


def test_ignore_index_is_torchs_default():
    assert IGNORE_INDEX == -100 == torch.nn.CrossEntropyLoss().ignore_index


def test_a_logits_only_model_given_by_import_path_trains_and_its_saved_run_reproduces(models, tmp_path):
    scenario = TINY.replace(model_factory="my_models:make", model_kwargs={"width": 8}).with_breaks(NoClip())
    assert scenario.name == "phase-19+steps=6+model=my_models:make(width=8)+no_clip"
    run = train(scenario)
    assert len(run) == 6 and np.isfinite(run["loss"]).all()
    assert (
        repr(run) == f"Run({scenario.name!r}, 6 steps, {len(run.events)} event records, content hash {run.meta['content_hash']})"
    )
    with pytest.raises(SpikeCheckError, match=r"built-in GPT only, and this run trained your own model \(my_models:make\)"):
        assert_no_lockin(run)
    run.save(tmp_path / "run")
    loaded = Run.load(tmp_path / "run")
    assert loaded.scenario.model_factory == "my_models:make" and dict(loaded.scenario.model_kwargs) == {"width": 8}
    assert loaded.scenario.content_hash() == run.meta["content_hash"] == scenario.content_hash()
    assert main(["train", str(tmp_path / "run" / "config.yaml"), "--out", str(tmp_path / "again"), "--quiet"]) == 0
    again = Run.load(tmp_path / "again")
    np.testing.assert_array_equal(again["loss"], run["loss"])
    assert again.meta["content_hash"] == run.meta["content_hash"]


def test_the_callable_and_its_import_path_are_the_same_scenario(models):
    assert TINY.replace(model_factory=models.make).content_hash() == TINY.replace(model_factory="my_models:make").content_hash()


def test_the_yaml_form_of_a_model_factory(models, tmp_path):
    (tmp_path / "config.yaml").write_text("preset: phase-19\nsteps: 6\nmodel: {factory: 'my_models:make', kwargs: {width: 4}}\n")
    scenario = Scenario.from_yaml(tmp_path / "config.yaml")
    assert scenario.model_factory == "my_models:make" and dict(scenario.model_kwargs) == {"width": 4}


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        ("my_models:nano", r"failed on targets holding IGNORE_INDEX \(-100, padding\): compute the loss with ignore_index="),
        ("my_models:three_outputs", r"forward must return logits or \(logits, loss\), returned tuple of length 3"),
        ("my_models:missing", r"module 'my_models' has no attribute 'missing'"),
        ("no_such_module_here:make", r"cannot import 'no_such_module_here'"),
    ],
)
def test_contract_violations_are_one_line_errors_when_the_model_is_built(models, factory, message):
    with pytest.raises(ConfigError, match=message) as info:
        build_model(TINY.replace(model_factory=factory), vocab_size=50)
    assert "\n" not in str(info.value)


def test_bad_factory_arguments_are_refused_at_construction_or_build(models):
    with pytest.raises(ConfigError, match="import path 'package.module:function'"):
        TINY.replace(model_factory="my_models.make")
    with pytest.raises(ConfigError, match=r"factory\(vocab_size, \*\*model_kwargs\)"):
        build_model(TINY.replace(model_factory="my_models:make", model_kwargs={"depth": 3}), vocab_size=50)


@pytest.mark.parametrize(
    "breaks", [(LayerNormEps0(),), (MaskPaddingKeys(), LeftPadding()), (QKLayerNorm(),), (GatedAttention(),)]
)
def test_model_level_breaks_need_the_hook(models, breaks):
    with pytest.raises(ConfigError, match="has no spikecheck_configure"):
        build_model(TINY.replace(model_factory="my_models:make").with_breaks(*breaks).resolved(), vocab_size=50)


def test_the_built_in_models_switches_are_refused_with_your_own_model(models):
    with pytest.raises(ConfigError, match=r"model.arch 'llama' picks a built-in model, and the scenario trains your own"):
        build_model(TINY.replace(model_factory="my_models:make", model__arch="llama").resolved(), vocab_size=50)


def test_model_level_breaks_reach_a_model_with_the_hook(models):
    build_model(
        TINY.replace(model_factory="my_models:hooked").with_breaks(MaskPaddingKeys()).resolved(), vocab_size=50, pad_token_id=3
    )
    assert models.WithHook.configured == {"mask_padding": True, "pad_token_id": 3}


def test_a_data_level_break_needs_no_hook(models):
    build_model(TINY.replace(model_factory="my_models:make").with_breaks(LeftPadding()).resolved(), vocab_size=50)
