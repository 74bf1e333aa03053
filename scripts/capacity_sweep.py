"""Seed B's capacity claim, measured: does an unclipped spike hurt bigger models more?

    python scripts/capacity_sweep.py --out docs/capacity.json
    python scripts/capacity_sweep.py --table --plot docs/capacity.png --out docs/capacity.json

The grid is experiments/sweeps/capacity.yaml: the same break (Phase-19, 8 never-seen sentences
in the batch of step 312) on models from 32 wide x 2 layers to 256 wide x 6 layers, each with
and without clip 1.0 on the same batches, seeds 0-2, trained through the sweep engine (the
largest first; --jobs, --executor local|ray, resumed from out/sweeps/capacity/). Measured per
size: spike ratio, eval-loss jump and recovery without the clip, the final eval-loss gap between
the unclipped and the clipped run, and how many runs diverged.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from _sweep import add_sweep_arguments, run_sweep

from pytest_spikecheck.sweep.summary import median

EVENT = 312
#: (width, layers, heads), the sweep file's points: from half of Phase-19's model (64 x 2) to ~5M parameters.
SHAPES = [(32, 2, 2), (64, 2, 4), (128, 2, 4), (128, 4, 4), (256, 4, 8), (256, 6, 8)]


def measure(point, run) -> dict:
    from pytest_spikecheck.judge.analysis import final_value, loss_jump, recovery_steps, spike_ratio

    m, model = run.metrics, run.scenario.model
    return {
        "width": model.n_embd,
        "layers": model.n_layer,
        "parameters": run.meta["parameters"],
        "clip": point.recipe,
        "seed": run.scenario.seed,
        "ratio": spike_ratio(m, EVENT),
        "eval_jump": loss_jump(m, EVENT),
        "recovery": recovery_steps(m, EVENT),
        "final_eval": final_value(m),
        "diverged": run.stopped_early,
        "train_seconds": run.meta["train_seconds"],
        "adam_surprise": (getattr(run.event_at(EVENT), "adam_surprise", None) or {}).get("share"),
    }


def rows(records: list[dict]) -> list[dict]:
    out = []
    for shape in SHAPES:
        w, layers, _ = shape
        nc = [r for r in records if (r["width"], r["layers"]) == (w, layers) and r["clip"] == "no-clip"]
        cl = [r for r in records if (r["width"], r["layers"]) == (w, layers) and r["clip"] == "clip-1.0"]
        if not nc or not cl:
            continue
        gaps = [a["final_eval"] - b["final_eval"] for a in nc for b in cl if a["seed"] == b["seed"]]
        out.append(
            {
                "width": w,
                "layers": layers,
                "parameters": nc[0]["parameters"],
                "ratio": median([r["ratio"] for r in nc]),
                "eval_jump": median([r["eval_jump"] for r in nc]),
                "eval_jump_clip": median([r["eval_jump"] for r in cl]),
                "recovery": median([r["recovery"] for r in nc]),
                "final_gap": median(gaps),
                "adam_surprise": median([r["adam_surprise"] for r in nc]),
                "diverged": f"{sum(r['diverged'] for r in nc)}/{len(nc)}",
                "seconds": median([r["train_seconds"] for r in nc]),
            }
        )
    return out


def table(records: list[dict]) -> str:
    lines = [
        "| width × layers | parameters | ratio (no clip) | eval jump no clip / clip 1.0 | recovery (steps) | "
        "final gap (no clip − clip) | share of weights with \\|g\\|/√v̂ > 10 | diverged | s per run |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows(records):
        lines.append(
            f"| {r['width']} × {r['layers']} | {r['parameters']:,} | {r['ratio']:.1f}× | {r['eval_jump']:.3f} / "
            f"{r['eval_jump_clip']:.3f} | {r['recovery']:.0f} | {r['final_gap']:+.3f} | {r['adam_surprise']:.1%} | "
            f"{r['diverged']} | {r['seconds']:.0f} |"
        )
    return "\n".join(lines)


def plot(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = rows(records)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), dpi=110)
    params = [r["parameters"] for r in data]
    axes[0].plot(params, [r["eval_jump"] for r in data], "o-", color="#d62728", label="no clip")
    axes[0].plot(params, [r["eval_jump_clip"] for r in data], "o-", color="#1f77b4", label="clip 1.0")
    axes[0].set_ylabel("eval-loss jump after the burst (nats)")
    axes[1].plot(params, [r["ratio"] for r in data], "o-", color="#555")
    axes[1].set_ylabel("pre-clip grad-norm spike ratio")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("parameters")
        ax.grid(alpha=0.3, which="both")
    axes[0].legend()
    fig.suptitle("Brittleness against capacity (Phase-19, 8 unseen sentences at step 312; medians over seeds)")
    fig.tight_layout()
    fig.savefig(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/capacity.json")
    parser.add_argument("--table", action="store_true")
    parser.add_argument("--plot", default=None)
    add_sweep_arguments(parser)
    args = parser.parse_args()
    out = Path(args.out)
    if args.table or args.plot:
        records = json.loads(out.read_text())
        if args.plot:
            plot(records, Path(args.plot))
        print(table(records))
        return 0
    result = run_sweep("capacity", args)
    records = [measure(point, run) for point, run in zip(result.points, result.runs)]
    out.write_text(json.dumps(records, indent=1))
    print(table(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
