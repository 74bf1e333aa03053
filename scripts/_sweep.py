"""What the measurement scripts share: seed ranges, running 1-thread trainings in a process
pool, and summarising cells as ``median [min–max]`` over seeds. Each script trains its own
scenarios; this module only holds the plumbing (import it from a script in scripts/)."""

from __future__ import annotations

import math
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Callable, Iterable, Sequence

#: Recovery is measured over this many steps after the event (analysis.RECOVERY_HORIZON).
RECOVERY_HORIZON = 50


def seed_range(text: str) -> list[int]:
    """``"0-9"`` -> 0..9; ``"1,5,7"`` -> those seeds."""
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",")]


def run_jobs(measure: Callable, jobs: Sequence, jobs_at_once: int, describe: Callable[[dict], str]) -> list[dict]:
    """Run ``measure(job)`` for every job in a process pool (one 1-thread training each),
    printing one progress line per finished job to stderr."""
    records = []
    with ProcessPoolExecutor(max_workers=jobs_at_once) as pool:
        for i, record in enumerate(pool.map(measure, jobs), 1):
            records.append(record)
            print(f"[{i}/{len(jobs)}] {describe(record)}", file=sys.stderr, flush=True)
    return records


def _present(values: Iterable) -> list[float]:
    return [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]


def spread(values: Iterable, spec: str = ".1f") -> str:
    """``median [min–max]`` of the measured values (missing ones left out), or ``—``."""
    v = _present(values)
    if not v:
        return "—"
    return f"{format(statistics.median(v), spec)} [{format(min(v), spec)}–{format(max(v), spec)}]"


def recovery_spread(values: Sequence[int | None]) -> str:
    """Recovery steps over seeds; runs that did not recover within the horizon are counted."""
    back = [v for v in values if v is not None]
    if not back:
        return "not back"
    text = spread(back, ".0f")
    missing = len(values) - len(back)
    return f"{text} ({missing}/{len(values)} not back within {RECOVERY_HORIZON})" if missing else text


def median(values: Iterable) -> float:
    v = _present(values)
    return statistics.median(v) if v else math.nan
