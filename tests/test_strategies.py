"""Properties of the batch samplers and of the public Hypothesis strategies (no training)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from pytest_spikecheck import NoClip, RareTokenBurst, Scenario
from pytest_spikecheck.data.corpus import Sample
from pytest_spikecheck.data.samplers import plan_batches
from pytest_spikecheck.scenario import BurstSpec, SamplerSpec
from pytest_spikecheck.fuzz.strategies import Composition, batch_compositions, blind_batch_compositions, scenario_perturbations


def test_only_the_strategies_module_imports_hypothesis():
    code = (
        "import sys, pytest_spikecheck, pytest_spikecheck.plugin, pytest_spikecheck.fuzz.search\n"
        "from pytest_spikecheck.cli.commands import build_parser\n"
        "build_parser()\n"
        "print('hypothesis' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- the stratified sampler --------------------------------------------------------------------


@st.composite
def stratified_plans(draw):
    """A stratified sampler spec and a pool: any size, any rare samples, any cap, bursts of
    held-out corpus samples and of fresh ones, any seed."""
    batch_size = draw(st.integers(1, 12))
    n_corpus = draw(st.integers(batch_size, 80))
    rare = set(draw(st.lists(st.integers(0, n_corpus - 1), unique=True, max_size=n_corpus)))
    steps = draw(st.integers(1, 60))
    bursts, members = [], {}
    next_fresh = n_corpus
    for k in range(draw(st.integers(0, 3))):
        count = draw(st.integers(1, batch_size))
        held_out = sorted(rare)[:count]
        if held_out and draw(st.booleans()):  # corpus samples held out until the burst (like *written*)
            bursts.append(BurstSpec(at_step=draw(st.integers(1, steps)), count=len(held_out), content="written"))
            members[k] = tuple(held_out)
        else:  # fresh samples seen only at the burst (like *greek*): rare by construction
            members[k] = tuple(range(next_fresh, next_fresh + count))
            rare.update(members[k])
            next_fresh += count
            bursts.append(BurstSpec(at_step=draw(st.integers(1, steps)), count=count, content="greek"))
    spec = SamplerSpec(kind="stratified", batch_size=batch_size, rare_cap=draw(st.integers(0, batch_size)), bursts=tuple(bursts))
    return spec, steps, draw(st.integers(0, 2**32 - 1)), n_corpus, members, frozenset(rare)


@given(stratified_plans())
def test_the_stratified_sampler_never_exceeds_its_rare_cap(plan):
    spec, steps, seed, n_corpus, members, rare = plan
    try:
        batches = plan_batches(spec, steps=steps, seed=seed, n_corpus=n_corpus, burst_members=members, is_rare=rare.__contains__)
    except ValueError as exc:  # a pool the cap cannot serve is refused, by name
        assert "cannot fill a batch" in str(exc) or "samples in rotation" in str(exc), exc
        return
    assert len(batches) == steps
    for step, batch in enumerate(batches, 1):
        assert len(batch) == spec.batch_size, step
        assert sum(i in rare for i in batch) <= spec.rare_cap, (step, batch)


# -- batch_compositions ------------------------------------------------------------------------

#: 30 prose samples (3 rare), 6 fresh "greek" and 4 fresh "caps" samples (all rare).
POOL = (
    tuple(Sample(id=f"prose-{i:02d}", text="", source="prose", rare=i in (4, 11, 27)) for i in range(30))
    + tuple(Sample(id=f"greek-{i}", text="", source="burst:greek", rare=True) for i in range(6))
    + tuple(Sample(id=f"caps-{i}", text="", source="burst:caps", rare=True) for i in range(4))
)


@given(st.data())
def test_compositions_respect_every_knob(data):
    batch_size = data.draw(st.integers(1, 8), label="batch_size")
    min_rare = data.draw(st.integers(0, batch_size), label="min_rare")
    max_rare = data.draw(st.integers(min_rare, batch_size), label="max_rare")
    max_sources = data.draw(st.integers(1, 3), label="max_sources")
    try:
        strategy = batch_compositions(POOL, batch_size, min_rare=min_rare, max_rare=max_rare, max_sources=max_sources)
        batch = data.draw(strategy, label="batch")
    except InvalidArgument:
        return  # knobs no batch can satisfy (8 rare samples from one source) are refused up front
    assert isinstance(batch, Composition)
    assert len(batch) == batch_size == len(set(batch.indices))
    assert all(0 <= i < len(POOL) for i in batch)
    assert min_rare <= batch.n_rare <= max_rare
    assert len(batch.source_counts) <= max_sources
    assert batch.rare == tuple(POOL[i].rare for i in batch) and batch.sources == tuple(POOL[i].source for i in batch)


@given(batch_compositions(POOL, 8, sources=["burst:greek", "prose"]))
def test_compositions_draw_only_from_the_sources_allowed(batch):
    assert set(batch.source_counts) <= {"burst:greek", "prose"}


def test_compositions_shrink_toward_simple_batches():
    simplest = find(batch_compositions(POOL, 8), lambda batch: True)
    assert simplest.n_rare == 0 and simplest.source_counts == {"prose": 8}
    three_rare = find(batch_compositions(POOL, 8), lambda batch: batch.n_rare >= 3)
    assert three_rare.n_rare == 3 and list(three_rare.source_counts) == ["prose"]
    caps = find(batch_compositions(POOL, 8), lambda batch: "burst:caps" in batch.source_counts)
    assert caps.source_counts["burst:caps"] == 1  # one sample of the source, not a batch of it


def test_composition_repr_names_the_samples_and_marks_the_rare_ones():
    text = repr(find(batch_compositions(POOL, 3, min_rare=1), lambda batch: True))
    assert text.startswith("Composition(3 samples, 1 rare (*), prose×3:") and "prose-04*" in text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, "batch_size must be a positive integer"),
        ({"batch_size": 41}, "exceeds the pool's 40 samples"),
        ({"min_rare": 3, "max_rare": 2}, "need 0 <= min_rare <= max_rare"),
        ({"sources": ["tweets"]}, "unknown source 'tweets'; the pool has prose, burst:greek, burst:caps"),
        ({"sources": ["prose"], "min_rare": 4}, "no batch of 8 from prose .* holds between 4 and 8 rare samples"),
        ({"min_rare": 8, "max_sources": 1}, "at most 1 of them at once"),  # 8 rare need greek and caps together
        ({"max_sources": 0}, "max_sources must be >= 1"),
    ],
)
def test_compositions_refuse_impossible_knobs_by_name(kwargs, message):
    with pytest.raises(InvalidArgument, match=message):
        batch_compositions(POOL, **{"batch_size": 8, **kwargs})


def test_blind_compositions_do_not_depend_on_rarity_or_sources():
    relabelled = tuple(Sample(id=s.id, text="", source="one source", rare=not s.rare) for s in POOL)
    drawn = {"ours": _blind_draws(POOL), "relabelled": _blind_draws(relabelled)}
    assert drawn["ours"] == drawn["relabelled"] and len(set(drawn["ours"])) > 1


def _blind_draws(pool) -> list[tuple[int, ...]]:
    """The batches a derandomised search draws from ``pool`` (its own list: a closure over a loop
    variable would bind late)."""
    drawn: list[tuple[int, ...]] = []

    @settings(derandomize=True, database=None, max_examples=30)
    @given(blind_batch_compositions(pool, 8))
    def draw(batch):
        assert len(set(batch)) == 8
        drawn.append(batch.indices)

    draw()
    return drawn


@given(blind_batch_compositions(POOL, 5, candidates=[39, 0, 17, 3, 22, 8]))
def test_blind_compositions_draw_from_the_candidates(batch):
    assert set(batch) <= {39, 0, 17, 3, 22, 8}


def test_blind_compositions_shrink_toward_the_first_candidates():
    assert find(blind_batch_compositions(POOL, 3, candidates=[39, 0, 17, 3]), lambda b: True).indices == (0, 17, 39)
    with pytest.raises(InvalidArgument, match="candidates must be distinct pool indices"):
        blind_batch_compositions(POOL, 2, candidates=[1, 1, 2])


# -- scenario perturbations --------------------------------------------------------------------

BASE = Scenario.preset("phase-19").with_breaks(
    RareTokenBurst(count=3, at_step=312), RareTokenBurst(count=2, at_step=320, content="caps"), NoClip()
)


@given(scenario_perturbations(BASE, seed=(0, 99), burst_step=(100, 400), lr=(3e-3, 3e-2)))
def test_perturbations_stay_in_range_and_move_bursts_together(scenario):
    assert 0 <= scenario.seed <= 99 and 3e-3 <= scenario.optimizer.lr <= 3e-2
    first, second = [b.at_step for b in scenario.resolved().sampler.bursts]
    assert 100 <= first <= 400 and second - first == 8
    assert scenario.resolved().optimizer.grad_clip is None  # the other breaks are kept


def test_perturbations_shrink_toward_the_low_ends():
    low = find(scenario_perturbations(BASE, seed=(5, 99), burst_step=(100, 400), lr=(3e-3, 3e-2)), lambda s: True)
    assert (low.seed, low.burst_steps, low.optimizer.lr) == (5, (100, 108), 3e-3)
    assert find(scenario_perturbations(BASE), lambda s: True) == BASE


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"seed": (10, 1)}, "seed must be a \\(low, high\\) pair with low <= high"),
        ({"lr": (0.0, 1e-2)}, "lr must be a finite range above 0"),
        ({"burst_step": (100, 495)}, "would move a burst outside steps 1–500"),
    ],
)
def test_perturbations_refuse_bad_ranges(kwargs, message):
    with pytest.raises(InvalidArgument, match=message):
        scenario_perturbations(BASE, **kwargs)


def test_perturbing_the_burst_step_needs_a_burst():
    with pytest.raises(InvalidArgument, match="needs a base scenario with a RareTokenBurst"):
        scenario_perturbations(Scenario.preset("phase-19"), burst_step=(10, 20))
