"""A Hugging Face ``transformers.Trainer`` recorded like our own runs (extra ``[hf]``).

Where the gradients are, in ``Trainer``'s inner loop (transformers 5.x; tested with 5.24.0):
backward, then the clip (``max_grad_norm > 0``) *and then* ``on_pre_optimizer_step``, the
optimizer's step, ``on_optimizer_step``, the scheduler, ``zero_grad``, ``on_step_end``. No
callback runs between backward and the clip, so the pre-clip norms are measured in backward,
by a post-accumulate-grad hook on each parameter (:meth:`Recorder.tap_gradients`); the
post-clip norm and Adam's state are read in ``on_pre_optimizer_step`` (clipped gradients, no
update yet); loss, logits and labels come from a forward hook on the model (training mode
only), and the row is closed in ``on_step_end``.

The Trainer's own logged ``grad_norm`` is the **pre-clip** norm (``clip_grad_norm_`` returns the
norm before clipping); it is kept in ``run.json`` (``trainer_grad_norm``) beside ours. NoClip is
the Trainer's own setting: ``TrainingArguments(max_grad_norm=0)``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import TrainerCallback

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.integrations.burst import BurstStream
from pytest_spikecheck.integrations.recorder import Recorder, SampleCatalog

#: The Trainer's hooks this callback needs (older versions lack on_pre_optimizer_step).
_HOOKS = ("on_pre_optimizer_step", "on_step_end")


class SpikecheckCallback(TrainerCallback):
    """Records the Trainer's run into ``out`` (a run folder, written at the end of training)
    and into :attr:`recorder` (``callback.run()`` is the :class:`~pytest_spikecheck.Run`).
    ``stream``: the :func:`~pytest_spikecheck.inject_burst` dataset you gave the Trainer as
    ``train_dataset``; ``catalog``: your samples' ids, sources and tokens."""

    def __init__(self, out: str | Path | None = None, *, catalog: SampleCatalog | None = None,
                 stream: BurstStream | None = None, name: str = "hf-trainer", **recorder_options: Any) -> None:
        missing = [h for h in _HOOKS if not hasattr(TrainerCallback, h)]
        if missing:
            raise ConfigError(f"transformers {transformers.__version__} has no {', '.join(missing)} callback hook; "
                              f"SpikecheckCallback needs transformers >= 5.0")
        self.out, self.catalog, self.stream, self.name = out, catalog, stream, name
        self.options = recorder_options
        self.recorder: Recorder | None = None
        self._forward: dict[str, Any] = {}
        self._handle: Any = None
        self.trainer_grad_norm: dict[int, float] = {}

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        if args.gradient_accumulation_steps != 1:
            raise ConfigError(f"SpikecheckCallback records one batch per optimizer step: gradient_accumulation_steps "
                              f"must be 1, was {args.gradient_accumulation_steps}")
        if self.stream is not None and args.per_device_train_batch_size != self.stream.batch_size:
            raise ConfigError(f"per_device_train_batch_size is {args.per_device_train_batch_size} but the burst stream "
                              f"plans batches of {self.stream.batch_size}")
        optimizer = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps it
        max_norm = args.max_grad_norm if args.max_grad_norm and args.max_grad_norm > 0 else None
        self.recorder = Recorder(model, optimizer, max_norm=max_norm, catalog=self.catalog, stream=self.stream,
                                 name=self.name, trainer=f"transformers {transformers.__version__}",
                                 meta={"trainer_grad_norm_is": "pre-clip"}, **self.options)
        self.recorder.tap_gradients()
        self._handle = model.register_forward_hook(self._capture, with_kwargs=True)

    def _capture(self, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        if not module.training:
            return
        labels = kwargs.get("labels")
        logits = getattr(output, "logits", None)
        self._forward = {"loss": getattr(output, "loss", None),
                         # a causal LM predicts labels[t + 1] at position t (the model shifts them)
                         "logits": logits[:, :-1].detach() if logits is not None else None,
                         "targets": labels[:, 1:] if labels is not None else None}

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.recorder.before_clip()  # the norms the backward hooks measured before the clip
        self.recorder.after_clip()  # the clipped gradients, before the optimizer's step

    def on_step_end(self, args, state, control, **kwargs):
        f = self._forward
        loss = f.get("loss")
        self.recorder.step(loss=loss if loss is not None else math.nan, logits=f.get("logits"), targets=f.get("targets"))
        self._forward = {}

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "grad_norm" in logs:
            self.trainer_grad_norm[state.global_step] = float(logs["grad_norm"])

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if metrics and "eval_loss" in metrics:
            self.recorder.set_eval_loss(state.global_step, metrics["eval_loss"])

    def on_train_end(self, args, state, control, **kwargs):
        self.recorder.close()
        if self._handle is not None:
            self._handle.remove()
        if self.out is not None:
            self.run().save(self.out)

    def run(self):
        """The recorded run (a :class:`~pytest_spikecheck.Run`), with the Trainer's logged norms in its meta."""
        run = self.recorder.run()
        run.meta["trainer_grad_norm"] = {str(k): v for k, v in sorted(self.trainer_grad_norm.items())}
        return run
