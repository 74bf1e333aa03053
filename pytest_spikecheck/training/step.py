"""One training step, the one copy of it: the engine's loop and every probe run this.

Order matters (Seed B): forward, backward, clip, measure, and only then AdamW touches ``m``,
``v`` or any parameter. :meth:`TrainingStep.forward_backward_clip` stops before the update so
that whoever runs the step can look at the clipped gradients and Adam's state first (the
event records do), then :meth:`TrainingStep.update` applies it (or skips it).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch

from pytest_spikecheck.clipping import ClipResult
from pytest_spikecheck.judge.baseline import spike_baseline
from pytest_spikecheck.models.config import HEAD_LOGITS_KEY
from pytest_spikecheck.training.optimizers import set_learning_rate
from pytest_spikecheck.training.sharding import Sharding


@dataclass
class StepOutcome:
    """What one step did, up to (not including) the optimizer update."""

    step: int
    lr: float
    batch: list[int]
    x: torch.Tensor
    y: torch.Tensor
    logits: torch.Tensor
    loss: float
    clip: ClipResult
    max_norm: float  # the limit the clip applied (inf: none)
    grad_norm_pre: float  # the clipping backend's pre-clip global norm
    #: The global L2 norm of the gradients as the optimizer will receive them, measured after the
    #: clip in float64 by code independent of the backend (never computed from its scale).
    grad_norm_post: float
    #: What the model reported through the spikecheck stats hook on this forward (attention
    #: logits, log Z, the z-loss term; empty for a model without the hook), as floats.
    stats: dict[str, float] = field(default_factory=dict)
    #: The per-head largest attention logit of this forward, (layers, heads), left on the device
    #: (read at event steps only); None for a model that does not report it.
    head_logits: torch.Tensor | None = None

    @property
    def nonfinite(self) -> bool:
        return not math.isfinite(self.loss) or bool(self.clip.nonfinite)


class TrainingStep:
    """Runs steps of ``model`` with ``optimizer`` through ``sharding`` (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, sharding: Sharding, *,
                 backend: str, clip_mode: str) -> None:
        self.model, self.optimizer, self.sharding = model, optimizer, sharding
        self.backend = backend
        # adaptive clipping is a global clip at a moving limit (the policy supplies the limit)
        self.clip_mode = "global" if clip_mode == "adaptive" else clip_mode

    def forward_backward_clip(self, step: int, batch: list[int], x: torch.Tensor, y: torch.Tensor, *,
                              lr: float, max_norm: float) -> StepOutcome:
        set_learning_rate(self.optimizer, lr)
        logits, loss = self.sharding.forward_backward(self.model, x, y)
        stats = model_stats(self.model)
        clip = self.sharding.clip(max_norm, backend=self.backend, mode=self.clip_mode)
        post = self.sharding.grad_norm()
        # The loss column is the cross-entropy: an auxiliary z-loss the model added is reported apart.
        cross_entropy = float(loss.detach()) - stats["z_loss"] if "z_loss" in stats else float(loss.detach())
        return StepOutcome(step=step, lr=lr, batch=batch, x=x, y=y, logits=logits, loss=cross_entropy,
                           clip=clip, max_norm=max_norm, grad_norm_pre=float(clip.total_norm),
                           grad_norm_post=float(post), stats=stats,
                           head_logits=(getattr(self.model, "spikecheck_stats", None) or {}).get(HEAD_LOGITS_KEY))

    def update(self, *, skip: bool = False) -> dict[str, float]:
        """The optimizer's step (unless ``skip``: then nothing reaches the weights or the
        optimizer's state), then the gradients are dropped. Returns what the optimizer's after-step
        hook reported (QK-Clip's ``qk_clipped_heads``; 0 at a skipped step; empty without a hook)."""
        if not skip:
            self.sharding.optimizer_step(self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        keys = getattr(self.optimizer, "report_keys", ())
        return dict.fromkeys(keys, 0.0) if skip else {k: self.optimizer.last_report[k] for k in keys}


def model_stats(model: torch.nn.Module) -> dict[str, float]:
    """The model's ``spikecheck_stats`` from its last forward (the stats hook, see
    :class:`pytest_spikecheck.models.gpt.GPT`) as floats; empty when it has none. A key naming
    several stats (``"a, b"``) holds a 1-d tensor of their values; the per-head attention logits
    (``HEAD_LOGITS_KEY``, an array) are not a per-step float and are left to the event records."""
    out: dict[str, float] = {}
    for key, value in (getattr(model, "spikecheck_stats", None) or {}).items():
        if key == HEAD_LOGITS_KEY:
            continue
        if "," in key:  # several stats in one tensor: one host sync for all of them
            out.update(zip((k.strip() for k in key.split(",")), value.tolist()))
        else:
            out[key] = float(value)
    return out


@dataclass
class StepVerdict:
    """How a step's pre-clip norm compares with the steps before it (the online detector)."""

    baseline: float  # the spike baseline of the pre-clip norm (NaN before enough history)
    ratio: float
    is_spike: bool
    skip: bool  # SkipSpikes drops this step
    declared: str | None  # the declared event at this step ("burst", "new_source"), if any
    nonfinite: bool

    @property
    def is_event(self) -> bool:
        return self.declared is not None or self.is_spike or self.nonfinite

    @property
    def kinds(self) -> list[str]:
        return [k for k, on in ((self.declared, self.declared is not None), ("spike", self.is_spike),
                                ("nonfinite", self.nonfinite)) if on]


@dataclass
class SpikeWatch:
    """The engine's online view of the pre-clip norm: each step's ratio to the spike baseline
    (:func:`~pytest_spikecheck.judge.baseline.spike_baseline`, the same one every judgement
    uses), whether it is a spike worth an event record, and whether ``SkipSpikes`` drops it."""

    spike_ratio: float
    window: int
    skip_ratio: float | None
    declared: dict[int, str]
    _steps: deque = field(init=False)
    _norms: deque = field(init=False)

    def __post_init__(self) -> None:
        self._steps, self._norms = deque(maxlen=self.window), deque(maxlen=self.window)

    def judge(self, outcome: StepOutcome) -> StepVerdict:
        return self.judge_norm(outcome.step, outcome.grad_norm_pre, nonfinite=outcome.nonfinite)

    def judge_norm(self, step: int, grad_norm_pre: float, *, nonfinite: bool) -> StepVerdict:
        """The verdict on a step known only by its pre-clip norm (what a recorder inside someone
        else's trainer sees before the clip).

        Most steps cannot be a spike: their norm is under ``threshold x`` the smallest value the
        baseline's median could be taken over (its history is always among the last ``window``
        norms held here; a NaN among them makes Python's ``min`` either NaN, which turns this
        off, or another of them, a bound all the same). Those get a quiet verdict without computing the baseline (``baseline``
        and ``ratio`` NaN: nothing reads them on a step that is not an event)."""
        threshold = self.spike_ratio if self.skip_ratio is None else min(self.spike_ratio, self.skip_ratio)
        norms = self._norms
        if step not in self.declared and not nonfinite and norms and grad_norm_pre < threshold * min(norms):
            return StepVerdict(baseline=math.nan, ratio=math.nan, is_spike=False, skip=False, declared=None,
                               nonfinite=False)
        base = spike_baseline(np.fromiter(self._steps, np.int64, len(self._steps)),
                              np.fromiter(self._norms, np.float64, len(self._norms)), step, self.window)
        ratio = grad_norm_pre / base if base > 0 else math.nan
        return StepVerdict(
            baseline=base, ratio=ratio,
            is_spike=not nonfinite and ratio >= self.spike_ratio,
            skip=not nonfinite and self.skip_ratio is not None and ratio >= self.skip_ratio,
            declared=self.declared.get(step), nonfinite=nonfinite)

    def observe(self, outcome: StepOutcome) -> None:
        """Add a completed step's pre-clip norm to the history."""
        self.observe_norm(outcome.step, outcome.grad_norm_pre)

    def observe_norm(self, step: int, grad_norm_pre: float) -> None:
        self._steps.append(step)
        self._norms.append(grad_norm_pre)
