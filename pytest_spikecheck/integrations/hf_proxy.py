"""A Hugging Face causal LM as a spikecheck model: the proxies of ``spikecheck preflight``
(extra ``[preflight]``; tested with transformers 5.24.0).

:func:`proxy_model` is a model factory (``Scenario(model_factory=PROXY_FACTORY,
model_kwargs={"config": {...}})``): it builds ``transformers``' own class for the config's
``model_type`` (``LlamaForCausalLM``, ``MistralForCausalLM``, ``Qwen2ForCausalLM``,
``Qwen3ForCausalLM``, through ``AutoModelForCausalLM.from_config``) at the vocabulary the
engine's tokenizer has, in float32, and wraps it in :class:`HFProxy`, which meets the model
contract (``training/model_contract.py``) and the engine's hooks:

* the stats hook (``record_stats``, ``spikecheck_stats``): the attention runs through an
  attention function registered with ``transformers.AttentionInterface`` as
  :data:`ATTENTION` (torch's SDPA, as transformers' own ``sdpa`` path calls it), which hands
  the layer's queries and keys (after RoPE and any q/k-norm: the logits' own inputs) to the
  shared measurement (``models.layers.logit_stats``, the same code our GPT and Llama use), so
  ``attn_logit_max`` and the per-head largest logits mean exactly what they mean there;
* QK-Clip's hook (``spikecheck_qk_projections``: each layer's ``q_proj``/``k_proj`` weights and
  biases, Qwen2's ``attention_bias`` included); refused for a model with q/k-norm (Qwen3's, or
  the QKLayerNorm defence), whose norm undoes the clip's scale;
* the model-level defences through ``spikecheck_configure``: ``qk_layernorm`` (an RMSNorm on
  each head's query and key before RoPE, as Qwen3 and OLMo 2 have it, with the config's
  ``rms_norm_eps``) and ``z_loss``; any other model-level break is one line;
* μP's per-group learning rate (``spikecheck_lr_scales``) and output multiplier, when the
  factory is given them (``preflight.hf_config``'s documented rule).

The forward is the HF base model (``model.model``) and its head (``lm_head``), never the HF
loss: the engine's targets are already shifted, and HF's ``labels`` would shift them again.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from typing import Any, Mapping

import torch
import torch.nn as nn

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.models.config import GPTConfig
from pytest_spikecheck.models.layers import QueriesKeys, output_loss_and_stats

#: The transformers version the proxies were built and tested with (pyproject's dev pin).
TESTED_TRANSFORMERS = "5.24.0"
#: The name the measuring attention function is registered under in ``AttentionInterface``.
ATTENTION = "spikecheck"
#: The import path of :func:`proxy_model`, for ``Scenario.model_factory``.
PROXY_FACTORY = "pytest_spikecheck.integrations.hf_proxy:proxy_model"
#: The ``model_type`` values whose HF classes the proxies are built from.
MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def transformers_version() -> str | None:
    """The installed transformers' version, None when it is not installed (reads metadata only)."""
    try:
        return importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return None


def check_transformers(allow_untested: bool = False) -> str:
    """The installed transformers' version; one line when it is missing or (unless
    ``allow_untested``) not the version the proxies were tested with."""
    version = transformers_version()
    if version is None:
        raise ConfigError(
            "spikecheck preflight builds its proxies with transformers, which is not installed: "
            "pip install 'pytest-spikecheck[preflight]'"
        )
    if version != TESTED_TRANSFORMERS and not allow_untested:
        raise ConfigError(
            f"transformers {version} is installed; the preflight proxies were tested with transformers "
            f"{TESTED_TRANSFORMERS} only: install that (pip install 'transformers=={TESTED_TRANSFORMERS}') "
            f"or pass --allow-untested-transformers"
        )
    return version


class _Recording:
    """Where the measuring attention function puts each layer's (queries, keys) during a
    recording forward (None otherwise): one per model, shared by its attention modules."""

    def __init__(self) -> None:
        self.queries_keys: QueriesKeys | None = None


def spikecheck_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, Any]:
    """transformers' SDPA attention, with the layer's queries and keys (B, nh, T, hs), keys
    repeated per query head under grouped-query attention, kept for the stats hook."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    recording = getattr(module, "_spikecheck_recording", None)
    if recording is not None and recording.queries_keys is not None:
        groups = query.shape[1] // key.shape[1]
        recording.queries_keys.append((query, key.repeat_interleave(groups, dim=1) if groups > 1 else key))
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def _register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, spikecheck_attention)


class HeadNormed(nn.Module):
    """A q or k projection followed by an RMSNorm over each head's features (qk-norm before
    RoPE, as Qwen3's ``q_norm``/``k_norm``): (B, T, heads * hs) -> the same shape."""

    def __init__(self, linear: nn.Linear, head_dim: int, eps: float) -> None:
        super().__init__()
        self.linear, self.head_dim = linear, head_dim
        self.norm = nn.RMSNorm(head_dim, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        return self.norm(y.view(*y.shape[:-1], -1, self.head_dim)).view(y.shape)


class HFProxy(nn.Module):
    """An HF causal LM (``self.hf``) under the model contract: ``forward(idx, targets) ->
    (logits, loss)`` with the engine's stats hook, QK-Clip's hook and the model-level defences
    (the module docstring). ``output_multiplier`` scales the logits (μP's readout multiplier);
    ``hidden_lr_scale`` is the learning-rate factor of every hidden matrix (μP; 1 = standard)."""

    #: Measure the attention and output-logit statistics (set by the engine; off for bare use).
    record_stats: bool = False

    def __init__(self, hf_model: nn.Module, *, output_multiplier: float = 1.0, hidden_lr_scale: float = 1.0) -> None:
        super().__init__()
        self.hf = hf_model
        self.output_multiplier, self.hidden_lr_scale = float(output_multiplier), float(hidden_lr_scale)
        self.vocab_size = int(hf_model.config.vocab_size)
        self._loss_config = GPTConfig()  # its z_loss (0) and logit_softcap (0) are what the shared loss reads
        self._recording = _Recording()
        for attention in self.attention_modules():
            attention._spikecheck_recording = self._recording
        self.qk_norm = hasattr(self.attention_modules()[0], "q_norm")  # Qwen3's own q/k-norm

    def attention_modules(self) -> list[nn.Module]:
        return [layer.self_attn for layer in self.hf.model.layers]

    def hidden_matrices(self) -> list[tuple[str, nn.Parameter]]:
        """The 2-D parameters that are neither an embedding nor the output head (nor tied to
        them): the attention and MLP matrices, Muon's and μP's "hidden" role."""
        outside = {p.data_ptr() for p in self.hf.get_input_embeddings().parameters()}
        outside |= {self.hf.lm_head.weight.data_ptr()}
        return [(n, p) for n, p in self.named_parameters() if p.dim() == 2 and p.data_ptr() not in outside]

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> tuple[torch.Tensor, Any]:
        record = self.record_stats and targets is not None and torch.is_grad_enabled()
        self._recording.queries_keys = [] if record else None
        try:
            hidden = self.hf.model(input_ids=idx, use_cache=False).last_hidden_state  # (B, T, C)
        finally:
            attention, self._recording.queries_keys = self._recording.queries_keys, None
        logits = self.hf.lm_head(hidden)  # (B, T, vocab)
        if self.output_multiplier != 1.0:
            logits = logits * self.output_multiplier
        logits, loss, stats = output_loss_and_stats(self._loss_config, logits, targets, attention)
        if loss is not None:
            self.spikecheck_stats = stats
        return logits, loss

    def spikecheck_configure(self, pad_token_id: int = -1, **settings: Any) -> None:
        """The model-level defences a preflight study trains: ``qk_layernorm`` and ``z_loss``."""
        for name, value in settings.items():
            if name == "z_loss":
                self._loss_config = dataclasses.replace(self._loss_config, z_loss=float(value))
            elif name == "qk_layernorm" and value:
                self._add_qk_norm()
            elif name != "qk_layernorm":
                raise ConfigError(
                    f"the {type(self.hf).__name__} proxy takes the model-level breaks qk_layernorm and "
                    f"z_loss; {name}={value!r} is not one of them"
                )

    def _add_qk_norm(self) -> None:
        if self.qk_norm:
            raise ConfigError(
                f"{type(self.hf).__name__} already has q/k-norm (q_norm, k_norm): the qk_layernorm "
                f"defence would add a second one; it is the config as given"
            )
        eps = float(getattr(self.hf.config, "rms_norm_eps", 1e-6))
        for attention in self.attention_modules():
            attention.q_proj = HeadNormed(attention.q_proj, attention.head_dim, eps)
            attention.k_proj = HeadNormed(attention.k_proj, attention.head_dim, eps)
        self.qk_norm = True

    def spikecheck_qk_projections(self) -> list[tuple]:
        """QK-Clip's hook: per layer (W_q, W_k, n_heads, b_q, b_k); refused under q/k-norm."""
        if self.qk_norm:
            raise ConfigError(
                f"QKClip on {type(self.hf).__name__} with q/k-norm: the norm undoes the clip's scale of "
                f"W_q and W_k, so each step would clip again; drop one of the two"
            )
        out = []
        for attention in self.attention_modules():
            q, k = attention.q_proj, attention.k_proj
            out.append((q.weight, k.weight, self.hf.config.num_attention_heads, q.bias, k.bias))
        return out

    def spikecheck_lr_scales(self) -> dict[str, float]:
        """The learning-rate factor per parameter name where it is not 1 (μP's hidden matrices)."""
        if self.hidden_lr_scale == 1.0:
            return {}
        return {n: self.hidden_lr_scale for n, _ in self.hidden_matrices()}


def proxy_model(
    vocab_size: int,
    *,
    config: Mapping[str, Any],
    transformers: str = TESTED_TRANSFORMERS,
    output_multiplier: float = 1.0,
    hidden_lr_scale: float = 1.0,
    hidden_init_scale: float = 1.0,
) -> HFProxy:
    """The model factory: the HF class of ``config["model_type"]`` built from ``config`` (a
    scaled ``config.json``, ``preflight.hf_config.proxy_config``) at ``vocab_size``, float32,
    initialised by the class's own ``_init_weights`` under torch's seeded generator; hidden
    matrices then multiplied by ``hidden_init_scale`` (μP's 1/sqrt(width) init). ``transformers``
    is the version the study was planned with (part of the run's cache key); building under
    another is one line."""
    installed = transformers_version()
    if installed != transformers:
        raise ConfigError(
            f"this proxy was planned with transformers {transformers}, and {installed} is installed: "
            f"rerun the preflight with the installed one"
        )
    import transformers as hf

    fields = dict(config)
    model_type = fields.pop("model_type", None)
    if model_type not in MODEL_TYPES:
        raise ConfigError(f"proxy_model: model_type {model_type!r} is not one of {', '.join(MODEL_TYPES)}")
    _register_attention()
    hf_config = hf.AutoConfig.for_model(model_type, **{**fields, "vocab_size": int(vocab_size)})
    hf_config._attn_implementation = ATTENTION
    model = hf.AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    proxy = HFProxy(model, output_multiplier=output_multiplier, hidden_lr_scale=hidden_lr_scale)
    if hidden_init_scale != 1.0:
        with torch.no_grad():
            for _, p in proxy.hidden_matrices():
                p.mul_(hidden_init_scale)
    return proxy
