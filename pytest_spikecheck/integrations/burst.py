"""A declared burst in your own data: :func:`inject_burst` plans every batch of a run up front
(the engine's sampler, :func:`pytest_spikecheck.data.samplers.plan_batches`, with one burst),
and serves them through a ``torch.utils.data.IterableDataset`` that any trainer's data loader
reads in order: a plain ``DataLoader``, Hugging Face's ``Trainer`` and Lightning alike.

Planning up front is what lets a recorder name each step's samples without touching the
batch: step k's samples are :meth:`BurstStream.batch_at` (k), however far the trainer's data
loader prefetches. With gradient accumulation the plan is per optimizer step: each step's
``batch_size × accumulation`` samples are served as ``accumulation`` consecutive micro-batches
of ``batch_size``, and the burst lands in the micro-batches of optimizer step ``at_step``.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

from torch.utils.data import IterableDataset, Sampler, get_worker_info

from pytest_spikecheck.data.samplers import plan_batches
from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.scenario.sections import BurstSpec, SamplerSpec


class BurstStream(IterableDataset):
    """``dataset``'s items in the planned order: ``steps`` optimizer steps of ``batch_size ×
    accumulation`` samples (``accumulation`` micro-batches of ``batch_size`` each), the burst's
    samples filling ``count`` slots of step ``at_step``. Step k + 1 holds the dataset indices
    ``plan[k]``. Give the trainer the same micro-batch size and accumulation, ``max_steps`` at
    most ``steps``, and no shuffling of its own (a DataLoader never shuffles an iterable dataset)."""

    def __init__(
        self,
        dataset: Any,
        plan: list[list[int]],
        *,
        burst_ids: frozenset[int],
        at_step: int,
        batch_size: int,
        accumulation: int = 1,
    ) -> None:
        self.dataset, self.plan, self.burst_ids = dataset, plan, burst_ids
        self.at_step, self.batch_size, self.accumulation = at_step, batch_size, accumulation

    @property
    def steps(self) -> int:
        return len(self.plan)

    @property
    def declared(self) -> dict[int, str]:
        """The declared events of this stream (step -> kind), as the engine declares a burst."""
        return {self.at_step: "burst"}

    def batch_at(self, step: int) -> list[int]:
        """The dataset indices of optimizer step ``step`` (1-based): all its micro-batches, in order."""
        if not 1 <= step <= len(self.plan):
            raise ConfigError(
                f"step {step} is outside the planned run (steps 1..{len(self.plan)}); "
                f"plan more steps with inject_burst(..., steps=...)"
            )
        return self.plan[step - 1]

    def indices(self) -> list[int]:
        return [i for batch in self.plan for i in batch]

    def check_trainer(
        self,
        *,
        batch_size: int | None,
        accumulation: int,
        max_steps: int | None,
        names: tuple[str, str, str] = ("batch_size", "accumulation", "max_steps"),
    ) -> None:
        """ConfigError, before training, when a trainer would read this stream differently from
        its plan: another micro-batch size, another accumulation, or more steps than planned.
        ``names``: what the trainer calls its batch size, accumulation and step count."""
        batch_name, accumulation_name, steps_name = names
        if batch_size is not None and batch_size != self.batch_size:
            raise ConfigError(
                f"{batch_name} is {batch_size} but the burst stream plans batches of {self.batch_size}: "
                f"give both the same (inject_burst(..., batch_size=...) is the micro-batch)"
            )
        if accumulation != self.accumulation:
            raise ConfigError(
                f"{accumulation_name} is {accumulation} but the burst stream plans {self.accumulation} "
                f"micro-batch(es) per optimizer step: give both the same "
                f"(inject_burst(..., accumulation={accumulation}))"
            )
        if max_steps is not None and max_steps > self.steps:
            raise ConfigError(
                f"{steps_name} is {max_steps} but the burst stream plans {self.steps} optimizer steps: plan "
                f"at least {max_steps} (inject_burst(..., steps={max_steps})) or train fewer"
            )

    def sampler(self) -> Sampler[int]:
        """The same order as a Sampler, for a map-style ``DataLoader(dataset, sampler=..., batch_size=...)``."""
        return _PlannedSampler(self.indices())

    def __iter__(self) -> Iterator[Any]:
        worker = get_worker_info()
        if worker is not None and worker.num_workers > 1:
            raise ConfigError(f"a BurstStream serves one planned order: use num_workers <= 1 (was {worker.num_workers})")
        for i in self.indices():
            yield self.dataset[i]

    # No __len__: Lightning warns about any iterable dataset with one, and the trainers need
    # only the step count (HF: max_steps; Lightning: max_steps or the stream's end).


class _PlannedSampler(Sampler[int]):
    def __init__(self, order: list[int]) -> None:
        self.order = order

    def __iter__(self) -> Iterator[int]:
        return iter(self.order)

    def __len__(self) -> int:
        return len(self.order)


def inject_burst(
    dataset: Any,
    *,
    samples: Sequence[int],
    at_step: int,
    count: int | None = None,
    batch_size: int,
    steps: int,
    seed: int = 0,
    rejoin: bool = False,
    accumulation: int = 1,
) -> BurstStream:
    """Plan ``steps`` optimizer steps of ``dataset`` (shuffled epochs, seeded by ``seed``) with ``count`` of
    the dataset indices ``samples`` (default: all of them) concentrated in the batch of step
    ``at_step``: :class:`~pytest_spikecheck.RareTokenBurst` for your data. ``batch_size`` is the
    micro-batch your trainer reads; with ``accumulation`` k each step is k micro-batches
    (``batch_size × k`` samples), and the burst's samples go into the micro-batches of step
    ``at_step`` (``count`` at most ``batch_size × k``).

    The burst's samples are held out of the rotation until then; after the burst they never
    recur (a contaminated batch, like the ``greek`` content), or with ``rejoin=True`` they
    join the rotation at the next epoch (like Seed A's *written* samples).
    """
    n = len(dataset)
    if isinstance(accumulation, bool) or not isinstance(accumulation, int) or accumulation < 1:
        raise ConfigError(
            f"inject_burst: accumulation must be an integer >= 1 (micro-batches per optimizer step), was {accumulation!r}"
        )
    chosen = list(dict.fromkeys(int(i) for i in samples))
    count = len(chosen) if count is None else count
    bad = [i for i in chosen if not 0 <= i < n]
    if bad:
        raise ConfigError(f"inject_burst: sample index {bad[0]} is outside the dataset (0..{n - 1})")
    step_batch = batch_size * accumulation
    if not chosen or not 1 <= count <= min(len(chosen), step_batch):
        raise ConfigError(
            f"inject_burst needs 1 <= count <= min(len(samples), batch_size × accumulation), was "
            f"count={count}, {len(chosen)} samples, batch_size={batch_size}, accumulation={accumulation}"
        )
    if not 1 <= at_step <= steps:
        raise ConfigError(f"inject_burst needs 1 <= at_step <= steps, was at_step={at_step}, steps={steps}")
    # Pool order for the planner: the rotation first, then (unless they rejoin) the burst's
    # samples as "fresh" pool entries that the planner serves at the burst only.
    held = set(chosen)
    pool = list(range(n)) if rejoin else [i for i in range(n) if i not in held] + chosen
    n_corpus = n if rejoin else n - len(chosen)
    members = tuple(pool.index(i) for i in chosen) if rejoin else tuple(range(n_corpus, n))
    spec = SamplerSpec(
        kind="shuffle",
        batch_size=step_batch,
        bursts=(BurstSpec(at_step=at_step, count=count, content="written" if rejoin else "greek"),),
    )
    try:
        planned = plan_batches(
            spec, steps=steps, seed=seed, n_corpus=n_corpus, burst_members={0: members}, is_rare=lambda i: False
        )
    except ValueError as exc:
        raise ConfigError(f"inject_burst: {exc}") from None
    plan = [[pool[i] for i in batch] for batch in planned]
    injected = frozenset(i for i in plan[at_step - 1] if i in held)
    return BurstStream(dataset, plan, burst_ids=injected, at_step=at_step, batch_size=batch_size, accumulation=accumulation)
