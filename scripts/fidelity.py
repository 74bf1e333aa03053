"""Measure Seed A's claims on our Phase-19 set-up over many seeds; write docs/fidelity data.

    python scripts/fidelity.py --out docs/fidelity_phase19.json

The grid is experiments/sweeps/fidelity-phase19.yaml: each burst trained as a control (clip
1.0), a break (no clip) and, for the calibrated burst, the clip-0.5 lesson, on the same batches
(same seed), seeds 0-9, through the sweep engine (--jobs, --executor local|ray, resumed from
out/sweeps/fidelity-phase19/). Every run is a 1-thread training, bit-identical to `spikecheck
train` with the same seed. The JSON holds one record per run; `--table` prints the markdown
used in docs/fidelity.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from _sweep import add_sweep_arguments, run_sweep

from pytest_spikecheck.sweep import recovery_spread, spread

BURST = 312
#: The sweep file's recipes are "<config> <clip>"; the table's rows, in this order.
CONFIGS = ("greek-3", "greek-8", "caps-3", "written-3")
CLIPS = ("clip-1.0", "no-clip", "clip-0.5")


def measure(point, run) -> dict:
    from pytest_spikecheck.judge.analysis import baseline, final_value, loss_jump, recovery_steps, spike_ratio, value_at

    config, clip_name = point.recipe.split(" ")
    m = run.metrics
    clip_factor = np.asarray(m["clip_factor"])
    return {
        "config": config,
        "clip": clip_name,
        "seed": run.scenario.seed,
        "ratio": spike_ratio(m, BURST),
        "grad_norm_pre": value_at(m, "grad_norm_pre", BURST),
        "grad_norm_post": value_at(m, "grad_norm_post", BURST),
        "grad_norm_baseline": baseline(m, "grad_norm_pre", BURST),
        "train_loss_before": baseline(m, "loss", BURST),
        "train_loss_at": value_at(m, "loss", BURST),
        "eval_jump": loss_jump(m, BURST),
        "recovery": recovery_steps(m, BURST),
        "final_eval": final_value(m),
        "nonfinite": run.stopped_early,
        "share_steps_clipped": float(np.mean(clip_factor < 1.0)),
        "median_clip_factor_after_warmup": float(np.median(clip_factor[100:])),
        "adam_surprise": (getattr(run.event_at(BURST), "adam_surprise", None) or {}).get("share"),
        "train_seconds": run.meta["train_seconds"],
        "seconds": run.meta["seconds"],
    }


def summarise(records: list[dict]) -> str:
    lines = [
        "| burst at 312 | clip | ratio | pre-clip norm | post-clip norm | train loss before → at | eval jump | recovery (steps) | final eval | NaN runs |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for config in CONFIGS:
        for clip in CLIPS:
            rs = [r for r in records if r["config"] == config and r["clip"] == clip]
            if not rs:
                continue
            nan = sum(r["nonfinite"] for r in rs)
            lines.append(
                f"| {config} | {clip} | {spread([r['ratio'] for r in rs])}× | {spread([r['grad_norm_pre'] for r in rs], '.2f')} | "
                f"{spread([r['grad_norm_post'] for r in rs], '.2f')} | {spread([r['train_loss_before'] for r in rs], '.2f')} → "
                f"{spread([r['train_loss_at'] for r in rs], '.2f')} | {spread([r['eval_jump'] for r in rs], '.3f')} | "
                f"{recovery_spread([r['recovery'] for r in rs])} | {spread([r['final_eval'] for r in rs], '.3f')} | {nan}/{len(rs)} |"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/fidelity_phase19.json")
    parser.add_argument("--table", action="store_true", help="print the markdown table of an existing --out file")
    add_sweep_arguments(parser)
    args = parser.parse_args()
    out = Path(args.out)
    if args.table:
        print(summarise(json.loads(out.read_text())))
        return 0
    result = run_sweep("fidelity-phase19", args)
    records = [measure(point, run) for point, run in zip(result.points, result.runs)]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(records, indent=1))
    print(summarise(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
