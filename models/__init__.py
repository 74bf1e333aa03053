"""Tiny language models (installed as ``pytest_spikecheck.models``): the GPT-2-style ``GPT``
(``model.arch: gpt``) and the Llama-style ``Llama`` (``model.arch: llama``).

``GPTConfig`` and the presets import without torch; ``GPT`` and ``Llama`` (the torch modules)
are loaded on first access so that reading a config never pays for torch.
"""

from pytest_spikecheck.models.config import PRESETS, GPTConfig, model_preset

__all__ = ["GPT", "GPTConfig", "Llama", "PRESETS", "model_preset"]


def __getattr__(name: str):
    if name == "GPT":
        from pytest_spikecheck.models.gpt import GPT

        return GPT
    if name == "Llama":
        from pytest_spikecheck.models.llama import Llama

        return Llama
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
