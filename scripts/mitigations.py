"""Seed B's mitigations side by side, each a config switch, on the same breaks and seeds.

    python scripts/mitigations.py --seeds 0-4 --jobs 2 --out docs/mitigations.json
    python scripts/mitigations.py --table --out docs/mitigations.json

Two breaks, both unclipped at baseline: ``burst`` (Phase-19, 3 never-seen sentences in the
batch of step 312) and ``new-source`` (Seed B's mixture; a source in a script the model never
saw enters at the first phase boundary after step 312 and is tried alone for one phase).
Each mitigation is a break/defence added to the same scenario, so the batches are the same.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from _sweep import recovery_spread, run_jobs, seed_range, spread

EVENT = 312


def _breaks():
    from pytest_spikecheck import (AdaptiveClip, ClipAt, MixtureShift, NoClip, NoWarmup, RareTokenBurst, Scenario,
                                   SkipSpikes, StratifiedBatches)

    base = {
        "burst": Scenario.preset("phase-19").with_breaks(RareTokenBurst(count=3, at_step=EVENT), NoClip()),
        "new-source": Scenario.preset("seed-b").with_breaks(MixtureShift(new_source="foreign", new_source_at=EVENT), NoClip()),
    }
    mitigations = {
        "no clip": (),
        "clip 1.0": (ClipAt(1.0),),
        "clip 0.5": (ClipAt(0.5),),
        "per-tensor clip 1.0": (ClipAt(1.0, mode="per_tensor"),),
        "no warmup, no clip": (NoWarmup(),),
        "no warmup, clip 1.0": (NoWarmup(), ClipAt(1.0)),
        "stratified batches": (StratifiedBatches(rare_cap=1),),
        "skip step (ratio ≥ 5)": (SkipSpikes(5.0),),
        "adaptive clip (ZClip z=2.5)": (AdaptiveClip(),),
    }
    return base, mitigations


def measure(job: tuple[str, str, int]) -> dict:
    brk, mitigation, seed = job
    from pytest_spikecheck import train
    from pytest_spikecheck.judge.analysis import final_value, loss_jump, recovery_steps, spike_ratio, value_at

    base, mitigations = _breaks()
    scenario = base[brk].with_breaks(*mitigations[mitigation]).replace(seed=seed)
    run = train(scenario, backend="torch", threads=1)
    m = run.metrics
    event = EVENT
    if brk == "new-source":  # the first step whose batch holds the new source
        event = next((b["step"] for b in run.batches if "foreign" in b["sources"]), EVENT)
    return {
        "break": brk, "mitigation": mitigation, "seed": seed, "event_step": event,
        "ratio": spike_ratio(m, event), "grad_norm_post": value_at(m, "grad_norm_post", event),
        "eval_jump": loss_jump(m, event), "recovery": recovery_steps(m, event),
        "final_eval": final_value(m), "nonfinite": run.stopped_early,
        "first_step_max_update": (run.meta["first_step_update"] or {}).get("max_abs"),
        "skipped_steps": len(run.meta["skipped_steps"]),
    }


def summarise(records: list[dict]) -> str:
    _, mitigations = _breaks()
    lines = []
    for brk in ("burst", "new-source"):
        lines += [f"\n**{brk}**\n", "| mitigation | ratio at the event | post-clip norm | eval jump | recovery (steps) | "
                  "final eval | first-step max \\|Δθ\\| | skipped steps | NaN runs |", "|---|---|---|---|---|---|---|---|---|"]
        for name in mitigations:
            rs = [r for r in records if r["break"] == brk and r["mitigation"] == name]
            if not rs:
                continue
            lines.append(f"| {name} | {spread([r['ratio'] for r in rs], '.1f')}× | {spread([r['grad_norm_post'] for r in rs], '.2f')} | "
                         f"{spread([r['eval_jump'] for r in rs], '.3f')} | {recovery_spread([r['recovery'] for r in rs])} | "
                         f"{spread([r['final_eval'] for r in rs], '.3f')} | {spread([r['first_step_max_update'] for r in rs], '.1e')} | "
                         f"{spread([r['skipped_steps'] for r in rs], '.0f')} | {sum(r['nonfinite'] for r in rs)}/{len(rs)} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0-4")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", default="docs/mitigations.json")
    parser.add_argument("--table", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    if args.table:
        print(summarise(json.loads(out.read_text())))
        return 0
    _, mitigations = _breaks()
    jobs = [(b, m, s) for b in ("burst", "new-source") for m in mitigations for s in seed_range(args.seeds)
            if not (b == "new-source" and m == "stratified batches")]  # no rare samples to spread in a source shift
    records = run_jobs(measure, jobs, args.jobs, lambda r: f"{r['break']} / {r['mitigation']} / seed {r['seed']}: "
                       f"ratio {r['ratio']:.1f} jump {r['eval_jump']:.3f}")
    out.write_text(json.dumps(records, indent=1))
    print(summarise(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
