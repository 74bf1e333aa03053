"""The labelled real-log corpus (tests/data/reallogs) and how a judgement is scored on it.

Shared by tests/test_reallogs.py (the goal, and the two doors agreeing) and
scripts/real_log_table.py (the table in docs/detectors.md), so both count the same way:

- a labelled spike onset is **found** when the judgement flags a step of any checked series
  within ±2 logged intervals of it (the interval of that file's series: the median gap
  between its logged steps); labels mark the first clearly abnormal point and a rule may
  fire one point later on a noisy series;
- a **negative** log is one labelled ``clean``, or ``rl_surrogate`` with no spike listed; it
  is **flagged** when the judgement fails it (a spike or a non-finite value);
- an ``unreadable`` log must be refused with one clear line (ConfigError: exit 2);
- **points judged**: per checked series, the most values any of its rules could judge.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.judge.policy import judge_log
from pytest_spikecheck.records.logs import read_runs

ROOT = Path(__file__).parent / "data" / "reallogs"
TOLERANCE_INTERVALS = 2


def corpus() -> list[dict]:
    return yaml.safe_load((ROOT / "corpus.yaml").read_text())


def judge_entry(entry: dict, detectors: tuple[str, ...] = ()) -> dict | None:
    """The judgement of one corpus file, every run it holds together (series of all runs; ok
    when every run is; judged when any is); None where the reader refuses it."""
    try:
        reports = [judge_log(record, detectors) for record in read_runs(ROOT / entry["file"])]
    except ConfigError:
        return None
    return {
        "series": [s for r in reports for s in r["series"]],
        "ok": all(r["ok"] for r in reports),
        "judged": any(r["judged"] for r in reports),
        "runs": reports,
    }


@dataclass
class Score:
    onsets: int = 0
    found: int = 0
    missed: list[str] = field(default_factory=list)
    negatives: int = 0
    flagged: list[str] = field(default_factory=list)
    negative_flags: int = 0
    negative_points: int = 0
    points: int = 0
    judged: int = 0
    unjudged_logs: list[str] = field(default_factory=list)
    unreadable_ok: int = 0
    unreadable_wrong: list[str] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)  # readable logs the reader refused

    @property
    def detection(self) -> float:
        return self.found / self.onsets if self.onsets else float("nan")

    @property
    def clean_flagged(self) -> float:
        return len(self.flagged) / self.negatives if self.negatives else float("nan")

    @property
    def flags_per_1000(self) -> float:
        return 1000 * self.negative_flags / self.negative_points if self.negative_points else float("nan")


def split(name: str) -> list[dict]:
    """The corpus entries of one split: ``tune`` (the rules were calibrated on these) or
    ``heldout`` (added with issue 24 and never tuned on)."""
    return [e for e in corpus() if e["split"] == name]


def score(detectors: tuple[str, ...] = (), entries: list[dict] | None = None) -> Score:
    """The default policy (``detectors=()``) or the named detectors, scored on the corpus."""
    out = Score()
    for entry in entries if entries is not None else corpus():
        report = judge_entry(entry, detectors)
        if entry["label"] == "unreadable":
            out.unreadable_ok += report is None
            if report is not None:
                out.unreadable_wrong.append(entry["file"])
            continue
        onsets = entry["spikes"] or []
        out.onsets += len(onsets)
        if report is None:
            out.missed += [f"{entry['file']}@{o} (unreadable)" for o in onsets]
            out.unread.append(entry["file"])
            continue
        judged_series = [s for s in report["series"] if s["status"] != "skipped"]
        out.points += sum(s["logged"] for s in judged_series)
        out.judged += sum(s.get("judged", 0) for s in judged_series)
        if not report["judged"]:
            out.unjudged_logs.append(entry["file"])
        for onset in onsets:
            hit = any(
                abs(h["step"] - onset) <= TOLERANCE_INTERVALS * (s["interval"] or 0)
                for s in report["series"]
                for h in s["spikes"]
            )
            out.found += hit
            if not hit:
                out.missed.append(f"{entry['file']}@{onset}")
        if not onsets:
            out.negatives += 1
            flags = sum(len(s["spikes"]) for s in report["series"])
            out.negative_flags += flags
            out.negative_points += sum(s["logged"] for s in judged_series)
            if not report["ok"]:
                out.flagged.append(entry["file"])
    return out
