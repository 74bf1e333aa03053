"""The preflight's HF proxies (transformers' own classes) under the engine: the measuring
attention function gives the numbers our own Llama gives on the same weights; Muon's role rule,
QK-Clip's hook, the qk-norm and z-loss defences and muP's per-group LR work on them; a tiny
study runs through the sweep engine, writes its verdict and page, and a rerun trains nothing."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from pytest_spikecheck import QKClip, QKLayerNorm, Scenario, ZLoss, train  # noqa: E402
from pytest_spikecheck.errors import ConfigError  # noqa: E402
from pytest_spikecheck.integrations.hf_proxy import PROXY_FACTORY, HFProxy, proxy_model  # noqa: E402
from pytest_spikecheck.models.config import HEAD_LOGITS_KEY, GPTConfig  # noqa: E402
from pytest_spikecheck.preflight.hf_config import check_config, proxy_config  # noqa: E402
from pytest_spikecheck.training.model_contract import ContractModel  # noqa: E402
from pytest_spikecheck.training.optimizers import muon_matrices, parameter_groups  # noqa: E402

LLAMA = check_config(
    {
        "model_type": "llama",
        "hidden_size": 2048,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "head_dim": 64,
        "tie_word_embeddings": False,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5,
    },
    "llama",
)
QWEN3 = check_config(
    {
        "model_type": "qwen3",
        "hidden_size": 1024,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "head_dim": 128,
        "tie_word_embeddings": True,
        "layer_types": ["full_attention"] * 28,
    },
    "qwen3",
)
QWEN2 = check_config(
    {
        "model_type": "qwen2",
        "hidden_size": 896,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "tie_word_embeddings": True,
        "sliding_window": 32768,
        "use_sliding_window": False,
    },
    "qwen2",
)


def test_the_hf_llama_proxy_measures_what_our_llama_measures_on_the_same_weights():
    from pytest_spikecheck.models.llama import Llama, swiglu_hidden

    torch.manual_seed(0)
    ours = Llama(GPTConfig(arch="llama", n_layer=2, n_head=4, n_kv_head=1, n_embd=32, block_size=16, vocab_size=50))
    cfg = {**proxy_config(LLAMA, 32, head_dim=8), "intermediate_size": swiglu_hidden(32)}
    proxy = proxy_model(50, config=cfg)
    names = {
        "wte.weight": "hf.model.embed_tokens.weight",
        "norm_f.weight": "hf.model.norm.weight",
        "lm_head.weight": "hf.lm_head.weight",
    }
    for i in range(2):
        names[f"blocks.{i}.attn_norm.weight"] = f"hf.model.layers.{i}.input_layernorm.weight"
        names[f"blocks.{i}.mlp_norm.weight"] = f"hf.model.layers.{i}.post_attention_layernorm.weight"
        names |= {
            f"blocks.{i}.attn.{p}.weight": f"hf.model.layers.{i}.self_attn.{p}.weight"
            for p in ("q_proj", "k_proj", "v_proj", "o_proj")
        }
        names |= {
            f"blocks.{i}.mlp.{p}.weight": f"hf.model.layers.{i}.mlp.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")
        }
    theirs = dict(proxy.named_parameters())
    assert set(theirs) == set(names.values())
    with torch.no_grad():
        for mine, hf in names.items():
            theirs[hf].copy_(dict(ours.named_parameters())[mine])
    ours.record_stats = proxy.record_stats = True
    idx = torch.randint(0, 50, (3, 16), generator=torch.Generator().manual_seed(1))
    targets = torch.randint(0, 50, (3, 16), generator=torch.Generator().manual_seed(2))
    logits_a, loss_a = ours(idx, targets)
    logits_b, loss_b = proxy(idx, targets)
    torch.testing.assert_close(logits_b, logits_a, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss_b, loss_a)
    a, b = ours.spikecheck_stats, proxy.spikecheck_stats
    torch.testing.assert_close(b[HEAD_LOGITS_KEY], a[HEAD_LOGITS_KEY], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        b["logz_mean, logz_absmax, attn_logit_max"], a["logz_mean, logz_absmax, attn_logit_max"], rtol=1e-5, atol=1e-6
    )
    assert b[HEAD_LOGITS_KEY].shape == (2, 4)


@pytest.mark.parametrize("config, tied", [(LLAMA, False), (QWEN3, True)])
def test_muon_takes_the_attention_and_mlp_matrices_never_the_embeddings_or_the_head(config, tied):
    proxy = proxy_model(60, config=proxy_config(config, 64, head_dim=16))
    wrapped = ContractModel(proxy, True, "proxy", 60)
    chosen = {m.name for m in muon_matrices(wrapped, Scenario.preset("phase-19").replace(optimizer__name="muon"))}
    assert chosen and all(".self_attn." in n or ".mlp." in n for n in chosen)
    assert not any("embed_tokens" in n or "lm_head" in n or "norm" in n for n in chosen)
    matrices = {n for n, p in proxy.named_parameters() if p.dim() == 2}
    assert matrices - chosen == {"hf.model.embed_tokens.weight"} | (set() if tied else {"hf.lm_head.weight"})


def test_the_hooks_train_qk_clip_qk_norm_z_loss_muon_and_refuse_what_does_not_fit():
    base = Scenario.preset("phase-19").replace(
        steps=3, model_factory=PROXY_FACTORY, model_kwargs={"config": proxy_config(QWEN2, 56, head_dim=8)}
    )
    clipped = train(base.with_breaks(QKClip(tau=0.05)))  # Qwen2's q/k biases scaled with the rows
    assert clipped.metrics["qk_clipped_heads"][0] > 0
    assert max(clipped.metrics["attn_logit_max"][1:]) <= 0.05 * 2
    plain = train(base)
    normed = train(base.with_breaks(QKLayerNorm()))
    assert normed.metrics["loss"][0] != plain.metrics["loss"][0]  # the norm is in the forward
    z = train(base.with_breaks(ZLoss(coefficient=1e-2)))
    assert z.metrics["z_loss"][0] > 0
    assert train(base.replace(optimizer__name="muon", optimizer__lr=0.02)).metrics["loss"][-1] < plain.metrics["loss"][0]
    qwen3 = base.replace(model_kwargs={"config": proxy_config(QWEN3, 64, head_dim=16)})
    with pytest.raises(ConfigError, match="q/k-norm"):
        train(qwen3.with_breaks(QKClip()))
    with pytest.raises(ConfigError, match="already has q/k-norm"):
        train(qwen3.with_breaks(QKLayerNorm()))


def test_mup_gives_hidden_matrices_their_own_lr_and_scales_the_readout():
    proxy = proxy_model(60, config=proxy_config(LLAMA, 128, head_dim=16), output_multiplier=0.5, hidden_lr_scale=0.5)
    scenario = Scenario.preset("phase-19")
    groups = parameter_groups(ContractModel(proxy, True, "proxy", 60), scenario)
    scaled = [g for g in groups if g.get("lr_scale") == 0.5]
    hidden = {id(p) for _, p in proxy.hidden_matrices()}
    assert {id(p) for g in scaled for p in g["params"]} == hidden
    assert sum(len(g["params"]) for g in groups) == len(list(proxy.parameters()))
    idx = torch.zeros(1, 4, dtype=torch.long)
    half = proxy(idx)[0]
    proxy.output_multiplier = 1.0
    torch.testing.assert_close(proxy(idx)[0] * 0.5, half)
    plain = proxy_model(60, config=proxy_config(LLAMA, 128, head_dim=16))
    assert isinstance(plain, HFProxy) and not plain.spikecheck_lr_scales()


def test_a_tiny_study_runs_through_the_sweep_engine_and_a_rerun_trains_nothing(tmp_path):
    from pytest_spikecheck.preflight import assert_preflight, preflight

    options = dict(
        widths=[32, 64],
        head_dim=8,
        lr_factors=[1.0, 30.0],
        defences=["qk-norm"],
        seeds=[0],
        corpora=["phase19"],
        steps=10,
        jobs=1,
        progress=False,
    )
    result = preflight(LLAMA, {"optimizer": "adamw", "lr": 0.01}, out=tmp_path, **options)
    assert result.counts == "4 done"
    data = json.loads((tmp_path / "preflight.json").read_text())
    assert [(s["corpus"], s["defence"]) for s in data["verdict"]["studies"]] == [("phase19", "qk-norm")]
    assert len(data["rows"]) == 4 and {r["width"] for r in data["rows"]} == {32, 64}
    page = (tmp_path / "index.html").read_text()
    assert page.count("<svg") == 1 and "<script" not in page and "http" not in page.replace("http://www.w3.org", "")
    assert "First failing LR per width" in (tmp_path / "preflight.md").read_text()
    again = preflight(LLAMA, {"optimizer": "adamw", "lr": 0.01}, out=tmp_path, **options)
    assert again.counts == "4 cached" and again.verdict == result.verdict
    assert_preflight(result, defences_hold=["qk-norm"], lr_margin=1.0)
