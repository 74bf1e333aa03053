"""Muon's step cost against AdamW's at Phase-19 size (a script, not a test): the numbers in
docs/benchmarks.md.

    python benchmarks/bench_muon.py [--repeats 5] [--steps 100] [--json docs/bench_muon.json]

1. The optimizer step alone, on the Phase-19 model (GPT, and the Llama of the same width), fixed
   random gradients: AdamW (the default recipe) against Muon on the hidden matrices with AdamW on
   the rest, their steps alternating in one process and one torch thread, so a shared machine's
   load hits both alike. Also one Newton-Schulz orthogonalisation (torch's, 5 iterations in
   bfloat16) of each shape the models hand to Muon.
2. The whole training step as the engine runs it (forward, backward, clip, update, recording;
   evaluation excluded): ``train`` of Phase-19 for ``--steps`` steps with each optimizer,
   alternating A B A B ..., ``--repeats`` times; median [min-max] of seconds per step.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch


def _optimizers(arch: str):
    from pytest_spikecheck import Scenario
    from pytest_spikecheck.training.build import build_model
    from pytest_spikecheck.training.optimizers import build_optimizer

    out = {}
    for name, lr in (("adamw", 1e-2), ("muon", 0.2)):
        scenario = Scenario.preset("phase-19").replace(model__arch=arch, optimizer__name=name, optimizer__lr=lr).resolved()
        torch.manual_seed(0)
        model = build_model(scenario, 384)
        optimizer = build_optimizer(model, scenario)
        generator = torch.Generator().manual_seed(1)
        grads = [torch.randn(p.shape, generator=generator) * 1e-2 for p in model.parameters()]
        out[name] = (model, optimizer, grads)
    return out


def optimizer_step_ms(arch: str, repeats: int = 300) -> dict[str, float]:
    """Median ms of one optimizer step (gradients set before each, outside the timing)."""
    parts = _optimizers(arch)
    times: dict[str, list[float]] = {name: [] for name in parts}
    for _ in range(repeats):
        for name, (model, optimizer, grads) in parts.items():
            for p, g in zip(model.parameters(), grads):
                p.grad = g.clone()
            start = time.perf_counter()
            optimizer.step()
            times[name].append(time.perf_counter() - start)
    return {name: 1e3 * statistics.median(t) for name, t in times.items()}


def newton_schulz_ms(shapes: list[tuple[int, int]], repeats: int = 300) -> dict[str, float]:
    from torch.optim._muon import DEFAULT_A, DEFAULT_B, DEFAULT_C, DEFAULT_NS_STEPS, EPS, _zeropower_via_newtonschulz

    out = {}
    for shape in shapes:
        g = torch.randn(shape)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            _zeropower_via_newtonschulz(g, (DEFAULT_A, DEFAULT_B, DEFAULT_C), DEFAULT_NS_STEPS, EPS)
            times.append(time.perf_counter() - start)
        out[f"{shape[0]}x{shape[1]}"] = 1e3 * statistics.median(times)
    return out


def muon_shapes(arch: str) -> list[tuple[int, int]]:
    """Each matrix Muon orthogonalises in one step (the fused q/k/v as its three blocks)."""
    muon = _optimizers(arch)["muon"][1].parts["muon"]
    return [tuple(p.shape) for group in muon.param_groups for p in group["params"]]


def train_step_ms(steps: int, repeats: int) -> dict[str, list[float]]:
    from pytest_spikecheck import Scenario, train

    out: dict[str, list[float]] = {"adamw": [], "muon": []}
    for _ in range(repeats):
        for name, lr in (("adamw", 1e-2), ("muon", 0.2)):
            run = train(Scenario.preset("phase-19").replace(steps=steps, optimizer__name=name, optimizer__lr=lr), threads=1)
            out[name].append(1e3 * run.meta["train_seconds"] / len(run))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    load_before = os.getloadavg()[0]
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "load_before": load_before,
        "optimizer_step_ms": {},
        "newton_schulz_ms": {},
    }
    for arch in ("gpt", "llama"):
        result["optimizer_step_ms"][arch] = optimizer_step_ms(arch)
        shapes = muon_shapes(arch)
        result["newton_schulz_ms"][arch] = {"matrices": len(shapes), **newton_schulz_ms(sorted(set(shapes)))}
    steps = train_step_ms(args.steps, args.repeats)
    result["train_step_ms"] = steps
    result["load_after"] = os.getloadavg()[0]
    ratios = [m / a for a, m in zip(steps["adamw"], steps["muon"])]
    for arch, ms in result["optimizer_step_ms"].items():
        print(
            f"{arch}: optimizer step AdamW {ms['adamw']:.2f} ms, Muon + AdamW part {ms['muon']:.2f} ms "
            f"({ms['muon'] / ms['adamw']:.1f}x); Newton-Schulz per matrix {result['newton_schulz_ms'][arch]}"
        )
    for name, values in steps.items():
        print(f"training step ({name}): {statistics.median(values):.1f} [{min(values):.1f}-{max(values):.1f}] ms")
    print(
        f"Muon / AdamW per training step: {statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]; "
        f"load average {load_before:.1f} before, {result['load_after']:.1f} after"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
