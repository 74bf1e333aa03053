"""High-learning-rate instabilities (Wortsman et al. 2023) at our scale: LR sweeps per recipe,
Wortsman's LR sensitivity, and how attention-logit growth depends on the model's size.

    python scripts/high_lr.py sweep --out docs/high_lr.json --panel docs/panels/lr_sensitivity.png
    python scripts/high_lr.py sweep --recipes muon --out docs/high_lr.json   # retrains one row, keeps the others
    python scripts/high_lr.py sizes --out docs/high_lr_sizes.json
    python scripts/high_lr.py table --out docs/high_lr.json [--sizes docs/high_lr_sizes.json]

The grids are the sweep files experiments/sweeps/high-lr.yaml (recipes x peak LR x seeds 0-4 on
Phase-19's micro model), high-lr-muon.yaml (the ``muon`` recipe: the same grid under Muon) and
high-lr-sizes.yaml (model sizes x {baseline, qk-layernorm} at lr 0.1), trained by the sweep engine
(--jobs, --executor local|ray, resumed from out/sweeps/<file>/).
Every run is Phase-19's preset (240 sentences, batch 8, AdamW, weight decay 0.1, clip 1.0)
for 150 steps with a cosine schedule; a recipe is a set of breaks/defences, the peak LR the
sweep's (``muon``: torch.optim.Muon at the sweep's lr on the hidden matrices, its AdamW part at 1e-2,
the rest of the recipe as the baseline's). ``final loss`` is the eval loss at the last step; the
initial loss is step 1's train loss.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from _sweep import add_sweep_arguments, run_sweep

from pytest_spikecheck.sweep import spread
from pytest_spikecheck.sweep.summary import median

STEPS = 150
LRS = (1e-2, 3e-2, 1e-1, 3e-1)
RECIPES = ("baseline", "no warmup", "qk-layernorm", "qk-layernorm + z-loss", "muon")
#: The sweep file of each recipe of ``sweep`` (Muon's differs in its base's optimizer, not in its breaks).
RECIPE_FILES = {**{recipe: "high-lr" for recipe in RECIPES}, "muon": "high-lr-muon"}
SIZES = ("nano", "micro", "mini")  # models.config.PRESETS: width 32, 64, 128; depth 2, 2, 4


def measure(point, run) -> dict:
    """The record of one point of either sweep file."""
    import numpy as np

    from pytest_spikecheck.judge.sweeps import final_loss, initial_loss

    att = run["attn_logit_max"]
    return {
        "recipe": point.recipe,
        "lr": run.scenario.optimizer.lr,
        "seed": run.scenario.seed,
        "model": point.value("model.preset") or "micro",
        "final": final_loss(run),
        "initial": initial_loss(run),
        "attn_max": float(np.nanmax(att)),
        "attn_step10": float(att[9]),
        "logz_end": float(run["logz_mean"][-1]),
        "seconds": run.meta["train_seconds"],
    }


def _sweeps(records: list[dict]):
    from pytest_spikecheck.judge.sweeps import LRSweep

    out = {}
    for recipe in RECIPES:
        for seed in sorted({r["seed"] for r in records}):
            rows = sorted(
                (r for r in records if r["recipe"] == recipe and r["seed"] == seed and r.get("model", "micro") == "micro"),
                key=lambda r: r["lr"],
            )
            if rows:
                out[recipe, seed] = LRSweep(
                    recipe, tuple(r["lr"] for r in rows), tuple(r["final"] for r in rows), initial=rows[0]["initial"]
                )
    return out


def table(data: dict | None, sizes: dict | None) -> str:
    lines: list[str] = []
    if data is not None:
        lines += _sweep_table(data)
    if sizes:
        lines += _sizes_table(sizes)
    return "\n".join(lines)


def _sweep_table(data: dict) -> list[str]:
    from pytest_spikecheck.judge.sweeps import lr_sensitivity

    records = data["records"]
    seeds = sorted({r["seed"] for r in records})
    sweeps = _sweeps(records)
    lines = [
        f"LR sweep, {STEPS} steps, micro model, seeds {seeds[0]}-{seeds[-1]} ({data['date']}); cells: final eval loss, "
        "median [min–max] over seeds",
        "",
        "| recipe | " + " | ".join(f"lr {lr:g}" for lr in LRS) + " | LR sensitivity |",
        "|---|" + "---|" * (len(LRS) + 1),
    ]
    for recipe in RECIPES:
        cells = [spread([r["final"] for r in records if r["recipe"] == recipe and r["lr"] == lr], ".3f") for lr in LRS]
        sens = spread([lr_sensitivity(sweeps[recipe, s]) for s in seeds if (recipe, s) in sweeps], ".3f")
        lines.append(f"| {recipe} | " + " | ".join(cells) + f" | {sens} |")
    lines += ["", "Largest |attention logit| over the run at lr 0.1, median [min–max]:", ""]
    for recipe in RECIPES:
        lines.append(
            f"- {recipe}: {spread([r['attn_max'] for r in records if r['recipe'] == recipe and r['lr'] == 0.1], ',.0f')}"
        )
    return lines


def _sizes_table(sizes: dict) -> list[str]:
    lines = [
        "",
        f"Size dependence at lr 0.1 ({sizes['date']}): final eval loss, median [min–max]; runs stuck "
        "(>= 1 nat above their qk-layernorm twin) / seeds",
        "",
        "| model | baseline | qk-layernorm | stuck | largest attention logit (baseline) |",
        "|---|---|---|---|---|",
    ]
    recs = sizes["records"]
    for model in SIZES:
        base = {r["seed"]: r for r in recs if r["model"] == model and r["recipe"] == "baseline"}
        qk = {r["seed"]: r for r in recs if r["model"] == model and r["recipe"] == "qk-layernorm"}
        if not base:
            continue
        stuck = sum(1 for s in base if s in qk and base[s]["final"] - qk[s]["final"] >= 1.0)
        lines.append(
            f"| {model} | {spread([r['final'] for r in base.values()], '.3f')} | "
            f"{spread([r['final'] for r in qk.values()], '.3f')} | {stuck}/{len(base)} | "
            f"{spread([r['attn_max'] for r in base.values()], ',.0f')} |"
        )
    return lines


def panel(data: dict, path: Path) -> None:
    from pytest_spikecheck.judge.sweeps import LRSweep
    from pytest_spikecheck.report import plot_lr_sweep

    records = data["records"]
    # the median over seeds of each recipe's final loss per LR (one line per recipe)
    sweeps = [
        LRSweep(
            recipe,
            LRS,
            tuple(
                median(
                    [
                        r["final"] if math.isfinite(r["final"]) else r["initial"]
                        for r in records
                        if r["recipe"] == recipe and r["lr"] == lr
                    ]
                )
                for lr in LRS
            ),
            initial=median([r["initial"] for r in records]),
        )
        for recipe in RECIPES
    ]
    plot_lr_sweep(sweeps, path, title=f"Final eval loss vs peak LR (micro, {STEPS} steps, median over seeds)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("sweep", "sizes", "table"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--sizes", default=None, help="table: the sizes JSON to add")
    parser.add_argument("--panel", default=None, help="sweep: draw the final-loss-vs-LR panel here")
    parser.add_argument(
        "--recipes",
        default=",".join(RECIPES),
        help="sweep: the recipes to train (comma-separated); the JSON keeps the others' records",
    )
    add_sweep_arguments(parser)
    args = parser.parse_args()
    if args.mode == "table":
        sizes = json.loads(Path(args.sizes).read_text()) if args.sizes else None
        print(table(json.loads(Path(args.out).read_text()) if Path(args.out).is_file() else None, sizes))
        return 0
    today = time.strftime("%Y-%m-%d")
    if args.mode == "sizes":
        result = run_sweep("high-lr-sizes", args)
        data = {"date": today, "steps": STEPS, "records": [measure(p, run) for p, run in zip(result.points, result.runs)]}
    else:
        recipes = [r for r in args.recipes.split(",") if r]
        unknown = sorted(set(recipes) - set(RECIPES))
        if unknown:
            parser.error(f"unknown recipe {unknown[0]!r}; choose from {', '.join(RECIPES)}")
        records = []
        for name in dict.fromkeys(RECIPE_FILES[r] for r in recipes):
            result = run_sweep(name, args, recipes=[r for r in recipes if RECIPE_FILES[r] == name])
            records += [measure(p, run) for p, run in zip(result.points, result.runs)]
        kept, old = [], {}
        if Path(args.out).is_file():  # the recipes not re-run keep their records
            old = json.loads(Path(args.out).read_text())
            kept = [r for r in old["records"] if r["recipe"] not in recipes]
        dates = {**{r["recipe"]: old.get("date", today) for r in kept}, **old.get("dates", {}), **{rc: today for rc in recipes}}
        data = {"date": old.get("date", today) if kept else today, "dates": dates, "steps": STEPS, "records": kept + records}
    Path(args.out).write_text(json.dumps(data, indent=1))
    if args.panel:
        panel(data, Path(args.panel))
    print(table(data, None) if args.mode == "sweep" else table(None, data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
