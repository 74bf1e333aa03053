import math

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
        ({"optimizer": {"grad_clip": -1}}, "grad_clip must be >= 0"),
        ({"optimizer": {"lr": "fast"}}, "optimizer.lr must be a number"),
        ({"optimizer": {"weight_decy": 0.1}}, "unknown key optimizer.weight_decy"),
        ({"model": {"preset": "huge"}}, "unknown model preset 'huge'"),
        ({"preset": "phase-20"}, "unknown scenario preset 'phase-20'"),
        ({"breaks": ["no_clipping"]}, "unknown break 'no_clipping'"),
        ({"breaks": [{"rare_token_burst": {"count": 3, "step": 5}}]}, "unknown parameter 'step'"),
        ({"breaks": [{"rare_token_burst": {"content": "klingon"}}]}, "content must be one of"),
        ({"model": {"n_embd": 30, "n_head": 4}}, "divisible"),
        ({"steps": 0}, "steps must be a positive integer"),
        ({"sampler": {"bursts": [{"count": 3}]}}, "needs at_step"),
    ],
)
def test_bad_configs_raise_one_line_errors(raw, message):
    with pytest.raises(ConfigError, match=message) as info:
        Scenario.from_dict(raw)
    assert "\n" not in str(info.value)


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
