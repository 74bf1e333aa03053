"""The default policy on the classes issue 24 names: sparse logs with little history, noisy short
logs, and RL logs whose gradients come in bursts. Each rule change has its sabotage: the old
setting (kept as a parameter) must fail the same check."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pytest_spikecheck.judge.detectors import LossJump, SustainedLoss, log_noise
from pytest_spikecheck.judge.policy import degenerate_steps, judge_log
from pytest_spikecheck.records import Record


def flagged(rules, steps, values):
    return sorted({d.step for r in rules for d in r.detect(np.asarray(steps), np.asarray(values, dtype=float))})


def test_log_noise_ignores_a_straight_descent_and_reads_an_alternation():
    assert log_noise(np.linspace(10, 2, 50)) == pytest.approx(0.0, abs=1e-12)
    assert log_noise(np.array([1.0, 3.0] * 10)) == pytest.approx(1.4826 * 4 / math.sqrt(6))
    assert log_noise(np.array([1.0, math.nan])) == 0.0


# An LR sweep logged every 200 steps: 10.8, 7.2, then the learning rate is too high and the loss
# climbs back to ~9 and stays there. The median of the two points before the rise (9.0) is above
# where the model already was: only the lowest loss so far shows the rise.
SWEEP_STEPS = np.arange(1, 13) * 200
SWEEP = np.r_[10.8, 7.2, 9.1, 9.0, 9.2, 9.05, 9.15, 9.1, 9.0, 9.2, 9.1, 9.05]


def test_a_rise_the_next_points_keep_is_found_whatever_the_history():
    assert flagged([LossJump(), SustainedLoss()], SWEEP_STEPS, SWEEP) == [600]
    hit = SustainedLoss().detect(SWEEP_STEPS, SWEEP)[0]
    assert hit.baseline == 7.2 and hit.score == pytest.approx(9.1 - 7.2)
    # A fast healthy descent logged as sparsely is not flagged
    assert flagged([LossJump(), SustainedLoss()], SWEEP_STEPS, 2.5 + 8 * np.exp(-np.arange(12) / 1.5)) == []


def test_sabotage_the_old_early_baseline_misses_the_sweep():
    assert flagged([LossJump(noise_sigmas=0.0), SustainedLoss(early="median")], SWEEP_STEPS, SWEEP) == []


def noisy_short_log(seed: int, sigma: float = 0.5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return 3 + np.exp(-np.arange(28) / 8) + sigma * rng.standard_normal(28)


def test_a_noisy_short_log_is_judged_on_its_own_scale():
    # 28 points logged every 50 steps, per-batch noise 0.5 nats and no event: the old rules flag
    # about a third of such logs (a +1.2-nat move against five quiet points), the new ones few.
    steps = np.arange(1, 29) * 50
    new = sum(bool(flagged([LossJump(), SustainedLoss()], steps, noisy_short_log(s))) for s in range(60))
    old = sum(
        bool(flagged([LossJump(noise_sigmas=0.0), SustainedLoss(early="median")], steps, noisy_short_log(s))) for s in range(60)
    )
    assert new <= 6 < 12 <= old, (new, old)


def test_a_spike_on_a_quiet_dense_log_is_still_found():
    rng = np.random.default_rng(1)
    steps = np.arange(1, 401)
    loss = 2 + 3 * np.exp(-steps / 60) + 0.05 * rng.standard_normal(400)
    loss[300] += 0.8
    assert 301 in flagged([LossJump()], steps, loss)


def rl_record(norms: np.ndarray, **columns) -> Record:
    n = norms.size
    metrics = {"step": np.arange(1, n + 1), "loss": np.zeros(n), "grad_norm": norms, "reward": np.ones(n), **columns}
    return Record(metrics, None, "grpo", log_format="hf-trainer")


def bursty(seed: int = 0) -> np.ndarray:
    """A GRPO run's grad norm: 35 % of the steps have reward variance (norm ~0.1), the rest only the
    KL term (~1e-3)."""
    rng = np.random.default_rng(seed)
    real = rng.random(300) < 0.35
    return np.where(real, 0.1, 1e-3) * np.exp(0.3 * rng.standard_normal(300))


def test_bursty_rl_gradients_are_judged_against_the_real_steps():
    norms = bursty()
    report = judge_log(rl_record(norms))
    assert report["ok"], [h for s in report["series"] for h in s["spikes"]]
    grad = next(s for s in report["series"] if s["metric"] == "grad_norm")
    assert grad["degenerate"]["count"] == int(np.sum(norms < 0.02)) and "bimodal" in grad["degenerate"]["why"]
    # a real spike of the real level is still found
    spiked = norms.copy()
    at = 250 + int(np.flatnonzero(norms[250:] > 0.02)[0])
    spiked[at] = 2.0
    assert [h["step"] for s in judge_log(rl_record(spiked))["series"] for h in s["spikes"]] == [at + 1]


def test_sabotage_judging_the_bursts_against_the_degenerate_steps_flags_a_healthy_run():
    assert not judge_log(rl_record(bursty()), kind="sft")["ok"]  # as an SFT log: every burst is a "spike"


def test_a_zero_std_share_of_one_marks_a_degenerate_step():
    norms = np.full(40, 0.5)
    norms[[5, 17]] = 1e-4
    share = np.zeros(40)
    share[[5, 17]] = 1.0
    rec = rl_record(norms, frac_reward_zero_std=share)
    mask, why = degenerate_steps(rec, rec.metrics["step"], norms)
    assert np.flatnonzero(mask).tolist() == [5, 17] and why == "frac_reward_zero_std = 1 at 2"
    # a unimodal RL norm has no degenerate steps
    assert not degenerate_steps(rl_record(np.full(40, 0.5)), np.arange(1, 41), np.full(40, 0.5))[0].any()


# Issue 35: the shapes a new-user trial and public logs showed, rebuilt with their numbers.
# A 40-step fine-tune whose loss falls 3.5 -> 2.05 with per-batch noise, then one step at 5.15 (+2.2
# nats over the median before it): the descent's spread around the median (6 x 1.4826 MAD = 2.7
# nats) hid it; its point-to-point changes vary by 0.1.
def descent_with_a_jump() -> tuple[np.ndarray, np.ndarray]:
    noise = np.tile([0.06, -0.05, 0.02, -0.07, 0.04], 8)
    loss = 3.5 - 0.05 * np.arange(40) + noise
    loss[30] = 5.15
    return np.arange(1, 41), loss


def test_a_jump_of_nats_on_a_falling_loss_is_found_whatever_the_descent_says():
    steps, loss = descent_with_a_jump()
    assert flagged([LossJump()], steps, loss) == [31]
    hit = LossJump().detect(steps, loss)[0]
    assert hit.score == pytest.approx(5.15 - hit.baseline) and hit.score > 2
    # the same descent without the jump stays quiet
    quiet = loss.copy()
    quiet[30] = (quiet[29] + quiet[31]) / 2
    assert flagged([LossJump(), SustainedLoss()], steps, quiet) == []


def test_sabotage_the_spread_around_the_median_misses_the_jump():
    assert flagged([LossJump(detrend=False)], *descent_with_a_jump()) == []


# An LR sweep point logged every 200 steps, five points: the loss rises at the third and stays up.
# On five points the log's own noise is the rise itself (two of its three second differences).
SHORT_SWEEP = np.r_[10.8, 7.2, 9.1, 9.3, 9.6]


def test_a_sustained_rise_on_a_five_point_log_is_found():
    assert flagged([SustainedLoss()], np.arange(1, 6) * 200, SHORT_SWEEP) == [600]
    assert flagged([SustainedLoss(noise_min_points=0)], np.arange(1, 6) * 200, SHORT_SWEEP) == []  # sabotage
    # healthy five- and seven-point descents with 0.2 nats of noise: none flagged
    for n in (5, 7):
        for seed in range(50):
            rng = np.random.default_rng(seed)
            v = 3 + 4 * np.exp(-np.arange(n) / 1.5) + 0.2 * rng.standard_normal(n)
            assert flagged([LossJump(), SustainedLoss()], np.arange(1, n + 1) * 200, v) == []


def test_a_preference_loss_that_starts_at_ln2_is_no_likelihood():
    # The real DPO loss of jsonl/dpo-360-llamafactory (tests/data/reallogs, provenance in corpus.yaml)
    # with only its loss kept, as a log that names no reward or accuracy column: it wanders around
    # ln 2 (0.65, 0.65, 1.11, 0.26, 0.94, ...), so the loss rules step aside.
    from pytest_spikecheck.judge.policy import detect_kind
    from pytest_spikecheck.records.logs import read_log
    from reallogs import ROOT

    full = read_log(ROOT / "jsonl" / "dpo-360-llamafactory" / "trainer_log.jsonl")
    steps, loss = full.series("loss")
    rec = Record({"step": steps, "loss": loss}, None, "dpo", log_format="jsonl")
    kind, why = detect_kind(rec)
    assert kind == "rl" and "about ln 2" in why
    report = judge_log(rec)
    assert report["ok"] and report["series"][0]["status"] == "skipped"
    # an SFT loss starting at 1.04 (metamath-dense's) is judged as a likelihood
    sft = Record({"step": steps, "loss": loss + 0.4}, None, "sft", log_format="jsonl")
    assert detect_kind(sft)[0] is None


def five_jumps() -> np.ndarray:
    rng = np.random.default_rng(0)
    loss = 3.0 - np.linspace(0, 0.8, 30) + 0.05 * rng.standard_normal(30)
    loss[[7, 12, 17, 22, 27]] += 1.4
    return loss


def test_a_log_of_row_means_with_five_jumps_that_recover_is_found():
    # Issue 35's trial log, rebuilt: each row the mean of 10 steps, five jumps of 1.4 nats that recover
    # on the next row. Three second differences a jump: at their median the log read its jumps as its
    # noise (0.75 nats, a bar of 3); it reads more than twice their 40th percentile, so that is the noise.
    loss = five_jumps()
    assert flagged([LossJump(), SustainedLoss()], np.arange(1, 31) * 10, loss) == [80, 130, 180, 230, 280]
    assert log_noise(loss, quantile=0.5) > 0.7 > 0.2 > log_noise(loss)


def test_sabotage_the_median_noise_misses_the_five_jumps(monkeypatch):
    import pytest_spikecheck.judge.detectors as detectors

    median_noise = detectors.log_noise
    monkeypatch.setattr(detectors, "log_noise", lambda v: median_noise(v, quantile=0.5))
    assert flagged([LossJump(), SustainedLoss()], np.arange(1, 31) * 10, five_jumps()) == []


def test_a_loss_spike_at_an_fp16_overflow_step_is_still_a_loss_spike(tmp_path):
    # Issue 35: an HF trainer_state.json of an fp16 fine-tune whose loss jumps +1.6 nats at the step its
    # grad norm is Infinity (the scaler skipped that update): the skip excuses the grad norm, not the loss.
    import json
    from pytest_spikecheck.records.logs import read_log

    loss = 3.2 - 0.04 * np.arange(40) + np.tile([0.05, -0.04, 0.02, -0.06, 0.03], 8)
    loss[24] += 1.6
    history = [
        {"step": s + 1, "loss": round(float(v), 4), "grad_norm": math.inf if s == 24 else 1.0 + 0.1 * (s % 3)}
        for s, v in enumerate(loss)
    ]
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps({"log_history": history}))  # json writes inf as Infinity, as HF does
    rec = read_log(path)
    assert rec.skipped[25].startswith("overflow")
    report = judge_log(rec)
    assert not report["ok"] and report["nonfinite"] is None
    assert [h["step"] for s in report["series"] if s["metric"] == "loss" for h in s["spikes"]] == [25]
    steps, values = rec.series("loss")
    assert flagged([LossJump(detrend=False)], steps, values) == []  # sabotage: the descent's spread hid it
