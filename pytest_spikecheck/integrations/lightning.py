"""A Lightning run recorded like our own runs (extra ``[lightning]``; tested with 2.6.6).

Where the gradients are, in Lightning's automatic optimization: the closure runs
``training_step`` and backward, then ``on_before_optimizer_step`` (gradients complete, *not yet
clipped*), then the trainer's clip (``gradient_clip_val``), the optimizer's update,
``on_train_batch_end``; the gradients are zeroed only at the next step's closure. So the
pre-clip norms and Adam's state are read in ``on_before_optimizer_step`` and the post-clip norm
in ``on_train_batch_end``, on the very gradients the optimizer consumed.

Lightning logs no gradient norm itself; its ``lightning.pytorch.utilities.grad_norm``, called
in ``on_before_optimizer_step`` as its docs show, sees the **pre-clip** gradients. NoClip is
the trainer's own setting: ``Trainer(gradient_clip_val=None)`` (or 0). Value clipping
(``gradient_clip_algorithm="value"``) has no norm limit: the records say so.

Per-token losses need the logits: return ``{"loss": loss, "logits": logits, "targets": y}``
from ``training_step`` (targets aligned with the logits).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import lightning
from lightning.pytorch.callbacks import Callback

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.integrations.burst import BurstStream
from pytest_spikecheck.integrations.recorder import Recorder, SampleCatalog


class SpikecheckCallback(Callback):
    """Records the run into ``out`` (a run folder, written when training ends) and into
    :attr:`recorder` (``callback.run()`` is the :class:`~pytest_spikecheck.Run`). ``stream``:
    the :func:`~pytest_spikecheck.inject_burst` dataset your train DataLoader reads."""

    def __init__(self, out: str | Path | None = None, *, catalog: SampleCatalog | None = None,
                 stream: BurstStream | None = None, name: str = "lightning", **recorder_options: Any) -> None:
        self.out, self.catalog, self.stream, self.name = out, catalog, stream, name
        self.options = recorder_options
        self.recorder: Recorder | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        if trainer.accumulate_grad_batches != 1:
            raise ConfigError(f"SpikecheckCallback records one batch per optimizer step: accumulate_grad_batches "
                              f"must be 1, was {trainer.accumulate_grad_batches}")
        if len(trainer.optimizers) != 1:
            raise ConfigError(f"SpikecheckCallback records one optimizer, the trainer has {len(trainer.optimizers)}")
        loader = trainer.train_dataloader
        batch_size = getattr(loader, "batch_size", None)
        if self.stream is not None and batch_size is not None and batch_size != self.stream.batch_size:
            raise ConfigError(f"the train DataLoader's batch_size is {batch_size} but the burst stream plans batches "
                              f"of {self.stream.batch_size}")
        by_norm = trainer.gradient_clip_algorithm in (None, "norm")
        max_norm = trainer.gradient_clip_val if by_norm and trainer.gradient_clip_val else None
        self.recorder = Recorder(pl_module, trainer.optimizers[0], max_norm=max_norm, catalog=self.catalog,
                                 stream=self.stream, name=self.name, trainer=f"lightning {lightning.__version__}",
                                 meta={"gradient_clip_algorithm": str(trainer.gradient_clip_algorithm),
                                       "gradient_clip_val": trainer.gradient_clip_val}, **self.options)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.recorder.before_clip()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.recorder.after_clip()  # the gradients the optimizer just consumed (zeroed only at the next step)
        out = outputs if isinstance(outputs, dict) else {"loss": outputs}
        loss = out.get("loss")
        self.recorder.step(loss=loss if loss is not None else math.nan, logits=out.get("logits"),
                           targets=out.get("targets"))

    def on_validation_end(self, trainer, pl_module) -> None:
        value = trainer.callback_metrics.get("val_loss")
        if self.recorder is not None and value is not None and trainer.global_step > 0:
            self.recorder.set_eval_loss(trainer.global_step, float(value))

    def on_train_end(self, trainer, pl_module) -> None:
        if self.out is not None:
            self.run().save(self.out)

    def run(self):
        """The recorded run (a :class:`~pytest_spikecheck.Run`)."""
        return self.recorder.run()
