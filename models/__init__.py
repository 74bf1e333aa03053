"""Tiny GPT models (installed as ``pytest_spikecheck.models``).

``GPTConfig`` and the presets import without torch; ``GPT`` (the torch module) is loaded on
first access so that reading a config never pays for torch.
"""

from pytest_spikecheck.models.config import PRESETS, GPTConfig, model_preset

__all__ = ["GPT", "GPTConfig", "PRESETS", "model_preset"]


def __getattr__(name: str):
    if name == "GPT":
        from pytest_spikecheck.models.gpt import GPT

        return GPT
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
