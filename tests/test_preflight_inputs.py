"""spikecheck preflight's inputs, each bad one a single line before anything trains: the HF
config.json, the proxy widths, the recipe (own keys and TrainingArguments keys), the
transformers version; and the scaling rule on real configs. json and yaml only (no training)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.preflight.hf_config import check_config, check_widths, proxy_config, read_config, scaling_rule_lines
from pytest_spikecheck.preflight.recipe import recipe_from_dict

CONFIGS = Path(__file__).parent / "data" / "hf_configs"
LLAMA = {
    "model_type": "llama",
    "hidden_size": 2048,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "head_dim": 64,
    "tie_word_embeddings": True,
    "rope_theta": 500000.0,
    "vocab_size": 128256,
    "pad_token_id": None,
    "bos_token_id": 128000,
}


def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text, text
    return text


@pytest.mark.parametrize(
    "content, expected",
    [
        ("{not json", "is not JSON"),
        ("[1, 2]", "holds one JSON object"),
        ('{"hidden_size": 64}', "has no 'model_type'"),
        ('{"model_type": "llama"}', "has no 'hidden_size'"),
        ('{"model_type": "gemma2", "hidden_size": 64}', "model_type 'gemma2' is not supported"),
    ],
)
def test_a_bad_config_file_is_one_line(tmp_path, content, expected):
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(ConfigError) as exc:
        read_config(tmp_path)  # a folder holding config.json
    assert expected in one_line(exc)


@pytest.mark.parametrize(
    "field, value, what",
    [
        ("num_local_experts", 8, "mixture-of-experts"),
        ("num_experts", 64, "mixture-of-experts"),
        ("kv_lora_rank", 512, "multi-head latent attention"),
        ("attn_logit_softcapping", 50.0, "soft-capping"),
        ("final_logit_softcapping", 30.0, "soft-capping"),
    ],
)
def test_an_architecture_field_not_modelled_is_named(field, value, what):
    with pytest.raises(ConfigError) as exc:
        check_config({**LLAMA, field: value}, "cfg")
    assert field in one_line(exc) and what in one_line(exc)
    check_config({**LLAMA, field: None}, "cfg")  # null is the field's "off"


def test_a_sliding_window_is_named_refused_when_shorter_than_the_proxy_sequences():
    mistral = {**LLAMA, "model_type": "mistral", "sliding_window": 32}
    with pytest.raises(ConfigError) as exc:
        check_config(mistral, "cfg", block_size=64)
    assert "sliding_window 32" in one_line(exc)
    noted = check_config({**mistral, "sliding_window": 4096}, "cfg", block_size=64)
    assert any("sliding_window 4096" in n for n in noted.notes)
    qwen_off = check_config({**LLAMA, "model_type": "qwen2", "sliding_window": 32, "use_sliding_window": False}, "cfg")
    assert qwen_off.notes == ()  # Qwen2 carries a window it does not use


@pytest.mark.parametrize(
    "widths, expected",
    [
        ([], "width list is empty"),
        ([128, 64], "strictly increasing"),
        ([64, 64], "strictly increasing"),
        ([1024, 4096], "larger than the config's hidden_size 2048"),
        ([64, 96], "width 64 does not hold a whole number of 4-query-head groups of head_dim 64"),
    ],
)
def test_bad_widths_are_one_line(widths, expected):
    with pytest.raises(ConfigError) as exc:
        check_widths(check_config(LLAMA, "cfg"), widths)
    assert expected in one_line(exc)


def test_the_scaling_rule_keeps_head_dim_group_and_the_fields_it_must():
    cfg = check_config({**LLAMA, "attention_bias": True, "rms_norm_eps": 1e-5}, "cfg")
    p = proxy_config(cfg, 512)
    assert (p["hidden_size"], p["num_attention_heads"], p["num_key_value_heads"], p["head_dim"]) == (512, 8, 2, 64)
    assert p["intermediate_size"] == 2048 and p["num_hidden_layers"] == 2
    assert p["attention_bias"] is True and p["rms_norm_eps"] == 1e-5 and p["rope_theta"] == 500000.0
    assert p["tie_word_embeddings"] is True
    assert "vocab_size" not in p and "pad_token_id" not in p and "bos_token_id" not in p
    kept = proxy_config(cfg, 512, heads="keep")
    assert (kept["num_attention_heads"], kept["num_key_value_heads"], kept["head_dim"]) == (32, 8, 16)
    small = proxy_config(cfg, 64, head_dim=16, layers=3)
    assert (small["num_attention_heads"], small["num_key_value_heads"], small["num_hidden_layers"]) == (4, 1, 3)
    lines = scaling_rule_lines(cfg, [256, 512])
    assert "head_dim kept" in lines[1] and any("proxy width 512: 8 heads / 2 KV x head_dim 64" in line for line in lines)


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.json") if p.name != "PROVENANCE.json"))
def test_every_real_config_reads_and_scales(name):
    cfg = read_config(CONFIGS / name)
    provenance = json.loads((CONFIGS / "PROVENANCE.json").read_text())[name]
    assert provenance["repo"] and len(provenance["commit"]) == 40 and provenance["path"].endswith("config.json")
    p = proxy_config(cfg, cfg.head_dim * cfg.group * 2)
    assert p["num_attention_heads"] // p["num_key_value_heads"] == cfg.group
    if "layer_types" in p:
        assert len(p["layer_types"]) == p["num_hidden_layers"]


@pytest.mark.parametrize(
    "raw, expected",
    [
        ({"lr": 0}, "learning rate must be a number > 0"),
        ({"lr": -1e-3}, "learning rate must be a number > 0"),
        ({"optimizer": "lion", "lr": 1e-3}, "unknown optimizer 'lion'"),
        ({"lr": 1e-3, "beta": 0.9}, "unknown recipe key 'beta'"),
        ({"optimizer": "adamw"}, "has no learning rate"),
        ({"learning_rate": 1e-3, "optim": "adafactor"}, "unknown optimizer optim='adafactor'"),
        ({"learning_rate": 1e-3, "lr_scheduler_type": "linear"}, "lr_scheduler_type 'linear'"),
        ({"learning_rate": 1e-3, "lr_scheduler_type": "cosine", "warmup_steps": 100}, "needs max_steps"),
        ({"learning_rate": 1e-3, "label_smoothing_factor": 0.1}, "'label_smoothing_factor' is not a TrainingArguments key"),
        ({"optimizer": "muon", "lr": 0.02, "lr_transfer": "mup"}, "mup is defined for AdamW"),
        ({"lr": 1e-3, "lr_transfer": "magic"}, "lr_transfer must be one of standard, mup"),
    ],
)
def test_a_bad_recipe_is_one_line(raw, expected):
    with pytest.raises(ConfigError) as exc:
        recipe_from_dict(raw, "recipe.yaml")
    assert expected in one_line(exc)


def test_training_arguments_map_onto_the_recipe():
    r = recipe_from_dict(
        {
            "learning_rate": 3e-4,
            "warmup_ratio": 0.1,
            "lr_scheduler_type": "cosine",
            "weight_decay": 0.05,
            "max_grad_norm": 0.0,
            "adam_beta1": 0.9,
            "adam_beta2": 0.95,
            "adam_epsilon": 1e-6,
            "per_device_train_batch_size": 16,
            "output_dir": "x",
        }
    )
    assert (r.lr, r.warmup, r.schedule, r.weight_decay, r.grad_clip, r.betas, r.eps) == (
        3e-4,
        0.1,
        "cosine",
        0.05,
        None,
        (0.9, 0.95),
        1e-6,
    )
    assert set(r.ignored) == {"per_device_train_batch_size", "output_dir"}
    changes = r.scenario_changes(100)
    assert changes["schedule__warmup_steps"] == 10 and changes["optimizer__name"] == "adamw"


def test_mup_needs_heads_that_scale_and_an_untested_transformers_is_named(monkeypatch):
    from pytest_spikecheck.integrations import hf_proxy
    from pytest_spikecheck.preflight.study import plan_study

    cfg = check_config(LLAMA, "cfg")
    with pytest.raises(ConfigError) as exc:
        plan_study(cfg, recipe_from_dict({"lr": 1e-3, "lr_transfer": "mup"}), widths=[512, 1024], heads="keep")
    assert "mup needs heads that scale" in one_line(exc)
    monkeypatch.setattr(hf_proxy, "transformers_version", lambda: "5.30.0")
    with pytest.raises(ConfigError) as exc:
        hf_proxy.check_transformers()
    assert "transformers 5.30.0 is installed" in one_line(exc) and "tested with transformers 5.24.0" in one_line(exc)
    assert hf_proxy.check_transformers(allow_untested=True) == "5.30.0"
    monkeypatch.setattr(hf_proxy, "transformers_version", lambda: None)
    with pytest.raises(ConfigError, match=r"pytest-spikecheck\[preflight\]"):
        hf_proxy.check_transformers()


def test_the_cli_refuses_bad_input_in_one_line_before_training(tmp_path, capsys):
    from pytest_spikecheck.cli.commands import main

    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("optimizer: adamw\nlr: 3.0e-4\n")
    assert main(["preflight", str(config), "--recipe", str(recipe), "--widths", "256,128", "--plan-only"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "strictly increasing" in err
    recipe.write_text("optimizer: adamw\nlr: 0\n")
    assert main(["preflight", str(config), "--recipe", str(recipe), "--plan-only"]) == 2
    assert "learning rate must be a number > 0" in capsys.readouterr().err
    recipe.write_text("optimizer: adamw\nlr: 3.0e-4\n")
    assert main(["preflight", str(config), "--recipe", str(recipe), "--widths", "256,512", "--plan-only"]) == 0
    out = capsys.readouterr().out
    assert "proxy width 256: 4 heads / 1 KV x head_dim 64" in out and "336 points" in out
    assert "defence clip-1 left out: the recipe clips at 1 already" in out


def _rows(first_failing: dict[tuple[int, int], float | None], lrs=(1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2)) -> list[dict]:
    """Study rows for one corpus and defence whose first failing LR per (width, seed) is given:
    every LR from it on diverges (inf), every LR below ends at 2.0 from 5.0."""
    rows = []
    for (width, seed), first in first_failing.items():
        for lr in lrs:
            bad = first is not None and lr >= first
            rows.append(
                {
                    "corpus": "induction",
                    "defence": "as-given",
                    "width": width,
                    "seed": seed,
                    "lr": lr,
                    "status": "done",
                    "final_eval_loss": float("inf") if bad else 2.0,
                    "initial_loss": 5.0,
                    "max_attn_logit": 20.0,
                    "diverged": bad,
                }
            )
    return rows


def test_the_verdict_fits_the_first_failing_lr_against_width_and_extrapolates():
    from pytest_spikecheck.preflight.verdict import fails, verdict

    ladder = {(64, 0): 1.6e-2, (128, 0): 8e-3, (256, 0): 4e-3, (64, 1): 1.6e-2, (128, 1): 8e-3, (256, 1): 2e-3}
    found = verdict(_rows(ladder), user_lr=1e-3, target_width=1024)["studies"][0]
    assert [p["first_failing_lr"] for p in found["widths"]] == [1.6e-2, 8e-3, 3e-3]
    assert found["slope"] == pytest.approx(-1.21, abs=0.01)
    assert found["slope_interval"] == pytest.approx([-1.5, -1.0])
    assert found["predicted_first_failing_lr"] < 1e-3  # width^-1.2 from 3e-3 at 256 to 1024
    assert "predicted unstable" in found["sentence"] and "width^-1.21 [-1.50, -1.00]" in found["sentence"]
    one_seed = verdict(_rows({k: v for k, v in ladder.items() if k[1] == 0}), user_lr=1e-3, target_width=1024)
    assert "cannot tell (one seed, no interval)" in one_seed["studies"][0]["sentence"]
    flat = verdict(_rows({(64, 0): None, (128, 0): None}), user_lr=1e-3, target_width=1024)["studies"][0]
    assert flat["holds"] and "holds at every proxy width" in flat["sentence"]
    assert fails({"status": "done", "final_eval_loss": 4.0, "initial_loss": 5.0, "max_attn_logit": 150.0}) is True
    assert fails({"status": "done", "final_eval_loss": 5.1, "initial_loss": 5.0, "max_attn_logit": 1.0}) is True
    assert fails({"status": "done", "final_eval_loss": 4.0, "initial_loss": 5.0, "max_attn_logit": 99.0}) is False
    assert fails({"status": "failed"}) is None


def test_assert_preflight_checks_the_margin_at_every_width_and_the_extrapolated_one():
    from pytest_spikecheck.errors import SpikeCheckError
    from pytest_spikecheck.preflight.result import PreflightResult, assert_preflight
    from pytest_spikecheck.preflight.verdict import verdict

    def result(ladder, lr):
        rows = _rows(ladder)
        return PreflightResult("cfg", "adamw", lr, 1024, [], rows, verdict(rows, user_lr=lr, target_width=1024))

    steady = {(64, 0): 1.6e-2, (128, 0): 1.6e-2, (64, 1): 1.6e-2, (128, 1): 1.6e-2}
    assert_preflight(result(steady, 1e-3), defences_hold=["as-given"], lr_margin=2.0)
    with pytest.raises(SpikeCheckError, match=r"width 64: first failing LR 0.016 < 20 x lr 0.001"):
        assert_preflight(result(steady, 1e-3), defences_hold=["as-given"], lr_margin=20.0)
    falling = {(64, 0): 1.6e-2, (128, 0): 8e-3, (64, 1): 1.6e-2, (128, 1): 4e-3}
    with pytest.raises(SpikeCheckError, match=r"width 1024 \(extrapolated\)"):
        assert_preflight(result(falling, 1e-3), defences_hold=["as-given"], lr_margin=2.0)
    with pytest.raises(SpikeCheckError, match="'qk-norm' was not studied"):
        assert_preflight(result(steady, 1e-3), defences_hold=["qk-norm"])


def test_the_sweep_starts_the_widest_proxy_first_by_its_own_size_not_the_presets():
    """Point.cost reads the proxy's hidden_size and depth from the factory's config (and the
    corpus's batch size): the engine hands the executor the dearest points first. No training:
    the executor records the order and fails every point."""
    from pytest_spikecheck.preflight.study import plan_study, study_sweep
    from pytest_spikecheck.sweep import sweep
    from pytest_spikecheck.sweep.spec import factory_size
    from pytest_spikecheck.sweep.worker import Outcome

    study = plan_study(
        check_config(LLAMA, "llama"),
        recipe_from_dict({"lr": 1e-3}),
        widths=[64, 256],
        head_dim=16,
        lr_factors=[1.0],
        defences=["as-given"],
        seeds=[0],
        steps=10,
    )
    plan = study_sweep(study)
    points = plan.expand()
    by = {(p.scenario.data.corpus, p.scenario.model_kwargs["config"]["hidden_size"]): p.cost for p in points}
    assert by[("phase19", 256)] == 16 * by[("phase19", 64)]
    assert by[("induction", 64)] == 4 * by[("phase19", 64)]  # batches of 32 against 8
    assert factory_size({"config": {"hidden_size": 96, "num_hidden_layers": 4}}, 64, 2) == (96, 4)
    assert factory_size({"n_embd": 48, "n_layer": 3}, 64, 2) == (48, 3) and factory_size({}, 64, 2) == (64, 2)

    class Recording:
        order: list[int] = []

        def run(self, jobs, deliver):
            for job in jobs:
                self.order.append(job.index)
                deliver(Outcome(job.index, error="not trained", seconds=0.0, where="test"))

    recording = Recording()
    sweep(plan, executor=recording, progress=False)
    started = [
        (points[i].scenario.data.corpus, points[i].scenario.model_kwargs["config"]["hidden_size"]) for i in recording.order
    ]
    assert started == [("induction", 256), ("phase19", 256), ("induction", 64), ("phase19", 64)]


def test_quick_is_the_documented_subset():
    """--quick (docs/preflight.md): widths 64 and 128, the recipe's LR x 1, 2, 4, as-given and
    qk-norm, seed 0, both corpora, 100 steps: 24 points on Llama-3.2-1B, 12 on Qwen3-1.7B (its own
    q/k-norm is the qk-norm defence)."""
    from pytest_spikecheck.preflight.study import plan_study

    recipe = recipe_from_dict({"lr": 3e-3})
    llama = plan_study(read_config(CONFIGS / "llama-3.2-1b.json"), recipe, quick=True, head_dim=16)
    assert (llama.widths, llama.lr_factors, llama.defences, llama.seeds, llama.steps) == (
        (64, 128),
        (1.0, 2.0, 4.0),
        ("as-given", "qk-norm"),
        (0,),
        100,
    )
    assert llama.corpora == ("phase19", "induction") and llama.n_points == 24
    qwen3 = plan_study(read_config(CONFIGS / "qwen3-1.7b.json"), recipe, quick=True, head_dim=16)
    assert qwen3.defences == ("as-given",) and qwen3.n_points == 12
