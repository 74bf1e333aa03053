"""Trial runs for issue 35 §3's classes that no public log was found for (docs/logs.md): real
training on the project's corpus, each log written by the code a user writes for that format.

    python scripts/make_trial_logs.py row-means      # the HF Trainer, logging_steps=10: trainer_state.json
    python scripts/make_trial_logs.py config-jsonl   # a loop writing json.dumps lines, its config first
    python scripts/make_trial_logs.py python-logging # a loop logging through Python's logging module
    python scripts/make_trial_logs.py stepless-csv   # a loop writing csv.DictWriter rows, some with no step
    python scripts/make_trial_logs.py seed-sweep     # three seeds in one stdout, each run's last lines echoed
    python scripts/make_trial_logs.py all

Each writes into tests/data/logs/trials/<name>/ (``--out`` another folder). The spikes are real
dynamics: batches of never-seen content (Seed A's sentences in Greek script or in capitals,
``pytest_spikecheck.data.corpus.burst_pool``) planned into the data order by the project's
sampler (``plan_batches``), never a multiplied loss. One torch thread, CPU, seed fixed: the same
command writes the same file (trainer_state.json: but for the Trainer's own timing entries).
The loops train the project's micro GPT (Phase-19's preset: 2 layers, width 64, vocab 384) with
torch's AdamW, ``clip_grad_norm_`` and the preset's cosine schedule, as a user's loop does; the
row-means run trains a tiny ``GPT2LMHeadModel`` built from a config (nothing downloaded), as
tests/test_your_trainer_hf.py does.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import logging
import sys
from pathlib import Path

import numpy as np
import torch

from pytest_spikecheck import RareTokenBurst, Scenario
from pytest_spikecheck.data.dataset import build_dataset
from pytest_spikecheck.data.samplers import plan_batches
from pytest_spikecheck.models.config import IGNORE_INDEX
from pytest_spikecheck.scenario.sections import BurstSpec, SamplerSpec
from pytest_spikecheck.training.build import build_model
from pytest_spikecheck.training.schedule import lr_at

TRIALS = Path(__file__).resolve().parent.parent / "tests" / "data" / "logs" / "trials"
BATCH = 8
PRESET = Scenario.preset("phase-19")


def corpus(bursts: list[tuple[int, str]]):
    """Phase-19's 240 sentences plus 8 fresh never-seen sentences for each (step, content) burst, and
    the data order of the run: (dataset, burst specs, burst members) for :func:`plan`."""
    contents = sorted({c for _, c in bursts})
    need = {c: BATCH * sum(1 for _, b in bursts if b == c) for c in contents}
    # one RareTokenBurst per content brings its fresh sentences into the pool (the batch size here only
    # lets a content hold more sentences than one batch; the run's batches are BATCH)
    scenario = PRESET.replace(sampler__batch_size=max([BATCH, *need.values()]))
    scenario = scenario.with_breaks(*[RareTokenBurst(count=need[c], at_step=1, content=c) for c in contents]).resolved()
    data = build_dataset(scenario)
    left = {c: list(data.burst_members[k]) for k, c in enumerate(contents)}
    members = {}
    for k, (_, content) in enumerate(bursts):
        members[k], left[content] = tuple(left[content][:BATCH]), left[content][BATCH:]
    specs = tuple(BurstSpec(at_step=s, count=BATCH, content=c) for s, c in bursts)
    return data, specs, members


def plan(data, specs, members, steps: int, seed: int) -> list[list[int]]:
    """The batches of steps 1..steps (pool indices): shuffled epochs of the corpus, each burst's 8
    sentences the whole batch of its step (they never recur)."""
    spec = SamplerSpec(kind="shuffle", batch_size=BATCH, bursts=specs)
    return plan_batches(spec, steps=steps, seed=seed, n_corpus=data.n_corpus, burst_members=members, is_rare=lambda i: False)


class Loop:
    """A user's training loop on the project's micro GPT: AdamW, clip 1.0, the preset's schedule."""

    def __init__(self, data, steps: int, seed: int, lr: float = 1e-2, max_norm: float = 1.0) -> None:
        torch.manual_seed(seed)
        self.data, self.steps, self.lr, self.max_norm = data, steps, lr, max_norm
        self.model = build_model(PRESET, data.tokenizer.vocab_size, pad_token_id=data.tokenizer.pad_id)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, betas=(0.9, 0.999), weight_decay=0.1)
        self.inputs = torch.from_numpy(data.train.inputs)
        self.targets = torch.from_numpy(data.train.targets)

    def step(self, step: int, batch: list[int]) -> tuple[float, float, float]:
        """One optimizer step on the pool rows ``batch``: (loss, pre-clip grad norm, lr)."""
        lr = lr_at(step, base_lr=self.lr, total_steps=self.steps, spec=PRESET.schedule)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        _, loss = self.model(self.inputs[batch], self.targets[batch])
        loss.backward()
        norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_norm))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.item(), norm, lr

    @torch.no_grad()
    def eval_loss(self) -> float:
        x, y = torch.from_numpy(self.data.eval.inputs), torch.from_numpy(self.data.eval.targets)
        return float(self.model(x, y)[1])


# -- 1: a log of row means (the HF Trainer's logged loss is the mean over logging_steps) ----------------

ROW_MEANS_STEPS, LOGGING_STEPS = 300, 10
#: A contaminated shard five times: 24 never-seen sentences (three whole batches), Greek then capitals.
ROW_MEANS_BURSTS = [
    (s + d, c) for s, c in ((75, "greek"), (125, "caps"), (175, "greek"), (225, "caps"), (275, "greek")) for d in range(3)
]


def row_means(out: Path) -> None:
    from torch.utils.data import IterableDataset
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    data, specs, members = corpus(ROW_MEANS_BURSTS)
    order = [i for batch in plan(data, specs, members, ROW_MEANS_STEPS, seed=0) for i in batch]
    full = np.concatenate([data.train.inputs[:, :1], data.train.targets], axis=1)  # labels shifted by the model
    input_ids = np.where(full == IGNORE_INDEX, data.tokenizer.pad_id, full)

    class Rows(IterableDataset):  # the planned order; a DataLoader never shuffles an iterable dataset
        def __iter__(self):
            for i in order:
                yield {"input_ids": torch.from_numpy(input_ids[i]), "labels": torch.from_numpy(full[i])}

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=data.tokenizer.vocab_size,
        n_positions=64,
        n_embd=64,
        n_layer=2,
        n_head=4,
        bos_token_id=data.tokenizer.eos_id,
        eos_token_id=data.tokenizer.eos_id,
        pad_token_id=data.tokenizer.pad_id,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=ROW_MEANS_STEPS,
        per_device_train_batch_size=BATCH,
        learning_rate=1e-2,
        weight_decay=0.1,
        warmup_steps=10,
        lr_scheduler_type="cosine",
        max_grad_norm=1.0,
        logging_steps=LOGGING_STEPS,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = Trainer(model=GPT2LMHeadModel(config), args=args, train_dataset=Rows())
    with contextlib.redirect_stdout(io.StringIO()):  # the Trainer prints each logged dict too
        trainer.train()
    trainer.save_state()  # output_dir/trainer_state.json, as run_clm.py and most fine-tuning scripts do


# -- 2: a JSONL whose first line is the run's config ------------------------------------------------------

CONFIG_STEPS = 60
CONFIG_BURSTS = [(40, "greek")]


def config_jsonl(out: Path) -> None:
    data, specs, members = corpus(CONFIG_BURSTS)
    config = {"model": "micro-gpt", "n_layer": 2, "n_embd": 64, "lr": 1e-2, "batch_size": BATCH, "steps": CONFIG_STEPS,
              "grad_clip": 1.0, "seed": 0}  # fmt: skip
    loop = Loop(data, CONFIG_STEPS, seed=0)
    with open(out / "metrics.jsonl", "w") as log:
        log.write(json.dumps(config) + "\n")
        for step, batch in enumerate(plan(data, specs, members, CONFIG_STEPS, seed=0), 1):
            loss, norm, lr = loop.step(step, batch)
            log.write(json.dumps({"step": step, "loss": round(loss, 4), "grad_norm": round(norm, 4), "lr": lr}) + "\n")


# -- 3: Python logging lines -----------------------------------------------------------------------------

EPOCHS, PER_EPOCH = 8, 30  # 240 sentences, batches of 8
LOGGING_BURSTS = [(150, "greek")]


def _logger(path: Path, name: str) -> logging.Logger:
    """logging.basicConfig(filename=path, level=logging.INFO)'s handler and format, on a named logger."""
    logger = logging.getLogger(name)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    handler = logging.FileHandler(path, mode="w")
    handler.setFormatter(logging.Formatter(logging.BASIC_FORMAT))
    logger.addHandler(handler)
    return logger


def python_logging(out: Path) -> None:
    steps = EPOCHS * PER_EPOCH
    # a loop logging every 10th global batch: "Epoch 1, Global Batch 120, Training Loss: 3.2"
    data, specs, members = corpus(LOGGING_BURSTS)
    loop = Loop(data, steps, seed=0)
    batches = _logger(out / "batches.log", "batches")
    for step, batch in enumerate(plan(data, specs, members, steps, seed=0), 1):
        loss, _, _ = loop.step(step, batch)
        if step % 10 == 0:
            batches.info(f"Epoch {(step - 1) // PER_EPOCH + 1}, Global Batch {step}, Training Loss: {loss:.4f}")
    # a loop logging a dict of metrics at each epoch's end: "Epoch 3: {'loss': 2.1, ...}"
    data, specs, members = corpus([])
    loop = Loop(data, steps, seed=0)
    epochs = _logger(out / "epochs.log", "epochs")
    order = plan(data, specs, members, steps, seed=0)
    for epoch in range(1, EPOCHS + 1):
        losses = [loop.step(s, order[s - 1]) for s in range((epoch - 1) * PER_EPOCH + 1, epoch * PER_EPOCH + 1)]
        metrics = {"loss": round(float(np.mean([x[0] for x in losses])), 4), "eval_loss": round(loop.eval_loss(), 4),
                   "lr": round(losses[-1][2], 6)}  # fmt: skip
        epochs.info(f"Epoch {epoch}: {metrics}")
    for logger in (batches, epochs):
        for handler in logger.handlers:
            handler.close()
        logger.handlers.clear()


# -- 4: a CSV whose global_step is empty on some rows ---------------------------------------------------

CSV_BURSTS = [(100, "caps")]


def stepless_csv(out: Path) -> None:
    steps = 4 * PER_EPOCH
    data, specs, members = corpus(CSV_BURSTS)
    loop = Loop(data, steps, seed=0)
    order = plan(data, specs, members, steps, seed=0)
    with open(out / "log.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["epoch", "global_step", "loss", "grad_norm", "lr", "eval_loss"])
        writer.writeheader()
        for epoch in range(1, 5):
            losses = []
            for step in range((epoch - 1) * PER_EPOCH + 1, epoch * PER_EPOCH + 1):
                loss, norm, lr = loop.step(step, order[step - 1])
                losses.append(loss)
                writer.writerow(
                    {"epoch": epoch, "global_step": step, "loss": f"{loss:.4f}", "grad_norm": f"{norm:.4f}", "lr": f"{lr:.6f}"}
                )
            # the epoch's summary: its mean loss and the evaluation, no step (DictWriter leaves it empty)
            writer.writerow({"epoch": epoch, "loss": f"{np.mean(losses):.4f}", "eval_loss": f"{loop.eval_loss():.4f}"})


# -- 5: seeds concatenated in one stdout, each run's last lines echoed after it -------------------------

SWEEP_STEPS, SWEEP_SEEDS = 60, (0, 1, 2)
SWEEP_BURSTS = [(45, "greek")]


def seed_sweep(out: Path) -> None:
    lines: list[str] = []
    for seed in SWEEP_SEEDS:
        data, specs, members = corpus(SWEEP_BURSTS)
        loop = Loop(data, SWEEP_STEPS, seed=seed)
        lines.append(f"=== seed {seed}: python train.py --seed {seed} | tee run_{seed}.log ===")
        run = []
        for step, batch in enumerate(plan(data, specs, members, SWEEP_STEPS, seed=seed), 1):
            loss, norm, lr = loop.step(step, batch)
            run.append(f"step {step} | loss {loss:.4f} | grad_norm {norm:.4f} | lr {lr:.2e}")
        lines += run
        lines += [f"--- tail -n 3 run_{seed}.log ---", *run[-3:]]
    (out / "sweep.log").write_text("\n".join(lines) + "\n")


MAKERS = {
    "row-means": ("hf-row-means", row_means),
    "config-jsonl": ("config-first-jsonl", config_jsonl),
    "python-logging": ("python-logging", python_logging),
    "stepless-csv": ("stepless-csv", stepless_csv),
    "seed-sweep": ("seed-sweep-echoed", seed_sweep),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trial", choices=[*MAKERS, "all"])
    parser.add_argument("--out", type=Path, default=TRIALS, help="the folder the trial folders go into")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    for key in MAKERS if args.trial == "all" else [args.trial]:
        name, make = MAKERS[key]
        folder = args.out / name
        folder.mkdir(parents=True, exist_ok=True)
        make(folder)
        print(f"{key}: wrote {folder}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
