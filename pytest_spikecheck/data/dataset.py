"""Turn a scenario's data spec into token arrays: training pool, eval set, rarity.

The *pool* is every sample the sampler may serve: the corpus plus the fresh sentences of
each burst. Row ``i`` of ``inputs``/``targets`` is sample ``i`` as ``EOS text EOS``,
truncated to ``block_size + 1`` tokens and padded; targets of padding are IGNORE_INDEX.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from pytest_spikecheck.data.corpus import (
    Sample,
    burst_pool,
    induction_corpus,
    induction_eval_set,
    induction_prefix_length,
    phase19_corpus,
    phase19_eval_set,
)
from pytest_spikecheck.data.sources import BASE_SOURCES, mixture_corpus, mixture_eval_set, source_samples
from pytest_spikecheck.data.tokenizer import BPETokenizer, train_bpe
from pytest_spikecheck.models.config import IGNORE_INDEX
from pytest_spikecheck.scenario import Scenario


@dataclass(frozen=True)
class TokenArrays:
    inputs: np.ndarray  # (N, block_size) int64
    targets: np.ndarray  # (N, block_size) int64, IGNORE_INDEX on padding


@dataclass(frozen=True)
class Dataset:
    tokenizer: BPETokenizer
    pool: tuple[Sample, ...]  # corpus first, then burst samples
    train: TokenArrays  # one row per pool sample
    eval: TokenArrays
    eval_samples: tuple[Sample, ...]
    n_corpus: int  # pool[:n_corpus] is the corpus
    rare_tokens: frozenset[int]  # token ids in at most rare_doc_freq corpus samples (0: only in bursts)
    rare_token_counts: tuple[int, ...]  # per pool sample: how many rare-token occurrences
    burst_members: dict[int, tuple[int, ...]]  # burst index -> pool indices it injects
    #: The induction corpus: True on the eval targets of each sequence's repeated half (what only
    #: attention can predict), (N_eval, block_size); None for the other corpora.
    eval_repeat: np.ndarray | None = None

    def is_rare(self, index: int) -> bool:
        return self.rare_token_counts[index] > 0

    def sample_tokens(self, index: int) -> list[int]:
        row = self.train.targets[index]
        return [int(t) for t in row if t != IGNORE_INDEX]


def _encode(tok: BPETokenizer, samples: tuple[Sample, ...], block_size: int, padding_side: str = "right") -> TokenArrays:
    inputs = np.full((len(samples), block_size), tok.pad_id, dtype=np.int64)
    targets = np.full((len(samples), block_size), IGNORE_INDEX, dtype=np.int64)
    for i, s in enumerate(samples):
        if not s.text:
            continue  # an empty document has nothing to predict: its row is padding only
        ids = tok.encode(s.text)[: block_size + 1]
        n = len(ids) - 1
        cols = slice(0, n) if padding_side == "right" else slice(block_size - n, block_size)
        inputs[i, cols] = ids[:-1]
        targets[i, cols] = ids[1:]
    return TokenArrays(inputs, targets)


def build_dataset(scenario: Scenario) -> Dataset:
    """The dataset of a *resolved* scenario (cached: many scenarios share one corpus)."""
    d, s = scenario.data, scenario.sampler
    new_source = s.mixture.new_source if s.kind == "mixture" else None
    return _build(
        d.corpus,
        d.n_sentences,
        d.eval_sentences,
        d.vocab_size,
        d.corpus_seed,
        scenario.model.block_size,
        s.rare_doc_freq,
        s.bursts,
        d.padding_side,
        new_source,
        d.texts,
    )


def _corpus(
    corpus: str, n_sentences: int, eval_sentences: int, corpus_seed: int, texts: tuple[str, ...] = (), block_size: int = 32
) -> tuple[tuple[Sample, ...], tuple[Sample, ...]]:
    if corpus == "induction":
        n = induction_prefix_length(block_size)
        return induction_corpus(n_sentences, corpus_seed, n), induction_eval_set(eval_sentences, corpus_seed, n)
    if corpus == "texts":  # the user's own documents: the last eval_sentences are held out for eval
        samples = [Sample(id=f"text-{i:05d}", text=t, source="texts") for i, t in enumerate(texts)]
        return tuple(samples[:-eval_sentences]), tuple(samples[-eval_sentences:])
    if corpus == "mixture":
        return (mixture_corpus(n_sentences // len(BASE_SOURCES), corpus_seed), mixture_eval_set(eval_sentences, corpus_seed))
    return phase19_corpus(n_sentences, corpus_seed), phase19_eval_set(eval_sentences, corpus_seed)


@lru_cache(maxsize=16)
def _build(
    corpus: str,
    n_sentences: int,
    eval_sentences: int,
    vocab_size: int,
    corpus_seed: int,
    block_size: int,
    rare_doc_freq: int,
    bursts: tuple,
    padding_side: str = "right",
    new_source: str | None = None,
    texts: tuple[str, ...] = (),
) -> Dataset:
    corpus_samples, eval_samples = _corpus(corpus, n_sentences, eval_sentences, corpus_seed, texts, block_size)
    tok = train_bpe(tuple(s.text for s in corpus_samples), vocab_size)
    if new_source is not None and new_source not in BASE_SOURCES:
        # A source that enters late joins the corpus (the sampler holds it out until then) but
        # not the tokenizer's training text: its bytes stay unmerged, as for a real new domain.
        corpus_samples = corpus_samples + source_samples(new_source, n_sentences // len(BASE_SOURCES), corpus_seed)
    pool = list(corpus_samples)
    members: dict[int, tuple[int, ...]] = {}
    for k, burst in enumerate(bursts):
        if burst.content == "written":
            rare = tuple(i for i, smp in enumerate(corpus_samples) if smp.rare)
            members[k] = rare
        else:
            fresh = burst_pool(burst.content, burst.count, corpus_seed)
            known = {smp.id: i for i, smp in enumerate(pool)}
            ids = []
            for smp in fresh:  # two bursts of the same content share sentences
                if smp.id not in known:
                    known[smp.id] = len(pool)
                    pool.append(smp)
                ids.append(known[smp.id])
            members[k] = tuple(ids)
    pool_t = tuple(pool)
    train = _encode(tok, pool_t, block_size, padding_side)
    # Rarity is measured against the corpus (what the model trains on in rotation): a token
    # of injected burst content that never occurs in the corpus has frequency 0 and is rare,
    # however many burst sentences share it. A late source counts as corpus.
    doc_freq: Counter[int] = Counter()
    for row in train.targets[: len(corpus_samples)]:
        doc_freq.update({int(t) for t in row if t != IGNORE_INDEX and t != tok.eos_id})
    in_pool = {int(t) for row in train.targets for t in row if t != IGNORE_INDEX and t != tok.eos_id}
    rare = frozenset(t for t in in_pool if doc_freq[t] <= rare_doc_freq)
    counts = tuple(int(sum(1 for t in row if int(t) in rare)) for row in train.targets)
    evaluation = _encode(tok, eval_samples, block_size, padding_side)
    return Dataset(
        tokenizer=tok,
        pool=pool_t,
        train=train,
        eval=evaluation,
        eval_samples=eval_samples,
        n_corpus=len(corpus_samples),
        rare_tokens=rare,
        rare_token_counts=counts,
        burst_members=members,
        eval_repeat=_repeated_half(tok, eval_samples, evaluation, block_size) if corpus == "induction" else None,
    )


def _repeated_half(tok: BPETokenizer, samples: tuple[Sample, ...], arrays: TokenArrays, block_size: int) -> np.ndarray:
    """Where the eval targets are the repeated half of an induction sequence. Each sequence encodes
    to ``EOS s1..sn s1..sn EOS`` (one token per symbol, checked here), so the targets at positions
    n..2n-1 (whatever the padding side) are the repeat."""
    n = induction_prefix_length(block_size)
    mask = np.zeros(arrays.targets.shape, dtype=bool)
    for i, sample in enumerate(samples):
        ids = tok.encode(sample.text)
        if len(ids) != 2 * n + 2 or ids[1 : n + 1] != ids[n + 1 : 2 * n + 1]:
            raise ValueError(
                f"induction sample {sample.id} encodes to {len(ids)} tokens, not 2 x {n} + 2 with an "
                f"exact repeat: the tokenizer did not make one token per symbol"
            )
        first = int(np.flatnonzero(arrays.targets[i] != IGNORE_INDEX)[0])
        mask[i, first + n : first + 2 * n] = True
    return mask
