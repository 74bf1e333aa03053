"""The default policy's rule on the largest attention logit (issue 35: "a logit-growth monitor
should fire long before the loss does"), on the attn_logit_max of recorded engine runs
(tests/data/logit_runs.json: 5 explosions, 13 clean runs) and on small arrays."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from pytest_spikecheck.judge.logit_growth import LogitGrowth, for_record
from pytest_spikecheck.judge.policy import POLICY, judge_log, log_verdicts
from pytest_spikecheck.records.series import Record

RUNS = json.loads((Path(__file__).parent / "data" / "logit_runs.json").read_text())["runs"]
#: Kimi K2's tau: assert_logits_bounded(run, attention=100) fails on the Muon run at step 29.
TAU = 100.0


def _record(name: str, facts=None, **extra) -> Record:
    logits = np.asarray(RUNS[name]["attn_logit_max"], dtype=np.float64)
    steps = np.arange(1, logits.size + 1)
    loss = np.full(logits.size, 2.0)  # a flat loss: whatever is flagged is the logit rule's
    return Record(
        metrics={"step": steps, "loss": loss, "attn_logit_max": logits, **extra}, source=name, log_format="jsonl", facts=facts
    )


def _logit_flags(report: dict) -> list[int]:
    return [h["step"] for s in report["series"] if s["metric"] == "attn_logit_max" for h in s["spikes"]]


def test_the_policy_flags_muons_max_logit_explosion_before_the_logit_passes_tau():
    logits = np.asarray(RUNS["muon-max-logit"]["attn_logit_max"])
    passes_tau = int(np.flatnonzero(logits > TAU)[0]) + 1
    report = judge_log(_record("muon-max-logit"))
    assert passes_tau == 29 and _logit_flags(report) == [15]  # one episode, 14 steps before tau
    assert not report["ok"] and "logit-growth" in report["detectors"]
    first = next(v for v in log_verdicts(report) if not v.passed)
    assert first.reason == "the default policy flagged a attn_logit_max spike at step 15 (logit-growth)"


@pytest.mark.parametrize("name", [n for n, r in RUNS.items() if r["explodes"]])
def test_every_explosion_is_flagged_before_tau(name):
    logits = np.asarray(RUNS[name]["attn_logit_max"])
    flags = _logit_flags(judge_log(_record(name)))
    assert flags and flags[0] < int(np.flatnonzero(logits > TAU)[0]) + 1, flags


@pytest.mark.parametrize("name", [n for n, r in RUNS.items() if not r["explodes"]])
def test_no_clean_run_is_flagged(name):
    tau = RUNS[name]["qk_clip_tau"]
    rule = LogitGrowth() if tau is None else LogitGrowth(growth=None, bound=2 * tau)
    logits = np.asarray(RUNS[name]["attn_logit_max"])
    assert rule.detect(np.arange(1, logits.size + 1), logits) == []
    if tau is None:
        assert _logit_flags(judge_log(_record(name))) == []


def test_the_constants_have_their_measured_margins():
    """growth 10x in 10 steps from 10 up: the clean runs' largest 10-step growth above a logit of 10
    is 4.6x (Seed B's new source), the explosions' smallest 43.9x; below 10 a clean run's logits grow
    from their ~0.1 initial values by up to 19x in 10 steps."""

    def largest_growth(name, floor):
        a = np.asarray(RUNS[name]["attn_logit_max"])
        return max((a[i] / a[i - 10] for i in range(10, a.size) if a[i] >= floor), default=0.0)

    clean = [n for n, r in RUNS.items() if not r["explodes"] and r["qk_clip_tau"] is None]
    exploding = [n for n, r in RUNS.items() if r["explodes"]]
    assert max(largest_growth(n, 10) for n in clean) == pytest.approx(4.6, abs=0.05)
    assert min(largest_growth(n, 10) for n in exploding) == pytest.approx(43.9, abs=0.05)
    assert max(largest_growth(n, 0) for n in clean) > 10  # why the floor
    assert max(max(RUNS[n]["attn_logit_max"]) for n in clean) < 60 < TAU  # 52.9: the bound's margin


def _qk_clip_facts(tau: float):
    return type("Facts", (), {"qk_clip": type("QKClip", (), {"tau": tau})()})()


def test_with_qk_clip_the_bound_is_twice_tau_and_the_growth_up_to_tau_is_by_design():
    # The QK-Clip run grows 43.9x in 10 steps, as the break does, until QK-Clip acts at tau 100.
    rec = _record("muon-qk-clip", facts=_qk_clip_facts(TAU))
    assert for_record(rec) == LogitGrowth(growth=None, bound=200.0)
    assert judge_log(rec)["ok"] and _logit_flags(judge_log(rec)) == []
    assert _logit_flags(judge_log(_record("muon-qk-clip"))) == [15]  # a record that does not say QK-Clip was on
    over = _record("muon-max-logit", facts=_qk_clip_facts(TAU))  # "QK-Clip on" yet the logits reach 2,429
    assert _logit_flags(judge_log(over)) == [
        int(np.flatnonzero(np.asarray(RUNS["muon-max-logit"]["attn_logit_max"]) > 200)[0]) + 1
    ]
    assert for_record(_record("phase19-clean")) == LogitGrowth()


def test_an_unknown_qk_clip_tau_steps_aside_and_says_why():
    logits = np.asarray(RUNS["muon-qk-clip"]["attn_logit_max"])
    rec = _record("muon-qk-clip", qk_clipped_heads=(logits > TAU).astype(float))
    entry = next(s for s in judge_log(rec)["series"] if s["metric"] == "attn_logit_max")
    assert entry["status"] == "skipped" and "assert_qk_clip_contains(run, tau=...)" in entry["message"]


def test_a_sparse_log_compares_growth_rates_not_raw_ratios():
    rule = LogitGrowth()
    # a healthy run logged every 100 steps: 0.4 -> 16 -> 45 (40x between two points, a slow rate)
    steps = np.array([100, 200, 300, 400])
    assert rule.detect(steps, np.array([0.4, 16.0, 30.0, 45.0])) == []
    # logged every 5 steps: 5x in 10 steps at step 20 is not flagged, 10x at step 25 (3.2 -> 32) is
    dense = np.array([1.0, 2.0, 3.2, 10.0, 32.0, 40.0])
    assert [d.step for d in rule.detect(np.arange(5, 35, 5), dense)] == [25]
    # logged every 20 steps: 100x over 20 steps is the same rate, 99x is not
    assert [d.step for d in rule.detect(np.array([20, 40]), np.array([0.5, 50.0]))] == [40]
    assert rule.detect(np.array([20, 40]), np.array([0.5, 49.5])) == []


def test_one_flag_per_episode_a_nonfinite_logit_and_the_bound():
    rule = LogitGrowth()
    steps = np.arange(1, 41)
    a = np.full(40, 12.0)
    a[20:25] = 150.0  # above tau: one episode
    a[30] = math.nan
    flags = [(d.step, d.score) for d in rule.detect(steps, a)]
    assert flags == [(21, 1.5), (31, math.inf)]
    assert LogitGrowth().describe() == "logit-growth(growth=10.0, floor=10.0, window=10, bound=100.0)"


def test_the_rule_is_listed_and_other_series_are_judged_as_before():
    assert POLICY["attn_logit_max"] == ("logit-growth",)
    with_logits, without = _record("muon-max-logit"), _record("muon-max-logit")
    del without.metrics["attn_logit_max"]
    a, b = judge_log(with_logits), judge_log(without)
    assert [s for s in a["series"] if s["metric"] != "attn_logit_max"] == b["series"]
    assert b["ok"] and [s["metric"] for s in a["series"]] == ["loss", "attn_logit_max"]
    # named detectors and named series stay what the user asked for
    assert [s["metric"] for s in judge_log(with_logits, detectors=("ratio",))["series"]] == ["loss"]
    assert [s["metric"] for s in judge_log(with_logits, metrics=("loss",))["series"]] == ["loss"]


def _save_run_folder(tmp_path: Path, name: str, qk_clip_tau: float | None) -> Path:
    """A run folder as the recorder writes it: the muon-qk-clip run's logits, QK-Clip's per-step
    clipped-head count, and run.json's facts saying (or not) that QK-Clip was on at tau."""
    from pytest_spikecheck.records.facts import QKClipFacts, RunFacts
    from pytest_spikecheck.records.run import Run
    from pytest_spikecheck.records.series import MetricColumns

    logits = np.asarray(RUNS[name]["attn_logit_max"], dtype=np.float64)
    steps = np.arange(1, logits.size + 1)
    qk_clip = QKClipFacts(tau=qk_clip_tau, alpha=0.5, per_head=True) if qk_clip_tau is not None else None
    metrics = {"step": steps, "loss": np.full(logits.size, 2.0), "attn_logit_max": logits}
    metrics["qk_clipped_heads"] = (logits > TAU).astype(float)
    run = Run(
        scenario=None, metrics=MetricColumns(metrics), meta={"name": name}, facts=RunFacts(source="recorder", qk_clip=qk_clip)
    )
    return run.save(tmp_path / name)


def _logit_entry(printed: str) -> dict:
    report = json.loads(printed)
    report = report["logs"][0] if "logs" in report else report  # a folder's report lists its logs
    return next(s for s in report["series"] if s["metric"] == "attn_logit_max")


@pytest.mark.parametrize("target", ["folder", "metrics.jsonl"])
def test_a_run_folder_is_judged_with_the_facts_its_run_json_states(tmp_path, capsys, target):
    # The record is the contract: `spikecheck check` on a QK-Clip run's folder reads tau from its
    # run.json (it once read the bare metrics.jsonl and skipped the logit series: "does not say its tau").
    from pytest_spikecheck.cli import main as cli

    folder = _save_run_folder(tmp_path, "muon-qk-clip", qk_clip_tau=TAU)
    path = folder if target == "folder" else folder / "metrics.jsonl"
    assert cli(["check", str(path), "--json"]) == 0
    entry = _logit_entry(capsys.readouterr().out)
    assert entry["status"] != "skipped" and entry["spikes"] == []
    # the same logits with facts that say QK-Clip was on at tau 50: above 2 tau, flagged
    over = _save_run_folder(tmp_path / "low", "muon-qk-clip", qk_clip_tau=50.0)
    assert cli(["check", str(over), "--json"]) == 1
    entry = _logit_entry(capsys.readouterr().out)
    assert (
        entry["spikes"]
        and entry["spikes"][0]["step"] == int(np.flatnonzero(np.asarray(RUNS["muon-qk-clip"]["attn_logit_max"]) > 100)[0]) + 1
    )


def test_a_run_folder_whose_facts_say_nothing_of_qk_clip_steps_aside(tmp_path, capsys):
    from pytest_spikecheck.cli import main as cli

    folder = _save_run_folder(tmp_path, "muon-qk-clip", qk_clip_tau=None)
    cli(["check", str(folder), "--json"])
    entry = _logit_entry(capsys.readouterr().out)
    assert entry["status"] == "skipped" and "assert_qk_clip_contains(run, tau=...)" in entry["message"]


def test_a_run_folders_facts_are_read_without_its_config(tmp_path, capsys):
    # A format-2 run.json states its facts; a config.yaml this version cannot parse (another
    # version's keys) must not refuse the folder `spikecheck check` reads the metrics and facts of.
    from pytest_spikecheck.cli import main as cli

    from pytest_spikecheck.records import integrity

    folder = _save_run_folder(tmp_path, "muon-qk-clip", qk_clip_tau=TAU)
    (folder / "config.yaml").write_text("name: from-another-version\nkey_this_version_does_not_know: 1\n")
    meta = json.loads((folder / "run.json").read_text())  # saved with it, as that version's writer would
    meta.pop(integrity.MANIFEST_KEY)
    meta[integrity.MANIFEST_KEY] = integrity.manifest_of(folder, meta, len(RUNS["muon-qk-clip"]["attn_logit_max"]))
    (folder / "run.json").write_text(json.dumps(meta))
    assert cli(["check", str(folder / "metrics.jsonl"), "--json"]) == 0
    assert _logit_entry(capsys.readouterr().out)["status"] != "skipped"
