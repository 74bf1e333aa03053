"""The data every "your trainer" test trains on: Seed A's Phase-19 corpus plus three Greek
burst sentences, as a user would hold it (a plain list of rows), with the burst injected by
``inject_burst`` at step BURST_STEP of STEPS. A plain module (see short_runs.py for why)."""

from __future__ import annotations

from contextlib import contextmanager
from functools import lru_cache

import numpy as np
import torch

from pytest_spikecheck import RareTokenBurst, SampleCatalog, Scenario, inject_burst
from pytest_spikecheck.data.dataset import build_dataset
from pytest_spikecheck.models.config import IGNORE_INDEX

BURST_STEP, STEPS, BATCH, MAX_NORM = 30, 40, 8, 1.0


@lru_cache(maxsize=1)
def corpus():
    """(dataset, burst indices): our pool, whose last three rows are the Greek burst sentences."""
    scenario = Scenario.preset("phase-19").with_breaks(RareTokenBurst(count=3, at_step=BURST_STEP)).resolved()
    data = build_dataset(scenario)
    return data, list(data.burst_members[0])


def catalog() -> SampleCatalog:
    data, burst = corpus()
    return SampleCatalog.from_tokens(
        list(data.train.targets),
        vocab_size=data.tokenizer.vocab_size,
        ids=[s.id for s in data.pool],
        sources=[s.source for s in data.pool],
        token_str=data.tokenizer.token,
        rarity_excludes=burst,
    )


def stream(rows):
    _, burst = corpus()
    return inject_burst(rows, samples=burst, at_step=BURST_STEP, count=3, batch_size=BATCH, steps=STEPS, seed=0)


def causal_lm_rows() -> list[dict[str, np.ndarray]]:
    """Rows for a Hugging Face causal LM (``labels`` shifted inside the model): the first input
    token, then our targets, so the model is trained to predict exactly our targets."""
    data, _ = corpus()
    full = np.concatenate([data.train.inputs[:, :1], data.train.targets], axis=1)
    input_ids = np.where(full == IGNORE_INDEX, data.tokenizer.pad_id, full)
    return [{"input_ids": input_ids[i], "labels": full[i]} for i in range(len(full))]


@contextmanager
def one_thread():
    """Train on one torch thread, as the plugin does (two threads on a shared 2-core machine
    run these tiny models many times slower), then restore the caller's setting."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
