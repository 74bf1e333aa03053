"""The per-rank-norm bug of sharded training, caught: on 2 gloo ranks, ``ShardLocalNorm()``
makes each rank clip its gradient shard to its own shard's norm, and the harness sees the whole
gradient get through above ``max_norm``; the correct sharded clip, on the same batches, holds.

Run with ``pytest --spikecheck scenarios/test_distributed.py`` (two 2-rank launches, ~10 s on
two cores). The runs train on the CPU through ``train(..., nproc=2)`` (the plugin's fixtures
train on one process), with the session's clipping backend and seed.
"""

from __future__ import annotations

import numpy as np
import pytest

from pytest_spikecheck import RareTokenBurst, Scenario, ShardLocalNorm, SpikeCheckError, assert_clip_contains, assert_spike, train

pytestmark = pytest.mark.spikecheck

BURST = 40
MAX_NORM = 1.0
SHORT = Scenario.preset("phase-19").replace(steps=60).with_breaks(RareTokenBurst(count=3, at_step=BURST))


@pytest.fixture(scope="module")
def two_ranks(spikecheck):
    """(global clip, ShardLocalNorm) on 2 gloo ranks, same seed and batches."""
    settings = spikecheck.settings
    scenario = SHORT if settings.seed is None else SHORT.replace(seed=settings.seed)
    # 2 gloo ranks train on the CPU; cupy clips CUDA tensors only, so it stands in with torch.
    backend = "torch" if spikecheck.backend == "cupy" else spikecheck.backend
    kwargs = {"nproc": 2, "backend": backend, "device": "cpu", "threads": settings.threads}
    return (
        train(scenario.replace(name="two_ranks_global_clip"), **kwargs),
        train(scenario.with_breaks(ShardLocalNorm()).replace(name="two_ranks_shard_local_norm"), **kwargs),
    )


def test_the_sharded_global_clip_contains_the_burst(two_ranks):
    global_clip, _ = two_ranks
    assert global_clip.meta["distributed"]["world_size"] == 2
    assert_spike(global_clip, at=BURST, min_ratio=5)  # the data spikes the pre-clip norm ...
    assert_clip_contains(global_clip, max_norm=MAX_NORM)  # ... and the all-reduced norm clips it


def test_shard_local_norm_is_caught(two_ranks):
    global_clip, shard_local = two_ranks
    # Where the whole gradient is over max_norm, the global clip brings it to max_norm ...
    over = global_clip["grad_norm_pre"] > MAX_NORM
    np.testing.assert_allclose(global_clip["grad_norm_post"][over], MAX_NORM, rtol=1e-5)
    # ... while clipping each shard to its own norm never does: the whole gradient stays above.
    over = shard_local["grad_norm_pre"] > MAX_NORM
    assert over.sum() >= 10 and over[BURST - 1]
    assert np.all(shard_local["grad_norm_post"][over] > MAX_NORM * (1 + 1e-5))
    assert shard_local["grad_norm_post"][BURST - 1] > 1.2 * MAX_NORM
    with pytest.raises(SpikeCheckError, match=r"the clip did not contain the gradient: post-clip norm"):
        assert_clip_contains(shard_local, max_norm=MAX_NORM)
