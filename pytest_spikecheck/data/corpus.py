"""Deterministic corpora: Seed A's 240 training sentences, an eval set, and rare burst content.

Seed A (§A13) needs a small English corpus in which the verb *write* is common but the
form *written* is rare (5 of 240 sentences), so that byte-level BPE splits " written" into
``Ġwri`` + ``tt`` + ``en`` and the piece ``tt`` occurs nowhere else. Other words with a
double t (``button``, ``cotton``) are frequent enough that BPE merges them into whole-word
tokens, which is what leaves ``tt`` alone inside *written*.

Everything here is plain Python (no torch): the same ``corpus_seed`` always yields the
same sentences, so the tokenizer trained on them can be cached by content.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache


# BURST_CONTENTS, the rare content a burst can inject, is named by the scenario layer;
# this module builds each one.

_SUBJECTS = (
    "the teacher",
    "my sister",
    "the old man",
    "a young girl",
    "the doctor",
    "our friend",
    "the student",
    "his mother",
    "the farmer",
    "a quiet boy",
    "the poet",
    "her uncle",
    "the children",
    "seven women",
)
_OBJECTS = (
    "a long story",
    "a poem",
    "the report",
    "a new song",
    "the plan",
    "a card",
    "a diary page",
    "the recipe",
    "the menu",
    "a button song",
    "the cotton note",
)
_PLACES = (
    "at home",
    "in the garden",
    "at school",
    "on the train",
    "by the river",
    "in the kitchen",
    "after dinner",
    "before noon",
    "in the morning",
    "at night",
    "on monday",
    "in the park",
    "when it rains",
    "in the open",
)
_OTHER_VERBS = (
    ("reads", "read"),
    ("finds", "found"),
    ("likes", "liked"),
    ("sends", "sent"),
    ("opens", "opened"),
    ("keeps", "kept"),
    ("shows", "showed"),
    ("checks", "checked"),
    ("hides", "hid"),
    ("sings", "sang"),
)
#: How many sentences of each *write* form the 240-sentence corpus holds (the rest use
#: other verbs). ``written`` is the rare one.
_WRITE_FORMS = {"written": 5, "writes": 30, "wrote": 30, "will write": 15, "is writing": 15}

_GREEK = dict(zip("abcdefghijklmnopqrstuvwxyz", "αβψδεφγηιξκλμνοπθρστυωςχυζ"))


@dataclass(frozen=True)
class Sample:
    """One training or eval sentence. ``source`` names where it came from (``prose`` for
    Seed A's corpus, ``burst:<content>`` for injected rare content); ``rare`` marks the
    sentences a stratified sampler must spread out."""

    id: str
    text: str
    source: str
    rare: bool = False


def _sentence(rng: random.Random, form: str) -> str:
    subject, obj, place = rng.choice(_SUBJECTS), rng.choice(_OBJECTS), rng.choice(_PLACES)
    if form == "written":
        text = f"{obj} was written by {subject} {place}."
    elif form == "other":
        present, past = rng.choice(_OTHER_VERBS)
        text = f"{subject} {present if rng.random() < 0.5 else past} {obj} {place}."
    else:
        text = f"{subject} {form} {obj} {place}."
    return text[0].upper() + text[1:]


@lru_cache(maxsize=8)
def phase19_corpus(n_sentences: int = 240, corpus_seed: int = 0) -> tuple[Sample, ...]:
    """Seed A's training corpus: ``n_sentences`` templated sentences, 5 of them with *written*."""
    rng = random.Random(f"phase19-train-{corpus_seed}")
    forms = [form for form, count in _WRITE_FORMS.items() for _ in range(count)]
    if len(forms) > n_sentences:
        raise ValueError(f"n_sentences must be >= {len(forms)} (the write forms alone), was {n_sentences}")
    forms += ["other"] * (n_sentences - len(forms))
    rng.shuffle(forms)
    return tuple(
        Sample(id=f"train-{i:03d}", text=_sentence(rng, form), source="prose", rare=form == "written")
        for i, form in enumerate(forms)
    )


@lru_cache(maxsize=8)
def phase19_eval_set(n_sentences: int = 96, corpus_seed: int = 0) -> tuple[Sample, ...]:
    """Fixed in-distribution eval sentences (no *written*: the eval measures general harm)."""
    rng = random.Random(f"phase19-eval-{corpus_seed}")
    forms = [form for form in _WRITE_FORMS if form != "written"] + ["other"] * 4
    return tuple(Sample(id=f"eval-{i:03d}", text=_sentence(rng, rng.choice(forms)), source="prose") for i in range(n_sentences))


def to_greek(text: str) -> str:
    """Transliterate English into Greek script letter by letter (a script the corpus never uses)."""
    return "".join(_GREEK.get(ch, ch) for ch in text.lower())


@lru_cache(maxsize=32)
def burst_pool(content: str, count: int, corpus_seed: int = 0) -> tuple[Sample, ...]:
    """Fresh rare sentences for a burst of ``content`` (``caps`` or ``greek``)."""
    if content not in ("caps", "greek", "blank"):
        raise ValueError(f"burst content must be 'caps', 'greek' or 'blank' for fresh samples, was {content!r}")
    if content == "blank":
        return tuple(Sample(id=f"burst-blank-{i:03d}", text="", source="burst:blank", rare=True) for i in range(count))
    rng = random.Random(f"burst-{content}-{corpus_seed}")
    texts = [_sentence(rng, rng.choice(list(_WRITE_FORMS)[1:] + ["other"])) for _ in range(count)]
    transform = str.upper if content == "caps" else to_greek
    return tuple(
        Sample(id=f"burst-{content}-{i:03d}", text=transform(t), source=f"burst:{content}", rare=True)
        for i, t in enumerate(texts)
    )


# -- induction: sequences that only attention can finish -----------------------------------------

#: The induction corpus's symbols: one character each, written with a leading space, so that the
#: byte-level BPE makes each " x" one token and a sequence of n symbols is n tokens.
INDUCTION_SYMBOLS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUV"
#: Each symbol's successors in the bigram chain: one favourite takes this much more probability
#: than the rest, which is spread evenly over all symbols. Peaked, but only a little: the first half
#: costs 3.26 nats per symbol at best (uniform: ln 48 = 3.87), so what a model gains by copying the
#: repeated half (down to ~0) dwarfs what bigram statistics give it (measured: docs/fidelity.md).
_INDUCTION_FAVOURITES = (0.3,)


def induction_prefix_length(block_size: int) -> int:
    """Symbols in each half of an induction sequence: ``EOS prefix prefix EOS`` fills ``block_size + 1``
    token ids (the row of inputs and targets), one target of padding to spare at most."""
    return (block_size - 1) // 2


def _bigram_chain(rng: random.Random) -> list[list[float]]:
    v = len(INDUCTION_SYMBOLS)
    rest = (1 - sum(_INDUCTION_FAVOURITES)) / v
    chain = []
    for _ in range(v):
        row = [rest] * v
        for p, j in zip(_INDUCTION_FAVOURITES, rng.sample(range(v), len(_INDUCTION_FAVOURITES))):
            row[j] += p
        chain.append(row)
    return chain


def _induction_samples(kind: str, n: int, corpus_seed: int, prefix_length: int) -> tuple[Sample, ...]:
    chain = _bigram_chain(random.Random(f"induction-chain-{corpus_seed}"))  # one chain for train and eval
    rng = random.Random(f"induction-{kind}-{corpus_seed}")
    symbols = range(len(INDUCTION_SYMBOLS))
    samples = []
    for i in range(n):
        prefix = [rng.randrange(len(INDUCTION_SYMBOLS))]
        while len(prefix) < prefix_length:
            prefix.append(rng.choices(symbols, weights=chain[prefix[-1]])[0])
        text = "".join(" " + INDUCTION_SYMBOLS[s] for s in prefix + prefix)
        samples.append(Sample(id=f"{kind}-{i:05d}", text=text, source="induction"))
    return tuple(samples)


@lru_cache(maxsize=8)
def induction_corpus(n_sequences: int, corpus_seed: int = 0, prefix_length: int = 15) -> tuple[Sample, ...]:
    """``n_sequences`` synthetic sequences: a random prefix from a peaked bigram chain over
    INDUCTION_SYMBOLS, then an exact repeat of it. The first half is learnt from bigram statistics;
    the second only by attending back to the first (an induction head): a model whose attention has
    saturated cannot finish it."""
    return _induction_samples("train", n_sequences, corpus_seed, prefix_length)


@lru_cache(maxsize=8)
def induction_eval_set(n_sequences: int, corpus_seed: int = 0, prefix_length: int = 15) -> tuple[Sample, ...]:
    """Fresh sequences from the same chain (none is a training sequence but by chance)."""
    return _induction_samples("eval", n_sequences, corpus_seed, prefix_length)
