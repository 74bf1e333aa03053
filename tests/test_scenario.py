import math
import re

import pytest

from pytest_spikecheck import ClipAt, ConfigError, NoClip, RareTokenBurst, Scenario
from pytest_spikecheck.scenario import MixtureShift, break_from_config


def test_preset_is_seed_a_control_without_breaks():
    s = Scenario.preset("phase-19")
    assert (s.model.n_embd, s.model.n_layer, s.model.n_head, s.model.block_size) == (64, 2, 4, 32)
    assert (s.optimizer.lr, s.optimizer.weight_decay, s.optimizer.grad_clip, s.seed) == (1e-2, 0.1, 1.0, 42)
    assert s.sampler.batch_size == 8 and s.sampler.bursts == () and s.breaks == ()


def test_breaks_fold_into_config_switches_and_sampler_changes():
    s = Scenario.preset("phase-19").with_breaks(NoClip(), RareTokenBurst(count=3, at_step=312))
    r = s.resolved()
    assert r.breaks == () and math.isinf(r.max_norm)
    assert r.sampler.bursts[0].at_step == 312 and r.sampler.bursts[0].content == "greek"
    assert s.burst_steps == (312,)


def test_hash_ignores_name_and_spelling_of_no_clip():
    a = Scenario.preset("phase-19").with_breaks(NoClip())
    b = Scenario.preset("phase-19").replace(name="other", optimizer__grad_clip=float("inf"))
    assert a.content_hash() == b.content_hash()
    assert a.content_hash() != Scenario.preset("phase-19").content_hash()


def test_yaml_round_trip(tmp_path):
    s = Scenario.preset("phase-19").with_breaks(RareTokenBurst(count=2, at_step=50, content="caps"), ClipAt(0.5))
    path = tmp_path / "config.yaml"
    path.write_text(s.to_yaml())
    loaded = Scenario.from_yaml(path)
    assert loaded == s and loaded.content_hash() == s.content_hash()


def test_experiment_dir_in_the_seeds_shape():
    s = Scenario.from_yaml("experiments/19-break-no-clip")
    assert s.name == "19-break-no-clip" and s.optimizer.grad_clip is None
    assert s.content_hash() == Scenario.from_yaml("experiments/19-control").with_breaks(NoClip()).content_hash()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"optimizr": {}}, "unknown key 'optimizr'"),
        ({"optimizer": {"grad_clip": -1}}, "grad_clip must be > 0"),
        ({"optimizer": {"grad_clip": 0}}, "use a tiny max_norm"),
        ({"steps": 100, "breaks": [{"rare_token_burst": {"at_step": 312}}]}, r"at step 312 is after the last step \(100 steps\)"),
        (
            {"breaks": [{"rare_token_burst": {"count": 2.5}}]},
            r"config: break .rare_token_burst.: RareTokenBurst\(count=...\) must be an integer",
        ),
        ({"optimizer": {"lr": "fast"}}, "optimizer.lr must be a number"),
        ({"optimizer": {"weight_decy": 0.1}}, "unknown key optimizer.weight_decy"),
        ({"model": {"preset": "huge"}}, "unknown model preset 'huge'"),
        ({"preset": "phase-20"}, "unknown scenario preset 'phase-20'"),
        ({"breaks": ["no_clipping"]}, "unknown break 'no_clipping'"),
        ({"breaks": [{"rare_token_burst": {"count": 3, "step": 5}}]}, "unknown parameter 'step'"),
        ({"breaks": [{"rare_token_burst": {"content": "klingon"}}]}, "content must be one of"),
        ({"model": {"n_embd": 30, "n_head": 4}}, "divisible"),
        ({"model": {"arch": "llama", "n_embd": 36, "n_head": 4}}, "head size must be even"),
        ({"steps": 0}, "steps must be a positive integer"),
        ({"sampler": {"bursts": [{"count": 3}]}}, "needs at_step"),
    ],
)
def test_bad_configs_raise_one_line_errors(raw, message):
    with pytest.raises(ConfigError, match=message) as info:
        Scenario.from_dict(raw)
    assert "\n" not in str(info.value)


def test_qk_clip_with_qk_layernorm_is_refused_before_training():
    # the norm undoes QK-Clip's scale of W_q and W_k: each step would clip again and shrink them
    scenario = Scenario.from_dict({"breaks": ["qk_layernorm", {"qk_clip": {"tau": 30}}]})
    with pytest.raises(ConfigError, match="QKClip with QKLayerNorm: the norm undoes any scale of W_q and W_k"):
        scenario.resolved()


def test_bad_yaml_and_missing_paths(tmp_path):
    bad = tmp_path / "config.yaml"
    bad.write_text("optimizer: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        Scenario.from_yaml(bad)
    with pytest.raises(ConfigError, match="no such config file or experiment directory"):
        Scenario.from_yaml(tmp_path / "nope")


def test_with_breaks_rejects_non_breaks():
    with pytest.raises(ConfigError, match="expects Break instances"):
        Scenario().with_breaks("no_clip")
    assert isinstance(break_from_config("no_clip"), NoClip)


def test_mixture_shift_switches_to_the_mixture_corpus_and_round_trips(tmp_path):
    s = Scenario.preset("phase-19").with_breaks(MixtureShift(phase_lengths=(7, 14), new_source="foreign"))
    r = s.resolved()
    assert (r.data.corpus, r.sampler.kind, r.sampler.mixture.phase_lengths) == ("mixture", "mixture", (7, 14))
    path = tmp_path / "c.yaml"
    path.write_text(r.to_yaml())
    assert Scenario.from_yaml(path).content_hash() == s.content_hash()


# -- derived names -------------------------------------------------------------------------

PHASE19 = Scenario.preset("phase-19")


def test_a_derived_scenario_is_named_after_its_content():
    assert PHASE19.name == "phase-19" and Scenario().name == "scenario"
    assert PHASE19.with_breaks(NoClip(), RareTokenBurst(count=8, at_step=312)).name == "phase-19+no_clip+burst(8×greek@312)"
    assert PHASE19.replace(steps=120, optimizer__lr=3e-3).with_breaks(ClipAt(0.5)).name == "phase-19+steps=120+lr=0.003+clip(0.5)"
    assert PHASE19.with_breaks(NoClip()).resolved().name == "phase-19+no_clip"  # the declared name survives resolving


def test_explicit_names_win_and_stay():
    named = PHASE19.replace(name="mine")
    assert named.with_breaks(NoClip()).replace(steps=10).name == "mine"
    assert Scenario(name="x").name == "x"


def test_different_contents_never_share_a_derived_name():
    variants = [
        PHASE19,
        PHASE19.with_breaks(NoClip()),
        PHASE19.replace(seed=1),
        PHASE19.with_breaks(ClipAt(0.5)),
        PHASE19.with_breaks(ClipAt(0.5, mode="per_tensor")),
        PHASE19.replace(optimizer__lr=0.0100000001),
        PHASE19.with_breaks(RareTokenBurst(count=2, at_step=50)),
        PHASE19.with_breaks(RareTokenBurst(count=3, at_step=50)),
    ]
    assert len({v.name for v in variants}) == len({v.content_hash() for v in variants}) == len(variants)


def test_a_long_derived_name_is_cut_and_ends_in_a_content_hash():
    texts = tuple(f"document number {i}" for i in range(200))
    a = PHASE19.replace(data__corpus="texts", data__texts=texts, data__eval_sentences=20)
    b = a.replace(data__texts=texts[:-1] + ("another",))
    assert len(a.name) <= 64 and a.name.endswith("~" + a.content_hash()[:8]) and a.name != b.name


def test_break_parameters_are_checked_when_written():
    for make, message in [
        (lambda: ClipAt(max_norm=-1), r"ClipAt\(max_norm=...\) must be > 0"),
        (lambda: ClipAt(mode="nope"), r"ClipAt\(mode=...\) must be one of global"),
        (lambda: RareTokenBurst(count=2.5), r"RareTokenBurst\(count=...\) must be an integer, was 2.5"),
        (lambda: ClipAt(max_norm="1"), r"ClipAt\(max_norm=...\) must be a number"),
        (lambda: PHASE19.replace(optimizer__grad_clip="abc"), "optimizer.grad_clip must be a number"),
        (lambda: PHASE19.replace(optimizer__lr="fast"), "optimizer.lr must be a number"),
        (lambda: PHASE19.replace(optimizer__grad_clip=0), "use a tiny max_norm"),
        (
            lambda: PHASE19.replace(steps=100).with_breaks(RareTokenBurst()),
            r"RareTokenBurst at step 312 is after the last step \(100 steps\)",
        ),
        (lambda: PHASE19.replace(optimizer__gradclip=1.0), "unknown field optimizer.gradclip"),
    ]:
        with pytest.raises(ConfigError, match=message) as info:
            make()
        assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "is empty"),
        ("# only a comment\n", "is empty"),
        ("preset: phase-19\nsteps: 10\nsteps: 20\n", r"line 3 is not valid YAML \(duplicate key 'steps'"),
        ("preset: phase-19\nbreaks:\n- rare_token_burst: {count: 2.5, at_step: 5}\n", r"config.yaml: break 'rare_token_burst'"),
    ],
)
def test_bad_config_files_are_one_line_errors_naming_the_file(tmp_path, text, message):
    (tmp_path / "config.yaml").write_text(text)
    with pytest.raises(ConfigError, match=message) as info:
        Scenario.from_yaml(tmp_path / "config.yaml")
    assert "\n" not in str(info.value) and str(tmp_path) in str(info.value)


@pytest.mark.parametrize(
    "raw, where",
    [
        ({True: ["push"], "preset": "phase-19"}, "unknown key True"),
        ({"optimizer": {1: 0.1}}, "unknown key optimizer.1"),
        ({"breaks": [{"clip_at": {None: 1}}]}, "unknown parameter None"),
    ],
)
def test_a_key_that_is_not_a_string_is_one_line(raw, where):
    """YAML reads a bare ``on:`` (a CI workflow) as the key True: one line, not a TypeError from sorting."""
    with pytest.raises(ConfigError, match=re.escape(where)):
        Scenario.from_dict(raw)
