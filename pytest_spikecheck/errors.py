"""The project's exceptions. ``ConfigError`` messages are one line and name the problem."""

from __future__ import annotations


import reprlib

_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 80
_SHOWN.maxlist = _SHOWN.maxtuple = _SHOWN.maxdict = _SHOWN.maxset = 6
_SHOWN.maxlevel = 3
_SHOWN.maxlong = 40


def shown(value: object) -> str:
    """``repr(value)`` bounded in length (a huge list, string or integer from a config is shown by
    its start, never formatted whole into an error message)."""
    try:
        return _SHOWN.repr(value)
    except ValueError:  # an integer too long to convert to text at all
        return f"<an integer of about {value.bit_length() * 0.30103:.0f} digits>" if isinstance(value, int) else "<?>"


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
