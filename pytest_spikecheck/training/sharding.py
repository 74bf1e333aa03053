"""How one training step is split across processes: the :class:`Sharding` protocol and the
one-process default, :class:`SingleProcess`. The N-rank one is
:class:`pytest_spikecheck.training.distributed.FlatShard`.

The step (:mod:`.step`) delegates to a Sharding at the few points where a rank's work is not
the whole model's: forward/backward (a rank's part of the batch, which the step runs in its
micro-batches, then its shard of the summed gradient), the loss scaler (ranks agree on an
overflow), the clip (the norm over every shard), the measured norm of what the optimizer
receives, the optimizer step (a rank updates its shard, then every rank gathers the weights),
the logged Σv of Adam, and the gradients and Adam moments the event records read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch

from pytest_spikecheck.clipping import ClipResult, clip_grads_
from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.scenario import Scenario
from pytest_spikecheck.training.optimizers import build_optimizer


@dataclass
class EventView:
    """What the record of an event step reads, per trainable parameter (in the model's order): the
    gradients AdamW is about to see (post-clip; None for a parameter that received no gradient),
    their norms before the clip (0 without a gradient), and AdamW's state (``exp_avg_sq`` and
    ``step``; empty before the first step). ``logits`` are the whole batch's; ranks other than
    the recorder may leave them None."""

    logits: torch.Tensor | None
    grads: list[torch.Tensor | None]
    pre_clip_norms: torch.Tensor
    states: list[dict[str, Any]]


class Sharding(Protocol):
    """How one training step is split across processes (see the module docstring)."""

    #: True on the process that records the run (rank 0).
    is_recorder: bool

    def check(self, resolved: Scenario) -> None:
        """Raise ConfigError if this sharding cannot train ``resolved``."""

    def build_optimizer(self, model: torch.nn.Module, scenario: Scenario) -> torch.optim.Optimizer: ...

    def forward_backward(
        self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, rows_backward: RowsBackward
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """This process's logits, the whole batch's loss (detached) and the model's stats, with
        the gradients ready to clip. ``rows_backward`` (the step's micro-batch loop) runs forward
        and backward on this process's rows."""

    def loss_scaler(self, device_type: str, **options: Any) -> Any:
        """A ``torch.amp.GradScaler`` (``options``: its keyword arguments) whose overflow
        verdict is the same on every process."""

    def clip(self, max_norm: float, *, backend: str, mode: str, grad_scale: float = 1.0) -> ClipResult:
        """Clip in place; the result holds the norm of the whole model's gradient. ``grad_scale``:
        the factor the gradients still carry (a loss scale not removed yet, ClipBeforeUnscale):
        the clip acts on them as they are, the norms it reports and keeps are divided by it."""

    def grad_norm(self) -> torch.Tensor:
        """The L2 norm of the whole model's gradient as it is now, summed in float64 with code
        independent of any clipping backend (a 0-d float64 tensor; no host sync)."""

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None: ...

    def adam_v_sum(self, optimizer: torch.optim.Optimizer) -> float:
        """Σv over every AdamW second moment of the model."""

    def event_view(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        x: torch.Tensor,
        y: torch.Tensor,
        logits: torch.Tensor,
        clip: ClipResult,
    ) -> EventView: ...

    def describe(self) -> dict[str, Any] | None:
        """The run's ``meta["distributed"]`` (None: one process)."""


#: The step's micro-batch loop over one process's rows: ``rows_backward(x_rows, y_rows, batch_tokens)``
#: runs forward and backward and returns (logits, the rows' part of the batch loss, the model's stats);
#: ``batch_tokens`` is the whole batch's target count, None when the rows are the whole batch.
RowsBackward = Callable[[torch.Tensor, torch.Tensor, "int | None"], tuple[torch.Tensor, torch.Tensor, dict[str, float]]]


def float64_norms(grads: list[torch.Tensor]) -> torch.Tensor:
    """Each tensor's L2 norm, accumulated in float64 (a float64 vector, one entry per tensor)."""
    if not grads:
        return torch.zeros(0, dtype=torch.float64)
    return torch.stack(torch._foreach_norm(grads, 2, dtype=torch.float64))


def float64_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """‖grads‖₂ accumulated in float64 (per-tensor norms in float64, then their norm): the
    measurement the records trust, whatever a clipping backend computed."""
    return torch.linalg.vector_norm(float64_norms(grads))


class SingleProcess:
    """The default :class:`Sharding`: one process holds the whole model, its gradients and its
    optimizer. A trainable parameter that received no gradient (an unused module) is skipped in
    norms and clipping, as torch's ``clip_grad_norm_`` skips it."""

    is_recorder = True

    def __init__(self, params: list[torch.nn.Parameter] | None = None) -> None:
        #: The trainable parameters, in the model's order (set by :meth:`build_optimizer`, or
        #: given by a caller that built its optimizer already, as a probe does).
        self.params = params if params is not None else []

    def check(self, resolved: Scenario) -> None:
        if resolved.optimizer.clip.kind == "shard_local":
            raise ConfigError(
                "ShardLocalNorm (clip_kind shard_local) needs nproc >= 2: on one process the shard is "
                "the whole gradient, so there is no per-rank norm to get wrong"
            )

    def build_optimizer(self, model: torch.nn.Module, scenario: Scenario) -> torch.optim.Optimizer:
        self.params = [p for p in model.parameters() if p.requires_grad]
        return build_optimizer(model, scenario)

    def forward_backward(
        self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, rows_backward: RowsBackward
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        return rows_backward(x, y, None)

    def loss_scaler(self, device_type: str, **options: Any) -> Any:
        return torch.amp.GradScaler(device_type, **options)

    def _grads(self) -> list[torch.Tensor]:
        return [p.grad for p in self.params if p.grad is not None]

    def clip(self, max_norm: float, *, backend: str, mode: str, grad_scale: float = 1.0) -> ClipResult:
        # Measured before the clip, every step (the event record's per-tensor norms; a pass over
        # the gradients that costs ~1% of a Phase-19 step): never recovered from the backend's scale.
        grads = self._grads()
        self._pre_clip_norms = torch.stack(torch._foreach_norm(grads)) if grads else torch.zeros(0)
        result = clip_grads_(self.params, max_norm, backend=backend, mode=mode)
        if grad_scale == 1.0:
            return result
        # The gradients were measured scaled (a power of two for a dynamic scale: the division is exact).
        self._pre_clip_norms = self._pre_clip_norms / grad_scale
        return ClipResult(result.total_norm / grad_scale, result.scale, result.nonfinite)

    def grad_norm(self) -> torch.Tensor:
        return float64_norm(self._grads())

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()

    def adam_v_sum(self, optimizer: torch.optim.Optimizer) -> float:
        # AdamW's (Muon's AdamW part's) second moments; an optimizer without them (SGD, Muon's
        # matrices) adds nothing
        state = optimizer.state
        second_moments = [state[p]["exp_avg_sq"] for p in self.params if "exp_avg_sq" in state.get(p, ())]
        # One concatenated sum is ~2.5x cheaper than foreach L1 norms on a tiny model.
        return float(torch.cat([v.view(-1) for v in second_moments]).float().sum()) if second_moments else 0.0

    def event_view(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        x: torch.Tensor,
        y: torch.Tensor,
        logits: torch.Tensor,
        clip: ClipResult,
    ) -> EventView:
        grads = [p.grad for p in self.params]
        measured = iter(self._pre_clip_norms.tolist())
        pre = torch.tensor([next(measured) if g is not None else 0.0 for g in grads], dtype=torch.float32)
        return EventView(logits, grads, pre, [optimizer.state.get(p, {}) for p in self.params])

    def describe(self) -> None:
        return None
