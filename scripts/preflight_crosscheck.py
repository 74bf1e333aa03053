"""The HF-Llama proxy against our models/llama.py at one shape and recipe (docs/preflight.md,
"Cross-check"; docs/benchmarks.md, "Preflight proxy step"): the same phenomena (largest attention
logit, final eval loss, over seeds) and the wall time of one training step.

    .venv/bin/python scripts/preflight_crosscheck.py [--seeds 0-2] [--steps 150] [--lr 0.1] [--jobs 2]

Shape: Phase-19's micro model (width 64, 4 heads of 16, 2 KV heads, 2 layers, SwiGLU 176, RoPE
base 10000, RMSNorm eps 1e-5, untied head) as our Llama (``model.arch: llama``) and as
transformers' LlamaForCausalLM (the preflight's proxy, its own init: normal(0, 0.02) everywhere).
Both through the sweep engine with the same recipe (the phase-19 preset's AdamW, clip 1.0, at
``--lr``). The step time is the run's seconds over its steps (eval and bookkeeping included),
and separately a bare forward+backward+AdamW step timed in this process, the two models alternating.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from pytest_spikecheck import Scenario
from pytest_spikecheck.integrations.hf_proxy import PROXY_FACTORY, proxy_model
from pytest_spikecheck.sweep import sweep

HF_CONFIG = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 176,
    "num_hidden_layers": 2,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
}


def seeds(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def bare_steps_ms(models: list[torch.nn.Module], vocab: int, repeats: int = 40) -> list[list[float]]:
    """ms of forward + backward + AdamW step on a (8, 32) batch, one thread, the models' steps
    alternating (so load from other processes falls on both alike); 5 warm-up steps each."""
    torch.set_num_threads(1)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3, foreach=True) for m in models]
    idx = torch.randint(0, vocab, (8, 32), generator=torch.Generator().manual_seed(0))
    times: list[list[float]] = [[] for _ in models]
    for i in range(repeats + 5):
        for model, opt, out in zip(models, opts, times):
            started = time.perf_counter()
            _, loss = model(idx, idx)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if i >= 5:
                out.append((time.perf_counter() - started) * 1e3)
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0-2")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--out", default="out/preflight-crosscheck")
    args = p.parse_args()
    base = Scenario.preset("phase-19").replace(steps=args.steps, optimizer__lr=args.lr)
    ours = base.replace(model__arch="llama", model__n_kv_head=2)
    hf = base.replace(model_factory=PROXY_FACTORY, model_kwargs={"config": HF_CONFIG, "transformers": "5.24.0"})
    points = [{"seed": s} for s in seeds(args.seeds)]
    rows = {}
    for label, scenario in (("ours", ours), ("hf", hf)):
        result = sweep(scenario, points, jobs=args.jobs, out=f"{args.out}/{label}", progress="lines")
        rows[label] = [
            (r["final_eval_loss"], r["max_attn_logit"], run.meta["seconds"] / len(run))
            for r, run in zip(result.rows, result.runs)
        ]
    for label, rs in rows.items():
        print(
            f"{label}: final eval loss "
            + ", ".join(f"{r[0]:.3f}" for r in rs)
            + "; largest attention logit "
            + ", ".join(f"{r[1]:.1f}" for r in rs)
            + f"; run seconds per step median {statistics.median(r[2] for r in rs) * 1e3:.1f} ms"
        )
    from pytest_spikecheck.models.config import GPTConfig
    from pytest_spikecheck.models.llama import Llama

    vocab = 384
    torch.manual_seed(0)
    mine = Llama(GPTConfig(arch="llama", n_kv_head=2, vocab_size=vocab, block_size=32))
    theirs = proxy_model(vocab, config=HF_CONFIG)
    for model in (mine, theirs):
        model.record_stats = True
    ours_ms, hf_ms = bare_steps_ms([mine, theirs], vocab)
    ratios = sorted(h / o for o, h in zip(ours_ms, hf_ms))
    print(
        f"bare step (8 x 32 tokens, 1 thread, alternating, {len(ours_ms)} each): ours median "
        f"{statistics.median(ours_ms):.2f} ms, HF proxy {statistics.median(hf_ms):.2f} ms; HF / ours per pair "
        f"median {statistics.median(ratios):.2f} [quartiles {ratios[len(ratios) // 4]:.2f}-{ratios[3 * len(ratios) // 4]:.2f}]"
    )


if __name__ == "__main__":
    main()
