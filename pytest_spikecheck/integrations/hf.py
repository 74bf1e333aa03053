"""A Hugging Face ``transformers.Trainer`` recorded like our own runs (extra ``[hf]``).

Where the gradients are, in ``Trainer``'s inner loop (transformers 5.x; tested with 5.24.0):
for each of the ``gradient_accumulation_steps`` micro-batches a forward and a backward, then
(after the last) the clip (``max_grad_norm > 0``; accelerate unscales fp16 gradients first)
*and then* ``on_pre_optimizer_step``, the optimizer's step (skipped by accelerate's GradScaler
on an overflow), ``on_optimizer_step``, the scheduler, ``zero_grad``, ``on_step_end``. No
callback runs between the last backward and the clip, so the pre-clip norms are measured in
backward, by a post-accumulate-grad hook on each parameter (:meth:`Recorder.tap_gradients`),
armed for the step's last micro-batch only (accelerate's ``sync_gradients``): once per
optimizer step, on the accumulated gradient, the loss scale divided out. The post-clip norm is
measured when the optimizer's step returns, on what it consumed (not at all when it was
skipped: that step is ``skipped: overflow``); loss, logits and labels come from a forward hook
on the model (training mode only), and the row is closed in ``on_step_end``. The step's loss is
the one the Trainer backpropagated: with ``num_items_in_batch`` (models that take loss kwargs,
GPT-2 and Llama in 5.24 do) the token-weighted mean over the step's micro-batches, else the
mean of their means.

The Trainer's own logged ``grad_norm`` is the **pre-clip** norm of the accumulated, unscaled
gradient (``clip_grad_norm_`` returns the norm before clipping; measured equal to ours within
1e-5 at accumulation 1 and 4); it is kept in ``run.json`` (``trainer_grad_norm``) beside ours.
NoClip is the Trainer's own setting: ``TrainingArguments(max_grad_norm=0)``.
"""

from __future__ import annotations

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

    def __init__(
        self,
        out: str | Path | None = None,
        *,
        catalog: SampleCatalog | None = None,
        stream: BurstStream | None = None,
        name: str = "hf-trainer",
        **recorder_options: Any,
    ) -> None:
        missing = [h for h in _HOOKS if not hasattr(TrainerCallback, h)]
        if missing:
            raise ConfigError(
                f"transformers {transformers.__version__} has no {', '.join(missing)} callback hook; "
                f"SpikecheckCallback needs transformers >= 5.0"
            )
        self.out, self.catalog, self.stream, self.name = out, catalog, stream, name
        if out is not None:  # refused now, not after training: the run is saved there at the end
            from pytest_spikecheck.records.integrity import check_target

            check_target(Path(out))
        self.options = recorder_options
        self.recorder: Recorder | None = None
        self._handle: Any = None
        self.trainer_grad_norm: dict[int, float] = {}

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        accumulation = args.gradient_accumulation_steps
        if self.stream is not None:  # before the first step: a mismatch would misname every batch
            self.stream.check_trainer(
                batch_size=args.per_device_train_batch_size,
                accumulation=accumulation,
                max_steps=args.max_steps if args.max_steps > 0 else None,
                names=("per_device_train_batch_size", "gradient_accumulation_steps", "max_steps"),
            )
        inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps it
        scaler = getattr(optimizer, "scaler", None)  # accelerate's GradScaler (fp16 on a GPU), else None
        max_norm = args.max_grad_norm if args.max_grad_norm and args.max_grad_norm > 0 else None
        requested = "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"
        precision = f"{requested} (TrainingArguments)" + (", GradScaler" if scaler is not None else "")
        if args.fp16 and scaler is None:  # accelerate sets up fp16 AMP only on accelerators (measured: fp32 on a CPU)
            precision += ", but accelerate set up no GradScaler (on a CPU it trains in float32)"
        facts = {
            "trainer_version": f"transformers {transformers.__version__}",
            "precision": precision,
            "lr": args.learning_rate,
            "micro_batch_size": args.per_device_train_batch_size,
            "batch_size": args.per_device_train_batch_size * accumulation * max(args.world_size, 1),
            "max_steps": args.max_steps,
            "output_dir": str(args.output_dir),
        }
        self.recorder = Recorder(
            model,
            inner,
            max_norm=max_norm,
            catalog=self.catalog,
            stream=self.stream,
            name=self.name,
            trainer="hf",
            accumulation=accumulation,
            scaler=scaler,
            seed=args.seed,
            facts=facts,
            meta={"trainer_grad_norm_is": "pre-clip"},
            run_facts={
                "amp_dtype": "bfloat16" if args.bf16 else "float16" if scaler is not None else "float32",
                "loss_scale": "dynamic" if scaler is not None else "none",
                "world_size": max(args.world_size, 1),
                "batch_size": facts["batch_size"],
            },
            **self.options,
        )
        gradient_state = getattr(optimizer, "gradient_state", None)
        if gradient_state is not None:  # accelerate says which backward closes the optimizer step
            armed = lambda: bool(gradient_state.sync_gradients)  # noqa: E731
        else:
            armed = lambda: self.recorder.gathered == accumulation  # noqa: E731
        self.recorder.tap_gradients(armed, scaled=scaler is not None)
        self._handle = model.register_forward_hook(self._capture, with_kwargs=True)

    def _capture(self, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        if not module.training or not torch.is_grad_enabled():
            return
        labels = kwargs.get("labels")
        logits = getattr(output, "logits", None)
        # a causal LM predicts labels[t + 1] at position t (the model shifts them)
        targets = labels[:, 1:] if labels is not None else None
        self.recorder.gather(
            loss=getattr(output, "loss", None),
            summed="num_items_in_batch" in kwargs,
            logits=logits[:, :-1].detach() if logits is not None else None,
            targets=targets,
        )

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.recorder.before_clip()  # the norms the backward hooks measured before the clip

    def on_step_end(self, args, state, control, **kwargs):
        self.recorder.step_gathered()  # the micro-batches _capture gathered

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
