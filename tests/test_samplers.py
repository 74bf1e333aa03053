import pytest

from pytest_spikecheck.data.samplers import plan_batches
from pytest_spikecheck.scenario import BurstSpec, SamplerSpec

N = 40


def _plan(spec, steps=30, seed=0, members=None, rare=frozenset()):
    return plan_batches(spec, steps=steps, seed=seed, n_corpus=N, burst_members=members or {}, is_rare=lambda i: i in rare)


def test_shuffle_serves_epochs_without_repeats():
    batches = _plan(SamplerSpec(batch_size=8), steps=5)  # 5 x 8 = one epoch of 40
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(N))


def test_same_seed_same_batches_other_seed_other_batches():
    spec = SamplerSpec(batch_size=8)
    assert _plan(spec, seed=1) == _plan(spec, seed=1)
    assert _plan(spec, seed=1) != _plan(spec, seed=2)


def test_fresh_burst_samples_appear_exactly_at_their_step():
    spec = SamplerSpec(batch_size=8, bursts=(BurstSpec(at_step=10, count=3, content="greek"),))
    fresh = (N, N + 1, N + 2)  # pool indices after the corpus
    batches = _plan(spec, members={0: fresh})
    for step, batch in enumerate(batches, 1):
        hits = [i for i in batch if i in fresh]
        assert hits == (list(fresh) if step == 10 else []), step


def test_written_burst_holds_samples_out_until_the_burst_then_they_rejoin():
    written = (3, 7, 11, 19, 23)
    spec = SamplerSpec(batch_size=8, bursts=(BurstSpec(at_step=12, count=3, content="written"),))
    batches = _plan(spec, steps=40, members={0: written}, rare=frozenset(written))
    before = {i for b in batches[:11] for i in b}
    assert before.isdisjoint(written)
    assert sum(i in written for i in batches[11]) == 3
    after = {i for b in batches[12:] for i in b}
    assert set(written) <= after


def test_stratified_caps_rare_samples_per_batch_even_for_a_burst():
    written = (3, 7, 11, 19, 23)
    spec = SamplerSpec(kind="stratified", batch_size=8, rare_cap=1, bursts=(BurstSpec(at_step=12, count=3, content="written"),))
    batches = _plan(spec, steps=40, members={0: written}, rare=frozenset(written))
    assert max(sum(i in written for i in b) for b in batches) == 1
    assert all(len(b) == 8 for b in batches)
    # the burst is spread over the next batches instead of dropped
    assert sum(i in written for b in batches[11:14] for i in b) == 3


def test_stratified_refuses_impossible_caps():
    spec = SamplerSpec(kind="stratified", batch_size=8, rare_cap=0)
    with pytest.raises(ValueError, match="cannot fill a batch"):
        _plan(spec, rare=frozenset(range(N)))


def test_no_sample_appears_twice_in_a_batch_across_epoch_boundaries():
    # A rotation of 37 does not divide by 8: every epoch boundary falls inside a batch.
    written = (3,)
    spec = SamplerSpec(batch_size=8, bursts=(BurstSpec(at_step=5, count=1, content="written"),))
    batches = plan_batches(spec, steps=200, seed=0, n_corpus=38, burst_members={0: written}, is_rare=lambda i: False)
    assert all(len(set(b)) == len(b) == 8 for b in batches)
    served = [i for b in batches for i in b]
    assert max(served.count(i) for i in range(38)) - min(served.count(i) for i in range(38) if i != 3) <= 2
