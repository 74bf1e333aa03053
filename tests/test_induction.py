"""``data.corpus: induction``: sequences whose second half repeats the first, one token per symbol,
seeded and cached like the other corpora; the eval loss on the repeated half; every break on it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pytest_spikecheck import BlankDocument, ConfigError, RareTokenBurst, Run, Scenario, StratifiedBatches, train
from pytest_spikecheck.data.corpus import INDUCTION_SYMBOLS, induction_corpus, induction_prefix_length
from pytest_spikecheck.data.dataset import build_dataset
from pytest_spikecheck.models.config import IGNORE_INDEX

INDUCTION = Scenario.preset("phase-19").replace(
    name="induction",
    data__corpus="induction",
    data__n_sentences=64,
    data__eval_sentences=16,
    steps=3,
    seed=0,
    model__n_embd=32,
    model__n_head=2,
)


def test_each_sequence_repeats_its_first_half_token_for_token():
    data = build_dataset(INDUCTION.resolved())
    n = induction_prefix_length(32)
    assert n == 15 and data.tokenizer.vocab_size <= 258 + len(INDUCTION_SYMBOLS)
    for row in data.train.targets[:20]:
        tokens = row[row != IGNORE_INDEX]
        assert len(tokens) == 2 * n + 1 and (tokens[:n] == tokens[n : 2 * n]).all()  # then EOS
    mask = data.eval_repeat
    assert mask.shape == data.eval.targets.shape and (mask.sum(axis=1) == n).all()
    assert (data.eval.targets[mask] != IGNORE_INDEX).all()
    # the repeated targets are those of the first half, one sequence later in the row
    row, first = data.eval.targets[0], np.flatnonzero(mask[0])[0]
    assert (row[first : first + n] == row[first - n : first]).all()


def test_the_corpus_is_seeded_and_cached():
    assert induction_corpus(8, 0, 15) is induction_corpus(8, 0, 15)
    assert induction_corpus(8, 0, 15) != induction_corpus(8, 1, 15)
    eval_texts = {s.text for s in build_dataset(INDUCTION.resolved()).eval_samples}
    assert not eval_texts & {s.text for s in induction_corpus(64, 0, 15)}


def test_runs_on_it_record_the_repeated_halfs_eval_loss(tmp_path):
    run = train(INDUCTION)
    repeat = run["eval_loss_repeat"]
    assert math.isfinite(repeat[-1]) and repeat[-1] > 0
    np.testing.assert_array_equal(np.isnan(repeat), np.isnan(run["eval_loss"]))
    loaded = Run.load(run.save(tmp_path / "run"))
    np.testing.assert_array_equal(loaded["eval_loss_repeat"], repeat)
    assert "eval_loss_repeat" not in train(INDUCTION.replace(data__corpus="phase19", data__n_sentences=240)).metrics


@pytest.mark.parametrize(
    "breaks",
    [
        (RareTokenBurst(count=3, at_step=2),),
        (RareTokenBurst(count=2, at_step=2, content="caps"),),
        (BlankDocument(at_step=2),),
        (StratifiedBatches(),),
    ],
    ids=["greek", "caps", "blank", "stratified"],
)
def test_every_break_works_on_it(breaks):
    run = train(INDUCTION.with_breaks(*breaks))
    assert len(run) == 3 and np.isfinite(run["loss"]).all()
    if isinstance(breaks[0], RareTokenBurst):
        assert run.batch_at(2)["burst_samples"] == breaks[0].count


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"data__n_sentences": 4}, r"data.n_sentences \(4 induction sequences\) must be >= the batch size 8"),
        ({"model__block_size": 4}, "the induction corpus needs model.block_size >= 5"),
    ],
)
def test_bad_induction_settings_are_one_line(changes, message):
    with pytest.raises(ConfigError, match=message):
        INDUCTION.replace(**changes)
    with pytest.raises(ConfigError, match="a 'written' burst needs the phase19 corpus"):
        INDUCTION.with_breaks(RareTokenBurst(count=3, at_step=2, content="written")).resolved()
