"""Seed B's three data sources, generated: list-structured docs, long prose, Q&A.

ANDREA's bandit re-weights ``repo-docs`` (list-structured), ``gutenberg`` (long prose) and
``hermes3-general`` (Q&A). These generators give three sources of the same distinct styles
sharing one vocabulary of everyday words, so one BPE covers them, plus ``foreign``: prose in
Greek script, a source the tokenizer and the model never saw (the honest version of the
seed's shock when it enters the mixture for the first time). Plain Python, deterministic.
"""

from __future__ import annotations

import random
from functools import lru_cache

from pytest_spikecheck.data.corpus import Sample, to_greek
from pytest_spikecheck.scenario.sections import BASE_SOURCES, NEW_SOURCES

# The source names (BASE_SOURCES, NEW_SOURCES) are the scenario layer's vocabulary; built here.

_TOOLS = ("the package", "the tests", "the linter", "the server", "the docs", "the build", "the cache", "the config")
_DOC_VERBS = ("install", "run", "update", "check", "open", "restart", "clean", "read")
_DOC_TAILS = (
    "before you push",
    "after each change",
    "with the default flags",
    "from the project root",
    "on a fresh machine",
    "when the job fails",
    "once a week",
    "in a new shell",
)

_PEOPLE = (
    "the old sailor",
    "a young woman",
    "the tired doctor",
    "my grandfather",
    "the quiet girl",
    "a stranger",
    "the village baker",
    "her brother",
)
_PLACES = (
    "along the shore",
    "through the market",
    "across the bridge",
    "into the forest",
    "past the church",
    "over the hill",
    "down the narrow street",
    "around the lake",
)
_SCENES = (
    "the wind carried the smell of salt",
    "the bells rang for the evening prayer",
    "the rain began to fall",
    "the lamps were lit one by one",
    "the children ran home for supper",
    "the river shone like silver",
    "the dogs barked at the moon",
    "the shops closed their doors",
)

_SUBJECTS = ("a farmer", "the teacher", "a baker", "the doctor", "a sailor", "the student", "a painter", "the driver")
_QUESTIONS = (
    "what does {s} need in the morning",
    "where does {s} go on monday",
    "why does {s} like the rain",
    "how does {s} start the day",
    "when does {s} eat lunch",
    "who helps {s} at work",
)
_ANSWERS = (
    "a warm coat and a cup of tea",
    "the market near the river",
    "it makes the garden green",
    "with a short walk and some bread",
    "a little after noon",
    "a friend from the village",
)


def _docs(rng: random.Random) -> str:
    items = [f"- {rng.choice(_DOC_VERBS)} {rng.choice(_TOOLS)} {rng.choice(_DOC_TAILS)}" for _ in range(3)]
    return "\n".join(items)


def _prose(rng: random.Random) -> str:
    text = f"{rng.choice(_PEOPLE)} walked {rng.choice(_PLACES)}, and {rng.choice(_SCENES)} while {rng.choice(_SCENES)}."
    return text[0].upper() + text[1:]


def _qa(rng: random.Random) -> str:
    subject = rng.choice(_SUBJECTS)
    question = rng.choice(_QUESTIONS).format(s=subject)
    return f"Q: {question[0].upper() + question[1:]}? A: {rng.choice(_ANSWERS).capitalize()}."


_GENERATORS = {"docs": _docs, "prose": _prose, "qa": _qa, "foreign": lambda rng: to_greek(_prose(rng))}


@lru_cache(maxsize=16)
def source_samples(source: str, count: int, corpus_seed: int = 0, split: str = "train") -> tuple[Sample, ...]:
    """``count`` samples of ``source`` (``docs``, ``prose``, ``qa`` or ``foreign``)."""
    if source not in _GENERATORS:
        raise ValueError(f"unknown source {source!r}; choose one of {', '.join(_GENERATORS)}")
    rng = random.Random(f"source-{source}-{split}-{corpus_seed}")
    return tuple(
        Sample(id=f"{source}-{split}-{i:03d}", text=_GENERATORS[source](rng), source=source, rare=source in NEW_SOURCES)
        for i in range(count)
    )


def mixture_corpus(per_source: int, corpus_seed: int = 0) -> tuple[Sample, ...]:
    return tuple(s for source in BASE_SOURCES for s in source_samples(source, per_source, corpus_seed))


def mixture_eval_set(n_samples: int, corpus_seed: int = 0) -> tuple[Sample, ...]:
    per = -(-n_samples // len(BASE_SOURCES))
    mixed = [s for source in BASE_SOURCES for s in source_samples(source, per, corpus_seed, split="eval")]
    return tuple(mixed[:n_samples])
