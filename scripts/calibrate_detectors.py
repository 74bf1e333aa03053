"""Calibrate the named spike detectors on Phase-19 runs: detection rate, false positives, delay, ROC.

    python scripts/calibrate_detectors.py --jobs 2     # train, sweep, write docs/detectors.md and the ROC plot
    python scripts/calibrate_detectors.py --report     # rewrite the doc and plot from docs/detectors_calibration.json

*Clean* runs are the Phase-19 preset with nothing declared broken; *broken* runs add one
``RareTokenBurst`` of random content (greek, caps or written), size and step. Seed, peak
learning rate and clip (1.0 or none) are fuzzed for both, from one seeded design, so every
invocation trains the same runs: the design is a sweep of explicit points (seed, optimizer.lr,
optimizer.grad_clip, sampler.bursts) trained through the sweep engine (--jobs, --executor
local|ray, resumed from out/sweeps/calibrate-detectors/), each a 1-thread run of ``STEPS``
steps; every detector then runs on each run's pre-clip grad-norm and loss series at every
threshold of its sweep.

Definitions (the doc repeats them):

* a broken run is *detected* when a detector flags a step in ``[burst, burst + DETECTION_WINDOW)``;
  the *delay* is the first such step minus the burst step;
* *quiet* steps are every step of a clean run and the steps before the burst of a broken
  run (nothing declared happened there); a flag on a quiet step is a *false positive*, and
  the false-positive rate is flags per 1,000 quiet steps. Steps after the burst window of a
  broken run are the burst's aftermath and count neither way.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np
from _sweep import add_sweep_arguments

STEPS = 400
#: Bursts land after every detector has its full history (olmo-core: 128 steps, megatron: 100).
BURST_STEPS = (150, 350)
LR_RANGE = (5e-3, 2e-2)  # log-uniform around the preset's 1e-2
CLIPS = (1.0, None)
#: Burst content -> the largest count it can have (5 *written* sentences exist; batches hold 8).
CONTENT_MAX_COUNT = {"greek": 8, "caps": 8, "written": 5}
#: Content the model has never seen (every token new), as opposed to *written*'s one rare piece.
UNSEEN_CONTENT = ("greek", "caps")
DETECTION_WINDOW = 10
#: Warm-up of training: false positives there are reported separately.
EARLY_STEPS = 50
METRICS = ("grad_norm_pre", "loss")
#: Targets asked for by the issue: >= 95 % detection at <= 1 % false positives. "1 % per
#: 1,000 steps" reads two ways, so both are reported: <= 10 flags per 1,000 quiet steps
#: (1 % of steps) and the stricter <= 1 per 1,000.
TARGET_DETECTION = 0.95
FP_BUDGETS = (10.0, 1.0)
GRID_POINTS = 24
#: Each detector's threshold sweep (log-spaced); its published default is added to the grid.
SWEEPS = {
    "ratio": (1.25, 100.0),
    "llm-foundry": (1.05, 20.0),
    "lightning": (0.1, 100.0),
    "olmo-core": (1.0, 1000.0),
    "zclip": (1.0, 1000.0),
    "megatron": (0.5, 50.0),
}
#: The published detectors this script sweeps (the default policy's rules were calibrated on
#: real logs instead: scripts/real_log_table.py).
CALIBRATED = tuple(SWEEPS)
DOC = Path("docs/detectors.md")
#: docs/detectors.md's real-log section, written by scripts/real_log_table.py: kept as it is.
REAL_LOGS_START, REAL_LOGS_END = "<!-- real-logs:start -->", "<!-- real-logs:end -->"
SUMMARY = Path("docs/detectors_calibration.json")
PLOT = Path("docs/detectors_roc.png")
RAW = Path("out/calibration/runs.json")  # per-run series, for inspection (not committed)


def thresholds(name: str) -> list[float]:
    from pytest_spikecheck.judge.detectors import get_detector

    detector = get_detector(name)
    lo, hi = SWEEPS[name]
    grid = {float(f"{x:.3g}") for x in np.geomspace(lo, hi, GRID_POINTS)}
    grid.add(float(getattr(detector, detector.threshold_name)))
    return sorted(grid)


def design(n_clean: int, n_broken: int) -> list[dict]:
    """The runs to train, drawn from one seeded RNG: the same list every time."""
    rng = random.Random("detector-calibration")

    def fuzz(kind: str, i: int) -> dict:
        lr = math.exp(rng.uniform(math.log(LR_RANGE[0]), math.log(LR_RANGE[1])))
        return {"kind": kind, "seed": rng.randrange(10_000), "lr": round(lr, 6), "clip": rng.choice(CLIPS), "index": i}

    runs = [fuzz("clean", i) for i in range(n_clean)]
    contents = list(CONTENT_MAX_COUNT)
    for i in range(n_broken):
        run = fuzz("broken", i)
        content = contents[i % len(contents)]
        run.update(content=content, count=rng.randint(1, CONTENT_MAX_COUNT[content]), at_step=rng.randint(*BURST_STEPS))
        runs.append(run)
    return runs


def plan(runs: list[dict]):
    """The design as a sweep: one explicit point per run (a broken run's burst is its
    ``sampler.bursts``, what ``RareTokenBurst`` sets)."""
    from pytest_spikecheck import Scenario
    from pytest_spikecheck.sweep import Sweep

    points = []
    for job in runs:
        point = {"seed": job["seed"], "optimizer.lr": job["lr"], "optimizer.grad_clip": job["clip"]}
        if job["kind"] == "broken":
            point["sampler.bursts"] = [{"count": job["count"], "at_step": job["at_step"], "content": job["content"]}]
        points.append(point)
    return Sweep(Scenario.preset("phase-19").replace(steps=STEPS), points=points, name="calibrate-detectors")


def measure(job: dict, run) -> dict:
    """Sweep every detector over the run's two series."""
    from pytest_spikecheck.judge.detectors import get_detector

    steps = np.asarray(run.metrics["step"])
    burst = job.get("at_step")
    quiet = steps < burst if burst else np.ones(steps.size, bool)
    window = (steps >= burst) & (steps < burst + DETECTION_WINDOW) if burst else np.zeros(steps.size, bool)
    outcomes: dict[str, dict[str, list]] = {}
    for name in CALIBRATED:
        base = get_detector(name)
        outcomes[name] = {}
        for metric in METRICS:
            values = np.asarray(run.metrics[metric], dtype=float)
            rows = []
            for threshold in thresholds(name):
                flagged = np.isin(steps, [d.step for d in base.with_threshold(threshold).detect(steps, values)])
                hits = steps[flagged & window]
                rows.append(
                    [
                        int((flagged & quiet).sum()),
                        int((flagged & quiet & (steps <= EARLY_STEPS)).sum()),
                        int(hits[0] - burst) if hits.size else None,
                    ]
                )
            outcomes[name][metric] = rows
    return {
        **job,
        "steps": int(steps.size),
        "quiet_steps": int(quiet.sum()),
        "early_quiet_steps": int((quiet & (steps <= EARLY_STEPS)).sum()),
        "stopped_early": run.stopped_early,
        "seconds": run.meta["seconds"],
        "outcomes": outcomes,
        "series": {m: [float(v) for v in run.metrics[m]] for m in METRICS},
    }


def summarise(records: list[dict], wall_seconds: float, jobs: int) -> dict:
    """Counts per detector, metric and threshold: everything the doc and the plot need."""

    clean = [r for r in records if r["kind"] == "clean"]
    broken = [r for r in records if r["kind"] == "broken"]
    quiet = sum(r["quiet_steps"] for r in records)
    early_quiet = sum(r["early_quiet_steps"] for r in records)
    detectors = {}
    for name in CALIBRATED:
        detectors[name] = {"thresholds": thresholds(name), "metrics": {}}
        for metric in METRICS:
            rows = []
            for k, threshold in enumerate(detectors[name]["thresholds"]):
                fp = sum(r["outcomes"][name][metric][k][0] for r in records)
                fp_early = sum(r["outcomes"][name][metric][k][1] for r in records)
                delays = {c: [r["outcomes"][name][metric][k][2] for r in broken if r["content"] == c] for c in CONTENT_MAX_COUNT}
                rows.append(
                    {
                        "threshold": threshold,
                        "fp_flags": fp,
                        "fp_flags_early": fp_early,
                        "detected": {c: sum(d is not None for d in ds) for c, ds in delays.items()},
                        "delays": sorted(d for ds in delays.values() for d in ds if d is not None),
                    }
                )
            detectors[name]["metrics"][metric] = rows
    return {
        "date": date.today().isoformat(),
        "machine": "2 CPU cores, torch 2.13.0 CPU, 1 thread per run",
        "steps": STEPS,
        "clean_runs": len(clean),
        "broken_runs": {c: sum(r["content"] == c for r in broken) for c in CONTENT_MAX_COUNT},
        "quiet_steps": quiet,
        "early_quiet_steps": early_quiet,
        "early_steps": EARLY_STEPS,
        "detection_window": DETECTION_WINDOW,
        "burst_steps": BURST_STEPS,
        "lr_range": LR_RANGE,
        "stopped_early": sum(r["stopped_early"] for r in records),
        "wall_seconds": round(wall_seconds, 1),
        "jobs": jobs,
        "defaults": {name: _default_threshold(name) for name in CALIBRATED},
        "detectors": detectors,
    }


def _default_threshold(name: str) -> float:
    from pytest_spikecheck.judge.detectors import get_detector

    d = get_detector(name)
    return float(getattr(d, d.threshold_name))


def _rates(row: dict, summary: dict, contents: tuple[str, ...]) -> tuple[float, float]:
    """(detection rate over ``contents``, false positives per 1,000 quiet steps)."""
    n = sum(summary["broken_runs"][c] for c in contents)
    detected = sum(row["detected"][c] for c in contents)
    return detected / n if n else math.nan, 1000 * row["fp_flags"] / summary["quiet_steps"]


def reaching(rows: list[dict], summary: dict, contents: tuple[str, ...], fp_budget: float) -> list[dict]:
    """The sweep's rows that reach TARGET_DETECTION within ``fp_budget``, by threshold."""
    out = []
    for row in rows:
        detection, fp = _rates(row, summary, contents)
        if detection >= TARGET_DETECTION and fp <= fp_budget:
            out.append({"threshold": row["threshold"], "detection": detection, "fp": fp})
    return out


def best_within(rows: list[dict], summary: dict, contents: tuple[str, ...], fp_budget: float) -> tuple[float, float]:
    """(best detection, its FP rate) among thresholds within ``fp_budget`` (nan if none is)."""
    rates = [_rates(r, summary, contents) for r in rows]
    within = [r for r in rates if r[1] <= fp_budget]
    return max(within) if within else (math.nan, math.nan)


def _pct(x: float) -> str:
    return "—" if math.isnan(x) else f"{100 * x:.0f} %"


def _count(row: dict, summary: dict, content: str) -> str:
    return f"{row['detected'][content]}/{summary['broken_runs'][content]}"


def write_doc(summary: dict) -> str:

    s = summary
    n_broken = sum(s["broken_runs"].values())
    every, unseen = tuple(CONTENT_MAX_COUNT), UNSEEN_CONTENT
    lines = [
        "# Spike detectors, calibrated",
        "",
        "How well each named detector of `pytest_spikecheck.judge.detectors` finds a declared burst, how often it",
        f"fires when nothing was declared, and how late. Measured {s['date']} on {s['machine']}: "
        f"**{s['clean_runs']} clean and {n_broken} broken Phase-19 runs** of {s['steps']} steps "
        f"({s['wall_seconds']:.0f} s wall clock with {s['jobs']} processes, on a machine shared with other jobs).",
        "",
        '**Runs.** Every run is `Scenario.preset("phase-19")` with a fuzzed seed, a peak learning rate drawn '
        f"log-uniformly from {s['lr_range'][0]:g}–{s['lr_range'][1]:g} and clip 1.0 or none (half each). A broken run "
        "adds one `RareTokenBurst`: content greek, caps or written (a third each: "
        + ", ".join(f"{n} {c}" for c, n in s["broken_runs"].items())
        + f"), count 1–8 (1–5 for *written*), at a step drawn from {s['burst_steps'][0]}–{s['burst_steps'][1]}. "
        f"{s['stopped_early']} runs stopped early (non-finite values).",
        "",
        f"**Definitions.** A broken run is *detected* when the detector flags a step in `[burst, burst + "
        f"{s['detection_window']})`; the *delay* is the first such step minus the burst step. *Quiet* steps are every step "
        f"of a clean run and the steps before the burst of a broken run ({s['quiet_steps']:,} in all); a flag there is a "
        "*false positive* (FP), counted per 1,000 quiet steps. Steps after a burst's window are its aftermath and count "
        f'neither way. "early" is the share of false positives in the first {s["early_steps"]} steps (warmup and the '
        "fast initial fall of the loss). Every detector runs with its published defaults except the swept threshold.",
        "",
        "## At the published defaults",
        "",
        "| detector | series | threshold | detected (all) | greek | caps | written | FP / 1,000 steps | early | median delay |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in CALIBRATED:
        det = s["detectors"][name]
        k = det["thresholds"].index(s["defaults"][name])
        for metric in METRICS:
            row = det["metrics"][metric][k]
            detection, fp = _rates(row, s, every)
            early = row["fp_flags_early"] / row["fp_flags"] if row["fp_flags"] else math.nan
            delay = statistics.median(row["delays"]) if row["delays"] else math.nan
            lines.append(
                f"| `{name}` | {metric} | {s['defaults'][name]:g} | {_pct(detection)} | {_count(row, s, 'greek')} | "
                f"{_count(row, s, 'caps')} | {_count(row, s, 'written')} | {fp:.2f} | {_pct(early)} | "
                f"{'—' if math.isnan(delay) else f'{delay:.0f}'} |"
            )
    lines += [
        "",
        "## Thresholds that reach the target",
        "",
        f"The target: ≥ {TARGET_DETECTION:.0%} detection at ≤ 1 % false positives per 1,000 steps. That reads two "
        f"ways, so both are shown: ≤ {FP_BUDGETS[0]:g} flags per 1,000 quiet steps (1 % of steps) and the stricter "
        f"≤ {FP_BUDGETS[1]:g} per 1,000. Each cell gives the swept thresholds that reach it and, at the largest of "
        "them (the fewest false positives), detection / FP per 1,000; where none does, the best detection "
        'inside the FP budget. "all" counts every broken run, "unseen" only the greek and caps bursts '
        "(content the model has never seen); *written* bursts are Seed A's rare word in otherwise familiar "
        "sentences.",
        "",
        f"| detector | series | all bursts, FP ≤ {FP_BUDGETS[0]:g} | all bursts, FP ≤ {FP_BUDGETS[1]:g} | "
        f"unseen content, FP ≤ {FP_BUDGETS[1]:g} |",
        "|---|---|---|---|---|",
    ]
    verdicts: dict[tuple[str, str], bool] = {}
    for name in CALIBRATED:
        det = s["detectors"][name]
        for metric in METRICS:
            cells = []
            for contents, budget in ((every, FP_BUDGETS[0]), (every, FP_BUDGETS[1]), (unseen, FP_BUDGETS[1])):
                ok = reaching(det["metrics"][metric], s, contents, budget)
                if ok:
                    lo, hi = ok[0]["threshold"], ok[-1]["threshold"]
                    span = f"{lo:g}" if lo == hi else f"{lo:g}–{hi:g}"
                    cells.append(f"**{det_name(name)} {span}**: {_pct(ok[-1]['detection'])} / {ok[-1]['fp']:.2f}")
                else:
                    detection, fp = best_within(det["metrics"][metric], s, contents, budget)
                    cells.append(f"none (best {_pct(detection)} / {fp:.2f})")
                if contents == every and budget == FP_BUDGETS[1]:
                    verdicts[(name, metric)] = bool(ok)
            lines.append(f"| `{name}` | {metric} | " + " | ".join(cells) + " |")
    lines += ["", "## What this says", ""]
    lines += _conclusions(s, verdicts)
    lines += [
        "",
        f"![ROC per detector]({PLOT.name})",
        "",
        "Each panel sweeps one detector's threshold over both series: detection rate over all broken runs "
        "(solid) and over the unseen-content bursts only (dotted) against false positives per 1,000 quiet "
        "steps (symmetric log scale: 0 at the left edge); the ring marks the published default, the shaded "
        "corner the target at ≤ 10 per 1,000.",
        "",
        "## Recipe",
        "",
        "*Not run by the docs test: the calibration trains 160 runs (about 5 minutes on 2 cores) and rewrites this page.*",
        "```bash",
        f"python scripts/calibrate_detectors.py --jobs 2   # ~{s['wall_seconds'] / 60:.0f} min on 2 cores: trains, sweeps, "
        "writes this page, the plot and docs/detectors_calibration.json",
        "python scripts/calibrate_detectors.py --report   # rewrite this page and the plot from the JSON",
        "python scripts/real_log_table.py                 # ~30 s: rewrite the real-log section (keeps the rest)",
        "```",
        "",
    ]
    return "\n".join(lines)


def det_name(name: str) -> str:
    from pytest_spikecheck.judge.detectors import get_detector

    return get_detector(name).threshold_name


#: Why a detector cannot reach the target on single-batch bursts, shown only when it does not.
WHY_NOT = {
    "llm-foundry": "it flags only after `patience` (4) consecutive steps above its threshold, and a burst fills one "
    "batch: the loss is back at the next step",
    "megatron": "its reference is the largest value of the first 100 steps, when the loss is still near ln(vocab) "
    "and the gradient norm at its early peak; a burst hundreds of steps later rarely exceeds it, so only "
    "thresholds below 1 fire",
}


def _conclusions(s: dict, verdicts: dict[tuple[str, str], bool]) -> list[str]:

    out = []
    at_default = []
    for name in CALIBRATED:
        for metric in METRICS:
            det = s["detectors"][name]
            row = det["metrics"][metric][det["thresholds"].index(s["defaults"][name])]
            detection, fp = _rates(row, s, tuple(CONTENT_MAX_COUNT))
            if detection >= TARGET_DETECTION and fp <= FP_BUDGETS[1]:
                at_default.append(f"`{name}` on {metric} ({_pct(detection)}, {fp:.2f} FP per 1,000)")
    if at_default:
        out.append(f"- **At their published defaults**, {', '.join(at_default)} already meet the strict target over every burst.")
    reached = sorted({n for (n, _), ok in verdicts.items() if ok})
    if reached:
        out.append(
            "- With a calibrated threshold, the strict target (≤ 1 FP per 1,000 quiet steps) over every burst is "
            "reached by " + ", ".join(f"`{n}` on " + " and ".join(m for m in METRICS if verdicts[(n, m)]) for n in reached) + "."
        )
    for name in CALIBRATED:
        if not any(verdicts[(name, m)] for m in METRICS):
            why = f": {WHY_NOT[name]}" if name in WHY_NOT else ""
            out.append(f"- `{name}` reaches the strict target on neither series{why}.")
    loss_only = [n for n in CALIBRATED if verdicts[(n, "loss")] and not verdicts[(n, "grad_norm_pre")]]
    if loss_only:
        out.append(
            "- On the loss, " + ", ".join(f"`{n}`" for n in loss_only) + " reach the strict target where the "
            "pre-clip norm does not: the *written* bursts are what the norm misses. Three *written* sentences "
            "lift the batch loss 0.63 → 2.98 but the global gradient norm only 3.5× (docs/fidelity.md), within "
            "the norm's ordinary variation."
        )
    defaults = [d["metrics"][m][d["thresholds"].index(s["defaults"][n])] for n, d in s["detectors"].items() for m in METRICS]
    early, total = sum(r["fp_flags_early"] for r in defaults), sum(r["fp_flags"] for r in defaults)
    if total:
        out.append(
            f"- At the published defaults, {early} of the {total} false-positive flags (every detector, both "
            f"series) fall in the first {s['early_steps']} steps: {early / total:.0%} of the flags on "
            f"{s['early_quiet_steps'] / s['quiet_steps']:.0%} of the quiet steps. Warm-up draws more than its share."
        )
    olmo_loss = s["detectors"]["olmo-core"]["metrics"]["loss"][0]
    if olmo_loss["fp_flags"] == 0:
        out.append(
            f"- The train loss falls throughout these runs (240 sentences, memorised over the run), so a trailing "
            f"mean sits above it: `olmo-core` flags no quiet step of the loss even at "
            f"{olmo_loss['threshold']:g}σ. Loss rules look this good only on a loss that keeps falling."
        )
    out.append(
        "- These are Phase-19 numbers: one corpus, one model size, bursts of one batch. A threshold calibrated "
        "here is a starting point for another model, not a transferable constant; rerun the script on yours."
    )
    return out


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(13, 8), sharey=True)
    colors = {"grad_norm_pre": "tab:blue", "loss": "tab:orange"}
    for ax, name in zip(axes.flat, CALIBRATED):
        det = summary["detectors"][name]
        k_default = det["thresholds"].index(summary["defaults"][name])
        ax.add_patch(
            plt.Rectangle((0, TARGET_DETECTION), FP_BUDGETS[0], 1.02 - TARGET_DETECTION, color="tab:green", alpha=0.12, lw=0)
        )
        for metric in METRICS:
            rows = det["metrics"][metric]
            for contents, style in ((tuple(CONTENT_MAX_COUNT), "-"), (UNSEEN_CONTENT, ":")):
                pts = [_rates(r, summary, contents) for r in rows]
                fp = [p[1] for p in pts]
                tpr = [p[0] for p in pts]
                ax.plot(
                    fp,
                    tpr,
                    style,
                    color=colors[metric],
                    marker="." if style == "-" else None,
                    label=f"{metric} ({'all bursts' if style == '-' else 'unseen content'})",
                )
                ax.plot(fp[k_default], tpr[k_default], "o", mfc="none", mec="black", ms=9)
        ax.set_xscale("symlog", linthresh=0.1)
        ax.set_xlim(0, 1000)
        ax.set_ylim(0, 1.02)
        ax.set_title(f"{name} (sweeping {det_name(name)})")
        ax.set_xlabel("false positives per 1,000 quiet steps")
        ax.grid(alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel("detection rate")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=9)
    n_broken = sum(summary["broken_runs"].values())
    fig.suptitle(
        f"Spike detectors on Phase-19: {summary['clean_runs']} clean + {n_broken} broken runs of "
        f"{summary['steps']} steps ({summary['date']})"
    )
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clean", type=int, default=40, metavar="N", help="clean runs. Default: %(default)s")
    parser.add_argument(
        "--broken", type=int, default=120, metavar="N", help="broken runs (a third per content). Default: %(default)s"
    )
    parser.add_argument("--report", action="store_true", help=f"rewrite {DOC} and {PLOT} from {SUMMARY}, train nothing")
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=Path("."),
        metavar="DIR",
        help="where docs/ and out/ are written (default: the current directory)",
    )
    add_sweep_arguments(parser, seeds=False)
    args = parser.parse_args()
    doc, summary_path, plot_path, raw = (args.out_dir / p for p in (DOC, SUMMARY, PLOT, RAW))
    if args.report:
        summary = json.loads(summary_path.read_text())
    else:
        from pytest_spikecheck.sweep import sweep

        runs = design(args.clean, args.broken)
        started = time.perf_counter()
        result = sweep(
            plan(runs),
            executor=args.executor,
            address=args.address,
            jobs=args.jobs,
            out=Path(args.runs) / "calibrate-detectors",
            fresh=args.fresh,
        )
        if result.failed:
            raise SystemExit(f"{len(result.failed)} runs failed, first {result.failed[0]['point']}: {result.failed[0]['error']}")
        records = [measure(job, run) for job, run in zip(runs, result.runs)]
        summary = summarise(records, time.perf_counter() - started, args.jobs)
        raw.parent.mkdir(parents=True, exist_ok=True)
        raw.write_text(json.dumps(records))
        summary_path.parent.mkdir(parents=True, exist_ok=True)
        summary_path.write_text(json.dumps(summary, indent=1))
    doc.parent.mkdir(parents=True, exist_ok=True)
    text = write_doc(summary)
    old = doc.read_text() if doc.exists() else ""
    if REAL_LOGS_START in old and REAL_LOGS_END in old:
        kept = old[old.index(REAL_LOGS_START) : old.index(REAL_LOGS_END) + len(REAL_LOGS_END)]
        text = text.replace("\n## At the published defaults", f"\n{kept}\n\n## At the published defaults", 1)
    doc.write_text(text)
    plot(summary, plot_path)
    print(f"wrote {doc}, {plot_path}, {summary_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
