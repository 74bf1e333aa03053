"""Byte-level BPE trained with Hugging Face ``tokenizers`` on the training texts, cached by content.

Training on 240 sentences takes milliseconds, but a session trains many scenarios on the
same corpus, so the trained tokenizer is kept in memory and on disk (keyed by a hash of the
texts and the vocabulary size). Byte-level means any text encodes, including scripts the
tokenizer never saw: their bytes become single-byte tokens whose embeddings were never
trained, which is what makes unseen-script bursts honest outliers.
"""

from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from pathlib import Path
from typing import Sequence

EOS = "<|endoftext|>"
PAD = "<pad>"


def cache_dir() -> Path:
    """Where trained tokenizers (and other build artefacts) are cached: ``$SPIKECHECK_CACHE_DIR``
    or ``$XDG_CACHE_HOME/pytest-spikecheck`` or ``~/.cache/pytest-spikecheck``."""
    if env := os.environ.get("SPIKECHECK_CACHE_DIR"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "pytest-spikecheck"


class BPETokenizer:
    """A thin wrapper: ``encode`` returns ids with EOS on both ends; ``token(id)`` names a piece."""

    def __init__(self, hf_tokenizer) -> None:  # a tokenizers.Tokenizer
        self._tok = hf_tokenizer
        self.eos_id: int = hf_tokenizer.token_to_id(EOS)
        self.pad_id: int = hf_tokenizer.token_to_id(PAD)
        self.vocab_size: int = hf_tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return [self.eos_id, *self._tok.encode(text).ids, self.eos_id]

    def pieces(self, text: str) -> list[str]:
        return self._tok.encode(text).tokens

    def token(self, token_id: int) -> str:
        return self._tok.id_to_token(int(token_id))

    def token_id(self, piece: str) -> int | None:
        return self._tok.token_to_id(piece)

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)

    def to_json(self) -> str:
        return self._tok.to_str()


def _train(texts: tuple[str, ...], vocab_size: int):
    from tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(list(texts), vocab_size=vocab_size, min_frequency=1, special_tokens=[EOS, PAD], show_progress=False)
    return tok._tokenizer  # the underlying tokenizers.Tokenizer (serialisable, fast)


@lru_cache(maxsize=16)
def train_bpe(texts: tuple[str, ...], vocab_size: int) -> BPETokenizer:
    """Train (or load from the disk cache) a byte-level BPE with ``vocab_size`` tokens."""
    from tokenizers import Tokenizer

    if vocab_size < 258:
        raise ValueError(f"vocab_size must be >= 258 (256 bytes + EOS + PAD), was {vocab_size}")
    digest = hashlib.sha256("\n".join(texts).encode() + f"|{vocab_size}".encode()).hexdigest()[:16]
    path = cache_dir() / "tokenizers" / f"bpe-{vocab_size}-{digest}.json"
    if path.exists():
        return BPETokenizer(Tokenizer.from_file(str(path)))
    hf = _train(texts, vocab_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(hf.to_str())
    tmp.replace(path)  # atomic: parallel pytest-xdist workers may race to write the same file
    return BPETokenizer(hf)
