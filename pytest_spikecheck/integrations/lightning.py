"""A Lightning run recorded like our own runs (extra ``[lightning]``; tested with 2.6.6).

Where the gradients are, in Lightning's automatic optimization: the closure runs
``training_step`` and backward for each of the ``accumulate_grad_batches`` micro-batches (the
loss divided by their number), and after the last one ``on_before_optimizer_step`` (gradients
complete and, under ``16-mixed``, unscaled; *not yet clipped*), then the trainer's clip
(``gradient_clip_val``), the optimizer's update (skipped by the GradScaler on an overflow), and
``on_train_batch_end`` after every micro-batch; the gradients are zeroed only at the next
step's closure. So the pre-clip norms and Adam's state are read in
``on_before_optimizer_step``, the post-clip norm when the optimizer's step returns (on the very
gradients it consumed), and the row is closed at the ``on_train_batch_end`` of the micro-batch
that stepped. The loss Lightning hands that hook is the micro-batch's loss divided by
``accumulate_grad_batches``; the recorded loss is their sum, the loss Lightning backpropagated:
the mean of the micro-batch means (where micro-batches hold different numbers of target
tokens, not the token-weighted mean over the step's batch, and its gradient differs from
accumulation 1's: ``assert_accumulation_invariant`` shows by how much).

Lightning logs no gradient norm itself; its ``lightning.pytorch.utilities.grad_norm``, called
in ``on_before_optimizer_step`` as its docs show, sees the **pre-clip**, accumulated gradients.
NoClip is the trainer's own setting: ``Trainer(gradient_clip_val=None)`` (or 0). Value clipping
(``gradient_clip_algorithm="value"``) has no norm limit: the records say so. On a CPU
Lightning turns ``precision="16-mixed"`` into ``bf16-mixed`` (its own warning): no GradScaler.

Per-token losses need the logits: return ``{"loss": loss, "logits": logits, "targets": y}``
from ``training_step`` (targets aligned with the logits).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lightning
from lightning.pytorch.callbacks import Callback

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.integrations.burst import BurstStream
from pytest_spikecheck.integrations.recorder import Recorder, SampleCatalog


#: Lightning's precision settings as the autocast dtype (None: one not listed, unknown).
_AMP_DTYPES = {"32-true": "float32", "32": "float32", "bf16-mixed": "bfloat16", "16-mixed": "float16"}


class SpikecheckCallback(Callback):
    """Records the run into ``out`` (a run folder, written when training ends) and into
    :attr:`recorder` (``callback.run()`` is the :class:`~pytest_spikecheck.Run`). ``stream``:
    the :func:`~pytest_spikecheck.inject_burst` dataset your train DataLoader reads."""

    def __init__(
        self,
        out: str | Path | None = None,
        *,
        catalog: SampleCatalog | None = None,
        stream: BurstStream | None = None,
        name: str = "lightning",
        **recorder_options: Any,
    ) -> None:
        self.out, self.catalog, self.stream, self.name = out, catalog, stream, name
        if out is not None:  # refused now, not after training: the run is saved there at the end
            from pytest_spikecheck.records.integrity import check_target

            check_target(Path(out))
        self.options = recorder_options
        self.recorder: Recorder | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        accumulation = trainer.accumulate_grad_batches
        if len(trainer.optimizers) != 1:
            raise ConfigError(f"SpikecheckCallback records one optimizer, the trainer has {len(trainer.optimizers)}")
        loader = trainer.train_dataloader
        batch_size = getattr(loader, "batch_size", None)
        if self.stream is not None:  # before the first step: a mismatch would misname every batch
            if trainer.max_steps < 0 and trainer.max_epochs != 1:
                raise ConfigError(
                    f"give the Trainer max_steps (at most the burst stream's {self.stream.steps}) or "
                    f"max_epochs=1: the stream plans {self.stream.steps} optimizer steps, and a second "
                    f"epoch would read it again"
                )
            self.stream.check_trainer(
                batch_size=batch_size,
                accumulation=accumulation,
                max_steps=trainer.max_steps if trainer.max_steps >= 0 else None,
                names=("the train DataLoader's batch_size", "accumulate_grad_batches", "max_steps"),
            )
        by_norm = trainer.gradient_clip_algorithm in (None, "norm")
        max_norm = trainer.gradient_clip_val if by_norm and trainer.gradient_clip_val else None
        scaler = getattr(trainer.precision_plugin, "scaler", None)  # 16-mixed on a GPU: torch's GradScaler
        optimizer = trainer.optimizers[0]
        seed = os.environ.get("PL_GLOBAL_SEED")  # what seed_everything set, if it ran
        facts = {
            "trainer_version": f"lightning {lightning.__version__}",
            "precision": str(trainer.precision) + (", GradScaler" if scaler is not None else ""),
            "micro_batch_size": batch_size,
            "batch_size": batch_size * accumulation if batch_size is not None else None,
            "lr": float(optimizer.param_groups[0].get("initial_lr", optimizer.param_groups[0]["lr"])),
            "max_steps": trainer.max_steps,
        }
        self.recorder = Recorder(
            pl_module,
            optimizer,
            max_norm=max_norm,
            catalog=self.catalog,
            stream=self.stream,
            name=self.name,
            trainer="lightning",
            accumulation=accumulation,
            scaler=scaler,
            seed=int(seed) if seed is not None else None,
            facts=facts,
            meta={
                "gradient_clip_algorithm": str(trainer.gradient_clip_algorithm),
                "gradient_clip_val": trainer.gradient_clip_val,
            },
            run_facts={
                "amp_dtype": _AMP_DTYPES.get(str(trainer.precision)),
                "loss_scale": "dynamic" if scaler is not None else "none",
                "world_size": trainer.world_size,
                "batch_size": facts["batch_size"],
                # clipping by value is no ClipSpec kind: unknown, not "none"
                **({"clip": None} if not by_norm and trainer.gradient_clip_val else {}),
            },
            **self.options,
        )

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.recorder.before_clip()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        out = outputs if isinstance(outputs, dict) else {"loss": outputs}
        # what Lightning hands over is each micro-batch's loss / accumulate_grad_batches: summed
        self.recorder.gather(loss=out.get("loss"), logits=out.get("logits"), targets=out.get("targets"), summed=True)
        if self.recorder.step_open:  # the micro-batch that closed an optimizer step
            self.recorder.step_gathered()

    def on_validation_end(self, trainer, pl_module) -> None:
        value = trainer.callback_metrics.get("val_loss")
        if self.recorder is not None and value is not None and trainer.global_step > 0:
            self.recorder.set_eval_loss(trainer.global_step, float(value))

    def on_train_end(self, trainer, pl_module) -> None:
        self.recorder.close()
        if self.out is not None:
            self.run().save(self.out)

    def run(self):
        """The recorded run (a :class:`~pytest_spikecheck.Run`)."""
        return self.recorder.run()
