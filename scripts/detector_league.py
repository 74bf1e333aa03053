"""The detector league of issue 35: our default policy against the spike rules other frameworks
ship, on the held-out split of the labelled real-log corpus (tests/data/reallogs, scored as
tests/reallogs.py scores it), and on the whole corpus beside it. Writes the league section of
docs/detectors.md.

    python scripts/detector_league.py            # 6.5 min on 2 loaded cores, the engine runs trained: rewrite the section
    python scripts/detector_league.py --print    # print it instead

Entrants, each on the series its framework watches (a named rule also sees every non-finite value
of that series as a flag, as our detectors do):

- **ours**: ``spikecheck check``'s default policy (loss-jump, loss-sustained on the loss; grad-ratio on
  the pre-clip norm; logit-growth on ``attn_logit_max`` where the record has it, as every engine run's
  does; the finiteness decisions).
- **Lightning** ``SpikeDetection`` (lightning.fabric.utilities.spike, the installed class itself, at its
  defaults: window 10, rtol 2.0, warmup 1, finite_only): fed the logged loss point by point through a
  stand-in Fabric on one CPU process; a flag is each TrainingSpikeException it raises (it stops training
  at the first; here the next points are fed on so its false alarms can be counted).
- **llm-foundry** ``KillLossSpike`` (mosaicml/llm-foundry llmfoundry/callbacks/kill_loss_spike_callback.py):
  the loss above 2 x the mean of its window for more than ``patience`` (4) steps; our ``llm-foundry``
  detector, from that file.
- **OLMo-core** (allenai/OLMo-core's spike z-score): value > mean + 6 sigma over 128 steps, on the loss and
  the grad norm; our ``olmo-core`` detector.
- **ZClip** (the ``zclip`` package, 1.0.0, the installed class itself: ``pip install --dry-run zclip``
  keeps torch 2.13.0+cpu), at its defaults (alpha 0.97, z_thresh 2.5, warmup_steps 25, mode zscore,
  clip_option adaptive_scaling) but ``max_grad_norm=None`` (its fixed max-norm clip is a separate
  defence, not its detector): fed the logged grad norm point by point as the gradient of a one-element
  parameter; a flag is each step at which it computes an adaptive clip value (its z-score above 2.5),
  seen through a subclass that records ``_apply_clipping``'s ``clip_val``. A NaN norm enters its EMA as
  its code does (and blinds it from then on).
- **Megatron-Bridge** (loss >= 10 x its reference, the factor hard-coded 10); our ``megatron`` detector.
- **FlagScale** ``SpikyLossDetector`` (FlagOpen/FlagScale flagscale/train/spiky_loss.py, commit e6e5643):
  ``(loss - last) / last >= 0.2`` flags; an unflagged loss becomes ``last``; a NaN loss (or a NaN
  ``last``) silently becomes the new ``last``, unflagged; an infinite one flags. Implemented below from
  that file.

Columns: *events found* (a labelled onset with a flag within +-2 logged intervals), *healthy logs flagged*
(negative logs with any flag), *false alarms per 10,000 healthy steps* (flags on negative logs per 10,000
of their logged points), *latency* (median and largest, over the found events, of the steps from the onset
to the first flag within the window, 0 for a flag up to 2 intervals early). Engine runs with known event steps
are the third table. Muon's max-logit explosion (Phase-19, Muon lr 0.4, no weight decay, seed 42, 150 steps,
as scenarios/test_muon_max_logit.py) has a table of its own: its event is the attention logit, which none of
the frameworks' rules watch, and its latency column counts the steps from each entrant's first flag to the
step the loss diverges (ln 2 nats above its running minimum, the loss-jump floor), where it does.
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from reallogs import ROOT as LOGS, TOLERANCE_INTERVALS, corpus  # noqa: E402

from pytest_spikecheck.errors import ConfigError  # noqa: E402
from pytest_spikecheck.judge.detectors import get_detector, log_interval  # noqa: E402
from pytest_spikecheck.judge.policy import judge_log, pick_metric  # noqa: E402
from pytest_spikecheck.records.logs import read_runs  # noqa: E402

DOC = ROOT / "docs" / "detectors.md"
START, END = "<!-- league:start -->", "<!-- league:end -->"


def flagscale(steps: np.ndarray, values: np.ndarray, threshold: float = 0.2) -> list[int]:
    last, out = None, []
    for s, loss in zip(steps.tolist(), values.tolist()):
        if last is None:
            last = loss
        elif math.isnan(loss) or math.isnan(last):
            last = loss
        elif math.isinf(loss) or math.isinf(last):
            out.append(s)
        elif last == 0:
            last = loss  # FlagScale's code would divide by zero here (an RL surrogate at 0): unflagged
        elif (loss - last) / last >= threshold:
            out.append(s)
        else:
            last = loss
    return out


def lightning(steps: np.ndarray, values: np.ndarray) -> list[int]:
    import torch
    from lightning.fabric.utilities.spike import SpikeDetection, TrainingSpikeException

    strategy = SimpleNamespace(
        root_device=torch.device("cpu"), barrier=lambda: None, reduce_boolean_decision=lambda decision, all=True: decision
    )
    fabric = SimpleNamespace(strategy=strategy, global_rank=1)  # not rank 0: it writes no skip file
    detector = SpikeDetection()
    out = []
    with warnings.catch_warnings():
        # torchmetrics warns that it drops a NaN from its running mean; the class's own behaviour, kept
        warnings.simplefilter("ignore", UserWarning)
        for i, (s, v) in enumerate(zip(steps.tolist(), values.tolist())):
            try:
                detector.on_train_batch_end(fabric, torch.tensor(v, dtype=torch.float64), None, i)
            except TrainingSpikeException:
                out.append(s)
    return out


def zclip(steps: np.ndarray, values: np.ndarray) -> list[int]:
    import torch
    from zclip import ZClip

    class Watched(ZClip):
        flagged = False

        def _apply_clipping(self, model, clip_val, total_norm):
            self.flagged = clip_val is not None
            return super()._apply_clipping(model, clip_val, total_norm)

    detector = Watched(max_grad_norm=None)
    param = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    model = torch.nn.Module()
    model.p = param
    out = []
    for s, v in zip(steps.tolist(), values.tolist()):
        param.grad = torch.tensor([v], dtype=torch.float64)  # a gradient whose norm is the logged one
        detector.flagged = False
        detector.step(model)
        if detector.flagged:
            out.append(s)
    return out


def named(name: str):
    rule = get_detector(name)
    return lambda steps, values: [d.step for d in rule.detect(steps, values)]


#: entrant -> (rule on the loss, rule on the grad norm), None where the framework watches no such series
ENTRANTS = {
    "Lightning SpikeDetection (the class)": (lightning, None),
    "llm-foundry KillLossSpike": (named("llm-foundry"), None),
    "OLMo-core z-score": (named("olmo-core"), named("olmo-core")),
    "ZClip (the package)": (None, zclip),
    "Megatron-Bridge (factor 10)": (named("megatron"), None),
    "FlagScale SpikyLossDetector": (flagscale, None),
}


def _series(record, metric: str):
    try:
        name = pick_metric(record, metric)
    except Exception:
        return None
    steps, values = record.series(name)
    return np.asarray(steps, dtype=np.int64), np.asarray(values, dtype=np.float64)


def flags_of(entry: dict, entrant: str) -> tuple[list[tuple[int, int]], int] | None:
    """[(step, interval)] of every flag over the runs of a corpus file, and its logged points; None
    where the file is refused."""
    try:
        runs = read_runs(LOGS / entry["file"])
    except ConfigError:
        return None
    out, points = [], 0
    for record in runs:
        if entrant == "ours":
            report = judge_log(record)
            for s in report["series"]:
                out += [(h["step"], s["interval"] or 0) for h in s["spikes"]]
            logged = [s["logged"] for s in report["series"] if s["status"] != "skipped"]
            points += max(logged, default=0)
            if report["nonfinite"] is not None:
                out.append((report["nonfinite"]["step"], 0))
            continue
        loss_rule, grad_rule = ENTRANTS[entrant]
        longest = 0
        for rule, metric in ((loss_rule, "loss"), (grad_rule, "grad_norm_pre")):
            data = _series(record, metric) if rule is not None else None
            if data is None or data[0].size == 0:
                continue
            interval = log_interval(data[0]) or 0
            out += [(s, interval) for s in rule(*data)]
            longest = max(longest, int(data[0].size))
        points += longest
    return out, points


def score(entrant: str, entries: list[dict]) -> dict:
    found = onsets = negatives = flagged = false_alarms = healthy_points = 0
    latencies = []
    for entry in entries:
        if entry["label"] == "unreadable":
            continue
        result = flags_of(entry, entrant)
        spikes = entry["spikes"] or []
        onsets += len(spikes)
        if result is None:
            continue
        flags, points = result
        for onset in spikes:
            near = sorted(s - onset for s, iv in flags if abs(s - onset) <= TOLERANCE_INTERVALS * iv)
            if near:
                found += 1
                latencies.append(max(0, near[0]))
        if not spikes:
            negatives += 1
            flagged += bool(flags)
            false_alarms += len(flags)
            healthy_points += points
    return {
        "found": found,
        "onsets": onsets,
        "negatives": negatives,
        "flagged": flagged,
        "per_10k": 10_000 * false_alarms / healthy_points if healthy_points else math.nan,
        "latency": float(np.median(latencies)) if latencies else math.nan,
        "worst": float(np.max(latencies)) if latencies else math.nan,
    }


#: Engine runs (the project's own experiments/, trained by `spikecheck train`): (name, folder or None for
#: a plain Phase-19 run of 150 steps, event step (0: the break acts from the first step, so any flag
#: finds it, the latency counted from step 1), None for a clean run).
ENGINE = (
    ("Seed-42 greek burst, no clip (19-break-no-clip)", "19-break-no-clip", 312),
    ("Seed-42 greek burst, clipped (19-control: the batch is still the burst)", "19-control", 312),
    ("high LR 0.1 (high-lr-break)", "high-lr-break", 0),
    ("fp16 burst, the scaler skips the step (fp16-accumulation)", "fp16-accumulation", 24),
    ("high LR 0.1 + QK-LayerNorm (high-lr-qk-layernorm), clean", "high-lr-qk-layernorm", None),
    ("Phase-19, seed 42, 150 steps, no break, clean", None, None),
)


#: Muon's max-logit explosion: its config (scenarios/test_muon_max_logit.py's recipe at seed 42) and the
#: logit bound that dates the event (Kimi K2's tau, QK-Clip's default).
MUON_CONFIG = "preset: phase-19\nseed: 42\nsteps: 150\noptimizer: {name: muon, lr: 0.4, weight_decay: 0.0}\n"
MUON_TAU = 100.0


def _trained(out: Path, name: str, config: str) -> Path:
    from pytest_spikecheck.cli.commands import main as spikecheck

    target = out / name
    if not (target / "metrics.jsonl").exists():
        source = out / f"{name}-config"
        source.mkdir(parents=True, exist_ok=True)
        (source / "config.yaml").write_text(config)
        spikecheck(["train", str(source), "--out", str(target), "--quiet"])
    return target / "metrics.jsonl"


def loss_divergence(steps: np.ndarray, loss: np.ndarray) -> int | None:
    """The first step whose loss is ln 2 nats or more above the lowest loss before it (non-finite: diverged)."""
    low = math.inf
    for s, v in zip(steps.tolist(), loss.tolist()):
        if not math.isfinite(v) or v >= low + math.log(2):
            return int(s)
        low = min(low, v)
    return None


def muon_table(out: Path) -> str:
    record = read_runs(_trained(out, "muon-max-logit", MUON_CONFIG))[0]
    steps = np.asarray(record.metrics["step"])
    logits, loss = np.asarray(record.metrics["attn_logit_max"]), np.asarray(record.metrics["loss"])
    onset = int(steps[np.flatnonzero(logits > MUON_TAU)[0]])
    diverged = loss_divergence(steps, loss)
    low = np.minimum.accumulate(loss)
    rise = loss - np.concatenate([[np.inf], low[:-1]])
    worst = int(np.argmax(rise[1:])) + 1
    first = {
        "ours: assert_logits_bounded(attention=100) on attn_logit_max": [int(steps[np.flatnonzero(logits > MUON_TAU)[0]])],
        "**ours** (default policy)": engine_flags(out / "muon-max-logit" / "metrics.jsonl", "ours")[0],
    }
    first.update({name: engine_flags(out / "muon-max-logit" / "metrics.jsonl", name)[0] for name in ENTRANTS})
    lines = [
        f"**Muon's max-logit explosion** (Phase-19, Muon lr 0.4 on the hidden matrices, no weight decay, seed 42, "
        f"{steps.size} steps): the largest attention logit passes {MUON_TAU:g} (Kimi K2's tau) at step {onset} and "
        f"reaches {logits.max():,.0f}; the loss "
        + (
            f"diverges (ln 2 above its running minimum) at step {diverged}."
            if diverged is not None
            else f"never diverges in {steps.size} steps: its largest rise above its running minimum is "
            f"{rise[worst]:+.2f} nats (step {int(steps[worst])}) and it ends at {loss[-1]:.2f}: the model stops "
            f"learning while the logit grows, it does not blow up (the loss-based latency has no end point)."
        ),
        "",
        "| entrant | first flag (step) | steps after the logit passes tau | steps before the loss diverges |",
        "|---|---|---|---|",
    ]
    for name, flags in first.items():
        f = min(flags) if flags else None
        lines.append(
            f"| {name} | {f if f is not None else '—'} | {f - onset if f is not None else '—'} | "
            f"{(diverged - f if diverged is not None else 'the loss does not diverge') if f is not None else '—'} |"
        )
    return "\n".join(lines + [""])


def engine_runs(out: Path) -> list[tuple[str, Path, int | None]]:
    """Train (or reuse) the engine runs under ``out``; (name, metrics.jsonl, event step)."""
    from pytest_spikecheck.cli.commands import main as spikecheck

    runs = []
    for name, folder, event in ENGINE:
        target = out / (folder or "phase19-clean")
        metrics = target / "metrics.jsonl"
        if not metrics.exists():
            source = ROOT / "experiments" / folder if folder else None
            if source is None:
                source = out / "phase19-clean-config"
                source.mkdir(parents=True, exist_ok=True)
                (source / "config.yaml").write_text("preset: phase-19\nseed: 42\nsteps: 150\n")
            spikecheck(["train", str(source), "--out", str(target), "--quiet"])
        runs.append((name, metrics, event))
    return runs


def engine_flags(path: Path, entrant: str) -> tuple[list[int], int]:
    record = read_runs(path)[0]
    if entrant == "ours":
        report = judge_log(record)
        flags = [h["step"] for s in report["series"] for h in s["spikes"]]
        if report["nonfinite"] is not None:
            flags.append(report["nonfinite"]["step"])
        return flags, int(record.metrics["step"].size)
    flags = []
    loss_rule, grad_rule = ENTRANTS[entrant]
    for rule, metric in ((loss_rule, "loss"), (grad_rule, "grad_norm_pre")):
        data = _series(record, metric) if rule is not None else None
        if data is not None and data[0].size:
            flags += rule(*data)
    return flags, int(record.metrics["step"].size)


def engine_score(entrant: str, runs) -> dict:
    found = onsets = negatives = flagged = false_alarms = healthy = 0
    latencies = []
    for _, path, event in runs:
        flags, steps = engine_flags(path, entrant)
        if event is None:
            negatives += 1
            flagged += bool(flags)
            false_alarms += len(flags)
            healthy += steps
            continue
        onsets += 1
        start = max(event, 1)
        near = sorted(f - start for f in flags if (event == 0 or abs(f - event) <= TOLERANCE_INTERVALS))
        if near:
            found += 1
            latencies.append(max(0, near[0]))
    return {
        "found": found,
        "onsets": onsets,
        "negatives": negatives,
        "flagged": flagged,
        "per_10k": 10_000 * false_alarms / healthy if healthy else math.nan,
        "latency": float(np.median(latencies)) if latencies else math.nan,
        "worst": float(np.max(latencies)) if latencies else math.nan,
    }


def engine_table(out: Path) -> str:
    runs = engine_runs(out)
    listing = "; ".join(f"{name} (event {'from step 1' if e == 0 else e if e else 'none'})" for name, _, e in runs)
    return "\n".join(
        [
            f"**engine runs** ({listing}; trained by `spikecheck train`, CPU, seed 42):",
            "",
            "| entrant | events found | clean runs flagged | false alarms / 10,000 clean steps | latency, steps: median (max) |",
            "|---|---|---|---|---|",
            _row("**ours** (default policy)", engine_score("ours", runs)),
            *[_row(name, engine_score(name, runs)) for name in ENTRANTS],
            "",
        ]
    )


def _row(name: str, s: dict) -> str:
    lat = "—" if math.isnan(s["latency"]) else f"{s['latency']:g} (max {s['worst']:g})"
    return f"| {name} | {s['found']}/{s['onsets']} | {s['flagged']}/{s['negatives']} | {s['per_10k']:.1f} | {lat} |"


def table(splits: tuple[str, ...] = ("heldout", "all")) -> str:
    entries = corpus()
    lines = []
    for split in splits:
        chosen = entries if split == "all" else [e for e in entries if e["split"] == split]
        title = "held-out split (never tuned on)" if split == "heldout" else "whole corpus (tune + held-out)"
        lines += [
            f"**{title}**, {len(chosen)} files:",
            "",
            "| entrant | events found | healthy logs flagged | false alarms / 10,000 healthy steps | latency, steps: median (max) |",
            "|---|---|---|---|---|",
            _row("**ours** (default policy)", score("ours", chosen)),
            *[_row(name, score(name, chosen)) for name in ENTRANTS],
            "",
        ]
    return "\n".join(lines)


def section(body: str) -> str:
    return "\n".join(
        [
            START,
            "## The detector league (issue 35)",
            "",
            "Generated by `python scripts/detector_league.py` (its docstring names every entrant's "
            "source and how it was run); `tests/test_detector_league.py` checks the held-out table "
            "below against the script. Measured 2026-12-02 on the 2-core AMD EPYC VM, under load.",
            "",
            body,
            END,
        ]
    )


def committed_body(text: str) -> str:
    inner = text[text.index(START) + len(START) : text.index(END)]
    return inner


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", action="store_true", help="print the section instead of writing it")
    parser.add_argument(
        "--runs",
        type=Path,
        default=ROOT / ".cache" / "detector_league",
        help="where the engine runs are trained (reused when there)",
    )
    args = parser.parse_args()
    text = section(table() + "\n" + engine_table(args.runs) + "\n" + muon_table(args.runs))
    if args.print:
        print(text)
        return 0
    from _doc_section import write_section

    write_section(DOC, text, START, END, "league")
    return 0


if __name__ == "__main__":
    sys.exit(main())
