"""No silent fall-through: a name the decoder does not know (a schedule, an accumulation, a
conformance rule or value kind, a format-1 trainer) is one line naming the known ones, never a
default picked in an ``else``. Pure and cheap: no training."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from pytest_spikecheck.clipping import conformance
from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.records.facts import facts_from_format_1
from pytest_spikecheck.scenario import ClipSpec, ScheduleSpec
from pytest_spikecheck.training.schedule import lr_at
from pytest_spikecheck.training.sharding import SingleProcess
from pytest_spikecheck.training.step import TrainingStep


def test_an_unknown_schedule_is_not_cosine():
    assert lr_at(50, base_lr=1.0, total_steps=100, spec=ScheduleSpec("constant", warmup_steps=0)) == 1.0
    with pytest.raises(ConfigError, match=r"^schedule.name must be one of cosine, constant, was 'linear'$"):
        lr_at(50, base_lr=1.0, total_steps=100, spec=ScheduleSpec("linear", warmup_steps=0))


def test_an_unknown_accumulation_is_not_the_mean():
    model = torch.nn.Linear(2, 2)
    optimizer = SimpleNamespace(param_groups=[], step=lambda: None)  # any object with param_groups and step
    shard = SingleProcess(list(model.parameters()))

    def make(how: str) -> TrainingStep:
        return TrainingStep(model, optimizer, shard, backend="torch", clip=ClipSpec(), accumulation=2, accumulate=how)

    assert make("sum").accumulate == "sum"
    with pytest.raises(ConfigError, match=r"^accumulate must be one of mean, sum, was 'max'$"):
        make("max")


def test_an_unknown_conformance_rule_or_value_kind_is_one_line():
    case = conformance._make_case([(3,)], "float32", 0, ["normal"], [1.0], [], ("absolute", 2.0))
    assert case.max_norm == 2.0
    with pytest.raises(ValueError, match=r"^max_norm rule must be one of ratio, exact, absolute, was 'relative'$"):
        conformance._make_case([(3,)], "float32", 0, ["normal"], [1.0], [], ("relative", 2.0))
    with pytest.raises(ValueError, match=r"^value kind must be one of normal, uniform, constant, sparse, was 'spiky'$"):
        conformance._random_values(np.random.default_rng(0), 4, "spiky", 1.0)
    assert conformance._random_values(np.random.default_rng(0), 200, "sparse", 1.0).any()


@pytest.mark.parametrize(("trainer", "source"), [("hf", "hf"), ("lightning", "lightning"), ("loop", "recorder")])
def test_a_format_1_trainer_is_decoded_by_name(trainer, source):
    meta = {"recorded": {"trainer": trainer, "max_grad_norm": 0.5}}
    facts = facts_from_format_1(meta, None)
    assert facts.source == source and facts.clip == ClipSpec("global", 0.5)
    assert not math.isnan(facts.clip.max_norm)


def test_a_format_1_block_silent_on_the_clip_leaves_it_unknown():
    # unknown is null, never a default: a block without max_grad_norm says nothing of the clip;
    # one that wrote it as null (or HF's 0) said there was none
    assert facts_from_format_1({"recorded": {"trainer": "loop"}}, None).clip is None
    assert facts_from_format_1({"recorded": {"trainer": "loop", "max_grad_norm": None}}, None).clip == ClipSpec("none", None)
    assert facts_from_format_1({"recorded": {"trainer": "hf", "max_grad_norm": 0}}, None).clip == ClipSpec("none", None)


def test_an_unknown_format_1_trainer_is_not_the_recorder():
    with pytest.raises(ConfigError, match=r"^run.json recorded.trainer must be one of hf, lightning, loop, was 'keras'$"):
        facts_from_format_1({"recorded": {"trainer": "keras"}}, None)
