"""Hypothesis strategies: which samples share a batch, and how a scenario is perturbed.

This is the only module of ``pytest_spikecheck`` that imports Hypothesis (a dev
dependency): importing the package or loading the pytest plugin never does.

* :func:`batch_compositions` draws a batch from a pool with knobs for how many rare-token
  samples it holds and which sources it mixes. It shrinks toward simple batches: the fewest
  rare samples allowed, one source (the largest), the first samples of the pool.
* :func:`blind_batch_compositions` draws positions in a list of candidates and knows
  nothing about rarity or sources: what a search uses when it must not be told what to
  look for (:mod:`pytest_spikecheck.fuzz.search`).
* :func:`scenario_perturbations` varies a scenario's seed, burst step and learning rate
  (log-uniform) within ranges; each shrinks toward the low end of its range.

Pools are a :class:`~pytest_spikecheck.data.dataset.Dataset` (rarity = the sample holds a
rare token), a :class:`~pytest_spikecheck.training.probe.Probe` (its dataset), or any sequence of
:class:`~pytest_spikecheck.data.corpus.Sample` (rarity = ``Sample.rare``; pass ``is_rare``
to decide it yourself).

>>> from pytest_spikecheck.training.probe import probe_at  # doctest: +SKIP
>>> probe = probe_at(scenario, at_step=312)  # doctest: +SKIP
>>> @given(batch_compositions(probe, max_rare=3))  # doctest: +SKIP
... def test_the_clip_holds(batch):
...     assert probe(batch).grad_norm_post <= 1.0 * (1 + 1e-5)
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from pytest_spikecheck.scenario import Scenario

__all__ = ["Composition", "batch_compositions", "blind_batch_compositions", "scenario_perturbations"]


@dataclass(frozen=True)
class Composition:
    """One batch: the pool indices of its samples (sorted), with their ids, sources and rarity.

    Iterating yields the pool indices, so a Composition goes wherever a list of indices does
    (a :class:`~pytest_spikecheck.training.probe.Probe`, ``dataset.train.inputs[list(c)]``).
    """

    indices: tuple[int, ...]
    sample_ids: tuple[str, ...]
    sources: tuple[str, ...]
    rare: tuple[bool, ...]

    @property
    def n_rare(self) -> int:
        """How many of the samples are rare."""
        return sum(self.rare)

    @property
    def source_counts(self) -> dict[str, int]:
        """Samples per source, largest first."""
        return dict(Counter(self.sources).most_common())

    def __len__(self) -> int:
        return len(self.indices)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __repr__(self) -> str:  # Hypothesis prints this for a falsifying example
        mix = " + ".join(f"{source}×{n}" for source, n in self.source_counts.items())
        ids = ", ".join(i + ("*" if r else "") for i, r in zip(self.sample_ids, self.rare))
        return f"Composition({len(self)} samples, {self.n_rare} rare (*), {mix}: {ids})"


@dataclass(frozen=True)
class _Pool:
    ids: tuple[str, ...]
    sources: tuple[str, ...]
    rare: tuple[bool, ...]

    @classmethod
    def of(cls, data: Any, is_rare: Callable[[int], bool] | None) -> _Pool:
        data = getattr(data, "dataset", data)  # a Probe carries its dataset
        if hasattr(data, "pool") and hasattr(data, "is_rare"):  # a Dataset
            samples, rare_of = data.pool, is_rare or data.is_rare
        else:
            samples = tuple(data)
            if not all(hasattr(s, "source") and hasattr(s, "id") for s in samples):
                raise InvalidArgument("expected a Dataset, a Probe or a sequence of Samples (with id, source, rare)")
            rare_of = is_rare or (lambda i: bool(samples[i].rare))
        if not samples:
            raise InvalidArgument("the pool is empty")
        return cls(
            tuple(s.id for s in samples), tuple(s.source for s in samples), tuple(bool(rare_of(i)) for i in range(len(samples)))
        )

    def __len__(self) -> int:
        return len(self.ids)

    def composition(self, indices: Sequence[int]) -> Composition:
        ordered = tuple(sorted(indices))
        return Composition(
            ordered,
            tuple(self.ids[i] for i in ordered),
            tuple(self.sources[i] for i in ordered),
            tuple(self.rare[i] for i in ordered),
        )

    def sources_by_size(self) -> tuple[str, ...]:
        """Source names, largest first (ties by name): the first is the simplest to shrink to."""
        counts = Counter(self.sources)
        return tuple(sorted(counts, key=lambda s: (-counts[s], s)))


def _check_batch_size(batch_size: int, pool_size: int) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidArgument(f"batch_size must be a positive integer, was {batch_size!r}")
    if batch_size > pool_size:
        raise InvalidArgument(f"batch_size {batch_size} exceeds the pool's {pool_size} samples")


def _rare_bounds(pool: _Pool, members: Sequence[int], batch_size: int, min_rare: int, max_rare: int) -> tuple[int, int]:
    """The feasible range of rare samples in a batch drawn from ``members`` (empty if lo > hi)."""
    n_rare = sum(pool.rare[i] for i in members)
    n_common = len(members) - n_rare
    return max(min_rare, batch_size - n_common), min(max_rare, n_rare, batch_size)


#: batch_compositions enumerates the source mixes it may draw; more than this is refused.
MAX_SOURCE_MIXES = 4096


def _feasible_mixes(
    pool: _Pool,
    allowed: tuple[str, ...],
    members_of: dict[str, list[int]],
    max_sources: int,
    batch_size: int,
    min_rare: int,
    max_rare: int,
) -> list[tuple[str, ...]]:
    """Every mix of 1 to ``max_sources`` sources that can fill a batch within the rare
    bounds, simplest first: fewer sources, then larger ones (``allowed`` is largest first)."""
    n_mixes = sum(math.comb(len(allowed), k) for k in range(1, max_sources + 1))
    if n_mixes > MAX_SOURCE_MIXES:
        raise InvalidArgument(
            f"{len(allowed)} sources make {n_mixes} mixes of up to {max_sources}; narrow them "
            f"with sources= or max_sources= (at most {MAX_SOURCE_MIXES})"
        )
    mixes = [
        mix
        for k in range(1, max_sources + 1)
        for mix in itertools.combinations(allowed, k)
        if _fits(pool, [i for s in mix for i in members_of[s]], batch_size, min_rare, max_rare)
    ]
    if not mixes:
        rare = sum(pool.rare[i] for s in allowed for i in members_of[s])
        raise InvalidArgument(
            f"no batch of {batch_size} from {', '.join(allowed)} (at most {max_sources} of them at "
            f"once) holds between {min_rare} and {max_rare} rare samples ({rare} rare in all)"
        )
    return mixes


def _fits(pool: _Pool, members: Sequence[int], batch_size: int, min_rare: int, max_rare: int) -> bool:
    lo, hi = _rare_bounds(pool, members, batch_size, min_rare, max_rare)
    return lo <= hi


def batch_compositions(
    data: Any,
    batch_size: int = 8,
    *,
    min_rare: int = 0,
    max_rare: int | None = None,
    sources: Sequence[str] | None = None,
    max_sources: int | None = None,
    is_rare: Callable[[int], bool] | None = None,
) -> st.SearchStrategy[Composition]:
    """Batches of ``batch_size`` distinct pool samples.

    A draw picks a mix of sources first (1 to ``max_sources`` of ``sources``, default every
    source in the pool; only mixes that can fill the batch within the rare bounds), then
    how many rare samples (``min_rare`` to ``max_rare``, as far as the mix allows), then
    the samples. Shrinks toward a single source (the largest), the fewest rare samples and
    the first samples of the pool.
    """
    pool = _Pool.of(data, is_rare)
    _check_batch_size(batch_size, len(pool))
    known = pool.sources_by_size()
    allowed = known if sources is None else tuple(dict.fromkeys(sources))
    unknown = [s for s in allowed if s not in known]
    if unknown or not allowed:
        raise InvalidArgument(
            f"unknown source {unknown[0]!r}; the pool has {', '.join(known)}"
            if unknown
            else "sources must name at least one source"
        )
    allowed = tuple(s for s in known if s in allowed)  # largest first, whatever order was given
    max_rare = batch_size if max_rare is None else max_rare
    if min_rare < 0 or max_rare < min_rare:
        raise InvalidArgument(f"need 0 <= min_rare <= max_rare, were min_rare={min_rare}, max_rare={max_rare}")
    if max_sources is not None and max_sources < 1:
        raise InvalidArgument(f"max_sources must be >= 1, was {max_sources}")
    max_sources = len(allowed) if max_sources is None else min(max_sources, len(allowed))
    members_of = {s: [i for i in range(len(pool)) if pool.sources[i] == s] for s in allowed}
    mixes = _feasible_mixes(pool, allowed, members_of, max_sources, batch_size, min_rare, max_rare)

    @st.composite
    def compositions(draw: Callable[..., Any]) -> Composition:
        members = [i for s in draw(st.sampled_from(mixes)) for i in members_of[s]]
        lo, hi = _rare_bounds(pool, members, batch_size, min_rare, max_rare)
        n_rare = draw(st.integers(lo, hi))
        rare_members = [i for i in members if pool.rare[i]]
        common_members = [i for i in members if not pool.rare[i]]
        rare = draw(st.lists(st.sampled_from(rare_members), min_size=n_rare, max_size=n_rare, unique=True)) if n_rare else []
        n_common = batch_size - n_rare
        common = (
            draw(st.lists(st.sampled_from(common_members), min_size=n_common, max_size=n_common, unique=True)) if n_common else []
        )
        return pool.composition(rare + common)

    return compositions()


def _nearest_free(position: int, taken: set[int], size: int) -> int:
    """The free position closest to ``position`` in ``range(size)`` (above it on a tie)."""
    for distance in range(size):
        for candidate in (position + distance, position - distance):
            if 0 <= candidate < size and candidate not in taken:
                return candidate
    raise ValueError(f"no free position among {size}")  # unreachable: batch_size <= size is checked


def blind_batch_compositions(
    data: Any, batch_size: int = 8, *, candidates: Sequence[int] | None = None
) -> st.SearchStrategy[Composition]:
    """Batches of ``batch_size`` distinct samples, drawn knowing nothing about rarity or sources.

    A draw is ``batch_size`` positions in ``candidates`` (pool indices; default the whole
    pool, in pool order), each one integer choice; a position already taken moves to the
    nearest free one, so a slot stays among its neighbours. That is what lets
    :func:`hypothesis.target` climb, moving a slot to a neighbouring candidate: order
    ``candidates`` so that neighbours are alike (the search orders them by a measured
    effect), and shuffle them when the pool's own order carries information (ours puts burst
    content last). Shrinks toward the first candidates.
    """
    pool = _Pool.of(data, None)
    order = tuple(range(len(pool))) if candidates is None else tuple(int(i) for i in candidates)
    if len(set(order)) != len(order) or any(not 0 <= i < len(pool) for i in order):
        raise InvalidArgument(f"candidates must be distinct pool indices in [0, {len(pool)})")
    _check_batch_size(batch_size, len(order))

    def to_composition(positions: list[int]) -> Composition:
        taken: set[int] = set()
        for position in positions:
            taken.add(_nearest_free(position, taken, len(order)))
        return pool.composition([order[p] for p in taken])

    slot = st.integers(0, len(order) - 1)
    return st.lists(slot, min_size=batch_size, max_size=batch_size).map(to_composition)


def _range(name: str, bounds: Any) -> tuple[Any, Any]:
    try:
        lo, hi = bounds
    except (TypeError, ValueError):
        raise InvalidArgument(f"{name} must be a (low, high) pair, was {bounds!r}") from None
    if not lo <= hi:
        raise InvalidArgument(f"{name} must be a (low, high) pair with low <= high, was {bounds!r}")
    return lo, hi


def scenario_perturbations(
    base: Scenario,
    *,
    seed: tuple[int, int] | None = None,
    burst_step: tuple[int, int] | None = None,
    lr: tuple[float, float] | None = None,
) -> st.SearchStrategy[Scenario]:
    """``base`` with its seed, burst step and/or peak learning rate drawn from ranges.

    Each argument is an inclusive ``(low, high)`` range, or None to keep the base's value;
    the learning rate is drawn log-uniformly.
    ``burst_step`` moves the base's earliest :class:`~pytest_spikecheck.scenario.breaks.RareTokenBurst`
    to the drawn step and the others with it (same offsets). Shrinks toward the low ends.
    """
    from pytest_spikecheck.scenario.breaks import RareTokenBurst

    if not isinstance(base, Scenario):
        raise InvalidArgument(f"base must be a Scenario, was {type(base).__name__}")
    seeds = st.just(base.seed) if seed is None else st.integers(*_range("seed", seed))
    if lr is None:
        lrs = st.just(base.optimizer.lr)
    else:
        lr_lo, lr_hi = _range("lr", lr)
        if not (lr_lo > 0 and math.isfinite(lr_hi)):
            raise InvalidArgument(f"lr must be a finite range above 0, was {lr!r}")
        # Log-uniform, as learning rates are searched; shrinks to u = 0, i.e. to ``lr_lo``.
        lrs = st.floats(0.0, 1.0).map(lambda u: min(lr_hi, lr_lo * (lr_hi / lr_lo) ** u))
    bursts = [b for b in base.breaks if isinstance(b, RareTokenBurst)]
    if burst_step is None:
        offsets = st.just(0)
    else:
        if not bursts:
            raise InvalidArgument("burst_step needs a base scenario with a RareTokenBurst break to move")
        step_lo, step_hi = _range("burst_step", burst_step)
        first, last = min(b.at_step for b in bursts), max(b.at_step for b in bursts)
        if step_lo < 1 or step_hi + (last - first) > base.steps:
            raise InvalidArgument(f"burst_step {burst_step!r} would move a burst outside steps 1–{base.steps}")
        offsets = st.integers(step_lo, step_hi).map(lambda step: step - first)

    def perturb(seed_value: int, lr_value: float, offset: int) -> Scenario:
        breaks = tuple(
            dataclasses.replace(b, at_step=b.at_step + offset) if isinstance(b, RareTokenBurst) else b for b in base.breaks
        )
        return base.replace(seed=seed_value, optimizer__lr=lr_value, breaks=breaks)

    return st.builds(perturb, seeds, lrs, offsets)
