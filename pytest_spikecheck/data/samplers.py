"""Batch plans: which pool samples form the batch of each step, decided before training.

Planning every batch up front makes "same seed, same batches" between a control and a
break trivially true and lets the run record each batch's composition. Three behaviours
compose:

* **shuffle**: the rotation (corpus samples not held out) is served in epochs, each a
  fresh permutation from the seed.
* **bursts**: a burst's samples are held out of the rotation until its step, then fill
  ``count`` slots of that batch; held-out corpus samples (*written*) rejoin the rotation
  at the next epoch, fresh burst sentences never recur.
* **stratified**: at most ``rare_cap`` rare samples per batch; extra rare samples (from the
  rotation or a burst) wait for the next batches. Seed A's deeper fix.
* **mixture**: Seed B's bandit. Each step's batch draws its per-source counts from the
  phase's source weights (multinomial), and each source serves its own shuffled epochs.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Callable, Sequence

import numpy as np

from pytest_spikecheck.scenario import MixtureSpec, SamplerSpec


def mixture_weights(spec: MixtureSpec, sources: Sequence[str], *, steps: int, seed: int) -> list[dict[str, float]]:
    """The bandit's source weights at every step (index k is step k + 1): one Dirichlet draw
    per phase, phase lengths drawn from ``spec.phase_lengths`` (none: uniform throughout)."""
    names = list(dict.fromkeys(sources))
    if not spec.phase_lengths:
        active = [n for n in names if n != spec.new_source]
        return [{n: (1 / len(active) if n in active else 0.0) for n in names}] * steps
    rng = np.random.default_rng([seed, 0x5EED_B])
    weights: list[dict[str, float]] = []
    introduced = spec.new_source is None
    while len(weights) < steps:
        length = int(rng.choice(spec.phase_lengths))
        start = len(weights) + 1
        if not introduced and start >= spec.new_source_at:
            # The bandit meets a new arm and tries it alone for one phase: the shock.
            phase = {n: float(n == spec.new_source) for n in names}
            introduced = True
        else:
            active = [n for n in names if introduced or n != spec.new_source]
            draw = rng.dirichlet([spec.concentration] * len(active))
            phase = {n: 0.0 for n in names} | {n: float(w) for n, w in zip(active, draw)}
        weights.extend([phase] * length)
    return weights[:steps]


def _plan_mixture(spec: SamplerSpec, steps: int, seed: int, sources: Sequence[str]) -> list[list[int]]:
    weights = mixture_weights(spec.mixture, sources, steps=steps, seed=seed)
    names = list(dict.fromkeys(sources))
    members = {n: [i for i, src in enumerate(sources) if src == n] for n in names}
    rng = np.random.default_rng([seed, 0xBA7C4])
    streams: dict[str, deque[int]] = {n: deque() for n in names}
    batches = []
    for step_weights in weights:
        p = np.array([step_weights[n] for n in names])
        counts = rng.multinomial(spec.batch_size, p / p.sum())
        batch: list[int] = []
        for name, count in zip(names, counts):
            stream, repeats = streams[name], []
            while count > 0:
                if not stream:
                    stream.extend(int(i) for i in rng.permutation(members[name]))
                item = stream.popleft()
                if item in batch and len(members[name]) >= count + len(repeats) + 1:
                    repeats.append(item)  # a new epoch began inside the batch: no sample twice
                    continue
                batch.append(item)
                count -= 1
            stream.extendleft(reversed(repeats))
        batches.append(batch)
    return batches


def plan_batches(
    spec: SamplerSpec,
    *,
    steps: int,
    seed: int,
    n_corpus: int,
    burst_members: dict[int, tuple[int, ...]],
    is_rare: Callable[[int], bool],
    sources: Sequence[str] | None = None,
) -> list[list[int]]:
    """Return ``steps`` batches (lists of pool indices); batch ``k`` is used at step ``k + 1``.
    ``sources`` (the source of each pool sample) is needed by the mixture sampler."""
    if spec.kind == "mixture":
        if sources is None:
            raise ValueError("the mixture sampler needs each pool sample's source")
        if spec.bursts:
            raise ValueError("bursts are not supported with the mixture sampler; use MixtureShift(new_source=...)")
        return _plan_mixture(spec, steps, seed, list(sources)[:n_corpus])
    rng = random.Random(f"batches-{seed}")
    held_out = {i for members in burst_members.values() for i in members if i < n_corpus}
    rotation = [i for i in range(n_corpus) if i not in held_out]
    if len(rotation) < spec.batch_size:
        raise ValueError(f"only {len(rotation)} samples in rotation for a batch of {spec.batch_size}")
    stream: deque[int] = deque()
    waiting: deque[int] = deque()  # samples due but deferred (stratified cap), served first
    due: dict[int, list[int]] = {}
    for k, burst in enumerate(spec.bursts):
        chosen = list(burst_members[k])
        if burst.content == "written":
            chosen = random.Random(f"burst-{seed}-{k}").sample(chosen, min(burst.count, len(chosen)))
        due.setdefault(burst.at_step, []).extend(chosen[: burst.count])
    rejoin = sorted(held_out)
    cap = spec.rare_cap if spec.kind == "stratified" else spec.batch_size

    def refill() -> None:
        epoch = list(rotation)
        rng.shuffle(epoch)
        stream.extend(epoch)

    batches: list[list[int]] = []
    for step in range(1, steps + 1):
        if step in due:
            waiting.extendleft(reversed(due.pop(step)))
        batch: list[int] = []
        rare_in_batch = 0
        deferred: list[int] = []
        for source in (waiting, stream):
            while len(batch) < spec.batch_size:
                if not source:
                    if source is waiting:
                        break
                    refill()
                item = source.popleft()
                if item in batch:
                    # An epoch boundary inside the batch can bring back a sample it already
                    # holds: it waits for the next batch instead of appearing twice.
                    deferred.append(item)
                    continue
                if is_rare(item) and rare_in_batch >= cap:
                    deferred.append(item)
                    if source is stream and len(deferred) > 4 * spec.batch_size:
                        raise ValueError("stratified sampler cannot fill a batch: too many rare samples for rare_cap")
                    continue
                rare_in_batch += is_rare(item)
                batch.append(item)
        waiting.extendleft(reversed(deferred))
        batches.append(batch)
        if rejoin and any(b.at_step == step for b in spec.bursts):
            # Held-out corpus samples join the rotation once their burst has passed.
            first_burst = min(b.at_step for b in spec.bursts)
            if step == first_burst:
                rotation.extend(rejoin)
                rejoin = []
    return batches


def batch_composition(
    batch: Sequence[int], *, pool, rare_token_counts, burst_ids: set[int], weights: dict[str, float] | None = None
) -> dict:
    """What the run records per batch: sample ids, sources, rare counts (and the mixture's
    source weights at that step, when there is a mixture)."""
    sources: dict[str, int] = {}
    for i in batch:
        sources[pool[i].source] = sources.get(pool[i].source, 0) + 1
    return {
        "samples": [pool[i].id for i in batch],
        "sources": sources,
        "rare_samples": sum(1 for i in batch if rare_token_counts[i] > 0),
        "rare_tokens": sum(rare_token_counts[i] for i in batch),
        "burst_samples": sum(1 for i in batch if i in burst_ids),
        **({"weights": {k: round(v, 6) for k, v in weights.items()}} if weights is not None else {}),
    }
