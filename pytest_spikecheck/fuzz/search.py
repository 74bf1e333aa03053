"""Worst-batch search: which composition of a batch would make step S spike the most?

Three phases, all on the one-step probe of :mod:`pytest_spikecheck.training.probe`:

0. **Screen.** Each pool sample is probed once, swapped into the batch the sampler really
   serves at S, and the candidates are ordered by that measured ratio. This gives the
   climb a landscape in which neighbouring candidates are alike: Hypothesis's hill climber
   moves one choice at a time by ±k, and over a shuffled pool it barely climbs. Measured on
   Phase-19 at step 312 (search seeds 0–2, 2026-11-30): the best ratio found is 24–28× over
   a shuffled pool after 300 or 1,000 probes, 29–42× over the screened order after 300 and
   35–43× after 1,000; eight Greek sentences, the worst batch we know of, give 48×. Costs
   one probe per pool sample.
1. **Climb.** Hypothesis draws batches with
   :func:`~pytest_spikecheck.fuzz.strategies.blind_batch_compositions` over that order and
   steers toward a larger grad-norm ratio with :func:`hypothesis.target` (the probe's
   pre-clip norm over the median of the 50 steps before S). The best batch seen is kept:
   the interactions between samples are what this phase searches, not the screen.
2. **Minimise.** Each sample of the best batch in turn is swapped for one of the real
   batch's; a swap is kept when the ratio stays at least ``keep_fraction`` (90 %) of the
   best. At the fixed point every swapped-in sample is necessary: swapping any one of them
   back drops the ratio below the bar. A swap can also *raise* the ratio (a real sample may
   add to the spike more than the outlier it replaces): then that batch is the worst seen,
   and the phase starts again from it under its higher bar, so the reported worst is the
   largest ratio of any probe of the search and the minimal batch never beats it. (The batch size stays fixed: the loss is a mean over
   the batch's tokens, so a *smaller* batch of the same outliers spikes as much, and "the
   fewest samples" would always shrink to one outlier and hide the concentration.
   Hypothesis's own shrinker aims at its notion of simple — the first candidates — rather
   than at the fewest outliers, so this phase measures necessity directly.)

**What the search is told, and what it is not.** It gets the scenario, the step and the
pool: every sample the scenario's data could serve, i.e. the corpus plus any burst content
the scenario declares (a burst declared after S puts its sentences in the pool, unseen by
the model at S). It is *not* told which samples are rare, which source they come from, or
that rarity matters: its only signal is the probe's grad-norm ratio, and the order it
climbs over is the screen's measured order. Rarity and sources are read afterwards, only to
describe what it found.
"""

from __future__ import annotations

import math
import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_spikecheck.judge.analysis import BASELINE_WINDOW
from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.scenario import Scenario

if TYPE_CHECKING:  # pragma: no cover - typing only; the probe imports torch
    from pytest_spikecheck.training.probe import Probe, ProbeResult

__all__ = ["SearchResult", "find_worst_batch", "DEFAULT_MAX_EXAMPLES", "DEFAULT_KEEP_FRACTION"]

#: Phase 1's Hypothesis budget (probes): ~2 s at ~150 probes/s on one CPU thread.
DEFAULT_MAX_EXAMPLES = 300
#: Phase 2 keeps a swap while the ratio stays at least this fraction of the worst found.
DEFAULT_KEEP_FRACTION = 0.9
_TOKENS_SHOWN = 8
_TEXT_WIDTH = 60


@dataclass(frozen=True)
class SearchResult:
    """What :func:`find_worst_batch` found. ``minimal.indices`` is the real batch at S with
    the ``necessary`` samples swapped in; ``probes`` and ``seconds`` count every phase of the
    search (not the checkpoint, which :func:`~pytest_spikecheck.training.probe.probe_at` caches)."""

    probe: Probe
    real: ProbeResult  # the batch the sampler serves at S
    worst: ProbeResult  # the largest ratio of any probe of the search (screen, climb, minimise)
    minimal: ProbeResult  # phase 2's fixed point, probed with per-token losses
    necessary: tuple[int, ...]  # pool indices of the worst batch that phase 2 could not swap out
    keep_fraction: float
    probes: int
    seconds: float

    @property
    def at_step(self) -> int:
        return self.probe.at_step

    def text(self) -> str:
        """The report ``spikecheck search`` prints: the batches, the samples, the tokens."""
        probe, data = self.probe, self.probe.dataset
        pool, lines = data.pool, []
        s = probe.scenario
        base = probe.baseline_grad_norm
        lines.append(
            f"worst batch at step {self.at_step} of {s.name} (seed {s.seed}): {self.probes} probes in "
            f"{self.seconds:.1f}s over a pool of {len(pool)} samples (the search was not told which are rare)"
        )
        first = max(1, self.at_step - BASELINE_WINDOW)
        lines.append(f"  baseline      median pre-clip norm of steps {first}–{self.at_step - 1}: {base:.3g}")
        for label, result in (("real batch", self.real), ("worst found", self.worst), ("minimal", self.minimal)):
            lines.append(f"  {label:<12}  {_summary(result, data)}")
        bar = self.keep_fraction * self.worst.ratio
        lines.append(
            f"  the minimal batch is the real batch with {len(self.necessary)} of its {len(self.real.indices)} "
            f"samples swapped for these; swapping any one back drops the ratio below {bar:.1f}× "
            f"({self.keep_fraction:.0%} of the worst):"
        )
        for i in self.necessary:
            sample = pool[i]
            rare = [data.tokenizer.token(t) for t in data.sample_tokens(i) if t in data.rare_tokens]
            text = sample.text if len(sample.text) <= _TEXT_WIDTH else sample.text[: _TEXT_WIDTH - 1] + "…"
            lines.append(f"    {sample.id:<16} {sample.source:<12} {len(rare):>2} rare tokens  {text!r}")
        tl = self.minimal.token_losses
        total = sum(t.loss for t in tl) or math.nan
        rare_share = sum(t.loss for t in tl if t.rare) / total
        necessary = set(self.necessary)
        swapped_share = sum(t.loss for t in tl if t.sample in necessary) / total
        worst = ", ".join(f"{t.token!r} {t.loss:.1f}{'*' if t.rare else ''} ({pool[t.sample].id})" for t in tl[:_TOKENS_SHOWN])
        lines.append(f"  token losses  worst: {worst} (* rare)")
        lines.append(
            f"                rare tokens carry {rare_share:.0%} of the minimal batch's loss; "
            f"the swapped-in samples {swapped_share:.0%}"
        )
        lines.append(
            f"  update        max |Δθ| {self.minimal.update_max_abs:.3g} vs {self.real.update_max_abs:.3g} for the "
            f"real batch; ‖Δθ‖ {self.minimal.update_norm:.3g} vs {self.real.update_norm:.3g}"
        )
        n_rare = sum(data.is_rare(i) for i in self.necessary)
        lines.append(f"  => {_verdict(n_rare, len(self.necessary), len(self.real.indices), self.minimal.ratio)}")
        return "\n".join(lines)


def _summary(result: ProbeResult, data: Any) -> str:
    rare = sum(data.is_rare(i) for i in result.indices)
    sources = Counter(data.pool[i].source for i in result.indices)
    mix = " + ".join(f"{src}×{n}" for src, n in sources.most_common())
    clip = f", clipped to {result.grad_norm_post:.3g}" if result.clip_scale < 1 else ""
    return (
        f"ratio {result.ratio:6.1f}×  pre-clip {result.grad_norm_pre:.3g}{clip}, loss {result.loss:.3f}; "
        f"{rare} of {len(result.indices)} rare; {mix}"
    )


def _verdict(n_rare: int, n_necessary: int, batch_size: int, ratio: float) -> str:
    """One line on the minimal batch (``ratio`` is its ratio)."""
    if not math.isfinite(ratio) or ratio < 3:
        return f"no composition spikes clearly at this step (the minimal batch: {ratio:.1f}×)"
    if n_necessary and n_rare == n_necessary:
        return (
            f"rare-token samples concentrated in one batch: {n_rare} rare samples among {batch_size} "
            f"give {ratio:.0f}× the baseline gradient norm"
        )
    return f"{n_necessary} of {batch_size} samples ({n_rare} of them rare) give {ratio:.0f}× the baseline gradient norm"


def _score(result: ProbeResult) -> float:
    # hypothesis.target() takes finite numbers only; a non-finite norm is the worst batch there is.
    return result.ratio if math.isfinite(result.ratio) else sys.float_info.max


def find_worst_batch(
    scenario: Scenario,
    at_step: int,
    *,
    max_examples: int = DEFAULT_MAX_EXAMPLES,
    seed: int = 0,
    keep_fraction: float = DEFAULT_KEEP_FRACTION,
    backend: str = "auto",
    device: str = "cpu",
    threads: int = 1,
) -> SearchResult:
    """Search the batch of step ``at_step`` that maximises the grad-norm ratio, then minimise it.

    ``seed`` seeds Hypothesis: the same arguments give the same result. The checkpoint is
    shared with :func:`probe_at` (trained once per process).
    """
    try:
        from hypothesis import HealthCheck, Phase, given, settings, target
        from hypothesis import seed as hypothesis_seed
    except ImportError:
        raise ImportError("the worst-batch search needs Hypothesis: pip install 'pytest-spikecheck[fuzz]'") from None

    from pytest_spikecheck.training.probe import probe_at
    from pytest_spikecheck.fuzz.strategies import blind_batch_compositions

    if max_examples < 1:
        raise ConfigError(f"max_examples must be >= 1, was {max_examples}")
    if not 0 < keep_fraction <= 1:
        raise ConfigError(f"keep_fraction must be in (0, 1], was {keep_fraction}")
    probe = probe_at(scenario, at_step, backend=backend, device=device, threads=threads)
    if not probe.baseline_grad_norm > 0:
        raise ConfigError(f"no grad-norm baseline before step {at_step} (median {probe.baseline_grad_norm}): search a later step")
    started = time.perf_counter()
    batch_size = len(probe.real_batch)
    order, screened_worst = _screened_order(probe)
    probes = len(order)
    best: list[ProbeResult] = []

    @settings(
        max_examples=max_examples,
        phases=(Phase.generate, Phase.target),
        database=None,
        deadline=None,
        # A probe is a forward, backward and AdamW step (~7 ms): slow by Hypothesis's measure, by design.
        suppress_health_check=[HealthCheck.too_slow],
    )
    @hypothesis_seed(seed)
    @given(blind_batch_compositions(probe, batch_size, candidates=order))
    def climb(batch: Any) -> None:
        nonlocal probes
        result = probe(batch)
        probes += 1
        target(_score(result), label="grad-norm ratio")
        if not best or _score(result) > _score(best[0]):
            best[:] = [result]

    climb()
    worst, necessary, minimal_indices, minimise_probes = _worst_and_minimal(
        probe, max(best[0], screened_worst, key=_score), keep_fraction
    )
    probes += minimise_probes
    minimal = probe(minimal_indices, token_losses=True)
    real = probe(probe.real_batch)
    return SearchResult(
        probe=probe,
        real=real,
        worst=worst,
        minimal=minimal,
        necessary=necessary,
        keep_fraction=keep_fraction,
        probes=probes + 2,
        seconds=time.perf_counter() - started,
    )


def _screened_order(probe: Probe) -> tuple[list[int], ProbeResult]:
    """Pool indices ordered by the ratio of the real batch at S with that sample swapped in
    (weakest first, so Hypothesis shrinks toward harmless samples and climbs toward harmful ones),
    and the screen's largest ratio."""
    real = list(probe.real_batch)
    effect, worst = {}, None
    for i in range(probe.pool_size):
        batch = real if i in real else [i, *real[1:]]
        result = probe(batch)
        effect[i] = _score(result)
        if worst is None or effect[i] > _score(worst):
            worst = result
    return sorted(effect, key=lambda i: (effect[i], i)), worst


def _worst_and_minimal(
    probe: Probe, worst: ProbeResult, keep_fraction: float
) -> tuple[ProbeResult, tuple[int, ...], tuple[int, ...], int]:
    """Minimise ``worst``; when a swap beats it, that batch is the worst and minimising starts
    again from it (the worst's score rises each time, over finitely many batches: it ends).

    Returns (the worst batch seen, necessary samples, the minimal batch, probes run).
    """
    probes = 0
    while True:
        necessary, minimal, n, beaten_by = _minimise(probe, worst, keep_fraction)
        probes += n
        if beaten_by is None:
            return worst, necessary, minimal, probes
        worst = beaten_by


def _minimise(
    probe: Probe, worst: ProbeResult, keep_fraction: float
) -> tuple[tuple[int, ...], tuple[int, ...], int, ProbeResult | None]:
    """Swap samples of ``worst`` for the real batch's until every one left is necessary.

    Returns (necessary samples, the minimal batch, probes run, the first probed batch whose
    ratio beats ``worst``'s, or None); it stops at such a batch.
    """
    bar = keep_fraction * _score(worst)
    current = list(worst.indices)
    real = set(probe.real_batch)
    # As many real samples are missing from the batch as it holds samples from elsewhere.
    unused = [i for i in probe.real_batch if i not in current]
    probes = 0
    changed = True
    while changed and unused:
        changed = False
        for slot, sample in enumerate(current):
            if sample in real or not unused:
                continue
            candidate = current.copy()
            candidate[slot] = unused[0]
            probes += 1
            result = probe(candidate)
            if _score(result) > _score(worst):
                return (), tuple(candidate), probes, result
            if _score(result) >= bar:
                current = candidate
                unused.pop(0)
                changed = True
    necessary = tuple(sorted(i for i in current if i not in real))
    return necessary, tuple(current), probes, None
