"""The project's exceptions. ``ConfigError`` messages are one line and name the problem."""

from __future__ import annotations


class ConfigError(ValueError):
    """A scenario, break or experiment directory is invalid (bad key, unknown name, bad value)."""


class SpikeCheckError(AssertionError):
    """A spikecheck assertion failed; the message carries the evidence and the diagnosis."""
