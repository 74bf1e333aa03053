"""Every assertion reports what it measured (issue 33): a Verdict with the assertion's name, the
metric, the measured figure, the limit, the step, pass/fail and a one-line reason, returned where
the assertion returns nothing else, carried by the failure (``SpikeCheckError.verdict``) and
collected by ``collecting()``; and the failures carry what the README promises (the metric asked
about in the table, a sparkline, what was not on). Arrays and the session's short runs only."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from pytest_spikecheck import (
    SpikeCheckError,
    Verdict,
    assert_clip_contains,
    assert_diverges,
    assert_finite,
    assert_logits_bounded,
    assert_no_spike,
    assert_qk_clip_contains,
    assert_recovers,
    assert_spike,
)
from pytest_spikecheck.judge.verdict import collecting


def _flat(n: int = 40, spike_at: int | None = 30, height: float = 50.0) -> dict:
    pre = np.full(n, 0.5) + 0.01 * np.sin(np.arange(n))
    if spike_at is not None:
        pre[spike_at - 1] = height
    return {
        "loss": np.full(n, 2.0),
        "grad_norm_pre": pre,
        "grad_norm_post": np.minimum(pre, 1.0),
        "attn_logit_max": np.linspace(1.0, 5.0, n),
    }


def test_each_assertion_reports_a_verdict_passed_or_failed():
    record = _flat()
    with collecting() as got:
        ratio = assert_spike(record, at=30, min_ratio=10)
        held = assert_clip_contains(record, max_norm=1.0)
        assert_finite(record)
        with pytest.raises(SpikeCheckError) as failed:
            assert_no_spike(record)
        bounded = assert_logits_bounded(record, attention=10)
    assert [v.assertion for v in got] == [
        "assert_spike",
        "assert_clip_contains",
        "assert_finite",
        "assert_no_spike",
        "assert_logits_bounded",
    ]
    spike = got[0]
    assert (spike.passed, spike.metric, spike.step, spike.limit) == (True, "grad_norm_pre", 30, 10.0)
    assert spike.measured == pytest.approx(ratio) and "spike of" in spike.reason and "\n" not in spike.reason
    assert isinstance(held, Verdict) and held is got[1]
    assert (held.passed, held.metric, held.measured, held.limit) == (True, "grad_norm_post", 1.0, 1.0)
    assert failed.value.verdict is got[3] and not got[3].passed and got[3].step == 30
    assert got[3].reason == str(failed.value).splitlines()[0]
    assert bounded.passed and bounded.metric == "attn_logit_max" and bounded.limit == 10.0 and bounded.measured == 5.0
    # JSON-able, inf included (JSON has none), and back
    data = json.loads(json.dumps(dataclasses.replace(spike, measured=math.inf).to_json()))
    assert data["measured"] == "inf" and Verdict.from_json(data).measured == math.inf


def test_a_failure_carries_the_step_its_diagnosis_is_at(short_runs):
    _, broken = short_runs
    with pytest.raises(SpikeCheckError) as failure:
        assert_clip_contains(broken, max_norm=1.0)
    v = failure.value.verdict
    assert (v.assertion, v.passed, v.scenario, v.limit) == ("assert_clip_contains", False, "short-break", 1.0)
    assert v.diagnosis["step"] == v.step and v.measured > 1.0
    assert f"diagnosis at step {v.step}:" in str(failure.value)
    with collecting() as got:
        steps = assert_recovers(broken, within=100)
        first = assert_diverges({"loss": [1.0, 2.0, math.nan]})
    assert got[0].measured == steps and got[0].limit == 100 and got[1].step == first == 3


def test_the_failure_table_leads_with_the_metric_asked_about():
    record = _flat(spike_at=None)
    with pytest.raises(SpikeCheckError) as failure:
        assert_spike(record, at=30, metric="attn_logit_max")
    text = str(failure.value)
    assert text.startswith("expected an attn_logit_max spike of ≥ 10× at step 30")  # not "a attn_logit_max"
    header = next(line for line in text.splitlines() if line.startswith("step "))
    assert header.split()[:2] == ["step", "attn_logit_max"]
    assert "attn_logit_max: " in text  # its sparkline


def test_qk_clip_on_a_run_without_it_says_it_was_not_on(short_runs):
    control, _ = short_runs
    with pytest.raises(SpikeCheckError, match=r"^QK-Clip was not on in this run: it trained without QKClip\(\)") as failure:
        assert_qk_clip_contains(control)
    assert failure.value.verdict.assertion == "assert_qk_clip_contains" and not failure.value.verdict.passed


def test_qk_clip_failures_carry_the_evidence():
    record = {
        "step": [1, 2, 3, 4],
        "loss": [1.0] * 4,
        "attn_logit_max": [10.0, 40.0, 55.0, 59.0],
        "qk_clipped_heads": [0, 2, 1, 1],
    }
    with pytest.raises(SpikeCheckError) as failure:
        assert_qk_clip_contains(record, tau=30, factor=1.5)
    text = str(failure.value)
    assert "step  attn_logit_max  qk_clipped_heads" in text and "→ 3" in text and "attn_logit_max: " in text
    v = failure.value.verdict
    assert (v.step, v.measured, v.limit, v.metric) == (3, 55.0, 45.0, "attn_logit_max")
    with collecting() as got:
        assert assert_qk_clip_contains(record, tau=30) == 2
    assert got[0].passed and got[0].step == 2 and got[0].measured == 59.0


def test_a_recorded_clip_before_unscale_fails_clip_containment(short_runs):
    control, _ = short_runs
    warned = dataclasses.replace(control, meta={**control.meta, "clip_before_unscale_at": [5]})
    assert_clip_contains(control, max_norm=1.0)
    with pytest.raises(
        SpikeCheckError,
        match=r"the clip ran before the loss scaler's unscale at step 5 "
        r"\(ClipBeforeUnscaleWarning\)",
    ):
        assert_clip_contains(warned, max_norm=1.0)


def test_a_logs_spike_elsewhere_is_named(tmp_path):
    path = tmp_path / "train.jsonl"
    norms = 0.5 + 0.01 * np.sin(np.arange(1, 201))
    norms[136] = 40.0  # step 137
    path.write_text(
        "".join(json.dumps({"step": int(s), "loss": 2.0, "grad_norm": float(g)}) + "\n" for s, g in zip(range(1, 201), norms))
    )
    assert assert_spike(path, at=137) > 10
    with pytest.raises(SpikeCheckError, match=r"at step 136, but it flagged other steps \(137\)"):
        assert_spike(path, at=136)


def test_spikecheck_check_json_lists_its_verdicts(tmp_path, capsys):
    from pytest_spikecheck.cli import main

    path = tmp_path / "train.jsonl"
    path.write_text(
        "".join(json.dumps({"step": s, "loss": 2.0, "grad_norm": 0.5, "grad_norm_post": 0.5}) + "\n" for s in range(1, 41))
    )
    assert main(["check", str(path), "--json", "--max-norm", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [v["assertion"] for v in report["verdicts"]] == ["spikecheck check"] * 3 + ["assert_clip_contains"]
    assert all(v["passed"] for v in report["verdicts"]) and report["verdicts"][-1]["limit"] == 1.0


def test_spikecheck_check_json_gives_scores_as_numbers(tmp_path, capsys):
    from pytest_spikecheck.cli import main

    path = tmp_path / "train.jsonl"
    path.write_text(
        "".join(json.dumps({"step": s, "loss": 2.0, "grad_norm": 40.0 if s == 30 else 1.0}) + "\n" for s in range(1, 60))
    )
    assert main(["check", str(path), "--json"]) == 1
    spike = json.loads(capsys.readouterr().out)["series"][0]["spikes"][0]
    assert spike["scores"] == [40.0] and spike["units"] == ["×"] and spike["score_texts"] == ["40×"]
    assert main(["check", str(path)]) == 1
    assert "grad-ratio 40×" in capsys.readouterr().out  # the text as before


def test_a_sweep_panels_title_fits_its_figure():
    """The sweep plot's subtitle was cut at both edges: a long sweep name, wrapped to the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pytest_spikecheck.sweep.panels import fit_title

    name = "muon-fidelity+" + "+".join(f"model.n_embd={w}" for w in (64, 128, 256, 512, 1024))
    fig = plt.figure(figsize=(6.5, 4.2), dpi=110)
    title = fig.suptitle(
        fit_title(
            f"{name}\nfinal eval loss vs peak LR (median over 5 seeds, min–max shaded; a diverged run at its initial loss)", fig
        ),
        fontsize=10,
    )
    fig.canvas.draw()
    box = title.get_window_extent()
    assert 0 <= box.x0 and box.x1 <= fig.bbox.width, (box, fig.bbox.width)
    plt.close(fig)


def test_the_sweep_and_set_up_checks_report_verdicts_too():
    from pytest_spikecheck import LRSweep, assert_lr_sensitivity, assert_overflow_skips, assert_stable_up_to

    sweep = LRSweep("adamw", lrs=(1e-3, 1e-2, 1e-1), final_losses=(2.0, 1.8, math.inf), initial=5.0)
    with collecting() as got:
        with pytest.raises(SpikeCheckError) as failure:
            assert_lr_sensitivity(sweep, max=0.5)
        assert_stable_up_to(sweep, lr=1e-2)
        assert_overflow_skips({"step": [1, 2, 3], "loss": [1.0] * 3, "loss_scale": [2.0**16] * 3})
    assert failure.value.verdict is got[0] and got[0].measured == pytest.approx(sweep.sensitivity) and got[0].limit == 0.5
    assert [(v.assertion, v.passed) for v in got] == [
        ("assert_lr_sensitivity", False),
        ("assert_stable_up_to", True),
        ("assert_overflow_skips", True),
    ]


def test_nested_blocks_each_keep_their_own_verdicts_even_when_equal():
    """A pytester session inside a plugin test opens a block inside the test's own: both sinks
    are empty lists at first (equal by value), so leaving the inner one must remove it, not the
    outer (list.remove did: the outer's exit then failed with 'x not in list')."""
    with collecting(reproduce="outer") as outer:
        with collecting() as inner:
            pass
        assert inner == outer == []
        assert_finite(_flat())
    assert [v.assertion for v in outer] == ["assert_finite"] and inner == []
