"""Issue 35 §3's classes on real public logs (tests/data/logs/public, provenance in its README):
each file is read as a user would give it, through ``spikecheck check`` and the reader API."""

from __future__ import annotations

import math
from pathlib import Path

from pytest_spikecheck.cli.commands import main
from pytest_spikecheck.judge.policy import judge_log
from pytest_spikecheck.records.logs import detect_format, read_log, read_runs

PUBLIC = Path(__file__).parent / "data" / "logs" / "public"
NANOCHAT = PUBLIC / "nanochat-speedrun-crlf" / "speedrun.log"


def test_a_nanochat_speedrun_with_crlf_line_ends_is_two_phases(capsys):
    # chirag9127/nanochat's speedrun.log: CR LF line ends, the end of base training (steps
    # 21359-21400) then mid-training counting again from its validation at step 0.
    raw = NANOCHAT.read_bytes()
    assert raw.count(b"\r\n") == raw.count(b"\n") == 376 and b"\x00" not in raw
    assert detect_format(NANOCHAT) == "text"
    base, mid = read_runs(NANOCHAT)
    assert base.metrics["step"][[0, -1]].tolist() == [21359, 21400] and base.metrics["loss"][0] == 2.77358
    assert mid.metrics["step"][[0, -1]].tolist() == [0, 152] and mid.series("loss")[1][0] == 1.345409
    assert mid.series("Validation bpb")[1].tolist() == [0.7004, 0.4563]
    assert "2 runs or phases in one file" in base.notes[-1]
    assert not any("restart from a checkpoint" in n for r in (base, mid) for n in r.notes)
    # the config dicts nanochat's checkpoint manager prints are no Trainer log: no phantom run of
    # 'sequence_len'/'n_layer' between the phases (they made a third run, steps 1-3, before)
    assert not any("HF Trainer dict" in n for n in base.notes) and "n_layer" not in base.metrics
    assert main(["check", str(NANOCHAT)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{NANOCHAT}: 2 runs in one file") and "judged 149 of 152 points" in out


def test_deepspeed_chat_ppo_lines_and_their_inf_actor_loss(capsys):
    # DeepSpeedExamples issue #444: step-3 PPO lines whose actor and critic losses turn inf at 3184.
    path = PUBLIC / "deepspeed-chat-ppo-inf" / "step3.log"
    rec = read_log(path)
    assert rec.metrics["step"].tolist() == [3183, 3184, 3185]
    assert rec.metrics["loss"][0] == 30.921875 and math.isinf(rec.metrics["loss"][1])  # act_loss
    report = judge_log(rec)
    assert report["kind"] == "rl" and not report["ok"]
    assert report["nonfinite"]["step"] == 3184 and report["nonfinite"]["metric"] == "loss"
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert "an RL/preference loss: loss rules step aside" in out and "loss = inf at step 3184 (the first)" in out
