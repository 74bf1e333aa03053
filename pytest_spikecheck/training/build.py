"""Building the model a scenario trains: the built-in GPT or Llama (``model.arch``) or the user's
factory. The optimizer is built by :mod:`.optimizers`."""

from __future__ import annotations

import dataclasses

import torch

from pytest_spikecheck.scenario import Scenario

#: The model's dtype per scenario ``model.dtype``.
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def build_model(scenario: Scenario, vocab_size: int, pad_token_id: int = -1) -> torch.nn.Module:
    if scenario.model_factory is not None:  # your own model: the contract is checked as it is built
        from pytest_spikecheck.training.model_contract import build_custom_model

        return build_custom_model(scenario, vocab_size, pad_token_id)
    config = scenario.model
    if config.vocab_size not in (0, vocab_size):
        raise ValueError(f"model.vocab_size is {config.vocab_size} but the tokenizer has {vocab_size} tokens")
    config = dataclasses.replace(config, vocab_size=vocab_size, pad_token_id=pad_token_id)
    if config.arch == "llama":
        from pytest_spikecheck.models.llama import Llama

        return Llama(config)
    from pytest_spikecheck.models.gpt import GPT

    return GPT(config)
