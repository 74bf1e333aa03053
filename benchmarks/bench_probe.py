"""Probe-rate and search timings (a script, not a test): the probe figures in docs/benchmarks.md
and the README.

    python benchmarks/bench_probe.py [--repeats 3] [--probes 200] [--json out.json]

1. Probes: the Phase-19 scenario (clip 1.0, the Greek burst at step 312), probed at step 312
   on one torch thread: the checkpoint (training steps 1–311) once, then ``--probes`` one-step
   probes (forward, backward, clip, AdamW step, restore) on random batches of the pool; the
   rate is probes over the wall time of the probe loop, per repeat.
2. Search: ``spikecheck search experiments/19-search --at-step 312`` as a subprocess, per
   repeat: the probe count and search time it prints, and the wall time of the whole command.

On a shared machine every figure depends on what else runs: the script prints the load average
before and after, so that a reader can tell a quiet run from a busy one.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def probe_rates(repeats: int, probes: int) -> dict:
    import numpy as np
    import torch

    from pytest_spikecheck import RareTokenBurst, Scenario
    from pytest_spikecheck.scenario.presets import PHASE19_BURST_STEP as BURST
    from pytest_spikecheck.training.probe import Probe

    torch.set_num_threads(1)
    scenario = Scenario.preset("phase-19").with_breaks(RareTokenBurst(count=3, at_step=BURST, content="greek"))
    probe = Probe(scenario, BURST, backend="torch", threads=1)
    rng = np.random.default_rng(0)
    batch_size = len(probe.real_batch)
    rates = []
    for _ in range(repeats):
        batches = [tuple(rng.choice(probe.pool_size, batch_size, replace=False)) for _ in range(probes)]
        start = time.perf_counter()
        for batch in batches:
            probe(batch)
        rates.append(probes / (time.perf_counter() - start))
    return {
        "checkpoint_seconds": probe.checkpoint_seconds,
        "probes_per_repeat": probes,
        "batch": f"{batch_size}x{scenario.resolved().model.block_size}",
        "probes_per_second": rates,
    }


def search_timings(repeats: int) -> list[dict]:
    command = [
        sys.executable,
        "-m",
        "pytest_spikecheck.cli",
        "search",
        str(ROOT / "experiments" / "19-search"),
        "--at-step",
        "312",
    ]
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        wall = time.perf_counter() - start
        if result.returncode != 0:
            raise SystemExit(f"spikecheck search failed ({result.returncode}): {result.stderr.strip()[-500:]}")
        found = re.search(r"(\d+) probes in ([\d.]+)s", result.stdout)
        if found is None:
            raise SystemExit(f"no 'N probes in Xs' line in the search output:\n{result.stdout[:500]}")
        out.append({"probes": int(found[1]), "search_seconds": float(found[2]), "command_seconds": wall})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    load_before = os.getloadavg()
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average_before": load_before,
        "probe": probe_rates(args.repeats, args.probes),
        "search": search_timings(args.repeats),
        "load_average_after": os.getloadavg(),
    }
    import torch

    result["torch"] = torch.__version__
    p, s = result["probe"], result["search"]
    print(
        f"probes: {min(p['probes_per_second']):.0f}–{max(p['probes_per_second']):.0f} per second "
        f"({args.repeats}×{args.probes}, batch {p['batch']}), checkpoint {p['checkpoint_seconds']:.1f} s"
    )
    print(
        "search: "
        + "; ".join(f"{r['probes']} probes in {r['search_seconds']:.1f} s, command {r['command_seconds']:.1f} s" for r in s)
    )
    print(f"load average before {load_before[0]:.1f}, after {result['load_average_after'][0]:.1f} ({result['cpus']} CPUs)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
