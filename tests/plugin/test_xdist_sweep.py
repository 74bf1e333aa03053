"""A sweep (seeds x configs as parametrized scenario tests) spread over pytest-xdist workers
writes every scenario's report folder and disk-cache entry whole, and the index lists them all."""

from __future__ import annotations

import json

SWEEP = '''
import pytest

from pytest_spikecheck import ClipAt, NoClip, RareTokenBurst, Scenario, assert_spike

BASE = Scenario.preset("phase-19").replace(steps=40).with_breaks(RareTokenBurst(count=3, at_step=30))
CONFIGS = {"clip05": (ClipAt(max_norm=0.5),), "noclip": (NoClip(),)}


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_the_burst_spikes(spikecheck, config, seed):
    # One name per sweep point: the report folder and the summary row are keyed by it.
    run = spikecheck.run(BASE.replace(seed=seed).with_breaks(*CONFIGS[config]), name=f"sweep_{config}_seed{seed}")
    assert run.scenario.seed == seed
    assert_spike(run, at=30, min_ratio=3)
'''

NAMES = sorted(f"sweep_{config}_seed{seed}" for config in ("clip05", "noclip") for seed in (0, 1))
REPORT_FILES = ("loss.png", "grad_norm.png", "diagnosis.md", "summary.json",
                "run/config.yaml", "run/metrics.jsonl", "run/batches.jsonl", "run/events.json", "run/run.json")
CACHE_FILES = ("config.yaml", "metrics.jsonl", "batches.jsonl", "events.json", "run.json")


def test_a_sweep_over_two_workers_writes_every_report_and_cache_entry(pytester):
    pytester.makepyfile(test_sweep=SWEEP)
    report = pytester.path / "report"
    sweep_over_two_workers = ("--spikecheck", "-n", "2", f"--spikecheck-report={report}", "-p", "no:randomly")
    result = pytester.runpytest_subprocess(*sweep_over_two_workers)
    result.assert_outcomes(passed=4)
    result.stdout.re_match_lines([r"2 workers \[4 items\]",
                                  r"4 scenarios checked \(4 trained, 0 loaded from another worker, 0 from the disk cache\)\."])

    for name in NAMES:
        for file in REPORT_FILES:
            assert (report / name / file).is_file(), (name, file)
        assert len((report / name / "run" / "metrics.jsonl").read_text().splitlines()) == 40
        assert json.loads((report / name / "summary.json").read_text())["scenario"] == name
    index = (report / "index.md").read_text()
    assert [line.split("]")[0][3:] for line in index.splitlines() if line.startswith("| [")] == NAMES
    for name in NAMES:  # each worker's rows reached the controller, which alone writes the index
        assert f"![loss]({name}/loss.png)" in index

    cache = sorted(p for p in (report / ".cache").iterdir() if p.name != ".locks")
    assert len(cache) == 4 and len({entry.name.split("-")[0] for entry in cache}) == 4  # four content hashes
    for entry in cache:
        for file in CACHE_FILES:
            assert (entry / file).is_file(), (entry.name, file)
        assert len((entry / "metrics.jsonl").read_text().splitlines()) == 40
    folders = [*report.iterdir(), *(report / ".cache").iterdir()]
    leftovers = [p.name for p in folders if p.name.startswith(".") and p.name not in (".cache", ".locks")]
    assert not leftovers, f"temporary folders left behind: {leftovers}"

    # The entries are whole: the same sweep again (in one process: what is read is the cache the
    # two workers wrote) trains nothing and agrees.
    again = pytester.runpytest("--spikecheck", f"--spikecheck-report={report}", "-p", "no:randomly")
    again.assert_outcomes(passed=4)
    again.stdout.fnmatch_lines(["4 scenarios checked (0 trained, 4 from the disk cache)."])
    rows = [[line.split() for line in run.stdout.lines if line.startswith("sweep_")] for run in (result, again)]
    assert len(rows[0]) == 4 and rows[0] == rows[1]
