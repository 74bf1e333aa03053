"""Held-out-width validation of the preflight's extrapolation (docs/preflight.md, "Validation"):
for each recipe, train the study at the proxy widths, fit the first failing LR against width on
all but the largest width, predict the largest width's, and count a hit when the prediction is
within one grid step (a factor of 2 on the default grid) of the measured one.

    .venv/bin/python scripts/preflight_validate.py [--widths 64,128,256] [--head-dim 16] [--seeds 0,1,2]
        [--steps 150] [--corpus induction] [--jobs 2] [--executor local|ray] [--only NAME,...]
        [--lr-factors 0.5,1,2,4,8] [--lr-scale 1]

Five recipes on two configs (AdamW and Muon, with and without qk-norm; Llama-3.2-1B and Qwen3-1.7B
from tests/data/hf_configs, the Qwen3 one has q/k-norm of its own). Every point goes through the
sweep engine with a run store under out/preflight-validate/, so an interrupted run resumes.
A recipe whose held-out width (or fewer than two smaller widths) has no failing LR in the grid is
reported as "no prediction", not as a hit or a miss.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from pytest_spikecheck.preflight import preflight

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "tests" / "data" / "hf_configs"
ADAMW = {"optimizer": "adamw", "lr": 3e-3, "betas": [0.9, 0.95], "weight_decay": 0.1, "grad_clip": 1.0}
MUON = {"optimizer": "muon", "lr": 0.02, "adamw_lr": 3e-3, "weight_decay": 0.1, "grad_clip": 1.0}
#: name -> (config file, recipe, defence)
RECIPES = {
    "llama adamw": ("llama-3.2-1b.json", ADAMW, "as-given"),
    "llama adamw + qk-norm": ("llama-3.2-1b.json", ADAMW, "qk-norm"),
    "llama muon": ("llama-3.2-1b.json", MUON, "as-given"),
    "llama muon + qk-norm": ("llama-3.2-1b.json", MUON, "qk-norm"),
    "qwen3 adamw (own qk-norm)": ("qwen3-1.7b.json", ADAMW, "as-given"),
    "qwen3 muon (own qk-norm)": ("qwen3-1.7b.json", MUON, "as-given"),
}


def held_out(study: dict) -> tuple[float | None, float | None]:
    """(predicted, measured) first failing LR at the largest width, from the smaller widths' fit."""
    widths = study["widths"]
    *fit_on, last = widths
    pairs = [(math.log(p["width"]), math.log(p["first_failing_lr"])) for p in fit_on if p["first_failing_lr"]]
    if len(pairs) < 2 or last["first_failing_lr"] is None:
        return None, last["first_failing_lr"]
    n = len(pairs)
    mx, my = sum(x for x, _ in pairs) / n, sum(y for _, y in pairs) / n
    slope = sum((x - mx) * (y - my) for x, y in pairs) / sum((x - mx) ** 2 for x, _ in pairs)
    return math.exp(my + slope * (math.log(last["width"]) - mx)), last["first_failing_lr"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--widths", default="64,128,256")
    p.add_argument("--head-dim", type=int, default=16)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--corpus", default="induction")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--executor", default="local")
    p.add_argument("--only", default=None, help="comma-separated recipe names")
    p.add_argument("--lr-scale", type=float, default=1.0, help="multiply each recipe's LR (and so its grid) by this")
    p.add_argument("--lr-factors", default=None, help="the LR grid as factors of the recipe's LR. Default: the study's")
    args = p.parse_args()
    chosen = [n.strip() for n in args.only.split(",")] if args.only else list(RECIPES)
    lines = [
        "| recipe | widths | first failing LR per width (median over seeds) | predicted at the largest | "
        "measured | within one grid step |",
        "|---|---|---|---:|---:|---|",
    ]
    print(
        f"widths {args.widths}, head_dim {args.head_dim}, seeds {args.seeds}, {args.steps} steps, corpus {args.corpus}, "
        f"LR x {args.lr_scale:g}, grid x {args.lr_factors or 'the default'}"
    )
    hits = misses = none = 0
    for name in chosen:
        config, recipe, defence = RECIPES[name]
        recipe = {**recipe, "lr": recipe["lr"] * args.lr_scale}
        result = preflight(
            CONFIGS / config,
            recipe,
            widths=[int(w) for w in args.widths.split(",")],
            head_dim=args.head_dim,
            seeds=[int(s) for s in args.seeds.split(",")],
            steps=args.steps,
            corpora=[args.corpus],
            defences=[defence],
            executor=args.executor,
            jobs=args.jobs,
            lr_factors=[float(f) for f in args.lr_factors.split(",")] if args.lr_factors else None,
            out=ROOT / "out" / "preflight-validate" / name.replace(" ", "_").replace("(", "").replace(")", ""),
            progress="lines",
        )
        study = result.study(args.corpus, defence)
        predicted, measured = held_out(study)
        ladder = ", ".join("none" if q["first_failing_lr"] is None else f"{q['first_failing_lr']:.3g}" for q in study["widths"])
        if predicted is None:
            verdict, none = "no prediction", none + 1
        elif abs(math.log2(predicted / measured)) <= 1.0:
            verdict, hits = "hit", hits + 1
        else:
            verdict, misses = "miss", misses + 1
        lines.append(
            f"| {name} | {args.widths} | {ladder} | {'-' if predicted is None else f'{predicted:.3g}'} | "
            f"{'none' if measured is None else f'{measured:.3g}'} | {verdict} |"
        )
    print("\n".join(lines))
    print(f"\n{hits} hits, {misses} misses, {none} without a prediction, of {len(chosen)} recipes")


if __name__ == "__main__":
    main()
