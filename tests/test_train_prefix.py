"""``Scenario.stop_after``: train a prefix of a longer run, bit-identical to that run's first steps.

The scenario tests stop their runs soon after what they assert on (an event and its recovery
window) without changing the LR schedule or the batch plan of the run they measured.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from run_schema import validate_run_folder
from short_runs import SHORT_BURST, short_scenario

from pytest_spikecheck import ConfigError, RareTokenBurst, Scenario, train

PREFIX = SHORT_BURST + 12  # past the burst and the spike it makes, short of the run's 90 steps


def _rows(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def test_a_prefix_is_the_full_runs_first_steps_bit_for_bit(short_runs, tmp_path):
    full, _ = short_runs  # the 90-step short control, trained once per session
    prefix = train(short_scenario().replace(name="short-control", stop_after=PREFIX))
    assert len(prefix) == PREFIX and prefix.meta["stopped_by"] == "stop_after" and not prefix.stopped_early
    full.save(tmp_path / "full")
    prefix.save(tmp_path / "prefix")
    validate_run_folder(tmp_path / "prefix")  # run.json states stop_after and stopped_by as the schema allows
    assert json.loads((tmp_path / "prefix" / "run.json").read_text())["stopped_by"] == "stop_after"
    # every metrics.jsonl row (lr, loss, norms, eval loss, clip factor ...) as the full run wrote it
    assert _rows(tmp_path / "prefix") == _rows(tmp_path / "full")[:PREFIX]
    assert prefix.batches == full.batches[:PREFIX]
    assert [e.step for e in prefix.events] == [e.step for e in full.events if e.step <= PREFIX] != []
    full_events = json.loads((tmp_path / "full" / "events.json").read_text())
    prefix_events = json.loads((tmp_path / "prefix" / "events.json").read_text())
    assert prefix_events == [e for e in full_events if e["step"] <= PREFIX]  # the burst's record, tensors named
    assert np.array_equal(prefix["lr"], full["lr"][:PREFIX])  # the 90-step schedule, not a 72-step one


def test_stop_after_is_part_of_what_trains_and_of_the_name():
    base = Scenario.preset("phase-19")
    assert "stop_after" not in base.to_dict()  # unset, it leaves every existing content hash as it was
    cut = base.replace(stop_after=362)
    assert cut.name == "phase-19+stop_after=362" and cut.content_hash() != base.content_hash()
    read = Scenario.from_dict({"preset": "phase-19", "stop_after": 362})
    assert read.content_hash() == cut.content_hash() and read.to_dict()["stop_after"] == 362
    assert cut.describe_setup().startswith("the first 362 of 500 steps")
    assert base.replace(stop_after=500).name == "phase-19+stop_after=500"  # the whole run, allowed


@pytest.mark.parametrize("value", [0, -3, 501, 2.5, True, "100"])
def test_a_bad_stop_after_is_one_line_before_training(value):
    with pytest.raises(ConfigError, match=r"^stop_after must be an integer from 1 to steps \(500\), was ") as caught:
        Scenario.preset("phase-19").replace(stop_after=value)
    assert "\n" not in str(caught.value)


def test_a_stop_after_before_a_declared_burst_is_refused():
    with pytest.raises(ConfigError, match=r"^RareTokenBurst at step 312 is after the run stops \(stop_after 300\)"):
        Scenario.preset("phase-19").replace(stop_after=300).with_breaks(RareTokenBurst(count=3, at_step=312))


def test_a_bad_stop_after_in_yaml_names_the_file(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("preset: phase-19\nstop_after: 0\n")
    with pytest.raises(ConfigError, match=r"stop_after must be an integer from 1 to steps \(500\), was 0"):
        Scenario.from_yaml(config)
