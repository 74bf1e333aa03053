"""examples/downstream is a repo as a user writes one: its own conftest.py and model (given by
import path), a break/control pair, a parametrized @spikecheck_scenario, a max_norm sweep through
spikecheck.run without names, and a test that fails on purpose (xfail). It passes under -n 0
and -n 2 with the same summary table: names come from content, not from the worker that ran them;
and each scenario trains once either way (under xdist the other worker loads it)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "downstream"
#: The sweep's names are derived from content: long ones are cut in the middle and end in 8 hex
#: digits of the content hash (which changes whenever the scenario schema does, so not spelled here).
NAMES = [re.escape(name) for name in ("clipped[0.25]", "clipped[0.5]", "control", "no_clip")] + [
    re.escape(f"phase-19+steps=60+model=tin…)+burst(8×greek@40)+clip({n})~") + "[0-9a-f]{8}" for n in (2, 4)
]


def _summary(result) -> list[list[str]]:
    lines = result.stdout.lines
    start = next(i for i, line in enumerate(lines) if re.match(r"=+ spikecheck =+$", line))
    end = next(i for i, line in enumerate(lines) if i > start and (line.startswith("=") or line.startswith("tests (")))
    return [re.split(r"\s{2,}", line.strip()) for line in lines[start + 1 : end] if line.strip()]


def test_the_downstream_example_passes_with_the_same_summary_on_one_and_two_workers(pytester):
    for path in EXAMPLE.rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            target = pytester.path / path.relative_to(EXAMPLE)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, target)
    serial = pytester.runpytest("--spikecheck", "-p", "no:randomly")
    parallel = pytester.runpytest_subprocess("--spikecheck", "-n", "2", "--dist", "loadscope", "-p", "no:randomly")
    for result in (serial, parallel):
        result.assert_outcomes(passed=6, xfailed=1)
    summary = _summary(serial)
    assert summary[1:] == _summary(parallel)[1:]
    assert summary[:2] == [["6 scenarios checked (6 trained, 0 from the disk cache)."], ["6 held, 0 failed."]]
    parallel_counts = _summary(parallel)[0][0]
    assert re.fullmatch(
        r"6 scenarios checked \(6 trained, \d loaded from another worker, 0 from the disk cache\)\.", parallel_counts
    ), parallel_counts
    rows = summary[4:]
    assert len(rows) == len(NAMES) and all(re.fullmatch(p, row[0]) for p, row in zip(NAMES, rows)), rows
    assert all(row[-1] == "pass" for row in rows)
    assert {row[0]: row[4] for row in rows}["no_clip"] == "gradient norm: no clip"
