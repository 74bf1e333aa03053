"""What ``spikecheck check`` costs on a long log (a script, not a test): the numbers in
docs/benchmarks.md ("Checking a long log").

    python benchmarks/bench_check.py --steps 200000 1000000 [--repeats 3] [--source DIR] [--json out.json]

A synthetic JSONL log (our metrics.jsonl's shape: step, loss, grad_norm, lr, epoch; one row a
step) of N steps, seeded so every run writes the same bytes: a loss that falls 10 -> 2 with
per-batch noise, a log-normal gradient norm, one spike at 60 % of the run (loss +3 nats, norm
40x). Each repeat runs ``spikecheck check LOG --json`` in a fresh process and measures its wall
time and peak resident memory (the child's ru_maxrss); one more in-process run splits the time
into reading (``read_runs``) and judging (``check_record``). ``--source DIR`` runs the check from
another checkout (``PYTHONPATH=DIR``): the same log, the same machine, interleaved with this
one, for a before/after pair; ``--other-steps`` limits the sizes it runs at (today's code takes
minutes on a million steps). Wall time and CPU time (user + system) are both reported: on a
shared machine the wall time is mostly the load. Every run must find the one spike, and the script fails if the
two sources' reports differ.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SPIKE_AT = 0.6


def write_log(path: Path, steps: int, seed: int = 0) -> Path:
    """The synthetic log: one JSON object a line, ~110 bytes a line."""
    rng = np.random.default_rng(seed)
    s = np.arange(1, steps + 1)
    loss = 2.0 + 8.0 * np.exp(-s / (steps / 20)) + 0.05 * rng.standard_normal(steps)
    norm = 0.5 * np.exp(0.2 * rng.standard_normal(steps))
    spike = int(SPIKE_AT * steps)
    loss[spike - 1] += 3.0
    norm[spike - 1] *= 40.0
    lr = 3e-4 * np.minimum(1.0, s / 2000) * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * s / steps)))
    with open(path, "w") as f:
        for i in range(steps):
            f.write(
                f'{{"step": {s[i]}, "loss": {loss[i]:.6f}, "grad_norm": {norm[i]:.6f}, "lr": {lr[i]:.6e}, '
                f'"epoch": {s[i] / 10000:.4f}}}\n'
            )
    return path


def run_child(log: Path, source: Path) -> tuple[float, float, float, dict]:
    """(wall seconds, peak RSS in MB, CPU seconds, the JSON report) of one ``spikecheck check`` process."""
    env = {**os.environ, "PYTHONPATH": str(source), "OMP_NUM_THREADS": "1"}
    code = (
        "import resource, sys, time; t = time.perf_counter(); "
        "from pytest_spikecheck.cli.commands import main; rc = main(['check', sys.argv[1], '--json']); "
        "sys.stderr.write(f'WALL {time.perf_counter() - t}\\n'); "
        "u = resource.getrusage(resource.RUSAGE_SELF); sys.stderr.write(f'RSS {u.ru_maxrss}\\nCPU {u.ru_utime + u.ru_stime}\\n'); "
        "sys.exit(rc)"
    )
    # From the checkout's own folder: `python -c` puts the working directory first on sys.path.
    proc = subprocess.run([sys.executable, "-c", code, str(log)], env=env, capture_output=True, text=True, cwd=source)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"check failed ({proc.returncode}): {proc.stderr[-2000:]}")
    found = {
        line.split()[0]: float(line.split()[1]) for line in proc.stderr.splitlines() if line.startswith(("WALL", "RSS", "CPU"))
    }
    # The wall time is the command's own (imports included, interpreter start-up not); CPU is its user +
    # system time (what a loaded machine's other jobs cannot inflate); ru_maxrss is in KiB on Linux.
    return found["WALL"], found["RSS"] / 1024, found["CPU"], json.loads(proc.stdout)


def phases(log: Path) -> dict[str, float]:
    """Reading and judging timed apart, in this process (the current source)."""
    from pytest_spikecheck.cli.check import check_record
    from pytest_spikecheck.records.logs import read_runs

    t0 = time.perf_counter()
    records = read_runs(log)
    t1 = time.perf_counter()
    for record in records:
        check_record(record)
    t2 = time.perf_counter()
    return {"read_s": t1 - t0, "judge_s": t2 - t1}


def spikes(report: dict) -> list[tuple[str, int]]:
    runs = report["logs"] if "logs" in report else [report]
    return sorted((s["metric"], h["step"]) for r in runs for s in r["series"] for h in s["spikes"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[200_000, 1_000_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--source", type=Path, default=None, help="also run the check from this checkout")
    parser.add_argument(
        "--other-steps", type=int, nargs="*", default=None, help="the sizes the other checkout runs at (default: every size)"
    )
    parser.add_argument("--dir", type=Path, default=Path("/tmp"), help="where the synthetic logs are written")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    sources = {"this": ROOT} | ({"other": args.source.resolve()} if args.source else {})
    results = {"load": os.getloadavg(), "cpus": os.cpu_count(), "python": sys.version.split()[0], "sizes": []}
    for steps in args.steps:
        log = write_log(args.dir / f"bench_check_{steps}.jsonl", steps)
        size = {"steps": steps, "megabytes": log.stat().st_size / 1e6, "sources": {}}
        runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in sources}
        found: dict[str, list] = {}
        for _ in range(args.repeats):
            for name, source in sources.items():  # interleaved: the machine's load falls on both alike
                if name == "other" and args.other_steps is not None and steps not in args.other_steps:
                    continue
                wall, mb, cpu, report = run_child(log, source)
                runs[name].append((wall, mb, cpu))
                found[name] = spikes(report)
        for name, triples in ((n, t) for n, t in runs.items() if t):
            walls, cpus = [w for w, _, _ in triples], [c for _, _, c in triples]
            size["sources"][name] = {
                "wall_s": walls,
                "median_s": statistics.median(walls),
                "cpu_s": cpus,
                "median_cpu_s": statistics.median(cpus),
                "peak_rss_mb": max(m for _, m, _ in triples),
                "spikes": found[name],
            }
        size["phases"] = phases(log)
        if len(found) > 1 and len(set(map(tuple, found.values()))) > 1:
            raise SystemExit(f"the sources disagree at {steps} steps: {found}")
        results["sizes"].append(size)
        line = ", ".join(
            f"{n}: {v['median_s']:.2f} s [{min(v['wall_s']):.2f}-{max(v['wall_s']):.2f}] "
            f"(CPU {v['median_cpu_s']:.2f} s), {v['peak_rss_mb']:.0f} MB"
            for n, v in size["sources"].items()
        )
        print(
            f"{steps:>9,} steps ({size['megabytes']:.0f} MB): {line}; this: read {size['phases']['read_s']:.2f} s, "
            f"judge {size['phases']['judge_s']:.2f} s; spikes {found['this']}"
        )
    results["load_after"] = os.getloadavg()
    print(f"load average before {results['load'][0]:.2f}, after {results['load_after'][0]:.2f} ({results['cpus']} CPUs)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
