"""Rolling statistics over a whole series at once (numpy only): the history windows of
:func:`~pytest_spikecheck.judge.baseline.baseline_history` for every point, and their medians
and median absolute deviations, without a Python loop per point.

The window rule is the baseline's: the finite values logged in the ``window`` steps before a
point, widened back to the last ``min_points`` finite values when the window holds fewer,
empty when fewer than that were logged before the point at all. So the history of point ``i``
is always a run of consecutive finite values, ``finite[j - k : j]``, where ``j`` is how many
finite values come before ``i`` and ``k = max(in_window, min_points)``. Medians are taken over
those runs by sorting sliding windows, grouped by run length and in blocks, so a
million points cost a few tens of MB at a time and well under a second per statistic; each is
computed exactly as the per-point code did (the middle value, or the mean of the two middle
values), so every comparison against them gives the same answer.
"""

from __future__ import annotations

import contextlib
import heapq
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

_BLOCK_ELEMENTS = 4_000_000  # window elements sorted per block: ~32 MB of float64
_shared: dict[tuple, Any] | None = None  # results computed within one sharing() block, by their inputs


@contextlib.contextmanager
def sharing() -> Iterator[None]:
    """Within the block, histories and their medians computed for the same arrays and window are
    computed once (the loss rules of one judgement share the loss's 50-step histories). The arrays
    are the caller's and stay alive and unchanged for the block; outside it nothing is kept."""
    global _shared
    outer, _shared = _shared, {}
    try:
        yield
    finally:
        _shared = outer


def _where(a: np.ndarray) -> tuple:
    """The memory an array's values sit in (views of one buffer alike; the block keeps it alive)."""
    return a.__array_interface__["data"][0], a.shape, a.strides, a.dtype.str


def _remembered(key: tuple, compute):
    if _shared is None:
        return compute()
    if key not in _shared:
        _shared[key] = compute()
    return _shared[key]


@dataclass(frozen=True)
class Histories:
    """Where each point's history sits in the series' finite values: ``finite[start:stop]``
    (``start == stop``: no history)."""

    finite: np.ndarray  # the values histories are drawn from (the finite ones), in order
    start: np.ndarray  # int64 per point
    stop: np.ndarray  # int64 per point

    @property
    def size(self) -> np.ndarray:
        return self.stop - self.start


def histories(steps: np.ndarray, values: np.ndarray, window: int, min_points: int, usable: np.ndarray | None = None) -> Histories:
    """The history of every point, by the rule of ``baseline_history`` (``steps`` ascend),
    drawn from the finite values (or from the values where ``usable``, e.g. the positive ones)."""
    if usable is None:  # (a usable mask is the caller's own array: not shared)
        return _remembered(
            ("histories", _where(steps), _where(values), window, min_points),
            lambda: _histories(steps, values, window, min_points, None),
        )
    return _histories(steps, values, window, min_points, usable)


def _histories(steps: np.ndarray, values: np.ndarray, window: int, min_points: int, usable: np.ndarray | None) -> Histories:
    mask = np.isfinite(values) if usable is None else usable
    pool, pool_steps = values[mask], steps[mask]
    before = np.concatenate([[0], np.cumsum(mask)[:-1]]).astype(np.int64)  # pool values before each point
    # pool values logged before the window opens (steps < step - window); never more than `before`
    opened = np.minimum(np.searchsorted(pool_steps, steps - window, side="left"), before)
    need = max(1, min_points)
    length = np.where(before >= need, np.maximum(before - opened, need), 0)
    return Histories(pool, before - length, before)


def _middle(sorted_or_partitioned: np.ndarray, k: int) -> np.ndarray:
    mid = k // 2
    if k % 2:
        return sorted_or_partitioned[:, mid]
    return (sorted_or_partitioned[:, mid - 1] + sorted_or_partitioned[:, mid]) / 2


def _windows_median(values: np.ndarray, starts: np.ndarray, k: int, center: np.ndarray | None = None) -> np.ndarray:
    """Median of ``values[s:s+k]`` for each start (of ``|values - center|`` when given), in blocks."""
    view = sliding_window_view(values, k)
    out = np.empty(starts.size)
    block = max(1, _BLOCK_ELEMENTS // k)
    for a in range(0, starts.size, block):
        at = starts[a : a + block]
        # consecutive windows (a log written every step): a slice of the view, no gathered copy
        rows = view[at[0] : at[-1] + 1] if at[-1] - at[0] == at.size - 1 else view[at]
        if center is not None:
            rows = rows - center[a : a + block, None]
            np.abs(rows, out=rows)
        # A row sort (numpy's SIMD sort) is faster than a two-point partition on short rows.
        out[a : a + block] = _middle(np.sort(rows, axis=1), k)
    return out


def median_and_spread(h: Histories, spread: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Per point: the median of its history and the median absolute deviation from it (NaN
    where the history is empty). The MAD is ``median(|history - median|)`` (unscaled). Within
    :func:`sharing`, the arrays returned may be shared: do not change them in place."""
    # keyed by identity: the entry holds ``h``, so no other Histories can take its id in the block
    return _remembered(("median_and_spread", id(h), spread), lambda: (h, _median_and_spread(h, spread)))[1]


def _median_and_spread(h: Histories, spread: bool) -> tuple[np.ndarray, np.ndarray]:
    n = h.start.size
    med = np.full(n, np.nan)
    mad = np.full(n, np.nan)
    sizes = h.size
    for k in np.unique(sizes[sizes > 0]):
        at = np.flatnonzero(sizes == k)
        starts = h.start[at]
        med[at] = _windows_median(h.finite, starts, int(k))
        if spread:
            mad[at] = _windows_median(h.finite, starts, int(k), center=med[at])
    return med, mad


def step_spread(h: Histories) -> np.ndarray:
    """Per point: the median absolute deviation of its history's point-to-point changes around
    their median, over sqrt(2) (unscaled, like the MAD). A history that falls steadily has a wide
    spread around its median (the slope) but changes that barely vary: this is the noise without
    the trend. NaN below three points of history."""
    n = h.start.size
    out = np.full(n, np.nan)
    if h.finite.size < 3:
        return out
    d = np.diff(h.finite)  # history finite[a:b] has the changes d[a:b-1]
    sizes = h.size - 1
    for k in np.unique(sizes[sizes >= 2]):
        at = np.flatnonzero(sizes == k)
        starts = h.start[at]
        med = _windows_median(d, starts, int(k))
        out[at] = _windows_median(d, starts, int(k), center=med) / np.sqrt(2)
    return out


def forward_median(values: np.ndarray, hold: int) -> tuple[np.ndarray, np.ndarray]:
    """(median of ``values[i:i+hold]``, whether that window exists and is all finite) per point."""
    n = values.size
    med = np.full(n, np.nan)
    ok = np.zeros(n, dtype=bool)
    if n >= hold:
        view = sliding_window_view(values, hold)
        finite = np.isfinite(view).all(axis=1)
        starts = np.flatnonzero(finite)
        med[starts] = _windows_median(values, starts, hold)
        ok[: n - hold + 1] = finite
    return med, ok


def expanding_median_at(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The median of ``values[:c]`` for each count ``c`` (>= 1): by a partition of each prefix
    when the counts are few, else by one streaming pass with two heaps."""
    counts = np.asarray(counts, dtype=np.int64)
    out = np.empty(counts.size)
    if counts.size == 0:
        return out
    if counts.size * int(counts.max()) <= 50_000_000:
        for i, c in enumerate(counts):
            out[i] = _middle(np.partition(values[:c], [c // 2] if c % 2 else [c // 2 - 1, c // 2])[None, :], int(c))[0]
        return out
    low: list[float] = []  # max-heap (negated) of the lower half
    high: list[float] = []  # min-heap of the upper half
    wanted = np.argsort(counts, kind="stable")
    w = 0
    for seen, x in enumerate(values[: int(counts.max())].tolist(), 1):
        if low and x > -low[0]:
            heapq.heappush(high, x)
        else:
            heapq.heappush(low, -x)
        if len(low) > len(high) + 1:
            heapq.heappush(high, -heapq.heappop(low))
        elif len(high) > len(low):
            heapq.heappush(low, -heapq.heappop(high))
        while w < counts.size and counts[wanted[w]] == seen:
            out[wanted[w]] = -low[0] if seen % 2 else (-low[0] + high[0]) / 2
            w += 1
    return out
