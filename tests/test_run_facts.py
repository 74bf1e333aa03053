"""The record describes itself: ClipSpec, the facts block of run.json (format 2), format 1
upgraded in memory, the published JSON Schema, and a hand-written minimal run folder judged
like any other. No training here: the session's short runs (tests/short_runs.py) are reused."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from run_schema import validate_run_folder

from pytest_spikecheck import Scenario, assert_clip_contains, diagnose, record
from pytest_spikecheck.clipping import clip_grad_norm_, validate_max_norm
from pytest_spikecheck.cli import main
from pytest_spikecheck.errors import ConfigError, SpikeCheckError
from pytest_spikecheck.records import Run
from pytest_spikecheck.records.facts import FORMAT_VERSION, RunFacts
from pytest_spikecheck.scenario import AdaptiveClip, ClipAt, ClipBeforeUnscale, ClipSpec, NoClip
from pytest_spikecheck.scenario.sections import check_max_norm


# -- ClipSpec ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "kind", "when"),
    [
        ("global", "global", "after_unscale"),
        ("per_tensor", "per_tensor", "after_unscale"),
        ("adaptive", "adaptive", "after_unscale"),
        ("shard_local", "shard_local", "after_unscale"),
        ("before_unscale", "global", "before_unscale"),
        ("each_microbatch", "global", "per_microbatch"),
    ],
)
def test_the_old_clip_mode_spelling_is_an_alias(mode, kind, when):
    extra = (
        {"amp": {"dtype": "float16", "loss_scale": "dynamic"}}
        if mode == "before_unscale"
        else ({"sampler": {"accumulation": 2}} if mode == "each_microbatch" else {})
    )
    s = Scenario.from_dict({"preset": "phase-19", "optimizer": {"clip_mode": mode}, **extra})
    assert (s.optimizer.clip_kind, s.optimizer.clip_when) == (kind, when)
    assert "clip_mode" not in s.to_yaml()  # written in the new spelling
    assert Scenario.from_dict({"preset": "phase-19", "optimizer": {"clip_kind": kind, "clip_when": when}, **extra}) == s


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"clip_mode": "norm"}, "optimizer.clip_mode must be one of global, per_tensor, adaptive, shard_local"),
        ({"clip_mode": "global", "clip_kind": "global"}, "old spelling of clip_kind and clip_when: give one"),
        ({"clip_kind": "value"}, "optimizer.clip_kind must be one of global, per_tensor, shard_local, adaptive, was 'value'"),
        ({"clip_when": "later"}, "optimizer.clip_when must be one of after_unscale, before_unscale, per_microbatch"),
    ],
)
def test_an_unknown_clip_is_one_line_naming_the_known_ones(raw, message):
    with pytest.raises(ConfigError, match=message):
        Scenario.from_dict({"preset": "phase-19", "optimizer": raw})


def test_the_scenario_declares_one_clip_value():
    base = Scenario.preset("phase-19")
    assert base.optimizer.clip == ClipSpec("global", 1.0, "after_unscale")
    assert base.with_breaks(NoClip()).resolved().optimizer.clip == ClipSpec("none", None)
    assert base.with_breaks(ClipAt(0.5, "per_tensor")).resolved().optimizer.clip == ClipSpec("per_tensor", 0.5)
    assert base.with_breaks(AdaptiveClip(z=3.0)).resolved().optimizer.clip == ClipSpec("adaptive", 1.0, z=3.0, alpha=0.97)
    assert base.with_breaks(ClipBeforeUnscale()).resolved().optimizer.clip.when == "before_unscale"


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, "1"])
def test_one_rule_for_a_max_norm_everywhere(bad):
    """> 0, or inf/None for no clip: the spec, ClipAt, ClipSpec and the assertion say the same."""
    for make in (
        lambda: Scenario.preset("phase-19").replace(optimizer__grad_clip=bad),
        lambda: ClipAt(bad),
        lambda: ClipSpec("global", bad),
    ):
        with pytest.raises(ConfigError, match="must be"):
            make()
    with pytest.raises(ConfigError, match="assert_clip_contains.max_norm=.... must be"):
        assert_clip_contains({"grad_norm_post": [1.0]}, max_norm=bad)


def _refusal(make) -> str:
    """What follows the label in the one line ``make()`` raises (every label ends where ' must be' starts)."""
    with pytest.raises(ConfigError) as caught:
        make()
    message = str(caught.value)
    return message[message.index(" must be") :]


@pytest.mark.parametrize("bad", ["1", True, math.nan, -1.0, 0])
def test_one_function_validates_a_max_norm_at_every_entry_point(bad):
    """The clipping entry points (torch's drop-ins), the recorder, the spec, ClipSpec, ClipAt and
    the assertion refuse a bad limit in the same words, from the one function; the only
    difference is what 0 means: torch's clip_grad_norm_ takes 0 (it zeroes the gradient), a
    trainer's 0 is no clip, everywhere else 0 is refused."""
    model = torch.nn.Linear(2, 2)
    model.weight.grad = torch.ones(2, 2)
    ours = [
        lambda: Scenario.preset("phase-19").replace(optimizer__grad_clip=bad),
        lambda: ClipAt(bad),
        lambda: ClipSpec("global", bad),
        lambda: assert_clip_contains({"grad_norm_post": [1.0]}, max_norm=bad),
        lambda: check_max_norm(bad),
    ]
    theirs = [lambda: validate_max_norm(bad), lambda: clip_grad_norm_([model.weight], bad, backend="torch")]
    if bad == 0:
        assert {_refusal(make) for make in ours} == {
            " must be > 0, was 0 (0 would zero every update; to clip as hard "
            "as possible use a tiny max_norm such as 1e-3, for no clipping "
            "use None or inf)"
        }
        assert validate_max_norm(0) == 0.0 and float(clip_grad_norm_([model.weight], 0, backend="torch")) == 2.0
        assert float(model.weight.grad.abs().max()) == 0.0  # as torch's: zeroed
        assert record(model, max_norm=0).max_norm == math.inf  # a trainer's no clip
        return
    recorder = [lambda: record(model, max_norm=bad)]
    if bad == -1.0:  # the two rules for a negative limit: >= 0 (torch's) and > 0 (ours)
        assert {_refusal(make) for make in theirs} == {" must be >= 0 (inf or None for no clipping), was -1.0"}
        assert {_refusal(make) for make in ours + recorder} == {_refusal(ours[0])}
        return
    assert len({_refusal(make) for make in ours + theirs + recorder}) == 1


def test_a_clip_spec_refuses_contradictions():
    with pytest.raises(ConfigError, match="clip kind none with max_norm 1.0"):
        ClipSpec("none", 1.0)
    with pytest.raises(ConfigError, match="clip kind global needs a max_norm"):
        ClipSpec("global", None)
    with pytest.raises(ConfigError, match="an adaptive clip needs z > 0"):
        ClipSpec("adaptive", None)


# -- run.json format 2 ----------------------------------------------------------------------------


def test_an_engine_run_writes_its_facts_and_every_step_its_clip_limit(short_runs, tmp_path):
    run = short_runs[0]
    folder = run.save(tmp_path / "run")
    meta = json.loads((folder / "run.json").read_text())
    assert meta["format_version"] == FORMAT_VERSION == 2
    facts = meta["facts"]
    assert facts["source"] == "engine" and facts["clip"] == {
        "kind": "global",
        "max_norm": 1.0,
        "when": "after_unscale",
        "z": None,
        "alpha": None,
    }
    assert [g["name"] for g in facts["optimizers"]] == ["adamw", "adamw"]  # decayed and undecayed groups
    assert facts["model"]["arch"] == "gpt" and facts["model"]["parameters"] == meta["parameters"]
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert all(r["clip_limit"] == 1.0 for r in rows)
    loaded = Run.load(folder)
    assert loaded.facts == run.facts and "facts" not in loaded.meta


def test_a_no_clip_run_writes_null_clip_limits(short_runs, tmp_path):
    run = short_runs[1]
    folder = run.save(tmp_path / "run")
    assert {json.loads(line)["clip_limit"] for line in (folder / "metrics.jsonl").read_text().splitlines()} == {None}
    with pytest.raises(ConfigError, match="the record says it had no clip"):
        assert_clip_contains(Run.load(folder))


def _as_format_1(folder: Path) -> None:
    """The folder as the released code wrote it: no format_version, no facts, no manifest,
    clip_limit only for adaptive clips."""
    meta = json.loads((folder / "run.json").read_text())
    meta.pop("format_version"), meta.pop("facts"), meta.pop("manifest")
    (folder / "run.json").write_text(json.dumps(meta))
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    (folder / "metrics.jsonl").write_text(
        "".join(json.dumps({k: v for k, v in r.items() if k != "clip_limit"}) + "\n" for r in rows)
    )


def test_a_format_1_folder_is_upgraded_in_memory_and_judged_the_same(short_runs, tmp_path):
    run = short_runs[0]
    new = run.save(tmp_path / "new")
    old = Path(shutil.copytree(new, tmp_path / "old"))
    _as_format_1(old)
    a, b = Run.load(new), Run.load(old)
    assert b.facts.clip == a.facts.clip and b.facts.source == "engine" and b.facts.optimizers is None  # never written
    assert diagnose(b).text() == diagnose(a).text()
    assert_clip_contains(b)  # the limit from the upgraded facts (no clip_limit column in format 1)


def test_a_future_format_is_one_line(short_runs, tmp_path):
    folder = short_runs[0].save(tmp_path / "run")
    meta = json.loads((folder / "run.json").read_text())
    (folder / "run.json").write_text(json.dumps({**meta, "format_version": 3}))
    with pytest.raises(ConfigError, match=r"format_version 3 is not one this pytest-spikecheck reads \(1 or 2\)"):
        Run.load(folder)


def test_an_unknown_facts_field_is_one_line_naming_the_known_ones():
    with pytest.raises(ConfigError, match="unknown field 'optimiser'; known: source, model, optimizers, clip"):
        RunFacts.from_json({"source": "log", "optimiser": "adamw"})
    with pytest.raises(ConfigError, match="facts.clip: unknown field 'limit'"):
        RunFacts.from_json({"source": "log", "clip": {"kind": "global", "limit": 1.0}})
    with pytest.raises(ConfigError, match="run facts source must be one of engine, recorder, hf, lightning, log"):
        RunFacts.from_json({"source": "mine"})


# -- the published schema, and a run folder written by hand ---------------------------------------


def test_every_run_the_suite_writes_validates_against_the_schema(short_runs, tmp_path):
    for i, run in enumerate(short_runs):
        validate_run_folder(run.save(tmp_path / f"run{i}"))


def _minimal_folder(tmp_path: Path, post: list[float], facts: dict | None = None) -> Path:
    """run.json with the schema's required fields only (format_version, facts.source), and a
    metrics.jsonl of step (required) and the norms the judgement reads."""
    folder = tmp_path / "by-hand"
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"format_version": 2, "facts": {"source": "log", **(facts or {})}}))
    pre = [1.0] * 40 + [30.0] + [1.0] * 9
    (folder / "metrics.jsonl").write_text(
        "".join(
            json.dumps({"step": i + 1, "loss": 2.0, "grad_norm_pre": pre[i], "grad_norm_post": p}) + "\n"
            for i, p in enumerate(post)
        )
    )
    return folder


def test_a_hand_written_minimal_run_folder_is_judged(tmp_path, capsys):
    held = _minimal_folder(tmp_path, [1.0] * 50)
    validate_run_folder(held)
    assert_clip_contains(held, max_norm=1.0)
    with pytest.raises(ConfigError, match="does not say what the clip limit was"):
        assert_clip_contains(held)  # nothing says the limit: one line, not a guess
    assert main(["diagnose", str(held)]) == 0
    out = capsys.readouterr().out
    assert "diagnosis at step 41" in out and "clipped to 1" in out
    leaked = _minimal_folder(tmp_path / "b", [1.0] * 40 + [30.0] + [1.0] * 9)
    with pytest.raises(SpikeCheckError, match="post-clip norm 30 > max_norm 1 at step 41"):
        assert_clip_contains(leaked, max_norm=1.0)


def test_a_hand_written_folder_that_says_its_clip_is_judged_against_it(tmp_path, capsys):
    clip = {"clip": {"kind": "global", "max_norm": 1.0, "when": "after_unscale"}}
    held = _minimal_folder(tmp_path, [1.0] * 50, clip)
    validate_run_folder(held)
    assert_clip_contains(held)  # the limit from the facts: no max_norm=
    assert main(["diagnose", str(held)]) == 0
    assert "within max_norm 1" in capsys.readouterr().out
    with pytest.raises(SpikeCheckError, match="post-clip norm 30 > max_norm 1 at step 41"):
        assert_clip_contains(_minimal_folder(tmp_path / "b", [1.0] * 40 + [30.0] + [1.0] * 9, clip))


# -- every reader reads only the record -----------------------------------------------------------


def test_a_run_without_its_scenario_is_named_described_and_marked_as_with_it(short_runs, tmp_path):
    """The name, the description and the declared events are run.json's (format 2): an engine
    folder whose config.yaml is gone (nothing to retrain it) reads the same as with it."""
    run = short_runs[0]
    folder = run.save(tmp_path / "run")
    meta = json.loads((folder / "run.json").read_text())
    assert (meta["name"], meta["declared_events"]) == (run.scenario.name, [60])
    assert meta["description"] == run.scenario.describe_setup() and run.name not in meta["description"]
    (folder / "config.yaml").unlink()
    meta.pop("manifest")  # the manifest lists config.yaml: a hand-edited folder has none
    (folder / "run.json").write_text(json.dumps(meta))
    alone = Run.load(folder)
    assert alone.scenario is None
    assert (alone.name, alone.describe(), alone.declared_events) == (run.name, run.describe(), run.declared_events)
    assert alone.describe() == run.scenario.describe()
    renamed = run.renamed("other")
    assert (renamed.name, renamed.scenario.name, renamed.meta["name"], run.name) == ("other", "other", "other", run.scenario.name)


def test_a_format_1_folder_gets_its_name_description_and_events_from_its_config(short_runs, tmp_path):
    run = short_runs[0]
    old = run.save(tmp_path / "old")
    _as_format_1(old)
    meta = json.loads((old / "run.json").read_text())
    for key in ("name", "description", "declared_events"):
        meta.pop(key)
    (old / "run.json").write_text(json.dumps(meta))
    loaded = Run.load(old)
    assert (loaded.name, loaded.describe(), loaded.declared_events) == (run.name, run.describe(), (60,))
    assert loaded.facts.spike_ratio == run.scenario.record.spike_ratio == 5.0


def _ratio_folder(tmp_path: Path, facts: dict) -> Path:
    """A hand-written folder whose one high step is 3x its running median (a spike at ratio 2, not at 5)."""
    tmp_path.mkdir(parents=True)
    (tmp_path / "run.json").write_text(json.dumps({"format_version": 2, "facts": {"source": "log", **facts}}))
    pre = [1.0] * 40 + [3.0] + [1.0] * 9
    (tmp_path / "metrics.jsonl").write_text(
        "".join(
            json.dumps({"step": i + 1, "loss": 2.0 + (i == 40), "grad_norm_pre": g, "grad_norm_post": g}) + "\n"
            for i, g in enumerate(pre)
        )
    )
    return tmp_path


def test_the_summary_measures_recovery_at_the_ratio_the_record_states():
    """The spike ratio the writer's detector used is a fact (facts.spike_ratio): a run from a
    user's trainer or a folder by hand is measured at its own ratio; unknown (null): 5."""
    import tempfile

    from pytest_spikecheck.report.summary import measure

    with tempfile.TemporaryDirectory() as tmp:
        stated = Run.load(_ratio_folder(Path(tmp) / "stated", {"spike_ratio": 2.0}))
        unknown = Run.load(_ratio_folder(Path(tmp) / "unknown", {}))
        validate_run_folder(stated.folder)
    assert stated.facts.spike_ratio == 2.0 and unknown.facts.spike_ratio is None
    assert (measure(stated).spike_step, measure(stated).is_spike) == (41, True)
    assert (measure(unknown).spike_step, measure(unknown).is_spike) == (41, False)
    assert measure(stated).recovery == 1


def test_the_schema_and_the_docs_name_every_fact_and_what_the_run_is():
    """docs/run-schema.json lists exactly RunFacts' fields (and its nested types'), and
    docs/run-format.md names each, with run.json's name, description and declared_events."""
    from dataclasses import fields

    from pytest_spikecheck.records.facts import ModelFacts, OptimizerGroup, QKClipFacts
    from run_schema import SCHEMA

    run_json = json.loads(SCHEMA.read_text())["properties"]["run.json"]["properties"]
    facts = run_json["facts"]["properties"]
    assert list(facts) == [f.name for f in fields(RunFacts)]
    nested = {"model": ModelFacts, "clip": ClipSpec, "qk_clip": QKClipFacts}
    for key, cls in nested.items():
        assert list(facts[key]["oneOf"][0]["properties"]) == [f.name for f in fields(cls)], key
    assert list(facts["optimizers"]["items"]["properties"]) == [f.name for f in fields(OptimizerGroup)]
    assert {"name", "description", "declared_events"} <= set(run_json)
    doc = (SCHEMA.parent / "run-format.md").read_text()
    missing = [f.name for f in fields(RunFacts) if f"`{f.name}`" not in doc]
    assert missing == [] and all(f"`{k}`" in doc for k in ("name", "description", "declared_events"))
