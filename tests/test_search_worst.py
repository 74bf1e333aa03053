"""The worst-batch search reports the largest ratio it saw as the worst (issue 28: with
``--search-seed 5`` it printed "worst found 33.4×" above "minimal 35.7×"). A stand-in probe
with additive sample weights, where swapping an outlier for a strong real sample raises the
ratio, drives the minimising phase without training anything."""

from __future__ import annotations

from types import SimpleNamespace

from pytest_spikecheck.fuzz import search

#: the real batch is samples 0-3 (sample 0 is strong); samples 4-7 are outliers
WEIGHTS = {0: 10.0, 1: 1.0, 2: 1.0, 3: 1.0, 4: 5.0, 5: 5.0, 6: 5.0, 7: 5.0}


class StandInProbe:
    real_batch = (0, 1, 2, 3)
    pool_size = len(WEIGHTS)

    def __init__(self) -> None:
        self.seen: list[float] = []

    def __call__(self, batch, token_losses=False):
        ratio = sum(WEIGHTS[i] for i in batch)
        self.seen.append(ratio)
        return SimpleNamespace(indices=tuple(batch), ratio=ratio)


def climbed():
    return SimpleNamespace(indices=(4, 5, 6, 7), ratio=20.0)  # the climb's best: four outliers


def test_the_worst_is_the_largest_ratio_probed_and_the_minimal_batch_does_not_beat_it():
    probe = StandInProbe()
    worst, necessary, minimal, _ = search._worst_and_minimal(probe, climbed(), keep_fraction=0.9)
    assert worst.ratio == max(probe.seen) == 25.0  # swapping outlier 4 for real sample 0 beat the climb
    assert sum(WEIGHTS[i] for i in minimal) <= worst.ratio
    assert necessary == (5, 6, 7)  # at the fixed point each swapped-in outlier is necessary (0.9 × 25)


def test_the_screen_reports_its_largest_ratio():
    probe = StandInProbe()
    order, worst = search._screened_order(probe)
    assert worst.ratio == max(probe.seen) == 13.0  # the real batch itself; an outlier in it gives 8
    assert order[:4] == [4, 5, 6, 7]  # weakest first


def test_the_phase1_only_worst_fails_the_property():
    # sabotage: the report before the fix kept the climb's best as the worst and minimised
    # under its bar; the minimal batch then beats the reported worst
    probe = StandInProbe()
    bar = 0.9 * climbed().ratio
    current, unused = list(climbed().indices), [0, 1, 2, 3]
    for slot in range(len(current)):
        candidate = current.copy()
        candidate[slot] = unused[0]
        if probe(candidate).ratio >= bar:
            current, unused = candidate, unused[1:]
    assert sum(WEIGHTS[i] for i in current) > climbed().ratio
