"""The project's exceptions. ``ConfigError`` messages are one line and name the problem."""

from __future__ import annotations


class ConfigError(ValueError):
    """A scenario, break or experiment directory is invalid (bad key, unknown name, bad value)."""


class SpikeCheckError(AssertionError):
    """A spikecheck assertion failed; the message carries the evidence and the diagnosis, and
    ``verdict`` (a :class:`~pytest_spikecheck.judge.verdict.Verdict`, None where no assertion
    made one) what was measured against what limit at which step."""

    def __init__(self, *args: object, verdict: object = None) -> None:
        super().__init__(*args)
        self.verdict = verdict


class ClipBeforeUnscaleWarning(UserWarning):
    """The clip found the gradients still loss-scaled: it acts on scaled gradients. The recorder
    records the steps in the run (``clip_before_unscale_at``) and ``assert_clip_contains`` fails on
    them; the warning itself is shown, never raised, so ``filterwarnings = error`` does not stop
    the training it is reported from."""
