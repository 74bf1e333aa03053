"""The default policy on the labelled real-log corpus (tests/data/reallogs): the goal of
issue 12, and one judgement behind both doors (``spikecheck check`` and the assertions).
How a judgement is scored is in tests/reallogs.py."""

import json

import pytest

from pytest_spikecheck.cli.check import EXIT_FOUND, EXIT_NOT_JUDGED
from pytest_spikecheck.cli.commands import main
from pytest_spikecheck.errors import ConfigError, SpikeCheckError
from pytest_spikecheck.judge.assertions import assert_no_spike, assert_spike
from pytest_spikecheck.records.logs import read_log
from reallogs import ROOT, corpus, score, split

ENTRIES = corpus()


def test_default_policy_meets_the_goal_on_the_tune_split():
    result = score(entries=split("tune"))
    assert result.onsets == 18 and result.negatives == 38 and not result.unread
    assert result.detection >= 0.90, result.missed  # 17 of 18: the 90050 blow-up is rolled back by the log itself
    assert result.clean_flagged <= 0.05, result.flagged
    assert result.unreadable_ok == 4 and not result.unreadable_wrong  # refused with one line, not guessed at
    # Logs no rule can judge are reported as "not judged", never "no spike" (the words are
    # checked on every file below): a single entry, and two DPO logs whose only series is the
    # preference loss the loss rules step aside from.
    assert result.unjudged_logs == [
        "hf/grpo-one-entry/trainer_state.json",
        "jsonl/dpo-360-llamafactory/trainer_log.jsonl",
        "jsonl/dpo-recsys-llamafactory/trainer_log.jsonl",
    ]


def test_default_policy_on_the_heldout_split():
    # Added with issues 24 and 35 (text logs, an MLflow run, real LFS pointers, a golden-values JSON, three
    # word_language_model logs; then the log lines of a modded-nanogpt record and 22 trainer_state.json files
    # from 24 more repositories, re-taken from the file index; then 5 trainer_state.json files from 5 more; then
    # 19 files from 19 more, found by path in the file index; then 3 blocks of Megatron-DeepSpeed lines the
    # BigScience chronicles pasted around spikes they wrote up), labelled before the policy ran on them and never
    # tuned on. 9 of 13 onsets found (69 %: short of the 90 % goal, which with 13 events needs 12; it was 7 of 10
    # before the fifth batch, 7 of 9 before the fourth, 7 of 8 before the second, 9 of 10 before the Muon record,
    # not in the file index, was removed with its two found spikes). Misses: a tanh RNN whose loss is above
    # ln(vocabulary) from its first logged point (17.7 nats, no earlier point to compare with; loss-sustained flags
    # its +0.7-nat rise at 1000, 4 intervals after the labelled onset); a Whisper fine-tune whose loss climbs 0.118
    # -> 0.313 as its learning rate warms up, never more than +0.11 nats above its baseline (borderline in shape;
    # under the ln 2 bars; a relative rule calibrated on the tune split finds it no earlier than 425,
    # docs/detectors.md); a LLaMA-Factory SFT log at 122 nats and then exactly 0, whose mostly-zero loss is read as
    # an RL surrogate, so the loss rules step aside (not judged, said so); and BLOOM-176B's first lm loss spike,
    # labelled at 31216 (+0.39 nats, two points into its block), which loss-jump and loss-sustained flag at its
    # peak, 31219: 3 intervals after the onset, outside the scoring's 2. The other two chronicle blocks are found at
    # their onsets (6920, 17062). Healthy logs flagged: 1 of 43 (2.3 %, goal <= 5 %): a heavy-tailed per-batch loss
    # labelled clean (borderline), where loss-sustained flags three points at +0.70 nats (242). Not judged, and said
    # so: a DistilBERT classifier whose loss sits near ln 2 (read as a preference loss), three logs of one or two
    # points, and the collapsed LLaMA-Factory run. Not tuned to the goal.
    result = score(entries=split("heldout"))
    assert result.onsets == 13 and result.negatives == 43 and not result.unread
    assert result.found == 9 and result.missed == [
        "text/wlm-rnn-tanh-above-uniform/train.log@200",
        "hf/whisper-lr-rise/trainer_state.json@300",
        "jsonl/graduate-agent-zero-loss/trainer_log.jsonl@10",
        "text/bloom-176b-first-spike/main_log.txt@31216",
    ]
    assert result.clean_flagged <= 0.05
    assert result.flagged == ["hf/assignment-noisy-sft/trainer_state.json"]
    assert result.unreadable_ok == 11 and not result.unreadable_wrong
    assert result.unjudged_logs == [
        "hf/distilbert-halluc-26pt/trainer_state.json",
        "hf/decision-transformer-2pt/trainer_state.json",
        "hf/bart-samsum-one-entry/trainer_state.json",
        "jsonl/graduate-agent-zero-loss/trainer_log.jsonl",
        "text/gpt2-two-one-line/log/log.txt",
        "lightning/xkv-compression-2pt/metrics.csv",
    ]


def test_no_rl_or_preference_log_is_flagged():
    rl = [e for e in ENTRIES if e["label"] == "rl_surrogate" and not e["spikes"]]
    assert len(rl) == 8 and not score(entries=rl).flagged


def test_the_published_ratio_rule_misses_what_the_policy_finds():
    # Today's `ratio` (5x the median) on the same spikes, to show the goal test can tell them apart.
    assert score(("ratio",), [e for e in ENTRIES if e["label"] == "spike"]).detection < 0.75


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["file"].split("/")[1] for e in ENTRIES])
def test_check_and_assertions_agree(entry, capsys):
    path = ROOT / entry["file"]
    code = main(["check", str(path), "--json", "--strict"])
    out, err = capsys.readouterr()
    if entry["label"] == "unreadable":
        assert code == 2 and out == "" and err.count("\n") == 1
        with pytest.raises(ConfigError):
            assert_no_spike(path)
        return
    out = json.loads(out)
    runs = out["logs"] if "logs" in out else [out]
    worst = max(EXIT_FOUND if not r["ok"] else EXIT_NOT_JUDGED if r["not_judged"] or not r["judged"] else 0 for r in runs)
    assert code == worst
    for number, report in enumerate(runs, 1):
        record = read_log(path, run=number)  # the assertions judge one run: the one the check reported here
        code = EXIT_FOUND if not report["ok"] else EXIT_NOT_JUDGED if report["not_judged"] or not report["judged"] else 0
        spikes = any(s["spikes"] for s in report["series"])
        # assert_no_spike(log, strict=True) fails exactly where `check --strict` exits non-zero
        if code:
            with pytest.raises(SpikeCheckError, match="default policy flagged|non-finite|not judged"):
                assert_no_spike(record, strict=True)
        else:
            assert_no_spike(record, strict=True)
        # assert_spike(log) passes exactly where check lists a spike
        if spikes:
            assert_spike(record)
        else:
            with pytest.raises(SpikeCheckError, match="expected the default policy to flag a spike"):
                assert_spike(record)
        # "no spike" only for a judged series: every other one says why it was not judged
        for s in report["series"]:
            assert s["status"] in ("judged", "not judged", "skipped")
            if s["status"] == "not judged":
                assert s["message"].startswith(f"not judged: {s['logged']} point") and "needs" in s["message"]
        if entry["label"] == "rl_surrogate":
            assert report["kind"] == "rl" and all(s["status"] == "skipped" for s in report["series"] if s["metric"] == "loss")
