"""Measure Seed B's claims on the bandit and on lock-in, over seeds; print the numbers that
docs/fidelity.md quotes (the new-source and mitigation numbers come from scripts/mitigations.py,
the capacity numbers from scripts/capacity_sweep.py).

    python scripts/seed_b_fidelity.py --out docs/seed_b.json

The grid is experiments/sweeps/seed-b.yaml (the bandit with and without clip, ANDREA's v1 and
v2 recipes, seeds 0-4), trained through the sweep engine (--jobs, --executor local|ray,
resumed from out/sweeps/seed-b/).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from _sweep import add_sweep_arguments, run_sweep

KINDS = ("bandit-clip", "bandit-no-clip", "v1-recipe", "v2-recipe")


def measure(point, run) -> dict:
    import numpy as np

    from pytest_spikecheck.judge.analysis import final_value, ratio_series

    steps, ratios = ratio_series(run.metrics)
    weights = [b["weights"] for b in run.batches]
    boundaries = {run.batches[i]["step"] for i in range(1, len(weights)) if weights[i] != weights[i - 1]}
    after_warmup = steps > 60
    at_boundary = np.array([s in boundaries for s in steps]) & after_warmup
    elsewhere = ~np.array([s in boundaries for s in steps]) & after_warmup & np.isfinite(ratios)
    return {
        "kind": point.recipe,
        "seed": run.scenario.seed,
        "boundary_ratios": [float(r) for r in ratios[at_boundary]],
        "other_max_ratio": float(np.max(ratios[elsewhere])),
        "other_p99_ratio": float(np.percentile(ratios[elsewhere], 99)),
        "final_eval": final_value(run.metrics),
        "nonfinite": run.stopped_early,
        "lockin": {k: v for k, v in (run.meta["lockin"] or {}).items() if k != "samples"},
        "samples": (run.meta["lockin"] or {}).get("samples", []),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/seed_b.json")
    add_sweep_arguments(parser)
    args = parser.parse_args()
    result = run_sweep("seed-b", args)
    records = [measure(point, run) for point, run in zip(result.points, result.runs)]
    Path(args.out).write_text(json.dumps(records, indent=1))
    for kind in KINDS:
        rs = [r for r in records if r["kind"] == kind]
        b = [x for r in rs for x in r["boundary_ratios"]]
        print(
            f"{kind}: {len(b)} boundaries, ratio median {statistics.median(b):.2f}, max {max(b):.2f}; other steps max "
            f"{statistics.median(r['other_max_ratio'] for r in rs):.2f} (median over seeds), p99 "
            f"{statistics.median(r['other_p99_ratio'] for r in rs):.2f}; final eval "
            f"{statistics.median(r['final_eval'] for r in rs):.3f} [{min(r['final_eval'] for r in rs):.3f}-"
            f"{max(r['final_eval'] for r in rs):.3f}]; NaN {sum(r['nonfinite'] for r in rs)}/{len(rs)}; top-token share "
            f"{statistics.median(r['lockin']['top_token_share'] for r in rs):.3f} max {max(r['lockin']['top_token_share'] for r in rs):.3f}, "
            f"distinct-2 {statistics.median(r['lockin']['distinct_2'] for r in rs):.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
