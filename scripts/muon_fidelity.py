"""Muon's attention max-logit explosion and its defences, measured over seeds (docs/fidelity.md,
the Muon / QK-Clip section). Each grid is one or two sweep files in experiments/sweeps/ (GRIDS
below), trained by the sweep engine (--jobs, --executor local|ray, resumed from
out/sweeps/<file>/); each point is one 1-thread training.

    python scripts/muon_fidelity.py run --grid main --out docs/muon.json
    python scripts/muon_fidelity.py run --grid equal_update --out docs/muon.json
    python scripts/muon_fidelity.py run --grid seed_a --out docs/muon.json
    python scripts/muon_fidelity.py run --grid issue_probes --out docs/muon.json
    python scripts/muon_fidelity.py table --out docs/muon.json

``run`` adds its grid's records to the JSON (replacing that grid's earlier ones); ``table`` prints
the markdown of docs/fidelity.md from it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from _sweep import add_sweep_arguments, run_sweep

from pytest_spikecheck.sweep import spread

#: Each grid's sweep files (experiments/sweeps/<name>.yaml).
GRIDS = {
    "main": ("muon-main", "muon-weight-decay"),
    "equal_update": ("muon-equal-update",),
    "seed_a": ("muon-seed-a",),
    "issue_probes": ("muon-issue-probes",),
}
#: The main grid's steps and the table's order of its labels (the sweep files' content).
STEPS = 150
CORPORA = ("phase19", "induction")
ARCHS = ("gpt", "llama")
OPTIMIZERS = ("adamw", "muon")
DEFENCES = ("none", "qk-clip 30", "qk-clip 30 per-layer", "qk-clip 100", "qk-norm", "weight decay 0.1", "gated attention")
EQUAL_UPDATE_LRS = (0.01, 0.03, 0.1)
CLIPS = ("clip-1.0", "no-clip")
BURST_STEP = 312  # muon-seed-a.yaml's burst


def _defence(scenario) -> str:
    """An issue probe's defence, read from the fields its point sets."""
    if scenario.optimizer.qk_clip is not None:
        return f"qk-clip {scenario.optimizer.qk_clip:g}"
    if scenario.model.qk_layernorm:
        return "qk-norm"
    if scenario.model.attn_gate:
        return "gated attention"
    if scenario.optimizer.weight_decay:
        return f"weight decay {scenario.optimizer.weight_decay:g}"
    return "none"


def describe(grid: str, point, run) -> dict:
    """What a record says of the point it measures (the table's keys)."""
    sc = run.scenario
    corpus = "induction" if sc.data.corpus == "induction" else "phase19"
    if grid == "seed_a":
        return {"grid": grid, "arch": sc.model.arch, "clip": point.recipe, "seed": sc.seed}
    if grid == "equal_update":
        return {
            "grid": grid,
            "corpus": corpus,
            "arch": sc.model.arch,
            "optimizer": sc.optimizer.name,
            "lr": sc.optimizer.lr,
            "seed": sc.seed,
        }
    if grid == "issue_probes":
        defence = _defence(sc)
        corpus = f"{corpus}-{sc.sampler.batch_size}" if corpus == "induction" else corpus
        label = f"{corpus.split('-')[0]} {sc.optimizer.name} lr {sc.optimizer.lr:g}" + (
            "" if defence == "none" else f" {defence}"
        )
        return {
            "grid": grid,
            "label": label,
            "corpus": corpus,
            "steps": sc.steps,
            "optimizer": sc.optimizer.name,
            "lr": sc.optimizer.lr,
            "defence": defence,
            "arch": sc.model.arch,
            "seed": sc.seed,
        }
    return {
        "grid": grid,
        "corpus": corpus,
        "arch": sc.model.arch,
        "optimizer": sc.optimizer.name,
        "defence": point.recipe,
        "seed": sc.seed,
    }


def measure(grid: str, point, run) -> dict:
    import numpy as np

    from pytest_spikecheck.judge.analysis import final_value, recovery_steps, spike_ratio

    m = run.metrics
    out = {
        **describe(grid, point, run),
        "seconds": run.meta["train_seconds"],
        "stopped": run.stopped_early,
        "qk_weight_norm": run.meta.get("qk_weight_norm"),
    }  # ||W_q||·||W_k|| at the end, mean over layers
    if grid == "seed_a":
        return {
            **out,
            "ratio": spike_ratio(m, BURST_STEP),
            "recovery": recovery_steps(m, BURST_STEP),
            "final_eval": final_value(m),
        }
    logits = np.asarray(m["attn_logit_max"], dtype=float)
    out.update(
        max_logit=float(np.nanmax(logits)),
        logit_step10=float(logits[9]),
        final_eval=final_value(m, last=1),
        final_eval_repeat=(final_value(m, "eval_loss_repeat", last=1) if "eval_loss_repeat" in m else None),
        grad_ratio=float(np.nanmax(m["grad_norm_pre"]) / np.nanmedian(m["grad_norm_pre"])),
        nonfinite=bool(not np.isfinite(m["loss"]).all() or run.stopped_early),
    )
    if "qk_clipped_heads" in m:
        clipped = np.asarray(m["qk_clipped_heads"], dtype=float)
        active = np.flatnonzero(clipped > 0)
        first = int(active[0]) if active.size else None
        out.update(
            clip_steps=int(active.size),
            clip_last=int(active[-1]) + 1 if active.size else None,
            clip_late_share=float((clipped[-len(clipped) // 4 :] > 0).mean()),
            clip_heads=float(clipped.sum()),
            max_after_first_clip=float(np.nanmax(logits[first + 1 :])) if first is not None else None,
        )
    return out


# -- tables ----------------------------------------------------------------------------------


def _cells(records: list[dict], key: str, spec: str, **where) -> str:
    return spread([r.get(key) for r in records if all(r.get(k) == v for k, v in where.items())], spec)


def table(records: list[dict]) -> str:
    lines: list[str] = []
    main_rows = [r for r in records if r["grid"] == "main"]
    if main_rows:
        seeds = sorted({r["seed"] for r in main_rows})
        lines += [
            f"Largest attention logit over the run / final eval loss (induction: full, and on the repeated half), "
            f"median [min–max] over seeds {seeds[0]}–{seeds[-1]}, {STEPS} steps, weight decay 0 unless stated:",
            "",
        ]
        for corpus in CORPORA:
            head = (
                "| optimizer | defence | "
                + " | ".join(f"{a}: max logit | {a}: final eval" + (" (repeat)" if corpus == "induction" else "") for a in ARCHS)
                + " |"
            )
            lines += [f"**{corpus}**", "", head, "|---|---|" + "---|---|" * len(ARCHS)]
            for opt in OPTIMIZERS:
                for defence in DEFENCES:
                    if opt == "adamw" and "per-layer" in defence:
                        continue
                    cells = []
                    for arch in ARCHS:
                        where = dict(corpus=corpus, arch=arch, optimizer=opt, defence=defence)
                        final = _cells(main_rows, "final_eval", ".3f", **where)
                        if corpus == "induction":
                            final += f" ({_cells(main_rows, 'final_eval_repeat', '.2f', **where)})"
                        cells += [_cells(main_rows, "max_logit", ",.0f", **where), final]
                    lines.append(f"| {opt} | {defence} | " + " | ".join(cells) + " |")
            lines.append("")
        lines += [
            "QK-Clip's activity (Muon): steps with a clip / steps, share of the last quarter's steps with a clip, "
            "largest logit after the first clip ÷ tau:",
            "",
            "| corpus | arch | clip | steps clipping | last quarter | max after first clip / tau |",
            "|---|---|---|---|---|---|",
        ]
        for corpus in CORPORA:
            for arch in ARCHS:
                for defence, tau in (("qk-clip 30", 30), ("qk-clip 30 per-layer", 30), ("qk-clip 100", 100)):
                    rows = [
                        r
                        for r in main_rows
                        if (r["corpus"], r["arch"], r["optimizer"], r["defence"]) == (corpus, arch, "muon", defence)
                    ]
                    if rows:
                        lines.append(
                            f"| {corpus} | {arch} | {defence} | {spread([r['clip_steps'] for r in rows], '.0f')} | "
                            f"{spread([r['clip_late_share'] for r in rows], '.2f')} | "
                            f"{spread([(r['max_after_first_clip'] or math.nan) / tau for r in rows], '.2f')} |"
                        )
        lines.append("")
    eq = [r for r in records if r["grid"] == "equal_update"]
    if eq:
        lines += [
            "Equal update size (GPT, Phase-19, no defence; Muon with adjust_lr_fn match_rms_adamw): largest attention "
            "logit, median [min–max]:",
            "",
            "| lr | AdamW | Muon (match_rms_adamw) |",
            "|---|---|---|",
        ]
        for lr in EQUAL_UPDATE_LRS:
            lines.append(
                f"| {lr:g} | {_cells(eq, 'max_logit', ',.0f', optimizer='adamw', lr=lr)} | "
                f"{_cells(eq, 'max_logit', ',.0f', optimizer='muon', lr=lr)} |"
            )
        lines.append("")
    probes = [r for r in records if r["grid"] == "issue_probes"]
    if probes:
        lines += [
            "Issue 22's probes rerun with the project's code (GPT, no weight decay): largest attention logit; "
            "final eval loss (induction: full (repeated half)); one value per seed:",
            "",
            "| probe | steps | seeds | max logit | final eval | grad-norm max / median |",
            "|---|---|---|---|---|---|",
        ]
        for label in dict.fromkeys(r["label"] for r in probes):
            rows = sorted((r for r in probes if r["label"] == label), key=lambda r: r["seed"])
            if rows:
                finals = ", ".join(
                    f"{r['final_eval']:.2f}"
                    + (f" ({r['final_eval_repeat']:.2f})" if r.get("final_eval_repeat") is not None else "")
                    for r in rows
                )
                seeds_text = ", ".join(str(r["seed"]) for r in rows)
                logits = ", ".join(format(r["max_logit"], ",.0f") for r in rows)
                grads = ", ".join(format(r["grad_ratio"], ".1f") for r in rows)
                lines.append(f"| {label} | {rows[0]['steps']} | {seeds_text} | {logits} | {finals} | {grads} |")
        lines.append("")
    burst = [r for r in records if r["grid"] == "seed_a"]
    if burst:
        lines += [
            "Seed A's burst (8 unseen sentences at 312, Phase-19's recipe, AdamW), median [min–max]:",
            "",
            "| arch | clip | ratio at 312 | recovery (steps) | final eval |",
            "|---|---|---|---|---|",
        ]
        for arch in ARCHS:
            for clip in CLIPS:
                rows = [r for r in burst if r["arch"] == arch and r["clip"] == clip]
                lines.append(
                    f"| {arch} | {clip} | {spread([r['ratio'] for r in rows], '.1f')}× | "
                    f"{spread([r['recovery'] for r in rows], '.0f')} | {spread([r['final_eval'] for r in rows], '.3f')} |"
                )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("run", "table"))
    parser.add_argument("--grid", default="main", choices=tuple(GRIDS))
    parser.add_argument("--out", required=True)
    add_sweep_arguments(parser)
    args = parser.parse_args()
    out = Path(args.out)
    data = json.loads(out.read_text()) if out.is_file() else {"records": []}
    if args.mode == "run":
        records = []
        for name in GRIDS[args.grid]:
            result = run_sweep(name, args)
            records += [measure(args.grid, point, run) for point, run in zip(result.points, result.runs)]
        data["records"] = [r for r in data["records"] if r["grid"] != args.grid] + records
        data.setdefault("dates", {})[args.grid] = time.strftime("%Y-%m-%d")
        out.write_text(json.dumps(data, indent=1))
    print(table(data["records"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
