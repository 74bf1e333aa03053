"""A Hugging Face ``config.json``, read offline and checked, and the scaling rule that turns it
into proxies (docs/preflight.md, "The scaling rule"). json only: no torch, no transformers.

The rule, per proxy width ``w`` (printed by :func:`scaling_rule_lines`):

* ``hidden_size`` = w; ``intermediate_size`` = w times the config's ratio, rounded to a
  multiple of 8 (at least 8);
* heads: ``head_dim`` kept (the config's, or ``--head-dim``), so ``num_attention_heads`` =
  w / head_dim grows with width (default, ``heads="scale"``); or ``heads="keep"``: the config's
  head counts, head_dim = w / heads. Either way the query/KV group ratio is the config's;
* ``num_hidden_layers`` = the proxy depth (:data:`PROXY_LAYERS` by default, ``--layers``);
* ``vocab_size`` = the proxy tokenizer's (the engine's corpus); ``pad/bos/eos_token_id``
  unset (they index the real vocabulary; the corpora never feed them);
* kept as the config has them: ``attention_bias``, ``mlp_bias``, Qwen3's q/k-norm,
  ``rms_norm_eps``, ``rope_theta`` / ``rope_parameters`` / ``rope_scaling``,
  ``tie_word_embeddings``, ``hidden_act``, ``initializer_range``, ``attention_dropout``.

A field that changes the architecture in a way the proxies do not model is one line (a
:class:`ConfigError`): mixture-of-experts routing, multi-head latent attention, soft-capping,
a sliding window shorter than the proxy's sequence. A sliding window at least as long as the
proxy's sequences is full attention there, and is one printed note.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from pytest_spikecheck.errors import ConfigError

#: The model types the proxies are built for (transformers' classes of the same name).
MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
#: The proxy depth unless ``layers`` says otherwise.
PROXY_LAYERS = 2
#: Fields that change the architecture in ways the proxies do not model, by what they are.
UNMODELLED = {
    "num_experts": "mixture-of-experts routing",
    "num_local_experts": "mixture-of-experts routing",
    "n_routed_experts": "mixture-of-experts routing",
    "moe_intermediate_size": "mixture-of-experts routing",
    "num_experts_per_tok": "mixture-of-experts routing",
    "kv_lora_rank": "multi-head latent attention (MLA)",
    "q_lora_rank": "multi-head latent attention (MLA)",
    "attn_logit_softcapping": "attention-logit soft-capping",
    "final_logit_softcapping": "output-logit soft-capping",
}
#: Fields the proxy drops because they index the real vocabulary.
TOKEN_FIELDS = ("pad_token_id", "bos_token_id", "eos_token_id")
#: Fields that describe the checkpoint, not the architecture (dropped from the proxy's config).
CHECKPOINT_FIELDS = (
    "architectures",
    "torch_dtype",
    "dtype",
    "transformers_version",
    "_name_or_path",
    "use_cache",
    "quantization_config",
    "auto_map",
)


@dataclass(frozen=True)
class HFConfig:
    """A checked ``config.json``: its fields as read, where it came from, and the numbers the
    scaling rule uses. ``notes`` are the lines printed about fields kept or noted."""

    raw: Mapping[str, Any]
    source: str
    model_type: str
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    num_hidden_layers: int
    qk_norm: bool
    notes: tuple[str, ...] = field(default=())

    @property
    def group(self) -> int:
        """Query heads per key/value head."""
        return self.num_attention_heads // self.num_key_value_heads


def _positive_int(raw: Mapping[str, Any], name: str, where: str, default: Any = None) -> int:
    value = raw.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: {name} must be a positive integer, was {value!r}")
    return value


def check_config(raw: Any, where: str = "config", block_size: int = 32) -> HFConfig:
    """Check a config's fields (the module docstring); every problem is one line."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: a config.json holds one JSON object, this holds a {type(raw).__name__}")
    for name in ("model_type", "hidden_size"):
        if name not in raw:
            raise ConfigError(f"{where} has no {name!r}: is it a Hugging Face model config.json?")
    model_type = raw["model_type"]
    if model_type not in MODEL_TYPES:
        raise ConfigError(
            f"{where}: model_type {model_type!r} is not supported; preflight builds proxies for {', '.join(MODEL_TYPES)}"
        )
    for name, what in UNMODELLED.items():
        if raw.get(name) not in (None, 0, False):
            raise ConfigError(
                f"{where}: {name} = {raw[name]!r} ({what}) changes the architecture in a way the "
                f"{model_type} proxies do not model"
            )
    notes = []
    window = raw.get("sliding_window")
    active = window is not None and (model_type == "mistral" or raw.get("use_sliding_window") is True)
    if "sliding_attention" in (raw.get("layer_types") or ()):
        active = True
    if active:
        if not isinstance(window, int) or window < block_size:
            raise ConfigError(
                f"{where}: sliding_window {window!r} is shorter than the proxy's sequences "
                f"({block_size} tokens): a windowed attention the proxies do not model"
            )
        notes.append(
            f"sliding_window {window}: at the proxy's {block_size}-token sequences every query sees every "
            f"key, so the proxies train full attention (the window's effect at long context is not studied)"
        )
    hidden = _positive_int(raw, "hidden_size", where)
    heads = _positive_int(raw, "num_attention_heads", where)
    kv = _positive_int(raw, "num_key_value_heads", where, heads)
    if heads % kv:
        raise ConfigError(f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
    head_dim = raw.get("head_dim") or (hidden // heads if hidden % heads == 0 else None)
    if head_dim is None:
        raise ConfigError(f"{where}: hidden_size {hidden} does not split into {heads} heads and there is no head_dim")
    head_dim = _positive_int({"head_dim": head_dim}, "head_dim", where)
    intermediate = _positive_int(raw, "intermediate_size", where)
    layers = _positive_int(raw, "num_hidden_layers", where)
    if raw.get("rope_scaling"):
        notes.append(f"rope_scaling {raw['rope_scaling']!r}: kept (transformers' {model_type} class applies it)")
    return HFConfig(
        raw=dict(raw),
        source=where,
        model_type=model_type,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=head_dim,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        qk_norm=model_type == "qwen3",
        notes=tuple(notes),
    )


def read_config(path: str | Path, block_size: int = 32) -> HFConfig:
    """Read and check a ``config.json`` (a file, or a folder holding one) offline."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} is not JSON ({exc})") from None
    return check_config(raw, str(path), block_size)


def check_widths(config: HFConfig, widths: Sequence[int], heads: str = "scale", head_dim: int | None = None) -> None:
    """The proxy widths: a non-empty, strictly increasing list of widths no larger than the
    config's, each of which splits into whole heads under the head rule; one line otherwise."""
    widths = list(widths)
    if not widths:
        raise ConfigError("the proxy width list is empty: give at least two widths, e.g. --widths 64,128,256")
    if any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in widths):
        raise ConfigError(f"proxy widths must be positive integers, were {widths}")
    if widths != sorted(set(widths)):
        raise ConfigError(f"proxy widths must be strictly increasing, were {widths}")
    if widths[-1] > config.hidden_size:
        raise ConfigError(
            f"proxy width {widths[-1]} is larger than the config's hidden_size {config.hidden_size}: "
            f"proxies are smaller than the model they stand for"
        )
    if heads not in ("scale", "keep"):
        raise ConfigError(f"heads must be 'scale' (keep head_dim) or 'keep' (keep the head counts), was {heads!r}")
    for w in widths:
        proxy_heads(config, w, heads, head_dim)


def proxy_heads(config: HFConfig, width: int, heads: str = "scale", head_dim: int | None = None) -> tuple[int, int, int]:
    """(query heads, key/value heads, head_dim) of the proxy at ``width``; one line when it does not split."""
    group = config.group
    if heads == "keep":
        n = config.num_attention_heads
        if width % n:
            raise ConfigError(
                f"width {width} does not split into the config's {n} heads (heads: keep): give widths that are multiples of {n}"
            )
        return n, config.num_key_value_heads, width // n
    hd = head_dim or config.head_dim
    if width % (hd * group):
        raise ConfigError(
            f"width {width} does not hold a whole number of {group}-query-head groups of head_dim {hd} "
            f"(widths must be multiples of {hd * group}): give other --widths, or a smaller --head-dim"
        )
    n = width // hd
    return n, n // group, hd


def proxy_config(
    config: HFConfig, width: int, *, layers: int = PROXY_LAYERS, heads: str = "scale", head_dim: int | None = None
) -> dict[str, Any]:
    """The proxy's config at ``width`` (the module docstring's rule), without ``vocab_size``
    (the factory takes the tokenizer's): plain JSON, the model factory's keyword argument."""
    n_heads, n_kv, hd = proxy_heads(config, width, heads, head_dim)
    ratio = config.intermediate_size / config.hidden_size
    out = {k: v for k, v in config.raw.items() if k not in CHECKPOINT_FIELDS + TOKEN_FIELDS + ("vocab_size",)}
    out.update(
        hidden_size=width,
        intermediate_size=max(8, 8 * round(width * ratio / 8)),
        num_hidden_layers=layers,
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv,
        head_dim=hd,
    )
    if "layer_types" in out:  # one entry per layer (all full attention: check_config refused the rest)
        out["layer_types"] = ["full_attention"] * layers
    if "max_window_layers" in out:
        out["max_window_layers"] = layers
    return out


def scaling_rule_lines(
    config: HFConfig, widths: Sequence[int], *, layers: int = PROXY_LAYERS, heads: str = "scale", head_dim: int | None = None
) -> list[str]:
    """The scaling rule as applied to this config, one line per proxy and per kept field."""
    ratio = config.intermediate_size / config.hidden_size
    lines = [
        f"{config.model_type} config {config.source}: hidden_size {config.hidden_size}, "
        f"{config.num_hidden_layers} layers, {config.num_attention_heads} heads / {config.num_key_value_heads} "
        f"KV (group {config.group}), head_dim {config.head_dim}, intermediate {config.intermediate_size} "
        f"(ratio {ratio:.3g})",
        f"scaling rule: hidden_size = width; intermediate = width x {ratio:.3g} (multiple of 8); "
        + ("head_dim kept, heads = width / head_dim" if heads == "scale" else "head counts kept, head_dim = width / heads")
        + f"; group ratio {config.group} kept; {layers} layers; vocabulary = the proxy tokenizer's",
    ]
    for w in widths:
        p = proxy_config(config, w, layers=layers, heads=heads, head_dim=head_dim)
        lines.append(
            f"  proxy width {w}: {p['num_attention_heads']} heads / {p['num_key_value_heads']} KV x head_dim "
            f"{p['head_dim']}, intermediate {p['intermediate_size']}, {layers} layers"
        )
    kept = [
        f"{k} {config.raw[k]!r}"
        for k in ("attention_bias", "mlp_bias", "rms_norm_eps", "rope_theta", "tie_word_embeddings", "hidden_act")
        if k in config.raw
    ]
    if config.qk_norm:
        kept.append("q/k-norm (qwen3)")
    lines.append("kept: " + (", ".join(kept) if kept else "the class defaults"))
    lines.extend(f"note: {n}" for n in config.notes)
    return lines
