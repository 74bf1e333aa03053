"""Seed B's mitigations side by side, each a config switch, on the same breaks and seeds.

    python scripts/mitigations.py --out docs/mitigations.json
    python scripts/mitigations.py --table --out docs/mitigations.json

Two breaks, both unclipped at baseline, each a sweep file: ``burst``
(experiments/sweeps/mitigations-burst.yaml: Phase-19, 3 never-seen sentences in the batch of
step 312) and ``new-source`` (mitigations-new-source.yaml: Seed B's mixture; a source in a
script the model never saw enters at the first phase boundary after step 312 and is tried alone
for one phase). Each mitigation is a recipe added to the same scenario, so the batches are the
same; seeds 0-4, trained through the sweep engine (--jobs, --executor local|ray, resumed from
out/sweeps/<file>/).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from _sweep import add_sweep_arguments, run_sweep

from pytest_spikecheck.sweep import recovery_spread, spread

EVENT = 312
#: break -> its sweep file in experiments/sweeps/
BREAKS = {"burst": "mitigations-burst", "new-source": "mitigations-new-source"}
#: The table's rows in order: the recipes of the sweep files.
MITIGATIONS = (
    "no clip",
    "clip 1.0",
    "clip 0.5",
    "per-tensor clip 1.0",
    "no warmup, no clip",
    "no warmup, clip 1.0",
    "stratified batches",
    "skip step (ratio ≥ 5)",
    "adaptive clip (ZClip z=2.5)",
)


def measure(brk: str, point, run) -> dict:
    from pytest_spikecheck.judge.analysis import final_value, loss_jump, recovery_steps, spike_ratio, value_at

    m = run.metrics
    event = EVENT
    if brk == "new-source":  # the first step whose batch holds the new source
        event = next((b["step"] for b in run.batches if "foreign" in b["sources"]), EVENT)
    return {
        "break": brk,
        "mitigation": point.recipe,
        "seed": run.scenario.seed,
        "event_step": event,
        "ratio": spike_ratio(m, event),
        "grad_norm_post": value_at(m, "grad_norm_post", event),
        "eval_jump": loss_jump(m, event),
        "recovery": recovery_steps(m, event),
        "final_eval": final_value(m),
        "nonfinite": run.stopped_early,
        "first_step_max_update": (run.meta["first_step_update"] or {}).get("max_abs"),
        "skipped_steps": len(run.meta["skipped_steps"]),
    }


def summarise(records: list[dict]) -> str:
    lines = []
    for brk in ("burst", "new-source"):
        lines += [
            f"\n**{brk}**\n",
            "| mitigation | ratio at the event | post-clip norm | eval jump | recovery (steps) | "
            "final eval | first-step max \\|Δθ\\| | skipped steps | NaN runs |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for name in MITIGATIONS:
            rs = [r for r in records if r["break"] == brk and r["mitigation"] == name]
            if not rs:
                continue
            lines.append(
                f"| {name} | {spread([r['ratio'] for r in rs], '.1f')}× | {spread([r['grad_norm_post'] for r in rs], '.2f')} | "
                f"{spread([r['eval_jump'] for r in rs], '.3f')} | {recovery_spread([r['recovery'] for r in rs])} | "
                f"{spread([r['final_eval'] for r in rs], '.3f')} | {spread([r['first_step_max_update'] for r in rs], '.1e')} | "
                f"{spread([r['skipped_steps'] for r in rs], '.0f')} | {sum(r['nonfinite'] for r in rs)}/{len(rs)} |"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/mitigations.json")
    parser.add_argument("--table", action="store_true")
    add_sweep_arguments(parser)
    args = parser.parse_args()
    out = Path(args.out)
    if args.table:
        print(summarise(json.loads(out.read_text())))
        return 0
    records = []
    for brk, name in BREAKS.items():
        result = run_sweep(name, args)
        records += [measure(brk, point, run) for point, run in zip(result.points, result.runs)]
    out.write_text(json.dumps(records, indent=1))
    print(summarise(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
