"""One training step, the one copy of it: the engine's loop, every probe and every rank run this.

Order matters (Seed B): forward, backward, clip, measure, and only then the optimizer touches
its state or any parameter. :meth:`TrainingStep.forward_backward_clip` stops before the update
so that whoever runs the step can look at the clipped gradients and Adam's state first (the
event records do), then :meth:`TrainingStep.update` applies it (or skips it).

Inside the step, as people train:

- **gradient accumulation** (``sampler.accumulation`` = k): the step's batch (this rank's rows
  of it) is forward/backward'ed in k micro-batches; each micro-batch's mean loss is weighted by
  its share of the whole batch's target tokens, so the gradients add up to those of the
  token-weighted mean over the batch (what k = 1 computes; the ``AccumulateSum`` bug sums the
  micro-batch means instead). Clip, measurement and the optimizer step happen once per step.
- **the norm logged through torch's clip** (``ClipInfToLog``, a bug): a run that does not clip
  calls ``torch.nn.utils.clip_grad_norm_(params, max_norm=inf)`` after measuring, as people do to
  log the norm; the measurement is the engine's, the NaN that call makes of an infinite norm is torch's.
  Where the pre-clip norm is not finite the step records whether every gradient element was finite
  all the same (``grad_finite_pre``), before that call, so ``assert_clip_keeps_finite`` can tell a
  norm that overflowed from a gradient that did.
- **mixed precision** (:mod:`.precision`): the forward and the loss under autocast, the loss
  scaled before backward, the gradients unscaled before the clip (``ClipBeforeUnscale``: after
  it), a step whose unscaled gradients overflowed skipped. The norms recorded are always those
  of the unscaled gradients.

With k = 1 in float32 on one process the step runs exactly the operations it ran before
accumulation and mixed precision existed (the default recipe's metrics stay bit-identical).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch

from pytest_spikecheck.clipping import ClipResult, clip_grads_
from pytest_spikecheck.judge.baseline import spike_baseline
from pytest_spikecheck.models.config import HEAD_LOGITS_KEY, IGNORE_INDEX
from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.scenario.sections import ACCUMULATES, ClipSpec
from pytest_spikecheck.training.optimizers import set_learning_rate
from pytest_spikecheck.training.precision import Precision
from pytest_spikecheck.training.sharding import Sharding

#: The reason recorded for a step whose update was skipped (``Record.skipped``).
SKIPPED_OVERFLOW = "overflow"
SKIPPED_SPIKE = "skip_spikes"


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
    grad_norm_pre: float  # the pre-clip global norm of the unscaled gradients
    #: The global L2 norm of the gradients as the optimizer will receive them, measured after the
    #: clip (and the unscaling) in float64 by code independent of the backend (never computed from its scale).
    grad_norm_post: float
    #: Whether every gradient element was finite before the clip, measured only where the pre-clip
    #: norm is not finite (1.0: finite, only their norm overflowed, summed in the gradients' dtype;
    #: 0.0: an element was inf or NaN); NaN where the pre-clip norm is finite, which says it already.
    grad_finite_pre: float = math.nan
    #: What the model reported through the spikecheck stats hook on this forward (attention
    #: logits, log Z, the z-loss term; empty for a model without the hook), as floats.
    stats: dict[str, float] = field(default_factory=dict)
    #: The per-head largest attention logit of this step's forward, (layers, heads) (the largest
    #: over its micro-batches), left on the device; None for a model that does not report it.
    head_logits: torch.Tensor | None = None
    loss_scale: float = math.nan  # the loss scale this step's backward used (NaN: no loss scaling)
    #: The loss scaler found an inf or NaN in the unscaled gradients: the update is skipped.
    overflow: bool = False

    @property
    def nonfinite(self) -> bool:
        """A non-finite loss, or a non-finite gradient the loss scaler did not catch: the run stops."""
        return not math.isfinite(self.loss) or (bool(self.clip.nonfinite) and not self.overflow)


class TrainingStep:
    """Runs steps of ``model`` with ``optimizer`` through ``sharding`` (see the module docstring).

    ``optimizer`` is any object with ``param_groups`` and ``step`` (and ``zero_grad``)."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        sharding: Sharding,
        *,
        backend: str,
        clip: ClipSpec,
        accumulation: int = 1,
        accumulate: str = "mean",
        precision: Precision | None = None,
    ) -> None:
        self.model, self.optimizer, self.sharding = model, optimizer, sharding
        self.backend = backend
        # adaptive clipping is a global clip at a moving limit (the policy supplies the limit);
        # the two accumulation/precision bugs are clips at the wrong moment (clip.when)
        self.clip_order = clip.when
        self.clip_scope = clip.scope  # global | per_tensor | shard_local (the sharding's, on several ranks)
        if clip.when == "muon_update" and not hasattr(optimizer, "clip_update"):
            raise ValueError(
                f"clip when muon_update needs the engine's Muon optimizer (an OptimizerSet), was {type(optimizer).__name__}"
            )
        if accumulate not in ACCUMULATES:  # never mean by default
            raise ConfigError(f"accumulate must be one of {', '.join(ACCUMULATES)}, was {accumulate!r}")
        self.accumulation, self.accumulate = accumulation, accumulate
        self.precision = precision if precision is not None else Precision.float32()
        self._head_logits: list[torch.Tensor] = []

    def forward_backward_clip(
        self, step: int, batch: list[int], x: torch.Tensor, y: torch.Tensor, *, lr: float, max_norm: float
    ) -> StepOutcome:
        set_learning_rate(self.optimizer, lr)
        each_micro = _EachMicrobatchClip(self.sharding, max_norm, self.backend) if self.clip_order == "per_microbatch" else None
        self._head_logits = []  # each micro-batch's per-head attention logits (the model's stats hook)
        logits, loss, stats = self._forward_backward(x, y, each_micro)
        precision = self.precision
        scale = precision.current_scale()
        if self.clip_order == "before_unscale":  # the bug: the clip sees the scaled gradients
            clip = self.sharding.clip(max_norm, backend=self.backend, mode=self.clip_scope, grad_scale=scale)
            overflow = precision.unscale(self.optimizer)
        elif each_micro is not None:  # the bug: every micro-batch was clipped on its own already
            clip = each_micro.finish()
            overflow = False
        elif self.clip_order == "muon_update":  # the bug: the gradients stay as they are, measured only;
            overflow = precision.unscale(self.optimizer)  # the optimizer clips Muon's update (ClipMuonUpdate)
            clip = self.sharding.clip(math.inf, backend=self.backend, mode="global")
            self.optimizer.clip_update = max_norm
        else:
            overflow = precision.unscale(self.optimizer)
            clip = self.sharding.clip(max_norm, backend=self.backend, mode=self.clip_scope)
        pre = float(clip.total_norm)
        finite_pre = gradients_finite(self.sharding, pre)  # before anything below can touch them
        if self.clip_order == "inf_to_log":  # the bug (ClipInfToLog): no clip, but torch's own clip called
            # only to log the norm; an infinite norm makes its coefficient inf/inf = NaN, every gradient NaN
            torch.nn.utils.clip_grad_norm_(self.sharding.params, max_norm=math.inf)
        post = self.sharding.grad_norm()
        # The loss column is the cross-entropy: an auxiliary z-loss the model added is reported apart.
        cross_entropy = float(loss) - stats["z_loss"] if "z_loss" in stats else float(loss)
        return StepOutcome(
            step=step,
            lr=lr,
            batch=batch,
            x=x,
            y=y,
            logits=logits,
            loss=cross_entropy,
            clip=clip,
            max_norm=max_norm,
            grad_norm_pre=pre,
            grad_norm_post=float(post),
            grad_finite_pre=finite_pre,
            stats=stats,
            head_logits=self._last_head_logits(),
            loss_scale=scale,
            overflow=overflow,
        )

    def _forward_backward(
        self, x: torch.Tensor, y: torch.Tensor, each_micro: _EachMicrobatchClip | None
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """This rank's logits, the whole batch's loss (detached) and the model's stats, with the
        gradients of the step (summed over the micro-batches and the ranks) ready to clip."""

        def rows_backward(
            rows_x: torch.Tensor, rows_y: torch.Tensor, batch_tokens: int | None
        ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
            parts = _micro_batches(rows_x, rows_y, self.accumulation)
            whole = batch_tokens is None and len(parts) == 1  # one micro-batch is the batch: its mean is the loss
            if batch_tokens is None and not whole:
                batch_tokens = int((rows_y != IGNORE_INDEX).sum())
            logits_parts, shares, part_stats = [], [], []
            for xi, yi in parts:
                if each_micro is not None:
                    each_micro.before_backward()
                with self.precision.autocast():
                    logits_i, loss_i = self.model(xi, yi)
                tokens = 0 if whole else int((yi != IGNORE_INDEX).sum())
                share = loss_i if whole else self._share(loss_i, logits_i, tokens, batch_tokens)
                self.precision.scale(share).backward()
                if each_micro is not None:
                    each_micro.after_backward()
                logits_parts.append(logits_i)
                shares.append(share.detach())
                part_stats.append((model_stats(self.model), 1.0 if whole else tokens / max(batch_tokens, 1)))
                heads = (getattr(self.model, "spikecheck_stats", None) or {}).get(HEAD_LOGITS_KEY)
                if heads is not None:
                    self._head_logits.append(heads)
            if len(parts) == 1:
                return logits_parts[0], shares[0], part_stats[0][0]
            return torch.cat([lg.detach() for lg in logits_parts]), torch.stack(shares).sum(), combine_stats(part_stats)

        return self.sharding.forward_backward(self.model, x, y, rows_backward)

    def _share(self, loss: torch.Tensor, logits: torch.Tensor, tokens: int, batch_tokens: int) -> torch.Tensor:
        """A micro-batch's part of the step's loss. The model's loss is the mean over the
        micro-batch's tokens; weighted by its share of the batch's tokens the parts add up to
        the mean over the whole batch (under AccumulateSum: each micro-batch's mean, summed)."""
        if tokens:
            return loss if self.accumulate == "sum" else loss * (tokens / batch_tokens)
        if batch_tokens:  # no token here (e.g. blank documents), some elsewhere: add nothing
            return logits.sum() * 0.0  # (the model's own mean over 0 tokens is 0/0)
        return loss  # no token in the whole batch: NaN, as the model computes it

    def update(self, *, skip: bool = False, head_logits: torch.Tensor | None = None) -> dict[str, float]:
        """The optimizer's step (unless ``skip``: then nothing reaches the weights or the
        optimizer's state), the loss scale's update, then the gradients are dropped.

        An optimizer with an after-step hook (QK-Clip) is first handed the per-head attention
        logits of the step's forward (``head_logits``, default: those of the last
        :meth:`forward_backward_clip`); what its hook reports is returned (``qk_clipped_heads``;
        0 at a skipped step; empty for an optimizer without a hook)."""
        keys = getattr(self.optimizer, "report_keys", ())
        if not skip:
            if keys:
                self.optimizer.observe_forward(head_logits if head_logits is not None else self._last_head_logits())
            self.sharding.optimizer_step(self.optimizer)
        self.precision.update()
        self.optimizer.zero_grad(set_to_none=True)
        return dict.fromkeys(keys, 0.0) if skip else {k: self.optimizer.last_report[k] for k in keys}

    def _last_head_logits(self) -> torch.Tensor | None:
        """The per-head largest attention logit of the last step's forward: the largest over its micro-batches."""
        heads = self._head_logits
        return heads[0] if len(heads) == 1 else torch.stack(heads).amax(dim=0) if heads else None


def gradients_finite(sharding: Sharding, grad_norm_pre: float) -> float:
    """The ``grad_finite_pre`` fact of a step whose clip measured ``grad_norm_pre``: NaN where
    that norm is finite (every element is, then); else 1.0 if every gradient element is finite all the same (the norm
    overflowed, not a gradient), 0.0 if one is inf or NaN. Measured after the harness's clip,
    which leaves every gradient as it was when the norm is not finite, by the whole model's
    float64 norm (finite exactly when every element of a float32, bf16 or fp16 gradient is; one
    all-reduce on several ranks, all of which see the same pre-clip norm)."""
    if math.isfinite(grad_norm_pre):
        return math.nan
    return 1.0 if math.isfinite(float(sharding.grad_norm())) else 0.0


def _micro_batches(x: torch.Tensor, y: torch.Tensor, k: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``k`` consecutive parts of the rows, as even as they go (views; the whole for k = 1)."""
    if k == 1:
        return [(x, y)]
    n = x.shape[0]
    bounds = [n * i // k for i in range(k + 1)]
    return [(x[a:b], y[a:b]) for a, b in zip(bounds, bounds[1:]) if b > a]


def combine_stats(parts: list[tuple[dict[str, float], float]]) -> dict[str, float]:
    """The step's model stats from its micro-batches': a largest value (``*_max``,
    ``*_absmax``) is the largest over them, any other (a mean, the z-loss term) their
    token-weighted mean."""
    keys = [k for k in parts[0][0] if all(k in stats for stats, _ in parts)]
    out: dict[str, float] = {}
    for k in keys:
        values = [(stats[k], w) for stats, w in parts]
        out[k] = max(v for v, _ in values) if k.endswith("max") else sum(v * w for v, w in values)
    return out


class _EachMicrobatchClip:
    """ClipEachMicrobatch, the bug: each micro-batch's own gradient is clipped to ``max_norm``
    before it is added to the others. The unclipped sum is kept beside the clipped one (only
    under this break) so that the recorded pre-clip norm is the step's real gradient norm."""

    def __init__(self, sharding: Sharding, max_norm: float, backend: str) -> None:
        self.sharding, self.max_norm, self.backend = sharding, max_norm, backend
        self.params = sharding.params
        self.raw: list[torch.Tensor | None] = [None] * len(self.params)
        self.clipped: list[torch.Tensor | None] = [None] * len(self.params)

    def before_backward(self) -> None:
        for p in self.params:  # the next backward writes this micro-batch's gradient alone
            p.grad = None

    def after_backward(self) -> None:
        grads = [p.grad for p in self.params]
        self.raw = [r if g is None else g.clone() if r is None else r.add_(g) for r, g in zip(self.raw, grads)]
        clip_grads_([p for p in self.params if p.grad is not None], self.max_norm, backend=self.backend, mode="global")
        self.clipped = [c if g is None else g if c is None else c.add_(g) for c, g in zip(self.clipped, grads)]

    def finish(self) -> ClipResult:
        """The step's pre-clip norm, measured on the unclipped sum, then the clipped sum in place
        as the gradient the optimizer receives."""
        for p, raw in zip(self.params, self.raw):
            p.grad = raw
        measured = self.sharding.clip(math.inf, backend=self.backend, mode="global")  # measure, scale 1
        for p, clipped in zip(self.params, self.clipped):
            p.grad = clipped
        pre = measured.total_norm
        post = self.sharding.grad_norm().to(pre.dtype)
        finite = pre.isfinite() & (pre > 0)
        scale = torch.where(finite, post / torch.where(finite, pre, 1.0), 1.0)  # the effective global factor
        return ClipResult(pre, scale, measured.nonfinite)


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
    overflow: bool = False  # the loss scaler skips this step (its unscaled gradients overflowed)

    @property
    def is_event(self) -> bool:
        return self.declared is not None or self.is_spike or self.nonfinite

    @property
    def skipped(self) -> str | None:
        """Why the update of this step is not applied (``Record.skipped``), None when it is."""
        return SKIPPED_OVERFLOW if self.overflow else SKIPPED_SPIKE if self.skip else None

    @property
    def kinds(self) -> list[str]:
        return [
            k
            for k, on in ((self.declared, self.declared is not None), ("spike", self.is_spike), ("nonfinite", self.nonfinite))
            if on
        ]


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
        if outcome.overflow:
            return self.overflowed(outcome.step)
        return self.judge_norm(outcome.step, outcome.grad_norm_pre, nonfinite=outcome.nonfinite)

    def overflowed(self, step: int) -> StepVerdict:
        """The verdict on a step the loss scaler skips: its norm measures the overflow, not the
        data, so it is no spike, no failure, and it never enters the history."""
        return StepVerdict(
            baseline=math.nan,
            ratio=math.nan,
            is_spike=False,
            skip=False,
            declared=self.declared.get(step),
            nonfinite=False,
            overflow=True,
        )

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
            return StepVerdict(baseline=math.nan, ratio=math.nan, is_spike=False, skip=False, declared=None, nonfinite=False)
        base = spike_baseline(
            np.fromiter(self._steps, np.int64, len(self._steps)),
            np.fromiter(self._norms, np.float64, len(self._norms)),
            step,
            self.window,
        )
        ratio = grad_norm_pre / base if base > 0 else math.nan
        return StepVerdict(
            baseline=base,
            ratio=ratio,
            is_spike=not nonfinite and ratio >= self.spike_ratio,
            skip=not nonfinite and self.skip_ratio is not None and ratio >= self.skip_ratio,
            declared=self.declared.get(step),
            nonfinite=nonfinite,
        )

    def observe(self, outcome: StepOutcome) -> None:
        """Add a completed step's pre-clip norm to the history (not a step the loss scaler skipped)."""
        if not outcome.overflow:
            self.observe_norm(outcome.step, outcome.grad_norm_pre)

    def observe_norm(self, step: int, grad_norm_pre: float) -> None:
        self._steps.append(step)
        self._norms.append(grad_norm_pre)
