"""The numbers of a sweep: one row per point measured from its run, and summaries over seeds as
``median [min–max]``. numpy and the judges only: the rows can be recomputed from sweep.json."""

from __future__ import annotations

import math
import statistics
from typing import Any, Callable, Iterable, Mapping, Sequence


from pytest_spikecheck.judge.analysis import RECOVERY_HORIZON
from pytest_spikecheck.judge.sweeps import LRSweep, lr_sensitivity
from pytest_spikecheck.report.columns import logit  # noqa: F401  (the sweep tables format logits so)
from pytest_spikecheck.report.summary import measure  # noqa: F401  (the plugin's rows and the sweep's points: one measure

#: The measured columns of a row, after the point's name and axis values.
MEASURES = (
    "status",
    "final_eval_loss",
    "initial_loss",
    "max_attn_logit",
    "largest_spike_ratio",
    "spike_step",
    "is_spike",
    "recovery",
    "diverged",
    "seconds",
    "error",
)
#: The axis that summaries gather over, and the one an LR sensitivity is measured along.
SEED, LR = "seed", "optimizer.lr"


def present(values: Iterable[Any]) -> list[float]:
    """The measured values: None and NaN left out (inf kept: a diverged run's final loss)."""
    return [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]


def spread(values: Iterable[Any], spec: str | Callable[[float], str] = ".1f") -> str:
    """``median [min–max]`` of the measured values, the median alone for one value, ``—`` for
    none; ``spec`` is a format spec or a function that formats one value."""
    v = present(values)
    if not v:
        return "—"
    show = spec if callable(spec) else (lambda x: format(x, spec))
    if len(v) == 1:
        return show(v[0])
    return f"{show(statistics.median(v))} [{show(min(v))}–{show(max(v))}]"


def recovery_spread(values: Sequence[int | None]) -> str:
    """Recovery steps over seeds; the runs not back within the horizon are counted, not dropped."""
    back = [v for v in values if v is not None]
    if not back:
        return "not back"
    text = spread(back, ".0f")
    missing = len(values) - len(back)
    return f"{text} ({missing}/{len(values)} not back within {RECOVERY_HORIZON})" if missing else text


def _recovery(ran: Sequence[Mapping[str, Any]]) -> str:
    """Steps to recover over the runs whose largest ratio was a spike, and how many spiked."""
    spiked = [r["recovery"] for r in ran if r["is_spike"]]
    if not spiked:
        return "no spike"
    back = [v for v in spiked if v is not None]
    missing = len(spiked) - len(back)
    return (
        (spread(back, ".0f") if back else "not back")
        + f" ({len(spiked)}/{len(ran)} spiked"
        + (f", {missing} not back within {RECOVERY_HORIZON}" if missing and back else "")
        + ")"
    )


def median(values: Iterable[Any]) -> float:
    v = present(values)
    return statistics.median(v) if v else math.nan


def group(rows: Sequence[Mapping[str, Any]], axes: Sequence[str], leave_out: Sequence[str]) -> list[tuple[tuple, list]]:
    """Rows gathered by their values on ``axes`` minus ``leave_out``, in the order first seen."""
    keep = [a for a in axes if a not in leave_out]
    groups: dict[tuple, list] = {}
    for row in rows:
        groups.setdefault(tuple(_key(row.get(a)) for a in keep), []).append(row)
    return list(groups.items())


def _key(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)


def summaries(rows: Sequence[Mapping[str, Any]], axes: Sequence[str]) -> list[dict[str, Any]]:
    """One summary per combination of the axes other than ``seed``: how many points, how many
    failed, and each measure as ``median [min–max]`` over the seeds (over the points that ran)."""
    keep = [a for a in axes if a != SEED]
    out = []
    for values, members in group(rows, axes, (SEED,)):
        ran = [r for r in members if r["status"] in ("done", "cached")]
        out.append(
            {
                **dict(zip(keep, values)),
                "points": len(members),
                "failed": sum(r["status"] == "failed" for r in members),
                "final_eval_loss": spread((r["final_eval_loss"] for r in ran), ".3f"),
                "max_attn_logit": spread((r["max_attn_logit"] for r in ran), logit),
                "largest_spike_ratio": spread((r["largest_spike_ratio"] for r in ran), ".1f"),
                "recovery": _recovery(ran),
                "diverged": f"{sum(bool(r['diverged']) for r in ran)}/{len(ran)}",
            }
        )
    return out


def lr_sensitivities(rows: Sequence[Mapping[str, Any]], axes: Sequence[str]) -> list[dict[str, Any]]:
    """With ``optimizer.lr`` among the axes: Wortsman et al.'s LR sensitivity of each combination
    of the other axes but ``seed``, measured per seed over the LRs of the sweep, as
    ``median [min–max]`` over the seeds (a seed with a failed point is left out and counted)."""
    if LR not in axes:
        return []
    keep = [a for a in axes if a not in (SEED, LR)]
    out = []
    for values, members in group(rows, axes, (SEED, LR)):
        per_seed, incomplete = [], 0
        for _, seed_rows in group(members, axes, [a for a in axes if a != SEED]):
            if any(r["status"] not in ("done", "cached") for r in seed_rows):
                incomplete += 1
                continue
            seed_rows = sorted(seed_rows, key=lambda r: r[LR])
            sweep = LRSweep(
                "",
                tuple(r[LR] for r in seed_rows),
                tuple(r["final_eval_loss"] for r in seed_rows),
                initial=median(r["initial_loss"] for r in seed_rows),
            )
            per_seed.append((lr_sensitivity(sweep), sweep.best))
        out.append(
            {
                **dict(zip(keep, values)),
                "seeds": len(per_seed),
                "incomplete": incomplete,
                "lr_sensitivity": spread((s for s, _ in per_seed), ".3f"),
                "best_final_eval_loss": spread((b for _, b in per_seed), ".3f"),
                "lr_sensitivity_values": [s for s, _ in per_seed],
            }
        )
    return out
