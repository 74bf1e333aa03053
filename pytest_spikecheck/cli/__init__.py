"""The ``spikecheck`` command line (the commands live in :mod:`.commands`)."""

from pytest_spikecheck.cli.commands import main

__all__ = ["main"]
