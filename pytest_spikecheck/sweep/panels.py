"""A sweep's panels: final loss against the peak learning rate per recipe (Wortsman et al. 2023,
Figure 1), and the LR sensitivity against the model's width when the width varies. Drawn when
the sweep has an ``optimizer.lr`` axis; matplotlib is imported only to draw."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_spikecheck.sweep.summary import LR, SEED, group, lr_sensitivities, median, present

if TYPE_CHECKING:
    from pytest_spikecheck.sweep.result import SweepResult

#: More combinations than this of the axes beside the LR and the recipe: one plot, not a grid.
_MAX_SUBPLOTS = 12
#: Axes that set the width itself: the width panel's x, never one of its lines.
_WIDTH_AXES = ("model.n_embd", "model.preset")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only; never a window
    import matplotlib.pyplot as plt

    return plt


def _ran(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["status"] in ("done", "cached")]


def _label(keys: list[str], values: tuple) -> str:
    return ", ".join(f"{v}" if k == "recipe" else f"{k}={v}" for k, v in zip(keys, values)) or "all points"


def draw_panels(result: SweepResult, out: Path) -> list[Path]:
    """The panels this sweep supports, written into ``out``; their paths."""
    rows = _ran(result.rows)
    if LR not in result.axes or not rows:
        return []
    paths = [plot_final_loss_vs_lr(result, out / "final_loss_vs_lr.png")]
    widths = {_width(result, i) for i, r in enumerate(result.rows) if r["status"] in ("done", "cached")}
    if len(widths - {None}) > 1:
        paths.append(plot_lr_sensitivity_vs_width(result, out / "lr_sensitivity_vs_width.png"))
    return paths


def _width(result: SweepResult, index: int) -> int | None:
    scenario = result.points[index].scenario
    return None if scenario.model_factory is not None else scenario.resolved().model.n_embd


def fit_title(text: str, fig: Any, fontsize: float = 10) -> str:
    """``text`` wrapped to the figure's width (a 10-point character is about 0.6 of its size
    wide), so no line of a title runs past either edge."""
    per_line = max(20, int(fig.get_figwidth() * 72 / (0.6 * fontsize)) - 4)
    return "\n".join(textwrap.fill(line, per_line) for line in text.split("\n"))


def plot_final_loss_vs_lr(result: SweepResult, path: Path) -> Path:
    """One line per recipe: the median over seeds of the final eval loss at each peak LR (a
    diverged run counts at its initial loss, as the LR sensitivity counts it), min–max shaded;
    one subplot per combination of the other axes (the width, say)."""
    plt = _pyplot()
    axes = list(result.axes)
    lines_by = [a for a in axes if a == "recipe"]
    panel_by = [a for a in axes if a not in (LR, SEED, "recipe")]
    panels = group(_ran(result.rows), axes, [a for a in axes if a not in panel_by])
    if len(panels) > _MAX_SUBPLOTS:
        lines_by, panel_by = lines_by + panel_by, []
        panels = [((), _ran(result.rows))]
    columns = min(len(panels), 4)
    rows_n = math.ceil(len(panels) / columns)
    fig, grid = plt.subplots(
        rows_n, columns, figsize=(max(6.5, 4.2 * columns), 3.6 * rows_n + 0.6), dpi=110, squeeze=False, sharey=True
    )
    swept = sorted({r[LR] for r in _ran(result.rows)})
    for ax, (panel_values, members) in zip(grid.flat, panels):
        initial = median(r["initial_loss"] for r in members)
        for line_values, line_rows in group(members, axes, [a for a in axes if a not in lines_by]):
            lrs = sorted({r[LR] for r in line_rows})
            capped = [[min(r["final_eval_loss"], r["initial_loss"]) for r in line_rows if r[LR] == lr] for lr in lrs]
            ax.plot(lrs, [median(c) for c in capped], marker="o", label=_label(lines_by, line_values))
            if any(len(c) > 1 for c in capped):
                ax.fill_between(lrs, [min(present(c)) for c in capped], [max(present(c)) for c in capped], alpha=0.15)
        ax.axhline(initial, color="grey", ls=":", lw=1, label="loss at initialisation")
        ax.set(xscale="log", xlabel="peak learning rate", title=_label(panel_by, panel_values) if panel_by else "")
        ax.set_xticks(swept)
        ax.get_xaxis().set_major_formatter(_plain_ticks())
        ax.get_xaxis().set_minor_formatter(_no_ticks())
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(grid.flat)[len(panels) :]:
        ax.set_visible(False)
    for ax in grid[:, 0]:
        ax.set_ylabel("final eval loss (nats)")
    seeds = len({r.get(SEED) for r in result.rows})
    fig.suptitle(
        fit_title(
            f"{result.name}\nfinal eval loss vs peak LR (median over {seeds} seed{'s' if seeds != 1 else ''}, "
            "min–max shaded; a diverged run at its initial loss)",
            fig,
        ),
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_lr_sensitivity_vs_width(result: SweepResult, path: Path) -> Path:
    """The LR sensitivity (median over seeds, min–max as error bars) against the model width
    (``model.n_embd``), one line per recipe (and per value of any other axis)."""
    plt = _pyplot()
    axes = list(result.axes)
    found = lr_sensitivities(result.rows, axes)
    keep = [a for a in axes if a not in (SEED, LR)]
    lines_by = [a for a in keep if a not in _WIDTH_AXES]
    lines: dict[tuple, list[tuple[int, list[float]]]] = {}
    for entry in found:
        values = tuple(entry[a] for a in keep)
        index = next(i for i, r in enumerate(result.rows) if tuple(r.get(a) for a in keep) == values)
        width = _width(result, index)
        if width is None or not entry["lr_sensitivity_values"]:
            continue
        lines.setdefault(tuple(entry[a] for a in lines_by), []).append((width, entry["lr_sensitivity_values"]))
    fig, ax = plt.subplots(figsize=(6.5, 4.2), dpi=110)
    for line_values, points in lines.items():
        points.sort()
        xs = [w for w, _ in points]
        mids = [median(v) for _, v in points]
        low = [m - min(v) for m, (_, v) in zip(mids, points)]
        high = [max(v) - m for m, (_, v) in zip(mids, points)]
        ax.errorbar(xs, mids, yerr=[low, high], marker="o", capsize=3, label=_label(lines_by, line_values))
    ax.set(xscale="log", xlabel="model width (n_embd)", ylabel="LR sensitivity (nats)")
    ax.set_title(fit_title(f"{result.name}\nLR sensitivity vs width (median over seeds, min–max bars)", fig), fontsize=10)
    ax.set_xticks(sorted({w for pts in lines.values() for w, _ in pts}))
    ax.get_xaxis().set_major_formatter(_plain_ticks())
    ax.get_xaxis().set_minor_formatter(_no_ticks())
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _plain_ticks() -> Any:
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda x, _: f"{x:g}")


def _no_ticks() -> Any:
    from matplotlib.ticker import NullFormatter

    return NullFormatter()
