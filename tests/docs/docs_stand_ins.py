"""What the documented snippets assume the reader already has: their model, optimizer, data,
log file, kernels. A block names what it uses in a first comment line (``# assumes: model,
optimizer, ...``, visible on the page) and the docs test gives it exactly those
(tests/docs/docs_harness.py). Each stand-in is small, so the snippets run in seconds."""

from __future__ import annotations

import types
from functools import lru_cache

#: Files a block may assume, laid into the page's sandbox: the reader's path -> ours.
FILES = {
    "output/trainer_state.json": "tests/data/logs/hf/trainer_state_healthy.json"  # your Trainer's log
}


def make_model(vocab_size: int, width: int = 32):
    """A reader's model: a one-layer causal LM, forward(idx, targets) -> (logits, loss)."""
    import torch
    from torch import nn

    from pytest_spikecheck import IGNORE_INDEX

    class TinyLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab_size, width)
            self.mix = nn.Linear(width, width)
            self.head = nn.Linear(width, vocab_size)

        def forward(self, idx, targets=None):
            h = self.embed(idx)
            h = h + torch.cumsum(h, dim=1) / torch.arange(1, idx.shape[1] + 1, device=idx.device)[None, :, None]
            logits = self.head(torch.tanh(self.mix(h)))
            if targets is None:
                return logits
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)
            return logits, loss

    return TinyLM()


#: A reader's own texts: short sentences, the last 96 their eval set.
my_documents = [
    f"the {animal} {verb} over the {thing} number {i}."
    for i, (animal, verb, thing) in enumerate(
        (a, v, t)
        for a in ("cat", "dog", "fox", "owl")
        for v in ("jumps", "runs", "looks")
        for t in ("wall", "fence", "river", "hill", "road", "gate", "field", "bridge")
    )
]
my_documents = my_documents * 3


def _base():
    from pytest_spikecheck import RareTokenBurst, Scenario

    # a reader's own scenario: short, so a sweep of it trains in seconds
    return Scenario.preset("phase-19").replace(steps=60).with_breaks(RareTokenBurst(count=3, at_step=40))


BASE = _base()


@lru_cache(maxsize=1)
def _trainer_world():
    """The "Your trainer" snippet's world: Seed A's corpus as token rows with three Greek
    burst sentences (``rare_ids``), the tokenizer, and a small model with its optimizer."""
    import torch

    from pytest_spikecheck import RareTokenBurst, Scenario
    from pytest_spikecheck.data.dataset import build_dataset

    data = build_dataset(Scenario.preset("phase-19").with_breaks(RareTokenBurst(count=3, at_step=30)).resolved())
    rows = [(torch.from_numpy(data.train.inputs[i]), torch.from_numpy(data.train.targets[i])) for i in range(len(data.pool))]
    return data, rows


def __getattr__(name: str):
    """The loop's names, built on first use (the tokenizer and corpus take a moment)."""
    import torch

    data, rows = _trainer_world()
    world = {
        "dataset": rows,
        "rare_ids": list(data.burst_members[0]),
        "token_lists": list(data.train.targets),
        "V": data.tokenizer.vocab_size,
        "names": [s.id for s in data.pool],
        "tok": types.SimpleNamespace(decode=lambda ids: data.tokenizer.token(ids[0])),
        "loss_fn": lambda logits, y: torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100),
    }
    if name in ("model", "optimizer"):
        torch.manual_seed(0)
        model = make_model(data.tokenizer.vocab_size)
        world["model"], world["optimizer"] = model, torch.optim.AdamW(model.parameters(), lr=1e-2)
        globals().update(model=model, optimizer=world["optimizer"])
    if name in world:
        return world[name]
    raise AttributeError(name)


def _my_kernels():
    """A reader's clipping kernel: ours (the torch backend), as another repo would import its own."""
    from pytest_spikecheck import clipping

    return types.SimpleNamespace(clip_grad_norm=lambda grads, max_norm: clipping.get_backend("torch").clip_(grads, max_norm))


my_kernels = types.SimpleNamespace(clip_grad_norm=lambda grads, max_norm: _my_kernels().clip_grad_norm(grads, max_norm))
