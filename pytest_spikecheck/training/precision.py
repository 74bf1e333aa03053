"""How a training step computes: float32, or mixed precision with an optional loss scale.

:class:`Precision` is the scenario's ``amp`` section made concrete for one run: the autocast
context of the forward and the loss, and a ``torch.amp.GradScaler`` when the loss is scaled.
The step (:mod:`.step`) asks it to scale the loss before backward, to unscale the gradients
(before the clip, unless the scenario declares ``ClipBeforeUnscale``), whether the unscaled
gradients overflowed (then the step is skipped), and to update the scale after the step.

The scaler never steps the optimizer itself: the engine decides the skip (an overflow, or
``SkipSpikes``) and steps through its :class:`~pytest_spikecheck.training.sharding.Sharding`
(on N ranks the optimizer step is followed by an all-gather), so any optimizer object with
``param_groups`` and ``step`` works. ``GradScaler.update`` then reads the overflow flag that
``unscale_`` recorded, exactly as after ``scaler.step``.

Float32 (the default) is a no-op everywhere: no autocast context, no scaler, no host sync,
so the default recipe computes what it computed before this module existed.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, ContextManager

import torch

from pytest_spikecheck.scenario.sections import AmpSpec

#: torch.autocast's dtype per scenario ``amp.dtype`` (float32: no autocast).
AUTOCAST_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


class Precision:
    """The autocast dtype (None: float32) and the loss scaler (None: no loss scaling) of a run."""

    def __init__(
        self, dtype: torch.dtype | None = None, scaler: Any = None, static_scale: float | None = None, device_type: str = "cpu"
    ) -> None:
        self.dtype, self.scaler, self.static_scale, self.device_type = dtype, scaler, static_scale, device_type

    @classmethod
    def float32(cls) -> Precision:
        return cls()

    @classmethod
    def from_spec(cls, spec: AmpSpec, device: torch.device, sharding: Any = None) -> Precision:
        """The run's precision. ``sharding.loss_scaler`` builds the scaler (one process: a
        ``GradScaler``; N ranks: one that agrees on overflow across them)."""
        dtype = AUTOCAST_DTYPES.get(spec.dtype)
        if spec.loss_scale is None:
            return cls(dtype, device_type=device.type)
        static = None if spec.loss_scale == "dynamic" else float(spec.loss_scale)
        options = {} if static is None else {"init_scale": static}
        make = getattr(sharding, "loss_scaler", None)
        scaler = make(device.type, **options) if make is not None else torch.amp.GradScaler(device.type, **options)
        return cls(dtype, scaler, static, device.type)

    @property
    def is_float32(self) -> bool:
        return self.dtype is None and self.scaler is None

    def autocast(self) -> ContextManager[Any]:
        """The context of the forward and the loss."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """What backward is called on: the loss times the current scale (the loss itself without a scaler)."""
        return loss if self.scaler is None else self.scaler.scale(loss)

    def current_scale(self) -> float:
        """The scale this step's backward used (NaN without a scaler). One host sync."""
        return math.nan if self.scaler is None else float(self.scaler.get_scale())

    def unscale(self, optimizer: Any) -> bool:
        """Divide the gradients by the scale in place; True when the unscaled gradients hold an
        inf or NaN (the step must be skipped). False without a scaler."""
        if self.scaler is None:
            return False
        self.scaler.unscale_(optimizer)
        # GradScaler keeps the overflow flags of unscale_ per optimizer and device and reads them
        # in step() and update(); there is no public accessor, so read them as step() does.
        found = self.scaler._found_inf_per_device(optimizer)
        return bool(sum(float(v) for v in found.values()))

    def update(self) -> None:
        """After the step (taken or skipped): dynamic scaling halves the scale after an overflow
        and doubles it after ``growth_interval`` clean steps; a static scale stays."""
        if self.scaler is None:
            return
        if self.static_scale is None:
            self.scaler.update()
        else:
            self.scaler.update(new_scale=self.static_scale)

    def state_dict(self) -> dict[str, Any] | None:
        return None if self.scaler is None else self.scaler.state_dict()

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if self.scaler is not None and state is not None:
            self.scaler.load_state_dict(state)
