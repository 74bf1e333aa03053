"""``pytest --spikecheck`` on the downstream example with and without pytest-xdist: wall time,
and how many times the model was built (one per training). A script, not a test: the numbers in
docs/benchmarks.md ("pytest --spikecheck under xdist").

    python benchmarks/bench_xdist.py [--repeats 3] [--json docs/bench_xdist.json] [--code DIR]

It copies examples/downstream into a temporary folder, wraps the copy's model factory so that
each call appends a line to a file (the trainings, counted by the model, not by the plugin), and
runs ``pytest --spikecheck -p no:randomly -p no:cacheprovider`` there with ``-n 0``, ``-n 2
--dist load`` and ``-n 2 --dist loadscope``, interleaved, ``--repeats`` times (no report folder:
nothing is cached between runs). It prints each mode's wall time, median [min–max], the
trainings per run, the summary's counts line and the 1-minute load average around the runs.
``--code DIR`` puts DIR first on PYTHONPATH: an older checkout of the package (``git archive``
of a commit), whose plugin is then the one measured.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = {
    "-n 0": ["-n", "0"],
    "-n 2 --dist load": ["-n", "2", "--dist", "load"],
    "-n 2 --dist loadscope": ["-n", "2", "--dist", "loadscope"],
}

COUNTING = """

import os as _os

_make_model = make_model


def make_model(vocab_size, **kwargs):  # bench_xdist.py: one line per model built
    with open(_os.environ["BENCH_XDIST_BUILDS"], "a") as f:
        f.write("built\\n")
    return _make_model(vocab_size, **kwargs)
"""


def run_once(folder: Path, args: list[str], env: dict[str, str]) -> dict:
    builds = folder / "builds.txt"
    builds.unlink(missing_ok=True)
    load = os.getloadavg()[0]
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--spikecheck", "-p", "no:randomly", "-p", "no:cacheprovider", *args],
        cwd=folder,
        env={**env, "BENCH_XDIST_BUILDS": str(builds)},
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - started
    counts = re.search(r"^\d+ scenarios? checked \(.*\)\.$", result.stdout, re.M)
    return {
        "seconds": seconds,
        "exit": result.returncode,
        "trainings": len(builds.read_text().split()) if builds.exists() else 0,
        "counts": counts.group(0) if counts else None,
        "load_before": load,
        "load_after": os.getloadavg()[0],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None, help="write the measurements here")
    parser.add_argument("--code", default=None, help="a checkout of the package to put first on PYTHONPATH")
    args = parser.parse_args()
    env = dict(os.environ)
    if args.code:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(args.code).resolve()), env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory(prefix="bench-xdist-") as tmp:
        folder = Path(tmp) / "downstream"
        shutil.copytree(ROOT / "examples" / "downstream", folder, ignore=shutil.ignore_patterns("__pycache__"))
        with open(folder / "tinylm.py", "a") as f:
            f.write(COUNTING)
        runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
        for _ in range(args.repeats):
            for mode, mode_args in MODES.items():
                runs[mode].append(run_once(folder, mode_args, env))
    summary = {}
    for mode, measured in runs.items():
        seconds = [m["seconds"] for m in measured]
        summary[mode] = {
            "median_s": statistics.median(seconds),
            "min_s": min(seconds),
            "max_s": max(seconds),
            "trainings": sorted({m["trainings"] for m in measured}),
            "exits": sorted({m["exit"] for m in measured}),
            "counts": sorted({m["counts"] for m in measured if m["counts"]}),
            "load": [round(min(m["load_before"] for m in measured), 2), round(max(m["load_after"] for m in measured), 2)],
        }
        s = summary[mode]
        print(
            f"{mode:24s} {s['median_s']:6.1f} s [{s['min_s']:.1f}–{s['max_s']:.1f}]  trainings {s['trainings']}  "
            f"exit {s['exits']}  load {s['load'][0]}–{s['load'][1]}  {' | '.join(s['counts'])}"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"code": args.code or "this checkout", "repeats": args.repeats, "summary": summary, "runs": runs}, indent=2
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
