"""The default policy's rule on the largest attention logit (``attn_logit_max``): ``logit-growth``.

A max-logit explosion (Muon without QK-Clip, Kimi K2 2025; a learning rate too high without
qk-layernorm, Wortsman et al. 2023) grows the largest q·k/√d exponentially while the loss only
stops falling: a rule on the loss or the gradient norm sees it late or never. The rule has two
arms, each measured on the project's engine runs (docs/detectors.md, "The policy's rules"):

- **growth**: the logit is at least ``floor`` and at least ``growth`` x its value ``window``
  steps earlier (on a log sparser than that, the same rate over the gap to the first point at
  least ``window`` steps back: ``growth ** (gap / window)``);
- **bound**: the logit exceeds ``bound`` (Kimi K2's tau, 100), whatever its history.

Flagged once per episode (an episode lasts from a flag until the logit is back below ``floor``); a non-finite logit is
always flagged, as every detector does. With QK-Clip on, logits up to ``QK_CLIP_FACTOR`` x tau
are what the defence allows and the growth up to tau is by design: the policy then runs the
bound arm alone at that bound (:func:`for_record`). numpy only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from pytest_spikecheck.judge.defences import QK_CLIP_FACTOR, qk_clip_tau
from pytest_spikecheck.judge.detectors import Detection, Detector

#: The column the rule judges: the engine and the recorder always record it (whatever the defences).
LOGIT_METRIC = "attn_logit_max"


@dataclass(frozen=True)
class LogitGrowth(Detector):
    """``attn_logit_max`` >= ``floor`` and >= ``growth`` x its value ``window`` steps earlier, or
    above ``bound``; ``growth=None`` runs the bound alone."""

    name: ClassVar[str] = "logit-growth"
    growth: float | None = 10.0
    floor: float = 10.0
    window: int = 10
    bound: float = 100.0

    @property
    def threshold_name(self) -> str:
        return "growth"

    def needs(self) -> str:
        return "nothing"

    def _detect(self, steps, values):
        ok = np.isfinite(values)
        with np.errstate(invalid="ignore"):
            flagged = ok & (values > self.bound)
        baseline = np.where(flagged, self.bound, np.nan)
        if self.growth is not None:
            # j: the last logged point at least `window` steps before each point (-1: none yet)
            j = np.searchsorted(steps, steps - self.window, side="right") - 1
            for i in np.flatnonzero(ok & (values >= self.floor) & (j >= 0)).tolist():
                earlier = float(values[j[i]])
                if not (math.isfinite(earlier) and earlier > 0):
                    continue
                gap = int(steps[i] - steps[j[i]]) / self.window
                if math.log(float(values[i]) / earlier) >= gap * math.log(self.growth):
                    flagged[i] = True
                    baseline[i] = earlier if math.isnan(baseline[i]) else baseline[i]
        # One flag per episode: an episode lasts from a flag until the logit is back below `floor`.
        onset = np.zeros(values.size, dtype=bool)
        active = False
        for i in range(values.size):
            if active and ok[i] and values[i] < self.floor:
                active = False
            if flagged[i] and not active:
                onset[i] = active = True
        rows = np.flatnonzero(~ok | onset)
        out = [
            Detection(
                int(steps[i]),
                float(values[i]),
                float(baseline[i]) if ok[i] else math.nan,
                float(values[i] / baseline[i]) if ok[i] else math.inf,
            )
            for i in rows.tolist()
        ]
        return out, int(values.size)


def for_record(rec) -> LogitGrowth:
    """The rule as the default policy runs it on ``rec``: its defaults, or, where the record says
    QK-Clip was on with threshold tau, the bound alone at ``QK_CLIP_FACTOR`` x tau (the containment
    :func:`~pytest_spikecheck.judge.qk_clip.assert_qk_clip_contains` asserts)."""
    tau = qk_clip_tau(rec)
    if tau is None:
        return LogitGrowth()
    return LogitGrowth(growth=None, bound=max(LogitGrowth.bound, QK_CLIP_FACTOR * tau))
