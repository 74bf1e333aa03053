"""A preflight's result: the plan, the study's rows, the verdict, and what it writes
(``preflight.json``, ``preflight.md``, a self-contained ``index.html`` with inline SVG panels:
final loss against LR per width, for each corpus and defence). No torch."""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from pytest_spikecheck.errors import SpikeCheckError


@dataclass
class PreflightResult:
    """What :func:`pytest_spikecheck.preflight.preflight` returns.

    ``config``: the config it read (a path or a Hub id); ``recipe``: the recipe in one line;
    ``user_lr``: the recipe's learning rate; ``target_width``: the config's hidden size;
    ``plan_lines``: the plan as printed before training; ``rows``: one dict per point (its
    coordinates: width, LR, seed, defence, corpus; and its ``status``, ``final_eval_loss``,
    ``initial_loss``, ``max_attn_logit``, ``diverged``, ``seconds``, ``error``); ``verdict``:
    the per-corpus and per-defence studies (``studies``: the first failing LR per width, the
    fit, the sentence); ``wall_seconds``: measured; ``counts``: the points per status
    (``"20 done, 4 cached"``); ``sweep``: the
    :class:`~pytest_spikecheck.sweep.result.SweepResult` behind the rows."""

    config: str
    recipe: str
    user_lr: float
    target_width: int
    plan_lines: list[str]
    rows: list[dict[str, Any]]
    verdict: dict[str, Any]
    wall_seconds: float = math.nan
    counts: str = ""
    sweep: Any = field(default=None, repr=False)

    @property
    def studies(self) -> list[dict[str, Any]]:
        return self.verdict["studies"]

    def study(self, corpus: str, defence: str) -> dict[str, Any] | None:
        return next((s for s in self.studies if s["corpus"] == corpus and s["defence"] == defence), None)

    def lines(self) -> list[str]:
        """The verdict in the terminal: one sentence per corpus and defence."""
        return [s["sentence"] for s in self.studies]

    def json_data(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "recipe": self.recipe,
            "user_lr": self.user_lr,
            "target_width": self.target_width,
            "plan": self.plan_lines,
            "wall_seconds": self.wall_seconds,
            "counts": self.counts,
            "verdict": self.verdict,
            "rows": self.rows,
        }

    def markdown(self) -> str:
        out = [
            f"# Preflight: {self.config}",
            "",
            f"Recipe: {self.recipe}",
            "",
            *[f"    {line}" for line in self.plan_lines],
            "",
            "## Verdict",
            "",
            *[f"- {line}" for line in self.lines()],
            "",
            "## First failing LR per width (median over seeds; `none`: no LR of the grid fails)",
            "",
            "| corpus | defence | width | first failing LR | per seed | LR sensitivity | largest attention logit |",
            "|---|---|---:|---:|---|---:|---:|",
        ]
        for s in self.studies:
            for p in s["widths"]:
                seeds = ", ".join("none" if v is None else f"{v:.3g}" for v in p["first_failing_lr_seeds"])
                first = "none" if p["first_failing_lr"] is None else f"{p['first_failing_lr']:.3g}"
                logit = "-" if p["max_attn_logit"] is None else f"{p['max_attn_logit']:.1f}"
                out.append(
                    f"| {s['corpus']} | {s['defence']} | {p['width']} | {first} | {seeds} | {p['lr_sensitivity']:.3f} | {logit} |"
                )
        out += ["", f"{len(self.rows)} points ({self.counts}) in {self.wall_seconds:.0f} s.", ""]
        return "\n".join(out)

    def html(self) -> str:
        panels = "".join(_panel(s) for s in self.studies)
        items = "".join(f"<li>{html.escape(line)}</li>" for line in self.lines())
        plan = html.escape("\n".join(self.plan_lines))
        return (
            f"<!doctype html><html><head><meta charset='utf-8'><title>Preflight: {html.escape(self.config)}</title>"
            "<style>body{font-family:sans-serif;margin:2em;max-width:1100px}pre{background:#f4f4f4;padding:1em;"
            "overflow-x:auto}.panels{display:flex;flex-wrap:wrap;gap:1em}figure{margin:0}figcaption{font-size:.9em}"
            "</style></head><body>"
            f"<h1>Preflight: {html.escape(self.config)}</h1><p>Recipe: {html.escape(self.recipe)}</p><pre>{plan}</pre>"
            f"<h2>Verdict</h2><ul id='verdict'>{items}</ul><h2>Final loss against LR</h2>"
            f"<div class='panels'>{panels}</div></body></html>"
        )

    def write(self, out: str | Path) -> list[Path]:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        paths = [out / "preflight.json", out / "preflight.md", out / "index.html"]
        paths[0].write_text(json.dumps(_plain(self.json_data()), indent=1) + "\n")
        paths[1].write_text(self.markdown())
        paths[2].write_text(self.html())
        return paths


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")


def _panel(study: dict[str, Any], w: int = 340, h: int = 220) -> str:
    """An inline SVG: final loss (median over seeds) against log LR, one line per width; a
    diverged point sits on the top edge."""
    pad = 36
    lrs = [lr for p in study["widths"] for lr in p["lrs"]]
    finite = [f for p in study["widths"] for f in p["final_losses"] if math.isfinite(f)]
    if not lrs or not finite:
        return ""
    lo_x, hi_x = math.log(min(lrs)), math.log(max(lrs))
    lo_y, hi_y = min(finite), max(finite)
    span_x, span_y = (hi_x - lo_x) or 1.0, (hi_y - lo_y) or 1.0

    def xy(lr: float, loss: float) -> tuple[float, float]:
        y = hi_y if not math.isfinite(loss) else loss
        return pad + (math.log(lr) - lo_x) / span_x * (w - 2 * pad), h - pad - (y - lo_y) / span_y * (h - 2 * pad)

    parts = [
        f"<rect x='{pad}' y='{pad}' width='{w - 2 * pad}' height='{h - 2 * pad}' fill='none' stroke='#999'/>",
        f"<text x='{pad}' y='{h - 8}' font-size='10'>lr {min(lrs):.2g}</text>",
        f"<text x='{w - pad}' y='{h - 8}' font-size='10' text-anchor='end'>{max(lrs):.2g}</text>",
        f"<text x='4' y='{pad}' font-size='10'>{hi_y:.2f}</text>",
        f"<text x='4' y='{h - pad}' font-size='10'>{lo_y:.2f}</text>",
    ]
    for i, p in enumerate(study["widths"]):
        colour = COLOURS[i % len(COLOURS)]
        points = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(lr, f) for lr, f in zip(p["lrs"], p["final_losses"])))
        parts.append(f"<polyline fill='none' stroke='{colour}' stroke-width='2' points='{points}'/>")
        parts.append(f"<text x='{w - pad + 2}' y='{pad + 12 * i + 10}' font-size='10' fill='{colour}'>w{p['width']}</text>")
    caption = html.escape(study["sentence"])  # the study's verdict in a sentence, under its panel
    return (
        f"<figure><svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}'>{''.join(parts)}</svg>"
        f"<figcaption><b>{html.escape(study['corpus'])}, {html.escape(study['defence'])}</b>: {caption}"
        f"</figcaption></figure>"
    )


def assert_preflight(
    result: PreflightResult,
    *,
    defences_hold: Sequence[str] = ("as-given",),
    lr_margin: float = 2.0,
    corpora: Sequence[str] | None = None,
) -> None:
    """Fail unless, in ``result`` (what :func:`~pytest_spikecheck.preflight.preflight`
    returned), for each defence of ``defences_hold`` and each corpus studied (``corpora``:
    those named only; None: every one), the recipe's
    LR is at least ``lr_margin`` times below the first failing LR at every proxy width (a width
    where no LR of the grid fails passes) and below the extrapolated one at the config's width
    where the fit predicts one. One table of what failed."""
    __tracebackhide__ = True
    if not lr_margin >= 1:
        raise SpikeCheckError(f"lr_margin must be >= 1, was {lr_margin!r}")
    studied = {s["defence"] for s in result.studies}
    missing = [d for d in defences_hold if d not in studied]
    if missing:
        raise SpikeCheckError(
            f"assert_preflight: defence {missing[0]!r} was not studied; the result has {', '.join(sorted(studied))}"
        )
    bound = result.user_lr * lr_margin
    problems = []
    for s in result.studies:
        if s["defence"] not in defences_hold or (corpora is not None and s["corpus"] not in corpora):
            continue
        for p in s["widths"]:
            if p["first_failing_lr"] is not None and p["first_failing_lr"] < bound:
                problems.append(
                    f"{s['corpus']}, {s['defence']}, width {p['width']}: first failing LR "
                    f"{p['first_failing_lr']:.3g} < {lr_margin:g} x lr {result.user_lr:g}"
                )
        predicted = s.get("predicted_first_failing_lr")
        if predicted is not None and predicted < bound:
            problems.append(
                f"{s['corpus']}, {s['defence']}, width {result.target_width} (extrapolated): first "
                f"failing LR {predicted:.3g} < {lr_margin:g} x lr {result.user_lr:g}"
            )
    if problems:
        raise SpikeCheckError(f"preflight of {result.config}: {len(problems)} check(s) failed\n  " + "\n  ".join(problems))
