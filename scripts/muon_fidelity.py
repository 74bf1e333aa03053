"""Muon's attention max-logit explosion and its defences, measured over seeds (docs/fidelity.md,
the Muon / QK-Clip section). The grids are data, declared below, so that a sweep engine can
take them over as they are; each cell is one 1-thread training.

    python scripts/muon_fidelity.py run --grid main --seeds 0-4 --jobs 2 --out docs/muon.json
    python scripts/muon_fidelity.py run --grid equal_update --seeds 0-4 --jobs 2 --out docs/muon.json
    python scripts/muon_fidelity.py run --grid seed_a --seeds 0-4 --jobs 2 --out docs/muon.json
    python scripts/muon_fidelity.py run --grid issue_probes --seeds 0-2 --jobs 2 --out docs/muon.json
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

from _sweep import median, run_jobs, seed_range, spread

#: What every run of the main grid shares (on top of Phase-19's preset): the suite's recipe.
STEPS = 150
BASE = {"steps": STEPS, "optimizer__weight_decay": 0.0}
#: Corpora: Phase-19's memorised sentences, and induction sequences (only attention finishes
#: them; 2,000 training sequences, batches of 32 so that a healthy model learns to copy in 150 steps).
CORPORA = {
    "phase19": {},
    "induction": {"data__corpus": "induction", "data__n_sentences": 2000, "sampler__batch_size": 32},
}
ARCHS = ("gpt", "llama")
#: Optimizers at an exploding learning rate: AdamW at Wortsman's lr 0.1; Muon (torch defaults,
#: adjust_lr_fn original, its AdamW part at 1e-2) at 0.4.
OPTIMIZERS = {
    "adamw": {"optimizer__name": "adamw", "optimizer__lr": 0.1},
    "muon": {"optimizer__name": "muon", "optimizer__lr": 0.4},
}
#: Defences: (breaks as (name, params), scenario changes).
DEFENCES = {
    "none": ((), {}),
    "qk-clip 30": ((("QKClip", {"tau": 30.0}),), {}),
    "qk-clip 30 per-layer": ((("QKClip", {"tau": 30.0, "per_head": False}),), {}),
    "qk-clip 100": ((("QKClip", {"tau": 100.0}),), {}),
    "qk-norm": ((("QKLayerNorm", {}),), {}),
    "weight decay 0.1": ((), {"optimizer__weight_decay": 0.1}),
    "gated attention": ((("GatedAttention", {}),), {}),
}
#: Muon at AdamW's update size (adjust_lr_fn match_rms_adamw: Moonlight's 0.2·sqrt(max(A, B)),
#: which makes Muon's update RMS about AdamW's) against AdamW at the same lr, no defence.
EQUAL_UPDATE_LRS = (0.01, 0.03, 0.1)
#: Issue 22's throwaway probes, rerun with the project's code (the GPT, no weight decay, Muon's AdamW
#: part at 1e-2): Phase-19 for 400 steps at several Muon lrs, and induction for 600 steps in batches
#: of 8. Each: (label, corpus, steps, optimizer, lr, defence, seeds used: "all" or "first").
ISSUE_PROBES = (
    [(f"phase19 muon lr {lr:g}", "phase19", 400, "muon", lr, "none", "all" if lr == 0.2 else "first")
     for lr in (0.05, 0.1, 0.2, 0.4)]
    + [("phase19 adamw lr 0.01", "phase19", 400, "adamw", 0.01, "none", "first")]
    + [(f"phase19 muon lr {lr:g} qk-norm", "phase19", 400, "muon", lr, "qk-norm", "first") for lr in (0.2, 0.4)]
    + [(f"induction muon lr 0.2 {d}", "induction-8", 600, "muon", 0.2, d, "all")
       for d in ("none", "qk-clip 30", "qk-norm", "weight decay 0.1")]
    + [(f"induction adamw lr {lr:g}", "induction-8", 600, "adamw", lr, "none", "first") for lr in (0.05, 0.1)]
    + [("induction adamw lr 0.05 gated attention", "induction-8", 600, "adamw", 0.05, "gated attention", "first")]
)
#: Seed A's burst (8 unseen sentences at 312, Phase-19's full recipe), the llama beside the GPT.
SEED_A = {"burst": {"count": 8, "at_step": 312, "content": "greek"}, "clips": {"clip-1.0": 1.0, "no-clip": None}}


def _jobs(grid: str, seeds: list[int]) -> list[dict]:
    if grid == "main":
        return [{"grid": grid, "corpus": c, "arch": a, "optimizer": o, "defence": d, "seed": s}
                for s in seeds for c in CORPORA for a in ARCHS for o in OPTIMIZERS for d in DEFENCES
                if not (o == "adamw" and "per-layer" in d)]
    if grid == "equal_update":
        return [{"grid": grid, "corpus": "phase19", "arch": "gpt", "optimizer": o, "lr": lr, "seed": s}
                for s in seeds for lr in EQUAL_UPDATE_LRS for o in ("adamw", "muon")]
    if grid == "seed_a":
        return [{"grid": grid, "arch": a, "clip": c, "seed": s} for s in seeds for a in ARCHS for c in SEED_A["clips"]]
    if grid == "issue_probes":
        return [{"grid": grid, "label": label, "corpus": corpus, "steps": steps, "optimizer": opt, "lr": lr,
                 "defence": defence, "arch": "gpt", "seed": s}
                for label, corpus, steps, opt, lr, defence, which in ISSUE_PROBES
                for s in (seeds if which == "all" else seeds[:1])]
    raise SystemExit(f"unknown grid {grid!r}; choose main, equal_update, seed_a or issue_probes")


def scenario(job: dict):
    import pytest_spikecheck as sc

    if job["grid"] == "seed_a":
        return (sc.Scenario.preset("phase-19").replace(seed=job["seed"], model__arch=job["arch"],
                                                      optimizer__grad_clip=SEED_A["clips"][job["clip"]])
                .with_breaks(sc.RareTokenBurst(**SEED_A["burst"])))
    if job["grid"] == "issue_probes":
        corpus = {**CORPORA["induction"], "sampler__batch_size": 8} if job["corpus"] == "induction-8" else {}
        breaks, more = DEFENCES[job["defence"]]
        changes = {**BASE, **corpus, "steps": job["steps"], "seed": job["seed"], "optimizer__name": job["optimizer"],
                   "optimizer__lr": job["lr"], **more}
        return sc.Scenario.preset("phase-19").replace(**changes).with_breaks(*(getattr(sc, n)(**p) for n, p in breaks))
    changes = {**BASE, **CORPORA[job["corpus"]], "seed": job["seed"], "model__arch": job["arch"]}
    if job["grid"] == "equal_update":
        changes.update(optimizer__name=job["optimizer"], optimizer__lr=job["lr"])
        if job["optimizer"] == "muon":
            changes["optimizer__adjust_lr_fn"] = "match_rms_adamw"
        return sc.Scenario.preset("phase-19").replace(**changes)
    breaks, more = DEFENCES[job["defence"]]
    changes.update(OPTIMIZERS[job["optimizer"]], **more)
    return sc.Scenario.preset("phase-19").replace(**changes).with_breaks(*(getattr(sc, n)(**p) for n, p in breaks))


def measure(job: dict) -> dict:
    import numpy as np

    from pytest_spikecheck import train
    from pytest_spikecheck.judge.analysis import final_value, recovery_steps, spike_ratio

    norms: dict[str, float] = {}

    def qk_norms(ctx) -> None:  # the query and key weights' Frobenius norm at the end (weight decay's claim)
        if ctx.step == ctx.scenario.steps:
            hook = getattr(ctx.model, "spikecheck_qk_projections", None)
            if hook is not None:
                layers = hook()
                norms["qk_weight_norm"] = float(np.mean([float(q.detach().norm() * k.detach().norm()) for q, k, *_ in layers]))

    run = train(scenario(job), backend="torch", threads=1, callbacks=[qk_norms])
    m = run.metrics
    out = {**job, "seconds": run.meta["train_seconds"], "stopped": run.stopped_early, **norms}
    if job["grid"] == "seed_a":
        at = SEED_A["burst"]["at_step"]
        return {**out, "ratio": spike_ratio(m, at), "recovery": recovery_steps(m, at), "final_eval": final_value(m)}
    logits = np.asarray(m["attn_logit_max"], dtype=float)
    out.update(max_logit=float(np.nanmax(logits)), logit_step10=float(logits[9]), final_eval=final_value(m, last=1),
               final_eval_repeat=(final_value(m, "eval_loss_repeat", last=1) if "eval_loss_repeat" in m else None),
               grad_ratio=float(np.nanmax(m["grad_norm_pre"]) / np.nanmedian(m["grad_norm_pre"])),
               nonfinite=bool(not np.isfinite(m["loss"]).all() or run.stopped_early))
    if "qk_clipped_heads" in m:
        clipped = np.asarray(m["qk_clipped_heads"], dtype=float)
        active = np.flatnonzero(clipped > 0)
        first = int(active[0]) if active.size else None
        out.update(clip_steps=int(active.size), clip_last=int(active[-1]) + 1 if active.size else None,
                   clip_late_share=float((clipped[-len(clipped) // 4:] > 0).mean()), clip_heads=float(clipped.sum()),
                   max_after_first_clip=float(np.nanmax(logits[first + 1:])) if first is not None else None)
    return out


# -- tables ----------------------------------------------------------------------------------

def _cells(records: list[dict], key: str, spec: str, **where) -> str:
    return spread([r.get(key) for r in records if all(r.get(k) == v for k, v in where.items())], spec)


def table(records: list[dict]) -> str:
    lines: list[str] = []
    main_rows = [r for r in records if r["grid"] == "main"]
    if main_rows:
        seeds = sorted({r["seed"] for r in main_rows})
        lines += [f"Largest attention logit over the run / final eval loss (induction: full, and on the repeated half), "
                  f"median [min–max] over seeds {seeds[0]}–{seeds[-1]}, {STEPS} steps, weight decay 0 unless stated:", ""]
        for corpus in CORPORA:
            head = "| optimizer | defence | " + " | ".join(f"{a}: max logit | {a}: final eval" + (" (repeat)" if corpus == "induction" else "")
                                                            for a in ARCHS) + " |"
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
        lines += ["QK-Clip's activity (Muon): steps with a clip / steps, share of the last quarter's steps with a clip, "
                  "largest logit after the first clip ÷ tau:", "",
                  "| corpus | arch | clip | steps clipping | last quarter | max after first clip / tau |", "|---|---|---|---|---|---|"]
        for corpus in CORPORA:
            for arch in ARCHS:
                for defence, tau in (("qk-clip 30", 30), ("qk-clip 30 per-layer", 30), ("qk-clip 100", 100)):
                    rows = [r for r in main_rows if (r["corpus"], r["arch"], r["optimizer"], r["defence"]) ==
                            (corpus, arch, "muon", defence)]
                    if rows:
                        lines.append(f"| {corpus} | {arch} | {defence} | {spread([r['clip_steps'] for r in rows], '.0f')} | "
                                     f"{spread([r['clip_late_share'] for r in rows], '.2f')} | "
                                     f"{spread([(r['max_after_first_clip'] or math.nan) / tau for r in rows], '.2f')} |")
        lines.append("")
    eq = [r for r in records if r["grid"] == "equal_update"]
    if eq:
        lines += ["Equal update size (GPT, Phase-19, no defence; Muon with adjust_lr_fn match_rms_adamw): largest attention "
                  "logit, median [min–max]:", "", "| lr | AdamW | Muon (match_rms_adamw) |", "|---|---|---|"]
        for lr in EQUAL_UPDATE_LRS:
            lines.append(f"| {lr:g} | {_cells(eq, 'max_logit', ',.0f', optimizer='adamw', lr=lr)} | "
                         f"{_cells(eq, 'max_logit', ',.0f', optimizer='muon', lr=lr)} |")
        lines.append("")
    probes = [r for r in records if r["grid"] == "issue_probes"]
    if probes:
        lines += ["Issue 22's probes rerun with the project's code (GPT, no weight decay): largest attention logit; "
                  "final eval loss (induction: full (repeated half)); one value per seed:", "",
                  "| probe | steps | seeds | max logit | final eval | grad-norm max / median |", "|---|---|---|---|---|---|"]
        for label, *_ in ISSUE_PROBES:
            rows = sorted((r for r in probes if r["label"] == label), key=lambda r: r["seed"])
            if rows:
                finals = ", ".join(f"{r['final_eval']:.2f}" + (f" ({r['final_eval_repeat']:.2f})" if r.get("final_eval_repeat")
                                                               is not None else "") for r in rows)
                seeds_text = ", ".join(str(r["seed"]) for r in rows)
                logits = ", ".join(format(r["max_logit"], ",.0f") for r in rows)
                grads = ", ".join(format(r["grad_ratio"], ".1f") for r in rows)
                lines.append(f"| {label} | {rows[0]['steps']} | {seeds_text} | {logits} | {finals} | {grads} |")
        lines.append("")
    burst = [r for r in records if r["grid"] == "seed_a"]
    if burst:
        lines += ["Seed A's burst (8 unseen sentences at 312, Phase-19's recipe, AdamW), median [min–max]:", "",
                  "| arch | clip | ratio at 312 | recovery (steps) | final eval |", "|---|---|---|---|---|"]
        for arch in ARCHS:
            for clip in SEED_A["clips"]:
                rows = [r for r in burst if r["arch"] == arch and r["clip"] == clip]
                lines.append(f"| {arch} | {clip} | {spread([r['ratio'] for r in rows], '.1f')}× | "
                             f"{spread([r['recovery'] for r in rows], '.0f')} | {spread([r['final_eval'] for r in rows], '.3f')} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("run", "table"))
    parser.add_argument("--grid", default="main")
    parser.add_argument("--seeds", default="0-4")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out = Path(args.out)
    data = json.loads(out.read_text()) if out.is_file() else {"records": []}
    if args.mode == "run":
        jobs = _jobs(args.grid, seed_range(args.seeds))
        records = run_jobs(measure, jobs, args.jobs, lambda r: " ".join(
            f"{k}={r[k]}" for k in ("corpus", "arch", "optimizer", "defence", "lr", "clip", "seed") if k in r)
            + f": max logit {r.get('max_logit', math.nan):,.0f}, final {r.get('final_eval', math.nan):.3f}")
        data["records"] = [r for r in data["records"] if r["grid"] != args.grid] + records
        data.setdefault("dates", {})[args.grid] = time.strftime("%Y-%m-%d")
        out.write_text(json.dumps(data, indent=1))
    print(table(data["records"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
