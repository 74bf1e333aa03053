"""A downstream repo asserts on its own model config in CI: two tests (one per module) ask the
``spikecheck`` fixture for the same preflight study and assert on it with ``assert_preflight``;
under ``pytest --spikecheck -n 2`` each point of the study is trained once in the session (the
first worker trains it under the run store's lock, the other loads it)."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("transformers")

CONFIG = {
    "model_type": "llama",
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 1024,
    "num_hidden_layers": 8,
    "head_dim": 64,
    "tie_word_embeddings": True,
}

STUDY = """
from pytest_spikecheck import assert_preflight
from pytest_spikecheck.preflight import preflight


def study(spikecheck):
    return preflight("config.json", {"optimizer": "adamw", "lr": 1e-3}, widths=[16, 32], head_dim=8,
                     lr_factors=[1.0, 2.0], defences=["as-given"], seeds=[0], corpora=["phase19"], steps=10,
                     session=spikecheck, progress=False)
"""

TEST = """
from study import study
from pytest_spikecheck import assert_preflight


def test_my_config_{n}(spikecheck):
    result = study(spikecheck)
    assert len(result.rows) == 4
    assert_preflight(result, defences_hold=["as-given"], lr_margin=1.0)
"""


def test_each_point_trains_once_under_xdist(pytester):
    pytester.makefile(".json", config=json.dumps(CONFIG))
    pytester.makepyfile(study=STUDY, test_one=TEST.format(n="one"), test_two=TEST.format(n="two"))
    result = pytester.runpytest_subprocess(
        "--spikecheck", "-n", "2", "--dist", "load", "-p", "no:randomly", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=2)
    summary = [line for line in result.stdout.lines if "scenarios checked" in line]
    trained = re.search(r"(\d+) scenarios checked \((\d+) trained", summary[0])
    assert trained and trained[1] == "4" and trained[2] == "4", summary[0]  # 4 points, each trained once
