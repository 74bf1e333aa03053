"""Column names: which of a log's columns is the step, which are ours under another tool's
name, and which are bookkeeping (wall clock, throughput) rather than training signal.

Matching ignores case and treats ``_``, ``-`` and a space alike (``Loss``, ``lm loss``,
``LM_Loss`` are one name); ``/`` and ``.`` are kept, so ``train/loss`` is not ``train_loss``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable, Mapping

from pytest_spikecheck.errors import ConfigError

#: Our metric name -> the names other tools give it, most specific first. The first one
#: present is read under our name, unless the log already has a column with our name.
#: ``grad_norm`` (HF's pre-clip norm) is kept as it is: the assertions accept it wherever
#: the pre-clip norm is asked for.
KNOWN_NAMES: dict[str, tuple[str, ...]] = {
    "loss": (
        "train/loss",
        "train_loss_step",
        "train_loss",
        "loss/train",
        "lm loss",
        "train/CrossEntropyLoss",
        "training_loss",
        "train loss",
        "train/nll_loss",
        "nll_loss",
        "train_nll_loss",
        "act_loss",
    ),  # ... DeepSpeed-Chat's PPO actor loss (an RL surrogate: its cri_loss marks the log RL)  # HF via TB/W&B; Lightning; Megatron; OLMo
    "eval_loss": (
        "eval/loss",
        "val_loss",
        "val/loss",
        "loss/val",
        "validation_loss",
        "valid_loss",
        "validation lm loss",
        "val loss",
    ),
    "lr": (
        "learning_rate",
        "train/learning_rate",
        "learning rate",
        "lr-AdamW",
        "lr-Adam",
        "lr-SGD",
        "optim/learning_rate_group0",
    ),  # HF; Megatron; Lightning's LearningRateMonitor; OLMo
    "grad_norm": (
        "train/grad_norm",
        "grad norm",
        "grad_2.0_norm_total",
        "total_norm",
        "global_norm",
        "gradient_norm",
        "optim/total_grad_norm",
        "train/global_grad_norm",
        "norm",
    ),  # build-nanogpt's and nanochat's stdout print the clip's total norm as "norm"
    "eval_bpb": ("val/bpb", "val_bpb", "validation bpb", "val bpb"),  # nanochat: bits per byte
    "loss_scale": ("loss scale", "scaler/scale", "train/loss_scale", "grad_scale"),  # Megatron; GradScaler loggers
}

#: Columns that can hold the training step, most trustworthy first. W&B's ``_step`` counts
#: ``wandb.log`` calls (a train row and an eval row are two), so a real step column wins.
#: ``current_steps`` is LLaMA-Factory's ``trainer_log.jsonl``.
STEP_COLUMNS = ("step", "global_step", "train/global_step", "trainer/global_step", "current_steps", "_step")


def key(name: str) -> str:
    """The form names are compared in: lower case, with ``_``, ``-`` and spaces alike."""
    return re.sub(r"[\s_\-]+", "_", name.strip().lower())


_STEP_KEYS = {key(c): i for i, c in enumerate(STEP_COLUMNS)}


def step_column(names: Iterable[str]) -> str | None:
    """The column that holds the step: the most trustworthy of STEP_COLUMNS present, in any case."""
    found = [(_STEP_KEYS[key(n)], n) for n in names if key(n) in _STEP_KEYS]
    return min(found)[1] if found else None


_BOOKKEEPING_SUFFIXES = ("_runtime", "_per_second", "per_second")
_BOOKKEEPING_WORDS = (
    "elapsed time",
    "throughput",
    "tokens per",
    "samples per",
    "consumed samples",
    "consumed tokens",
    "tflops",
    "mfu",
    "memory",
    "tok/s",
    "tok/sec",  # nanochat's and build-nanogpt's tok/sec
    "tokens/sec",
    "time",  # a step's wall-clock time: "time: 644.64 ms", train_time, time/step
    "batches_per_second",
    "time per iteration",
    "batch size",
    "elapsed",
    "eta",
    "steps/s",
    "it/s",
    "iteration time",
    "mem allocated",
)


#: The bookkeeping words as runs of whole words ("eta" is no part of "theta", "it/s" none of "split/score").
_BOOKKEEPING_RUNS = tuple(tuple(re.findall(r"[a-z0-9]+", w)) for w in _BOOKKEEPING_WORDS)
#: Words that make a column a training signal whatever else it says ("memory_loss", "eta_grad_norm").
_SIGNAL_WORDS = frozenset({"loss", "norm", "grad", "gradient", "ppl", "perplexity", "logit", "logits"})


def _has_run(words: list[str], run: tuple[str, ...]) -> bool:
    n = len(run)
    return any(tuple(words[i : i + n]) == run for i in range(len(words) - n + 1))


def is_bookkeeping(name: str) -> bool:
    """Wall-clock, throughput, FLOP and progress counters (HF's eval_runtime, *_samples_per_second,
    total_flos; W&B's _runtime, _timestamp; Megatron's elapsed time and consumed samples) and the
    step columns themselves: no training signal, and they would crowd every listing and error.
    The words match whole words, and a name with a loss, norm or gradient word is never one."""
    low = name.lower()
    words = re.findall(r"[a-z0-9]+", low)
    if _SIGNAL_WORDS.intersection(words):
        return False
    return (
        key(name) in _STEP_KEYS
        or name.startswith("_")
        or low.endswith(_BOOKKEEPING_SUFFIXES)
        or low
        in (
            "total_flos",
            "total_steps",
            "percentage",
            "v_num",
            "rank",
            "local_rank",
        )  # LLaMA-Factory's progress; Lightning's bar; the printing rank
        or any(_has_run(words, run) for run in _BOOKKEEPING_RUNS)
        or low.startswith(("throughput/", "system/"))
    )


def listing(names: Iterable[str], limit: int = 12) -> str:
    """Column names for an error message, capped: a W&B export can have hundreds."""
    names = list(names)
    more = f", ... ({len(names) - limit} more)" if len(names) > limit else ""
    return (", ".join(names[:limit]) or "no columns") + more


def rename(path: Path, columns: list[str], mapping: Mapping[str, str]) -> dict[str, str]:
    """source column -> the name it is read under: the explicit mapping first (exact names),
    then KNOWN_NAMES and our own names in any case (``Loss`` is ``loss``)."""
    present = set(columns)
    for ours, theirs in mapping.items():
        if theirs not in present:
            raise ConfigError(f"{path}: cannot map {ours}={theirs}: the log has no {theirs!r} column (it has {listing(columns)})")
    sources = list(mapping.values())
    twice = next((s for s in sources if sources.count(s) > 1), None)
    if twice is not None:
        raise ConfigError(f"{path}: column {twice!r} is mapped twice")
    explicit = {theirs: ours for ours, theirs in mapping.items()}
    # A mapped column replaces a column that already has the name it is mapped to.
    out = {c: explicit.get(c, c) for c in columns if c in explicit or c not in mapping}
    taken = set(out.values())
    by_key: dict[str, str] = {}
    for c in out:
        if out[c] == c:  # not renamed explicitly: free to be read under a known name
            by_key.setdefault(key(c), c)
    for ours, aliases in KNOWN_NAMES.items():
        if ours in taken:
            continue
        alias = next((by_key[key(a)] for a in (ours, *aliases) if key(a) in by_key), None)
        if alias is not None:
            out[alias] = ours
            taken.add(ours)
    return out
