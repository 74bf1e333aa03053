"""Sabotage suite: deliberately wrong clipping backends, registered only here, and the checks
that must catch each one.

A check that a broken clip still passes guards nothing. Every backend below reports what a
correct clip would report (the pre-clip norm and a plausible scale) but does something else
to the gradients, which is what a buggy kernel looks like from the outside. Each must make

- an engine run fail ``assert_clip_contains`` (the post-clip norm is measured on the
  gradients AdamW receives, never derived from the backend's scale),
- the plugin's summary cell say the clip did not hold,
- the Hypothesis property "the clip holds for every composition" (scenarios/test_fuzz.py)
  find a counterexample through a probe,
- the conformance kit (``check_clip_function``) fail.

The honest torch backend passes every one of these checks on the same runs.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from pytest_spikecheck import (
    BlankDocument,
    MaskPaddingKeys,
    NoClip,
    RareTokenBurst,
    Scenario,
    assert_clip_contains,
    assert_finite,
    train,
)
from pytest_spikecheck.clipping import _registry
from pytest_spikecheck.clipping.torch_backend import BACKEND as TORCH, clip_scale
from pytest_spikecheck.clipping.conformance import ConformanceError, check_clip_function
from pytest_spikecheck.fuzz.strategies import batch_compositions
from pytest_spikecheck.models.config import model_preset
from pytest_spikecheck.report.summary import summarise
from pytest_spikecheck.training.probe import probe_at

MAX_NORM = 1.0
BURST = 25
#: nano model, 30 steps, 8 unseen-script sentences at step 25: the pre-clip norm exceeds 1 on
#: most steps (the clip acts early and often) and spikes at the burst.
SCENARIO = (
    Scenario.preset("phase-19")
    .replace(name="sabotage", steps=30, model=model_preset("nano"))
    .with_breaks(RareTokenBurst(count=8, at_step=BURST))
)


class _Sabotage:
    """Measures like the torch backend and returns its (norm, scale); subclasses break the scaling."""

    name = "sabotage"

    @staticmethod
    def unavailable_reason() -> None:
        return None

    def clip_(self, grads: list[torch.Tensor], max_norm: float) -> tuple[torch.Tensor, torch.Tensor]:
        total = TORCH.total_norm(grads)
        scale = clip_scale(total, max_norm)
        if max_norm != math.inf:
            self.misapply(grads, scale, max_norm)
        return total, scale

    def misapply(self, grads: list[torch.Tensor], scale: torch.Tensor, max_norm: float) -> None:
        raise NotImplementedError

    def scale_(self, grads: list[torch.Tensor], scale: torch.Tensor) -> None:
        self.misapply(grads, scale, math.nan)


class NeverScales(_Sabotage):
    """Computes the right factor and never applies it (the scale kernel returns early)."""

    def misapply(self, grads, scale, max_norm):
        pass


class WrongFactor(_Sabotage):
    """Applies √scale instead of scale (a factor computed from the squared norm)."""

    def misapply(self, grads, scale, max_norm):
        torch._foreach_mul_(grads, scale.sqrt())


class PerTensorWhenAskedGlobal(_Sabotage):
    """Clips each tensor to max_norm on its own: every tensor fits, their sum does not."""

    def misapply(self, grads, scale, max_norm):
        for g in grads:
            norm = torch.linalg.vector_norm(g)
            g.mul_(torch.clamp(max_norm / (norm + 1e-6), max=1.0))


class FirstTensorOnly(_Sabotage):
    """Scales only the first tensor of the table (an off-by-one in the tensor loop)."""

    def misapply(self, grads, scale, max_norm):
        grads[0].mul_(scale)


class LetsNaNThrough(_Sabotage):
    """Measures the norm over the finite values only, so a NaN gradient looks finite and is
    scaled into AdamW instead of stopping the step."""

    def clip_(self, grads, max_norm):
        total = torch.linalg.vector_norm(torch.stack([torch.nan_to_num(g, nan=0.0).norm() for g in grads]))
        scale = clip_scale(total, max_norm)
        torch._foreach_mul_(grads, scale)
        return total, scale


SCALING_SABOTAGE = {
    "never-scales": NeverScales(),
    "wrong-factor": WrongFactor(),
    "per-tensor-when-global": PerTensorWhenAskedGlobal(),
    "first-tensor-only": FirstTensorOnly(),
}
SABOTAGE = {**SCALING_SABOTAGE, "lets-nan-through": LetsNaNThrough()}


@pytest.fixture(scope="module", autouse=True)
def sabotaged_backends():
    """Register the sabotaged backends under their names for this module only."""
    real_load = _registry._load
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_registry, "_load", lambda name: SABOTAGE[name] if name in SABOTAGE else real_load(name))
        yield


@pytest.fixture(scope="module")
def runs() -> dict:
    """One engine run of SCENARIO per backend (the honest torch one included)."""
    return {name: train(SCENARIO, backend=name) for name in ("torch", *SCALING_SABOTAGE)}


def test_the_honest_backend_passes_every_check(runs):
    run = runs["torch"]
    assert (run["clip_factor"] < 1).sum() >= 10, "the scenario must make the clip act on many steps"
    assert_clip_contains(run, max_norm=MAX_NORM)
    assert summarise(run, cached=False).containment.startswith("gradient norm: held")


@pytest.mark.parametrize("name", list(SCALING_SABOTAGE))
def test_a_broken_clip_fails_assert_clip_contains(runs, name):
    run = runs[name]
    assert run.meta["backend"] == name
    # the backend's own report looks like a working clip: the evidence is the measurement
    assert (run["clip_factor"] < 1).any()
    with pytest.raises(AssertionError, match="the clip did not contain the gradient"):
        assert_clip_contains(run, max_norm=MAX_NORM)


@pytest.mark.parametrize("name", list(SCALING_SABOTAGE))
def test_the_summary_says_the_clip_did_not_hold(runs, name):
    assert summarise(runs[name], cached=False).containment.startswith("gradient norm: BROKEN")


def test_nan_let_through_is_caught():
    # A fully masked attention row (an empty document with padding keys masked) gives NaN
    # gradients at step 5 with a finite loss. The honest clip reports a non-finite norm and the
    # engine stops before AdamW; the sabotaged one hides it and steps.
    scenario = (
        Scenario.preset("phase-19")
        .replace(name="nan-through", steps=8, model=model_preset("nano"))
        .with_breaks(MaskPaddingKeys(), BlankDocument(at_step=5), NoClip())
    )
    honest = train(scenario, backend="torch")
    assert honest.meta["stopped_at"] == 5 and honest.meta["stop_reason"] == "non-finite gradient norm"
    broken = train(scenario, backend="lets-nan-through")
    with pytest.raises(AssertionError):
        assert_clip_contains(broken, max_norm=MAX_NORM)
    with pytest.raises(AssertionError):
        assert_finite(broken)


@pytest.mark.parametrize("name", ["torch", *SCALING_SABOTAGE])
def test_the_composition_property_finds_a_broken_clip(name):
    probe = probe_at(SCENARIO, at_step=BURST, backend=name)
    counterexamples = []

    # The property of scenarios/test_fuzz.py, generation only (no shrinking: finding one is the point).
    @settings(
        max_examples=25,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(data=st.data(), max_norm=st.floats(0.05, 2.0))
    def the_clip_contains_every_composition(data, max_norm):
        result = probe(data.draw(batch_compositions(probe)), max_norm=max_norm)
        if not result.grad_norm_post <= max_norm * (1 + 1e-5):
            counterexamples.append((result.grad_norm_post, max_norm))
            raise AssertionError(f"post-clip norm {result.grad_norm_post} > max_norm {max_norm}")

    if name == "torch":
        the_clip_contains_every_composition()
        assert not counterexamples
    else:
        with pytest.raises(AssertionError):
            the_clip_contains_every_composition()
        assert counterexamples


@pytest.mark.parametrize("name", list(SABOTAGE))
def test_the_conformance_kit_rejects_a_broken_clip(name):
    backend = SABOTAGE[name]
    with pytest.raises(ConformanceError):
        check_clip_function(lambda grads, max_norm: backend.clip_(grads, max_norm), max_examples=20)


def test_the_phase19_control_fails_with_a_clip_that_never_scales():
    # Seed A's control exactly as shipped (clip 1.0, 8 unseen sentences at step 312), stopped
    # after 40 steps: warmup already pushes the pre-clip norm past 1, so a clip that never
    # scales leaks there, and the honest clip holds on the same steps.
    from pytest_spikecheck.scenario.presets import PHASE19_BURST_STEP

    control = Scenario.preset("phase-19").with_breaks(RareTokenBurst(count=8, at_step=PHASE19_BURST_STEP))

    def stop_after_40(ctx):
        if ctx.step == 40:
            ctx.stop()

    honest = train(control, backend="torch", callbacks=[stop_after_40])
    assert (honest["clip_factor"] < 1).any(), "the control must clip within its first 40 steps"
    assert_clip_contains(honest, max_norm=MAX_NORM)
    with pytest.raises(AssertionError, match="the clip did not contain the gradient"):
        assert_clip_contains(train(control, backend="never-scales", callbacks=[stop_after_40]), max_norm=MAX_NORM)
