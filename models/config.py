"""Model configuration and named presets. Plain dataclasses: importing this never imports torch."""

from __future__ import annotations

from dataclasses import dataclass

from pytest_spikecheck.errors import ConfigError


#: model.arch values: the GPT-2-style model (models/gpt.py) and the Llama-style one (models/llama.py).
ARCHS = ("gpt", "llama")
#: model.pos_embedding values; ``auto`` is each arch's own (ARCH_POSITIONS' first entry).
POS_EMBEDDINGS = ("auto", "learned", "rope", "none")
#: The position schemes each arch implements, its own first. A GPT has learned absolute
#: positions (GPT-2) or none; a Llama rotates q and k (RoPE) or has none (NoPE). Learned
#: absolute positions on a Llama (or RoPE on the GPT) are no model anyone trains: refused.
ARCH_POSITIONS = {"gpt": ("learned", "none"), "llama": ("rope", "none")}
PAD_EMBEDDINGS = ("learned", "zero")
DTYPES = ("float32", "float16", "bfloat16")
#: The target id that adds nothing to the loss (padding): torch's and Hugging Face's default
#: ``ignore_index``. The one definition: the models, the datasets and the recorders import it.
IGNORE_INDEX = -100
#: The stats-hook key of the per-head largest attention logit, a (layers, heads) tensor (the
#: built-in models report it beside the per-step scalars; QK-Clip and the event records read it).
HEAD_LOGITS_KEY = "attn_logit_max_per_head"


@dataclass(frozen=True)
class GPTConfig:
    """The built-in models' shape and switches. ``arch`` picks the model: ``gpt`` (GPT-2: LayerNorm,
    learned positions, GELU MLP, fused q/k/v, biases) or ``llama`` (RMSNorm, RoPE, SwiGLU MLP,
    no biases, separate q/k/v projections, grouped-query attention with ``n_kv_head``)."""

    arch: str = "gpt"  # gpt | llama
    n_layer: int = 2  # transformer blocks
    n_head: int = 4  # attention heads per block; n_embd must divide by it
    n_embd: int = 64  # residual stream width
    block_size: int = 32  # context length in tokens
    vocab_size: int = 0  # 0 = take it from the tokenizer when the engine builds the model
    n_kv_head: int = 0  # llama: key/value heads (grouped-query attention; must divide n_head); 0 = n_head
    bias: bool = True  # gpt: biases in Linear and LayerNorm, as GPT-2 (a llama has none)
    layernorm_eps: float = (
        1e-5  # the LayerNorm's (gpt) or RMSNorm's (llama) eps; 0 is a numeric break: a constant input then gives 0/0 = NaN
    )
    init_std: float = 0.02  # GPT-2 init; residual projections get init_std / sqrt(2 * n_layer)
    pos_embedding: str = "auto"  # auto (gpt: learned, llama: rope) | learned | rope | none (position only
    # through causal attention, as NoPE models)
    pad_embedding: str = "learned"  # learned | zero (padding_idx: a zero row that never trains)
    mask_padding: bool = False  # attention ignores padding keys (a row with no key left is all -inf)
    dtype: str = "float32"  # float32 | float16 | bfloat16: parameters, activations and AdamW state
    pad_token_id: int = -1  # set by the engine from the tokenizer (-1 = no padding token)
    # Large-scale defences against high-learning-rate instabilities (Wortsman et al. 2023); all off by default.
    qk_layernorm: bool = False  # LayerNorm (llama: RMSNorm) on each head's queries and keys (Dehghani et al. 2023)
    z_loss: float = 0.0  # coefficient of the auxiliary loss mean(log(Z)^2) on the output logits (PaLM: 1e-4)
    logit_softcap: float = 0.0  # > 0: output logits become cap * tanh(logits / cap) (Gemma 2); 0 = none
    attn_gate: bool = False  # a per-head sigmoid gate on each attention output, from the block's input (Qiu et al. 2025)

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "n_embd", "block_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"model.{name} must be a positive integer, was {value!r}")
        if self.n_embd % self.n_head:
            raise ConfigError(f"model.n_embd ({self.n_embd}) must be divisible by model.n_head ({self.n_head})")
        if self.vocab_size < 0:
            raise ConfigError(f"model.vocab_size must be >= 0 (0 = from the tokenizer), was {self.vocab_size}")
        for name in ("z_loss", "logit_softcap"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or value == float("inf"):
                raise ConfigError(f"model.{name} must be a finite number >= 0 (0 = off), was {value!r}")
        if self.layernorm_eps < 0:
            raise ConfigError(f"model.layernorm_eps must be >= 0, was {self.layernorm_eps}")
        for name, allowed in (
            ("arch", ARCHS),
            ("pos_embedding", POS_EMBEDDINGS),
            ("pad_embedding", PAD_EMBEDDINGS),
            ("dtype", DTYPES),
        ):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"model.{name} must be one of {', '.join(allowed)}, was {getattr(self, name)!r}")
        own = ARCH_POSITIONS[self.arch]
        if self.pos_embedding not in ("auto",) + own:
            raise ConfigError(
                f"model.pos_embedding {self.pos_embedding} does not go with arch {self.arch}, which takes "
                f"{' or '.join(own)} (auto = {own[0]})"
            )
        if not isinstance(self.n_kv_head, int) or isinstance(self.n_kv_head, bool) or self.n_kv_head < 0:
            raise ConfigError(f"model.n_kv_head must be an integer >= 0 (0 = n_head), was {self.n_kv_head!r}")
        if self.n_head % self.kv_heads:
            raise ConfigError(
                f"model.n_kv_head ({self.n_kv_head}) must divide model.n_head ({self.n_head}): each "
                f"key/value head serves the same number of query heads"
            )
        if self.arch == "gpt" and self.kv_heads != self.n_head:
            raise ConfigError(
                f"model.n_kv_head {self.n_kv_head}: grouped-query attention is the llama model's "
                f"(set model.arch: llama); the gpt has one key/value head per query head"
            )
        head_size = self.n_embd // self.n_head
        if self.positions == "rope" and head_size % 2:
            raise ConfigError(
                f"model.n_embd / model.n_head = {head_size}: RoPE rotates pairs of a head's dimensions, "
                f"so the head size must be even (or set model.pos_embedding: none)"
            )

    @property
    def positions(self) -> str:
        """The position scheme the model uses: ``pos_embedding``, ``auto`` resolved to the arch's own."""
        return ARCH_POSITIONS[self.arch][0] if self.pos_embedding == "auto" else self.pos_embedding

    @property
    def kv_heads(self) -> int:
        """Key/value heads: ``n_kv_head``, 0 resolved to ``n_head``."""
        return self.n_kv_head or self.n_head


#: Named shapes. ``micro`` is Seed A's Phase-19 model. The ``andrea-*`` shapes are Seed B's
#: models (vocab 8449); they exist for kernel benchmarks and the capacity sweep's upper end,
#: and are far too slow to train on a CPU.
PRESETS: dict[str, GPTConfig] = {
    "nano": GPTConfig(n_layer=2, n_head=2, n_embd=32),
    "micro": GPTConfig(n_layer=2, n_head=4, n_embd=64),
    "mini": GPTConfig(n_layer=4, n_head=4, n_embd=128),
    "small": GPTConfig(n_layer=6, n_head=8, n_embd=256),
    "andrea-12m": GPTConfig(n_layer=6, n_head=6, n_embd=384, block_size=256, vocab_size=8449),
    "andrea-120m": GPTConfig(n_layer=12, n_head=12, n_embd=768, block_size=256, vocab_size=8449),
}


def model_preset(name: str) -> GPTConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown model preset {name!r}; choose one of {', '.join(PRESETS)}") from None
