"""The panels: loss and grad norm (Seed A's diagnostic ladder), logits, the LR sweep.
matplotlib is imported only when a panel is drawn."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from pytest_spikecheck.judge.analysis import column
from pytest_spikecheck.records.run import Run


def _matplotlib():
    import matplotlib

    matplotlib.use("Agg")  # files only; never a window
    import matplotlib.pyplot as plt

    return plt


def plot_loss(runs: Sequence[Run], path: Path, mark_steps: Sequence[int] = (), title: str = "Loss") -> Path:
    """Training loss (thin) and eval loss (line) of each run; declared steps marked. With a
    marked step, a second panel zooms on the eval loss around it (the harm a spike does is a
    fraction of a nat, invisible next to the first steps' loss)."""
    plt = _matplotlib()
    zoom = bool(mark_steps)
    fig, axes = plt.subplots(
        1,
        2 if zoom else 1,
        figsize=(12 if zoom else 9, 4.2),
        dpi=110,
        gridspec_kw={"width_ratios": [3, 2]} if zoom else None,
        squeeze=False,
    )
    full = axes[0][0]
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    for run, color in zip(runs, colors):
        s, v = column(run.metrics, "loss")
        full.plot(s, v, color=color, alpha=0.35, lw=0.8, label=f"{run.name} train loss")
        at_marks = np.isin(s, list(mark_steps))
        # A one-step train-loss spike sits exactly on the marker line: a dot keeps it visible.
        full.plot(s[at_marks], v[at_marks], color=color, ls="none", marker="o", ms=4, zorder=3)
        if "eval_loss" in run.metrics:
            es, ev = column(run.metrics, "eval_loss")
            full.plot(es, ev, color=color, lw=1.6, marker=".", ms=3, label=f"{run.name} eval loss")
            if zoom:
                sel = (es >= mark_steps[0] - 15) & (es <= mark_steps[0] + 60)
                axes[0][1].plot(es[sel], ev[sel], color=color, lw=1.6, marker=".", ms=4, label=f"{run.name}")
    for run in runs:
        where = run.meta.get("first_nonfinite")
        if where:  # the run stopped on NaN/inf: say where, the curve alone just ends
            full.axvline(where["step"], color="#d62728", lw=1.5)
            full.annotate(
                f"non-finite at step {where['step']}\nin {where['module']}",
                xy=(where["step"], 0.5),
                xycoords=("data", "axes fraction"),
                xytext=(-8, 0),
                textcoords="offset points",
                ha="right",
                color="#d62728",
                fontsize=9,
            )
    for ax in axes[0]:
        for step in mark_steps:
            ax.axvline(step, color="k", ls=":", lw=1, zorder=0)  # behind the curves, never over a spike
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    full.set_ylabel("cross-entropy (nats)")
    full.set_title(title)
    full.legend(fontsize=8, loc="upper right")
    if zoom:
        axes[0][1].set_title(f"eval loss around step {mark_steps[0]}")
        axes[0][1].legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_grad_norm(
    runs: Sequence[Run],
    path: Path,
    mark_steps: Sequence[int] = (),
    max_norm: float | None = None,
    title: str = "Gradient norm, pre- and post-clip",
) -> Path:
    plt = _matplotlib()
    fig, ax = plt.subplots(figsize=(9, 4.2), dpi=110)
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    for run, color in zip(runs, colors):
        s, pre = column(run.metrics, "grad_norm_pre")
        ax.plot(s, pre, color=color, lw=1.0, label=f"{run.name} pre-clip")
        if "grad_norm_post" in run.metrics:
            s2, post = column(run.metrics, "grad_norm_post")
            ax.plot(s2, post, color=color, lw=1.0, ls="--", alpha=0.8, label=f"{run.name} post-clip")
    if max_norm is not None and math.isfinite(max_norm):
        ax.axhline(max_norm, color="gray", lw=0.8, ls="-.", label=f"max_norm {max_norm:g}")
    boundaries = sorted({s for run in runs for s in run.phase_boundaries})
    for i, step in enumerate(boundaries):  # the bandit's source switches, faint
        ax.axvline(step, color="#2ca02c", lw=0.6, alpha=0.35, label="source weights change" if i == 0 else None)
    for step in mark_steps:
        ax.axvline(step, color="k", ls=":", lw=1)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("global L2 norm")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_logits(runs: Sequence[Run], path: Path, title: str = "Attention and output logits") -> Path:
    """The largest |attention logit| and the mean output log Z per step of each run (log scale):
    attention-logit growth and output-logit drift, side by side."""
    plt = _matplotlib()
    fig, (att, logz) = plt.subplots(1, 2, figsize=(12, 4.2), dpi=110)
    for run, color in zip(runs, ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]):
        for ax, name in ((att, "attn_logit_max"), (logz, "logz_mean")):
            if name in run.metrics:
                s, v = column(run.metrics, name)
                ax.plot(s, np.abs(v), color=color, lw=1.0, label=run.name)
    att.set(yscale="log", xlabel="step", ylabel="largest |q·k/√d|", title="attention logits")
    logz.set(yscale="log", xlabel="step", ylabel="|mean log Z|", title="output logits: log Z")
    for ax in (att, logz):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_attention(run: Run, path: Path, tau: float | None = None, factor: float = 2.0, title: str = "Attention logits") -> Path:
    """The attention logits of one run: the largest attention logit per step (log scale) with
    QK-Clip's tau and ``factor`` x tau where QK-Clip was on (``tau``) and the heads it clipped per
    step on a second axis; beside it the largest logit of each head (layers x heads) at the step
    the run's largest logit was reached (the engine records it: ``largest_attn_logit``)."""
    plt = _matplotlib()
    largest = run.meta.get("largest_attn_logit") or None
    fig, axes = plt.subplots(
        1,
        2 if largest else 1,
        figsize=(12 if largest else 9, 4.2),
        dpi=110,
        gridspec_kw={"width_ratios": [3, 2]} if largest else None,
        squeeze=False,
    )
    ax = axes[0][0]
    s, v = column(run.metrics, "attn_logit_max")
    ax.plot(s, np.abs(v), color="#1f77b4", lw=1.0, label="largest |q·k/√d|")
    if tau is not None:
        ax.axhline(tau, color="#d62728", ls="--", lw=1, label=f"QK-Clip τ = {tau:g}")
        ax.axhline(factor * tau, color="#d62728", ls=":", lw=1, label=f"{factor:g}τ (assert_qk_clip_contains)")
    if "qk_clipped_heads" in run.metrics:
        clipped = np.asarray(run.metrics["qk_clipped_heads"], dtype=float)
        twin = ax.twinx()
        twin.bar(np.asarray(run.metrics["step"]), clipped, color="#ff7f0e", alpha=0.35, width=1.0, label="heads clipped")
        twin.set_ylabel("heads QK-Clip clipped")
        twin.legend(fontsize=8, loc="lower right")
        ax.set_zorder(twin.get_zorder() + 1)  # the logits drawn over the bars
        ax.patch.set_visible(False)
    ax.set(yscale="log", xlabel="step", ylabel="largest |attention logit|", title=title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper left")
    if largest:
        heads = np.abs(np.asarray(largest["per_head"], dtype=float))
        heads = heads.reshape(1, -1) if heads.ndim == 1 else heads
        hm = axes[0][1]
        image = hm.imshow(heads, aspect="auto", cmap="magma", interpolation="nearest")
        fig.colorbar(image, ax=hm, label="largest |logit|")
        hm.set(xlabel="head", ylabel="layer", title=f"per head, step {largest['step']}")
        hm.set_xticks(range(heads.shape[1]))
        hm.set_yticks(range(heads.shape[0]))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_lr_sweep(sweeps: Sequence[Any], path: Path, title: str = "Final loss vs learning rate") -> Path:
    """Final loss against the learning rate, one line per recipe (Wortsman et al. 2023, Figure 1),
    with each recipe's LR sensitivity in the legend; a diverged run is drawn at its initial loss."""
    from pytest_spikecheck.judge.sweeps import lr_sensitivity

    plt = _matplotlib()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    for sweep in sweeps:
        finals = np.minimum(np.asarray(sweep.final_losses, dtype=np.float64), sweep.initial)
        ax.plot(sweep.lrs, finals, marker="o", label=f"{sweep.name} (LR sensitivity {lr_sensitivity(sweep):.2f})")
    if sweeps:
        ax.axhline(sweeps[0].initial, color="grey", ls=":", lw=1, label="loss at initialisation")
    ax.set(xscale="log", xlabel="peak learning rate", ylabel="final eval loss (nats)", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
