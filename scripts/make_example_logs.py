"""Write the example training logs in tests/data/logs/ from the project's own training runs.

    .venv/bin/python scripts/make_example_logs.py            # rewrites tests/data/logs/ (~10 s)

Four short Phase-19 runs (120 steps, seed 42, one thread, so every rerun gives the same
numbers) are trained and each is written the way another tool would log it:

========= ==========================================================================
break     no clipping, 8 rare (Greek-script) sentences in the batch of step 90: the
          pre-clip gradient norm and the loss spike at step 90
control   the same batches with clip 1.0: the same pre-clip spike, post-clip norm held at 1.0
healthy   clip 1.0, no burst: nothing to find
diverged  no clipping, learning rate 30 (3000x the preset): the gradient norm overflows
          to inf at step 28 and the engine stops there
========= ==========================================================================

Files (README.md in the same folder is written from these facts and the measured numbers):

- ``hf/trainer_state.json`` (break), ``hf/trainer_state_healthy.json`` (healthy): what
  ``transformers.Trainer`` writes with ``logging_steps=5, eval_steps=20``: ``loss`` is the
  mean over the steps since the last log, ``grad_norm`` (pre-clip) and ``learning_rate``
  are the logging step's; eval entries mixed in; the end-of-training summary entry
  (``train_loss``, ``train_runtime``, ...) last. Eval throughput fields are left out (the
  engine does not time its evals).
- ``hf/trainer_state_diverged.json`` (diverged, ``logging_steps=1``): step 28's
  ``"grad_norm": Infinity`` is the run's own. **Injected:** step 29, ``"loss": NaN,
  "grad_norm": NaN``, is not from the run (the engine stops at the first non-finite step);
  it is the entry the Trainer writes next, after AdamW has turned the infinite gradient
  into NaN weights, added so the file has both spellings HF writes.
- ``lightning/metrics.csv`` (control): ``CSVLogger`` with ``log_every_n_steps=2``,
  ``val_check_interval=20``, ``self.log("train_loss", on_step=True, on_epoch=True)``,
  ``grad_norm(self, 2)`` and ``LearningRateMonitor``. Lightning logs every row with the
  number of optimizer steps done *before* the batch, so our step k is its step k-1, and the
  validation and epoch-end rows after a batch share that batch's step; one epoch is 30
  steps (240 sentences / batch 8). Columns sorted, empty cells where a row logged nothing.
- ``tensorboard/`` (two event files, HF's ``TensorBoardCallback`` tags ``train/loss``,
  ``train/grad_norm``, ``train/learning_rate``, ``train/epoch``, ``eval/loss``, every
  step): **a restart, spliced from two runs.** The first file is the break run's steps
  1-100 (the spike at 90 is in it); the second continues from step 81 with the healthy
  run's values, i.e. what a team has after resuming from the step-80 checkpoint with the
  bad batch skipped. A reader that honours the restart sees no spike at 90.
- ``wandb/history.csv`` (break): a W&B history export of HF's ``WandbCallback``: one row
  per ``wandb.log`` call, so train rows and eval rows alternate, ``_step`` counts calls
  and ``train/global_step`` holds the training step. ``_runtime``/``_timestamp`` are
  left out (no per-step wall clock is recorded).
- ``jsonl/metrics.jsonl`` (control): the project's own ``metrics.jsonl``, as
  ``spikecheck train`` writes it (pre- and post-clip norms, ``null`` where not evaluated).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import shutil
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
BURST_STEP = 90
STEPS = 120
DIVERGING_LR = 30.0
HF_LOGGING_STEPS = 5
HF_EVAL_STEPS = 20
LIGHTNING_LOG_EVERY = 2
LIGHTNING_VAL_EVERY = 20
RESTART_LAST_STEP = 100  # the first TensorBoard file ends here ...
RESUMED_FROM = 80  # ... and the resumed run continues with step 81


def train_runs() -> dict:
    from pytest_spikecheck import NoClip, RareTokenBurst, Scenario, train

    base = Scenario.preset("phase-19").replace(steps=STEPS)
    burst = RareTokenBurst(count=8, at_step=BURST_STEP)
    scenarios = {
        "break": base.replace(name="break").with_breaks(NoClip(), burst),
        "control": base.replace(name="control").with_breaks(burst),
        "healthy": base.replace(name="healthy"),
        "diverged": base.replace(name="diverged", optimizer__lr=DIVERGING_LR).with_breaks(NoClip()),
    }
    return {name: train(s, backend="torch", threads=1) for name, s in scenarios.items()}


def check_runs(runs: dict) -> dict[str, str]:
    """Fail loudly if a run no longer shows what its files are documented to show."""
    from pytest_spikecheck.judge.analysis import first_nonfinite, largest_spike, spike_ratio

    facts = {}
    ratio = spike_ratio(runs["break"].metrics, BURST_STEP)
    if not ratio >= 10:
        sys.exit(f"the break run no longer spikes at step {BURST_STEP} (ratio {ratio:.1f}x); fix the scenario first")
    facts["break"] = f"pre-clip grad norm {ratio:.0f}x the median of the 50 steps before at step {BURST_STEP}"
    post = float(np.max(runs["control"]["grad_norm_post"]))
    if not post <= 1.0 + 1e-5:
        sys.exit(f"the control run's post-clip norm reached {post}")
    facts["control"] = (
        f"pre-clip spike {spike_ratio(runs['control'].metrics, BURST_STEP):.0f}x at step {BURST_STEP}, post-clip norm <= 1.0"
    )
    step, healthy_ratio = largest_spike(runs["healthy"].metrics)
    if not healthy_ratio < 3:
        sys.exit(f"the healthy run has a {healthy_ratio:.1f}x grad-norm jump at step {step}")
    facts["healthy"] = f"largest grad-norm ratio {healthy_ratio:.1f}x (step {step})"
    first = first_nonfinite(runs["diverged"].metrics, ["loss", "grad_norm_pre"])
    if first is None:
        sys.exit(f"the diverged run (lr {DIVERGING_LR}) stayed finite")
    facts["diverged"] = f"non-finite {first[1]} at step {first[0]} (the engine stops there)"
    return facts


def _f(value: float) -> float:
    return float(f"{value:.6g}")  # logs carry a few digits, not float64 noise


def _epoch(step: int, steps_per_epoch: int) -> float:
    return round(step / steps_per_epoch, 4)


def hf_trainer_state(run, logging_steps: int, extra_entries: list[dict] = ()) -> dict:
    m = run.metrics
    steps_per_epoch = run.scenario.data.n_sentences // run.scenario.sampler.batch_size
    history: list[dict] = []
    last = 0
    for i, step in enumerate(m["step"].tolist()):
        if step % logging_steps == 0 or i == len(m["step"]) - 1:
            history.append(
                {
                    "epoch": _epoch(step, steps_per_epoch),
                    "grad_norm": _f(m["grad_norm_pre"][i]),
                    "learning_rate": _f(m["lr"][i]),
                    "loss": _f(float(np.mean(m["loss"][last : i + 1]))),  # the mean since the last log
                    "step": step,
                }
            )
            last = i + 1
        if step % HF_EVAL_STEPS == 0 and math.isfinite(m["eval_loss"][i]):
            history.append({"epoch": _epoch(step, steps_per_epoch), "eval_loss": _f(m["eval_loss"][i]), "step": step})
    history.extend(extra_entries)
    final = int(m["step"][-1])
    if not run.stopped_early:
        history.append(
            {
                "epoch": _epoch(final, steps_per_epoch),
                "step": final,
                "train_loss": _f(float(np.mean(m["loss"]))),
                "train_runtime": round(run.meta["train_seconds"], 4),
                "train_samples_per_second": round(final * run.scenario.sampler.batch_size / run.meta["train_seconds"], 3),
                "train_steps_per_second": round(final / run.meta["train_seconds"], 3),
            }
        )
    return {
        "best_metric": None,
        "best_model_checkpoint": None,
        "epoch": _epoch(final, steps_per_epoch),
        "eval_steps": HF_EVAL_STEPS,
        "global_step": final,
        "is_hyper_param_search": False,
        "is_local_process_zero": True,
        "is_world_process_zero": True,
        "log_history": history,
        "logging_steps": logging_steps,
        "max_steps": run.scenario.steps,
        "num_train_epochs": math.ceil(run.scenario.steps / steps_per_epoch),
        "train_batch_size": run.scenario.sampler.batch_size,
        "trial_name": None,
        "trial_params": None,
    }


def write_json(path: Path, data: dict) -> None:
    # As the Trainer does: json.dumps(indent=2, sort_keys=True), which writes NaN and Infinity bare.
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def lightning_rows(run) -> list[dict]:
    m = run.metrics
    steps_per_epoch = run.scenario.data.n_sentences // run.scenario.sampler.batch_size
    rows = []
    epoch_losses: list[float] = []
    for i, step in enumerate(m["step"].tolist()):
        epoch = (step - 1) // steps_per_epoch
        epoch_losses.append(float(m["loss"][i]))
        if step % LIGHTNING_LOG_EVERY == 0:
            rows.append(
                {
                    "epoch": epoch,
                    "step": step - 1,
                    "train_loss_step": _f(m["loss"][i]),
                    "grad_2.0_norm_total": _f(m["grad_norm_pre"][i]),
                    "lr-AdamW": _f(m["lr"][i]),
                }
            )
        if step % LIGHTNING_VAL_EVERY == 0:
            rows.append({"epoch": epoch, "step": step - 1, "val_loss": _f(m["eval_loss"][i])})
        if step % steps_per_epoch == 0:
            rows.append({"epoch": epoch, "step": step - 1, "train_loss_epoch": _f(statistics.fmean(epoch_losses))})
            epoch_losses = []
    return rows


def write_csv(path: Path, rows: list[dict], columns: list[str]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def write_tensorboard(folder: Path, segments: list[tuple[object, range]]) -> None:
    """One event file per segment (a run and the steps of it to write), as a resumed run
    writes a new file into the same folder."""
    from torch.utils.tensorboard import SummaryWriter

    for n, (run, steps) in enumerate(segments):
        m = run.metrics
        staging = folder / f"segment-{n}"
        writer = SummaryWriter(str(staging))
        steps_per_epoch = run.scenario.data.n_sentences // run.scenario.sampler.batch_size
        for i, step in enumerate(m["step"].tolist()):
            if step not in steps:
                continue
            walltime = 1_800_000_000.0 + step  # fixed, so a rerun writes the same scalars
            writer.add_scalar("train/loss", m["loss"][i], step, walltime=walltime)
            writer.add_scalar("train/grad_norm", m["grad_norm_pre"][i], step, walltime=walltime)
            writer.add_scalar("train/learning_rate", m["lr"][i], step, walltime=walltime)
            writer.add_scalar("train/epoch", step / steps_per_epoch, step, walltime=walltime)
            if math.isfinite(m["eval_loss"][i]):
                writer.add_scalar("eval/loss", m["eval_loss"][i], step, walltime=walltime)
        writer.close()
        (written,) = staging.iterdir()
        # The writer names files events.out.tfevents.<time>.<host>.<pid>.<n>: keep the
        # name's order (TensorBoard reads a folder's files in name order), drop the host.
        written.rename(folder / f"events.out.tfevents.{1_800_000_000 + n}.example")
        staging.rmdir()


def wandb_rows(run) -> list[dict]:
    m = run.metrics
    steps_per_epoch = run.scenario.data.n_sentences // run.scenario.sampler.batch_size
    rows = []
    for i, step in enumerate(m["step"].tolist()):
        common = {"train/global_step": step, "train/epoch": _epoch(step, steps_per_epoch)}
        rows.append(
            {
                **common,
                "train/loss": _f(m["loss"][i]),
                "train/grad_norm": _f(m["grad_norm_pre"][i]),
                "train/learning_rate": _f(m["lr"][i]),
            }
        )
        if math.isfinite(m["eval_loss"][i]):
            rows.append({**common, "eval/loss": _f(m["eval_loss"][i])})
    for n, row in enumerate(rows):
        row["_step"] = n  # one per wandb.log call
    return rows


def write_readme(out: Path, facts: dict[str, str]) -> None:
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file() and p.name != "README.md")
    lines = [
        "# Example training logs",
        "",
        "Written by `scripts/make_example_logs.py` from the project's own Phase-19 runs (120 steps,",
        "seed 42); its docstring says how each file follows its tool and which values were injected",
        "for format coverage. Used by `tests/test_logs.py` and `tests/test_cli_check.py`.",
        "",
        "What the runs show, as measured when the files were written:",
        "",
        *(f"- **{name}**: {fact}" for name, fact in facts.items()),
        "",
        "Files: " + ", ".join(f"`{name}`" for name in files) + ".",
        "",
    ]
    (out / "README.md").write_text("\n".join(lines))


def main() -> int:
    from pytest_spikecheck.training.schedule import lr_at

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "logs", help="Default: %(default)s")
    out = parser.parse_args().out
    runs = train_runs()
    facts = check_runs(runs)
    if out.exists():
        shutil.rmtree(out)
    for folder in ("hf", "lightning", "tensorboard", "wandb", "jsonl"):
        (out / folder).mkdir(parents=True)

    write_json(out / "hf" / "trainer_state.json", hf_trainer_state(runs["break"], HF_LOGGING_STEPS))
    write_json(out / "hf" / "trainer_state_healthy.json", hf_trainer_state(runs["healthy"], HF_LOGGING_STEPS))
    diverged = runs["diverged"]
    steps_per_epoch = diverged.scenario.data.n_sentences // diverged.scenario.sampler.batch_size
    after = int(diverged.steps[-1]) + 1
    lr_after = lr_at(
        after, base_lr=diverged.scenario.optimizer.lr, total_steps=diverged.scenario.steps, spec=diverged.scenario.schedule
    )
    injected = {
        "epoch": _epoch(after, steps_per_epoch),
        "grad_norm": math.nan,
        "learning_rate": _f(lr_after),
        "loss": math.nan,
        "step": after,
    }
    write_json(out / "hf" / "trainer_state_diverged.json", hf_trainer_state(diverged, 1, [injected]))

    rows = lightning_rows(runs["control"])
    write_csv(out / "lightning" / "metrics.csv", rows, sorted({k for r in rows for k in r}))
    write_tensorboard(
        out / "tensorboard",
        [(runs["break"], range(1, RESTART_LAST_STEP + 1)), (runs["healthy"], range(RESUMED_FROM + 1, STEPS + 1))],
    )
    rows = wandb_rows(runs["break"])
    write_csv(
        out / "wandb" / "history.csv",
        rows,
        ["_step", "train/global_step", "train/epoch", "train/loss", "train/grad_norm", "train/learning_rate", "eval/loss"],
    )
    runs["control"].save(out / "jsonl" / "run")
    (out / "jsonl" / "run" / "metrics.jsonl").rename(out / "jsonl" / "metrics.jsonl")
    shutil.rmtree(out / "jsonl" / "run")

    write_readme(out, facts)
    too_big = [p for p in out.rglob("*") if p.is_file() and p.stat().st_size > 100_000]
    if too_big:
        sys.exit(f"example logs must stay under 100 KB: {', '.join(map(str, too_big))}")
    for name, fact in facts.items():
        print(f"{name}: {fact}")
    print(f"wrote {sum(1 for p in out.rglob('*') if p.is_file())} files to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
