"""Write what a Hugging Face Trainer run and a Lightning run print: tests/data/logs/text/.

    .venv/bin/python scripts/make_stdout_examples.py      # ~30 s on one CPU core

**hf_trainer_stdout.log**: a two-layer GPT-2 (32 wide, vocabulary 64, random tokens) trains 30 steps with
``transformers.Trainer`` on the CPU, logging every 2 steps and evaluating every 10. The file is
the run's stdout and stderr as the Trainer wrote them: tqdm progress bars redrawn with carriage
returns, the training dicts printed after the bar (transformers 5 prints their numbers as
strings, ``{'loss': '4.16', 'grad_norm': '0.93', ...}``), the evaluation dicts, the
end-of-training summary, and the library's warnings. The run's own ``log_history`` is written
beside it (``hf_trainer_stdout.trainer_state.json``) so ``tests/test_logs_text.py`` can read the
stdout against the numbers the Trainer kept.

**lightning_stdout.log**: a small regression model trained 3 epochs of 12 batches with
``lightning.Trainer`` on the CPU, ``self.log("train_loss", ..., prog_bar=True)`` every step and a
validation loss every epoch: Lightning's TQDM progress bar with the logged values in its postfix
(``Epoch 1:  50%|#####     | 6/12 [..., v_num=0, train_loss=0.912]``), redrawn with carriage
returns, plus the model summary and warnings Lightning prints.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "logs" / "text"


def main() -> int:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    )

    class Tokens(torch.utils.data.Dataset):
        def __init__(self, offset: int, size: int) -> None:
            self.offset, self.size = offset, size

        def __len__(self) -> int:
            return self.size

        def __getitem__(self, i: int) -> dict:
            x = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(self.offset + i))
            return {"input_ids": x, "labels": x}

    args = TrainingArguments(
        output_dir="/tmp/spikecheck_hf_stdout",
        per_device_train_batch_size=8,
        max_steps=30,
        logging_steps=2,
        eval_strategy="steps",
        eval_steps=10,
        per_device_eval_batch_size=16,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        learning_rate=1e-3,
        seed=0,
        disable_tqdm=False,
    )
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(0, 256), eval_dataset=Tokens(10_000, 32))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        trainer.train()
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "hf_trainer_stdout.log").write_text(printed.getvalue())
    (OUT / "hf_trainer_stdout.trainer_state.json").write_text(json.dumps(trainer.state.log_history, indent=1))
    print(f"wrote {OUT / 'hf_trainer_stdout.log'} ({len(printed.getvalue()):,} characters) and the run's log_history")
    lightning_run()
    return 0


def lightning_run() -> None:
    import lightning as L
    import torch

    torch.manual_seed(0)

    class Regression(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

        def training_step(self, batch, _):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss, prog_bar=True, on_step=True)
            return loss

        def validation_step(self, batch, _):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y), prog_bar=True)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 8, generator=g)
    y = x[:, :1] * 2 + 0.1 * torch.randn(96, 1, generator=g)
    data = torch.utils.data.TensorDataset(x, y)
    train = torch.utils.data.DataLoader(data, batch_size=8)
    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:32], y[:32]), batch_size=16)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        # The TQDM bar (Lightning's default without rich installed; rich draws a live panel instead).
        L.Trainer(
            max_epochs=3,
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            log_every_n_steps=1,
            callbacks=[L.pytorch.callbacks.TQDMProgressBar(refresh_rate=1)],
            default_root_dir="/tmp/spikecheck_lightning_stdout",
        ).fit(Regression(), train, val)
    (OUT / "lightning_stdout.log").write_text(printed.getvalue())
    print(f"wrote {OUT / 'lightning_stdout.log'} ({len(printed.getvalue()):,} characters)")


if __name__ == "__main__":
    sys.exit(main())
