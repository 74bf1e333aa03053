"""The preflight's verdict from the study's rows: numpy and the judges only, so it can be
recomputed from preflight.json. docs/preflight.md, "The verdict".

A point **fails** when its run diverged (stopped on a non-finite value: final loss inf), ended
no lower than it started (final eval loss >= the loss at initialisation), or its largest
attention logit passed :data:`LOGIT_LIMIT`. Per corpus, defence, width and seed the **first
failing LR** is the smallest LR of the grid that fails (none: no LR of the grid fails); the LR
sensitivity is Wortsman et al.'s over the grid. Across widths, log(first failing LR) is fitted
against log(width) (least squares): on the seeds' median, with the interval the per-seed fits'
[min, max]; the fit is extrapolated to the config's ``hidden_size``. The proxies cannot tell
when fewer than two widths fail, when there is one seed (no interval), or when the interval
holds both signs.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from pytest_spikecheck.judge.sweeps import LRSweep, lr_sensitivity

#: The attention-logit limit past which a point fails (Kimi K2's QK-Clip tau: the largest logit
#: they let a healthy head reach).
LOGIT_LIMIT = 100.0


def fails(row: Mapping[str, Any], limit: float = LOGIT_LIMIT) -> bool | None:
    """Whether a study row fails (the module docstring); None for a point that did not train."""
    if row.get("status") not in ("done", "cached"):
        return None
    final, initial = row.get("final_eval_loss"), row.get("initial_loss")
    if final is None or not math.isfinite(final) or row.get("diverged"):
        return True
    if initial is not None and final >= initial:
        return True
    logit = row.get("max_attn_logit")
    return logit is not None and logit > limit


def _fit(widths: Sequence[int], values: Sequence[float]) -> tuple[float, float] | None:
    """(slope, intercept) of log(value) on log(width) over the finite values; None below two."""
    pairs = [(math.log(w), math.log(v)) for w, v in zip(widths, values) if v is not None and math.isfinite(v) and v > 0]
    if len(pairs) < 2:
        return None
    x, y = np.array(pairs).T
    slope, intercept = np.polyfit(x, y, 1)
    return float(slope), float(intercept)


@dataclass(frozen=True)
class Curve:
    """One corpus and defence at one width and seed: final loss per LR, first failing LR."""

    corpus: str
    defence: str
    width: int
    seed: int
    lrs: tuple[float, ...]
    final_losses: tuple[float, ...]
    failing: tuple[bool | None, ...]
    initial: float
    max_logit: float | None

    @property
    def first_failing_lr(self) -> float | None:
        return next((lr for lr, f in zip(self.lrs, self.failing) if f), None)

    @property
    def lr_sensitivity(self) -> float:
        finals = tuple(math.inf if f is None else f for f in self.final_losses)
        return lr_sensitivity(LRSweep(self.defence, self.lrs, finals, self.initial))


def curves(rows: Sequence[Mapping[str, Any]], limit: float = LOGIT_LIMIT) -> list[Curve]:
    """The rows (each with corpus, width, lr, seed, defence and a sweep row's measures) as curves."""
    groups: dict[tuple, list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["corpus"], row["defence"], row["width"], row["seed"]), []).append(row)
    out = []
    for (corpus, defence, width, seed), rs in groups.items():
        rs = sorted(rs, key=lambda r: r["lr"])
        initials = [r["initial_loss"] for r in rs if r.get("initial_loss") is not None]
        logits = [r["max_attn_logit"] for r in rs if r.get("max_attn_logit") is not None]
        out.append(
            Curve(
                corpus,
                defence,
                width,
                seed,
                tuple(r["lr"] for r in rs),
                tuple(r.get("final_eval_loss") for r in rs),
                tuple(fails(r, limit) for r in rs),
                float(np.median(initials)) if initials else math.nan,
                max(logits) if logits else None,
            )
        )
    return sorted(out, key=lambda c: (c.corpus, c.defence, c.width, c.seed))


def _median_lr(values: Sequence[float | None]) -> float | None:
    """The seeds' median first failing LR, a seed without one counting as above the grid (inf)."""
    m = statistics.median([math.inf if v is None else v for v in values])
    return None if math.isinf(m) else m


def verdict(
    rows: Sequence[Mapping[str, Any]], *, user_lr: float, target_width: int, limit: float = LOGIT_LIMIT
) -> dict[str, Any]:
    """The verdict per corpus and defence (the module docstring), as plain data (preflight.json)."""
    found = curves(rows, limit)
    out: dict[str, Any] = {"user_lr": user_lr, "target_width": target_width, "logit_limit": limit, "studies": []}
    keys = sorted({(c.corpus, c.defence) for c in found})
    for corpus, defence in keys:
        mine = [c for c in found if (c.corpus, c.defence) == (corpus, defence)]
        widths = sorted({c.width for c in mine})
        seeds = sorted({c.seed for c in mine})
        per_width = []
        for w in widths:
            at = [c for c in mine if c.width == w]
            per_width.append(
                {
                    "width": w,
                    "first_failing_lr": _median_lr([c.first_failing_lr for c in at]),
                    "first_failing_lr_seeds": [c.first_failing_lr for c in at],
                    "lr_sensitivity": float(np.median([c.lr_sensitivity for c in at])),
                    "max_attn_logit": max((c.max_logit for c in at if c.max_logit is not None), default=None),
                    "lrs": list(at[0].lrs),
                    "final_losses": [
                        float(np.median([(math.inf if c.final_losses[i] is None else c.final_losses[i]) for c in at]))
                        for i in range(len(at[0].lrs))
                    ],
                }
            )
        study: dict[str, Any] = {
            "corpus": corpus,
            "defence": defence,
            "widths": per_width,
            "seeds": seeds,
            "max_lr": max(mine[0].lrs),
        }
        fit = _fit(widths, [p["first_failing_lr"] for p in per_width])
        seed_slopes = [
            f[0]
            for f in (
                _fit(widths, [next((c.first_failing_lr for c in mine if c.width == w and c.seed == s), None) for w in widths])
                for s in seeds
            )
            if f is not None
        ]
        sens_fit = np.polyfit(np.log2(widths), [p["lr_sensitivity"] for p in per_width], 1) if len(widths) >= 2 else None
        study["lr_sensitivity_per_doubling"] = None if sens_fit is None else float(sens_fit[0])
        study["slope"] = None if fit is None else fit[0]
        study["slope_interval"] = [min(seed_slopes), max(seed_slopes)] if len(seed_slopes) >= 2 else None
        if fit is not None:
            study["predicted_first_failing_lr"] = math.exp(fit[1] + fit[0] * math.log(target_width))
            if study["slope_interval"]:
                last = math.log(widths[-1])
                anchor = fit[1] + fit[0] * last
                ends = [math.exp(anchor + s * (math.log(target_width) - last)) for s in study["slope_interval"]]
                study["predicted_interval"] = [min(ends), max(ends)]
        logits = ", ".join(f"w{p['width']} {p['max_attn_logit']:.3g}" for p in per_width if p["max_attn_logit"] is not None)
        study["sentence"] = _sentence(study, user_lr, target_width) + (f" (largest attention logit {logits})" if logits else "")
        study["holds"] = all(p["first_failing_lr"] is None for p in per_width)
        out["studies"].append(study)
    return out


def _sentence(study: Mapping[str, Any], user_lr: float, target_width: int) -> str:
    head = f"{study['corpus']}, {study['defence']}"
    fails_at = [p for p in study["widths"] if p["first_failing_lr"] is not None]
    if not fails_at:
        return f"{head}: holds at every proxy width (no LR up to {study['max_lr']:.3g} fails)"
    ladder = ", ".join(
        f"w{p['width']} {p['first_failing_lr']:.3g}" if p["first_failing_lr"] is not None else f"w{p['width']} none"
        for p in study["widths"]
    )
    below = [p["width"] for p in fails_at if p["first_failing_lr"] <= user_lr]
    now = f"; already fails at lr {user_lr:g} at width {', '.join(map(str, below))}" if below else ""
    slope, interval = study["slope"], study["slope_interval"]
    if slope is None:
        return f"{head}: first failing LR {ladder}{now}; the proxies cannot tell a trend (fewer than two widths fail)"
    trend = f"first failing LR ~ width^{slope:.2f}" + (f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else "")
    predicted = study["predicted_first_failing_lr"]
    if interval is None or interval[0] < 0 < interval[1]:
        why = "one seed, no interval" if interval is None else "the interval holds both signs"
        return (
            f"{head}: {ladder}; {trend}: the proxies cannot tell ({why}); the fit alone predicts "
            f"{predicted:.3g} at width {target_width}{now}"
        )
    state = "predicted unstable" if user_lr >= predicted else f"predicted stable, margin x{predicted / user_lr:.1f}"
    return f"{head}: {ladder}; {trend}; at lr {user_lr:g} and width {target_width}: {state} (first failing {predicted:.3g}){now}"
