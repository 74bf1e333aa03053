"""Events have one typed shape (records/events.py ``Event``): written by the engine and by the
recorder in someone else's loop, read by ``Run.event_at`` and the diagnosis, published in
docs/run-schema.json; an events.json written before the type (format 1: the same keys as
plain objects) is read. No new training: the session's short runs are reused, and the
recorded run is four steps of a two-layer toy model."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest
import torch
from run_schema import validate_run_folder
from short_runs import SHORT_BURST

from pytest_spikecheck import diagnose, record
from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.records import Run
from pytest_spikecheck.records.events import Event, events_from_json

#: What the pre-type engine wrote for an event (format 1's events.json): every key plain JSON.
FORMAT_1_EVENT = {
    "step": 60,
    "kinds": ["burst"],
    "loss": 4.2,
    "grad_norm_pre": 9.5,
    "baseline_grad_norm": 1.1,
    "clip_factor": 0.105,
    "max_norm": 1.0,
    "grad_norm_post": 1.0,
    "skipped": False,
    "token_losses": {
        "mean": 4.2,
        "p50": 4.0,
        "p90": 6.0,
        "p99": 8.0,
        "max": 9.0,
        "n_tokens": 10,
        "rare_loss_share": 0.5,
        "novel_loss_share": 0.25,
        "novel_tokens": 1,
        "worst": [{"sample": "s1", "position": 3, "token": "zq", "loss": 9.0, "rare": True, "novel": True}],
        "by_token": [{"token": "zq", "count": 1, "total_loss": 9.0, "mean_loss": 9.0}],
    },
    "param_grad_norms": {"wte.weight": 9.0, "h.0.attn.weight": 3.0},
    "adam_surprise": {"threshold": 10.0, "share": 0.01, "by_param": {"wte.weight": 0.02}},
    "update": {"max_abs": 0.001, "by_param": {"wte.weight": 0.001}},
}


def test_an_event_round_trips_through_its_json():
    event = Event.from_json(FORMAT_1_EVENT)
    assert event.kinds == ("burst",) and event.token_losses["worst"][0]["token"] == "zq"
    assert event.to_json() == FORMAT_1_EVENT  # the same keys, in the same order, as before the type
    assert list(event.to_json()) == list(FORMAT_1_EVENT)
    assert Event.from_json(event.to_json()) == event


def test_an_unknown_event_field_or_a_missing_step_is_one_line():
    with pytest.raises(ConfigError, match="unknown event field 'grad_norms'; known: step, kinds, loss"):
        Event.from_json({"step": 3, "grad_norms": {}})
    with pytest.raises(ConfigError, match=r"events.json\[0\]: an event needs its step"):
        events_from_json([{"loss": 1.0}])


def test_the_engine_writes_typed_events_and_events_json_validates(short_runs, tmp_path):
    run = short_runs[0]
    assert run.events and all(isinstance(e, Event) for e in run.events)
    event = run.event_at(SHORT_BURST)
    assert "burst" in event.kinds and event.update is not None and event.max_norm == 1.0
    folder = run.save(tmp_path / "run")
    validate_run_folder(folder)  # events.json too
    loaded = Run.load(folder)
    assert loaded.events == run.events and all(isinstance(e, Event) for e in loaded.events)


def test_a_format_1_events_json_is_read_and_judged(short_runs, tmp_path):
    folder = short_runs[0].save(tmp_path / "run")
    meta = json.loads((folder / "run.json").read_text())
    meta.pop("format_version"), meta.pop("facts"), meta.pop("manifest")  # format 1: no version, no manifest
    (folder / "run.json").write_text(json.dumps(meta))
    old = [{**FORMAT_1_EVENT, "step": e.step} for e in short_runs[0].events]
    (folder / "events.json").write_text(json.dumps(old, indent=1))
    loaded = Run.load(folder)
    assert [e.to_json() for e in loaded.events] == old
    d = diagnose(loaded, step=SHORT_BURST)
    assert d.facts["worst_tokens"] == ["zq"] and d.facts["top_tensor"] == "wte.weight"


def _toy_recorded_run(tmp_path):
    """Four steps of a two-layer model through ``record``, a spike declared at step 3."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(11, 8), torch.nn.Linear(8, 11))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randint(0, 11, (4, 6)), torch.randint(0, 11, (4, 6))
    rec = record(model, opt, max_norm=1.0, declared={3: "burst"})
    for _ in range(4):
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, 11), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        rec.step(loss=loss, logits=logits, targets=y)
        opt.zero_grad()
    return rec


def test_the_recorder_writes_the_engines_shape(short_runs, tmp_path):
    rec = _toy_recorded_run(tmp_path)
    run = rec.run()
    assert [e.step for e in run.events] == [3] and isinstance(run.events[0], Event)
    engine_keys = set(short_runs[0].event_at(SHORT_BURST).to_json())
    recorded_keys = set(run.events[0].to_json())
    assert recorded_keys == engine_keys - {"update", "attn_logit_max_per_head"}  # what it did not measure
    folder = run.save(tmp_path / "saved")
    validate_run_folder(folder)
    # as JSON text: a four-step run's baseline is NaN, which no NaN equals
    assert json.dumps(Run.load(folder).event_at(3).to_json()) == json.dumps(run.events[0].to_json())
    assert {f.name for f in fields(Event)} >= engine_keys
