"""Building what a scenario trains: the model (the built-in GPT or the user's factory) and
AdamW with nanoGPT's parameter groups."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from pytest_spikecheck.scenario import Scenario

#: The model's dtype per scenario ``model.dtype``.
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def build_model(scenario: Scenario, vocab_size: int, pad_token_id: int = -1) -> torch.nn.Module:
    if scenario.model_factory is not None:  # your own model: the contract is checked as it is built
        from pytest_spikecheck.training.model_contract import build_custom_model

        return build_custom_model(scenario, vocab_size, pad_token_id)
    from pytest_spikecheck.models.gpt import GPT

    config = scenario.model
    if config.vocab_size not in (0, vocab_size):
        raise ValueError(f"model.vocab_size is {config.vocab_size} but the tokenizer has {vocab_size} tokens")
    return GPT(dataclasses.replace(config, vocab_size=vocab_size, pad_token_id=pad_token_id))


def parameter_groups(model: torch.nn.Module, scenario: Scenario) -> list[dict[str, Any]]:
    """AdamW's parameter groups. nanoGPT's rule: decay every matrix (embeddings included),
    never biases or norm gains."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return [{"params": decay, "weight_decay": scenario.optimizer.weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: torch.nn.Module, scenario: Scenario,
                    groups: list[dict[str, Any]] | None = None) -> torch.optim.AdamW:
    """The scenario's AdamW over ``groups`` (default: :func:`parameter_groups` of ``model``)."""
    o = scenario.optimizer
    groups = parameter_groups(model, scenario) if groups is None else groups
    return torch.optim.AdamW(groups, lr=o.lr, betas=o.betas, eps=o.eps, foreach=True)


