"""Your own model: the contract a ``Scenario(model_factory=...)`` model meets, checked when it is built.

The factory is a callable or its import path ``"package.module:function"``, called as
``factory(vocab_size, **scenario.model_kwargs)``; it returns a ``torch.nn.Module`` whose

* ``forward(idx, targets)`` returns ``(logits, loss)``, the loss a mean cross-entropy that skips
  targets equal to :data:`IGNORE_INDEX` (-100, torch's default ``ignore_index``: padding), **or**
* ``forward(idx)`` returns ``logits`` of shape ``(batch, time, vocab_size)``; the engine then
  computes that loss itself.

Model-level breaks (``LayerNormEps0``, ``MaskPaddingKeys``, ``QKLayerNorm``, ``ZLoss``,
``LogitSoftcap``, ``GatedAttention``) change the model, not the data. A custom model applies them
through a hook, ``spikecheck_configure(**settings)``, called once after the factory with the
changed settings (:data:`MODEL_LEVEL_FIELDS`) and the tokenizer's ``pad_token_id``; a model without
the hook refuses such a break with a :class:`ConfigError` instead of silently ignoring it.

Each rule is checked once, when the model is built, by a dry forward pass on a two-row batch
(under ``torch.random.fork_rng``, so it does not move the training's random streams); a
violation is one line naming the rule and the fix.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable

import torch
import torch.nn.functional as F

from pytest_spikecheck.models.config import IGNORE_INDEX
from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.models.config import GPTConfig
from pytest_spikecheck.scenario import Scenario

#: The method a custom model implements to take model-level breaks.
CONFIGURE_HOOK = "spikecheck_configure"
#: GPTConfig fields that model-level breaks change (the rest of ``model`` describes the built-in GPT).
MODEL_LEVEL_FIELDS = (
    "layernorm_eps",
    "pos_embedding",
    "pad_embedding",
    "mask_padding",
    "qk_layernorm",
    "z_loss",
    "logit_softcap",
    "attn_gate",
)
#: GPTConfig fields that pick a built-in model: meaningless with your own.
BUILT_IN_FIELDS = ("arch", "n_kv_head")


def resolve_factory(factory: Callable[..., Any] | str) -> Callable[..., Any]:
    """The factory itself, importing ``"package.module:function"`` when given as a path."""
    if callable(factory):
        return factory
    module_name, _, attribute = factory.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"model factory {factory!r}: cannot import {module_name!r} ({exc}); is its folder on "
            f"sys.path (installed, or next to the conftest.py / run from that folder)?"
        ) from None
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"model factory {factory!r}: module {module_name!r} has no attribute {attribute!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"model factory {factory!r} is not callable (a {type(obj).__name__})")
    if inspect.isbuiltin(obj):  # os:_exit, builtins:exec ...: a config file is code, and this is no model factory
        raise ConfigError(
            f"model factory {factory!r} is a built-in function, not a model factory (a function or "
            f"class returning an nn.Module); model.factory is imported and called: a config file is "
            f"code (docs/limits.md)"
        )
    return obj


def model_level_settings(scenario: Scenario) -> dict[str, Any]:
    """The model-level settings the (resolved) scenario changes from the defaults."""
    defaults = GPTConfig()
    return {
        name: getattr(scenario.model, name)
        for name in MODEL_LEVEL_FIELDS
        if getattr(scenario.model, name) != getattr(defaults, name)
    }


#: The custom model's hooks the wrapper hands through to the engine, where the model has them: the
#: stats hook (``record_stats``, ``spikecheck_stats``), QK-Clip's (``spikecheck_qk_projections``)
#: Muon's stacked matrices (``spikecheck_fused_projections``) and per-parameter lr factors
#: (``spikecheck_lr_scales``, the optimizer's parameter groups).
FORWARDED_HOOKS = (
    "record_stats",
    "spikecheck_stats",
    "spikecheck_qk_projections",
    "spikecheck_fused_projections",
    "spikecheck_lr_scales",
)


class ContractModel(torch.nn.Module):
    """The custom model, called the way the engine calls the built-in GPT: ``model(idx, targets)
    -> (logits, loss)`` and ``model(idx) -> (logits, None)``. Parameter names are the custom
    model's own (no wrapper prefix), so event records name its tensors as its author does. The
    hooks of :data:`FORWARDED_HOOKS` are the inner model's (absent where it has none)."""

    def __init__(self, inner: torch.nn.Module, takes_targets: bool, label: str, vocab_size: int = 0) -> None:
        super().__init__()
        self.inner = inner
        self.takes_targets = takes_targets
        self.label = label
        self.vocab_size = vocab_size  # Muon's role rule: a matrix with this many rows or columns is the head

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name in FORWARDED_HOOKS:
                return getattr(self._modules["inner"], name)
            raise

    def __setattr__(self, name: str, value: Any) -> None:
        if name in FORWARDED_HOOKS and "inner" in self._modules:
            setattr(self._modules["inner"], name, value)
        else:
            super().__setattr__(name, value)

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        return self.inner.named_parameters(prefix=prefix, recurse=recurse, remove_duplicate=remove_duplicate)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> tuple[torch.Tensor, Any]:
        out = self.inner(idx, targets) if self.takes_targets else self.inner(idx)
        if isinstance(out, torch.Tensor):
            logits, loss = out, None
        elif isinstance(out, (tuple, list)) and len(out) == 2 and isinstance(out[0], torch.Tensor):
            logits, loss = out
        else:
            raise ConfigError(
                f"model {self.label}: forward must return logits or (logits, loss), "
                f"returned {type(out).__name__}" + (f" of length {len(out)}" if isinstance(out, (tuple, list)) else "")
            )
        if targets is not None and loss is None:
            loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=IGNORE_INDEX)
        return logits, loss


def _takes_targets(model: torch.nn.Module) -> bool:
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params)


def build_custom_model(scenario: Scenario, vocab_size: int, pad_token_id: int) -> ContractModel:
    """Build the scenario's custom model, apply its model-level breaks through the hook, and
    check the contract with a dry forward pass. Every violation is a one-line ConfigError."""
    label = scenario.model_factory_path
    defaults = GPTConfig()
    for name in BUILT_IN_FIELDS:
        if getattr(scenario.model, name) != getattr(defaults, name):
            raise ConfigError(
                f"model.{name} {getattr(scenario.model, name)!r} picks a built-in model, and the scenario "
                f"trains your own ({label}): drop it (your factory decides the architecture)"
            )
    factory = resolve_factory(scenario.model_factory)
    kwargs = dict(scenario.model_kwargs)
    try:
        inspect.signature(factory).bind(vocab_size, **kwargs)
    except TypeError as exc:
        raise ConfigError(
            f"model factory {label} is called as factory(vocab_size, **model_kwargs) with model_kwargs {kwargs}: {exc}"
        ) from None
    except ValueError:  # no signature (a builtin): let the call say
        pass
    model = factory(vocab_size, **kwargs)
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f"model factory {label} must return a torch.nn.Module, returned {type(model).__name__}")
    settings = model_level_settings(scenario)
    if settings:
        hook = getattr(model, CONFIGURE_HOOK, None)
        if not callable(hook):
            changed = ", ".join(f"{k}={v!r}" for k, v in settings.items())
            raise ConfigError(
                f"the scenario's breaks change the model ({changed}), but the custom model from {label} "
                f"has no {CONFIGURE_HOOK}(**settings) method to apply them: implement it (README, "
                f"'Your own model') or drop the model-level break"
            )
        hook(**settings, pad_token_id=pad_token_id)
    wrapped = ContractModel(model, _takes_targets(model), label, vocab_size)
    _dry_run(wrapped, vocab_size, scenario.model.block_size, label)
    return wrapped


def _dry_run(model: ContractModel, vocab_size: int, block_size: int, label: str) -> None:
    """One forward pass on two rows (the second ends in padding targets) to check the contract."""
    time_steps = max(2, min(4, block_size))
    idx = torch.zeros(2, time_steps, dtype=torch.long)
    targets = torch.ones(2, time_steps, dtype=torch.long)
    targets[1, -1] = IGNORE_INDEX
    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            logits, loss = model(idx, targets)
    except ConfigError:
        raise
    except IndexError as exc:
        raise ConfigError(
            f"model {label} failed on targets holding IGNORE_INDEX ({IGNORE_INDEX}, padding): compute the "
            f"loss with ignore_index=pytest_spikecheck.IGNORE_INDEX (torch's default), or return only "
            f"logits and let the engine compute it ({type(exc).__name__}: {exc})"
        ) from None
    except Exception as exc:
        raise ConfigError(
            f"model {label} failed a forward pass on a (2, {time_steps}) batch of token ids: {type(exc).__name__}: {exc}"
        ) from None
    finally:
        model.train(was_training)
    if tuple(logits.shape) != (2, time_steps, vocab_size):
        raise ConfigError(
            f"model {label}: logits must have shape (batch, time, vocab_size) = (2, {time_steps}, "
            f"{vocab_size}), had {tuple(logits.shape)}"
        )
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        raise ConfigError(f"model {label}: the loss must be a scalar tensor, was {loss!r:.80}")
