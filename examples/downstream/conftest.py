"""The scenarios this repo checks, shared by every test module (as fixtures)."""

from pytest_spikecheck import ClipAt, NoClip, RareTokenBurst, Scenario, spikecheck_scenario

#: Phase-19's data and optimizer, our own model (by import path, so saved runs retrain it), a
#: short run, and 8 never-seen sentences in the batch of step 40.
BASE = (
    Scenario.preset("phase-19")
    .replace(steps=60, model_factory="tinylm:make_model", model_kwargs={"width": 32})
    .with_breaks(RareTokenBurst(count=8, at_step=40))
)


@spikecheck_scenario
def control():
    """The burst with the preset's clip (max_norm 1.0)."""
    return BASE


@spikecheck_scenario
def no_clip():
    """The same batches without clipping."""
    return BASE.with_breaks(NoClip())


@spikecheck_scenario(params=[0.25, 0.5])
def clipped(max_norm):
    """The burst under tighter clips: runs clipped[0.25] and clipped[0.5]."""
    return BASE.with_breaks(ClipAt(max_norm=max_norm))
