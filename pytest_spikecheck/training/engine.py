"""The training engine: builds data, sampler, model and optimizer from a scenario, trains,
and records every step into a :class:`~pytest_spikecheck.records.run.Run`.

The loop never forks on breaks: a break has already changed the scenario (a config switch, a
sampler change) before the engine sees it. Each iteration runs the one training step
(:mod:`.step`, shared with probes) and hands its outcome to the recorders (:mod:`.recorders`);
the clipping backend is a name the step passes to :mod:`pytest_spikecheck.clipping`, so the
engine does not know which one runs.

Determinism: the same scenario, seed, thread count and backend give bit-identical metrics
on CPU. torch's intra-op thread count changes reduction order, so it is pinned (default 1)
for the run and restored afterwards.

Several processes (``train(..., nproc=2)``) run this same loop through a
:class:`~pytest_spikecheck.training.sharding.Sharding` object; only the recorder (rank 0)
evaluates and writes records.
"""

from __future__ import annotations

import math
import platform
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch

from pytest_spikecheck import __version__
from pytest_spikecheck.clipping import resolve_backend
from pytest_spikecheck.data.dataset import Dataset, build_dataset
from pytest_spikecheck.data.samplers import mixture_weights, plan_batches
from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.records.run import Run
from pytest_spikecheck.scenario import Scenario
from pytest_spikecheck.training.build import DTYPES, build_model
from pytest_spikecheck.training.clip_policy import clip_policy
from pytest_spikecheck.training.recorders import (
    CompositionRecorder,
    EvalRecorder,
    EventRecorder,
    MetricsRecorder,
    locate_nonfinite,
    lockin_stats,
)
from pytest_spikecheck.training.schedule import lr_at
from pytest_spikecheck.training.sharding import Sharding, SingleProcess
from pytest_spikecheck.training.step import SpikeWatch, TrainingStep

__all__ = ["StepCallback", "StepContext", "train_with_sharding", "validate_nproc"]


@dataclass
class StepContext:
    """What a callback sees after each optimizer step (minGPT's ``on_batch_end`` idea: the
    loop is extended by callbacks, never forked). Call :meth:`stop` to end training after
    this step (the run is then recorded up to here, ``meta["stopped_by"] = "callback"``)."""

    step: int
    row: dict[str, float]
    batch: list[int]
    scenario: Scenario  # resolved
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    dataset: Dataset
    stop_requested: bool = False

    def stop(self) -> None:
        self.stop_requested = True


#: Called after every step with a StepContext.
StepCallback = Callable[[StepContext], None]


def validate_nproc(nproc: Any) -> int:
    """``nproc`` if it is a positive integer (a bool is not), else ConfigError."""
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ConfigError(f"nproc must be a positive integer, was {nproc!r}")
    return nproc


def train_with_sharding(scenario: Scenario, sharding: Sharding, *, backend: str = "auto", device: str = "cpu",
                        threads: int = 1, callbacks: Iterable[StepCallback] = ()) -> Run:
    """:func:`train` with an explicit :class:`Sharding` (every rank of a process group calls it)."""
    resolved = scenario.resolved()
    sharding.check(resolved)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    backend_name = resolve_backend(backend, device)
    callbacks = list(callbacks)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    # The whole run draws from torch's RNG seeded with the scenario's seed, in a forked RNG state:
    # initialisation and anything random in the loop (dropout in a user's model) repeat exactly.
    torch_device = torch.device(device)
    rng_devices = [torch_device.index or 0] if torch_device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=rng_devices):
            return _train(resolved, scenario, backend_name, torch_device, threads, callbacks, sharding)
    finally:
        torch.set_num_threads(previous_threads)


def _train(resolved: Scenario, original: Scenario, backend: str, device: torch.device, threads: int,
           callbacks: list[StepCallback], sharding: Sharding) -> Run:
    started = time.perf_counter()
    dataset = build_dataset(resolved)
    sources = [s.source for s in dataset.pool]
    plan = plan_batches(resolved.sampler, steps=resolved.steps, seed=resolved.seed, n_corpus=dataset.n_corpus,
                        burst_members=dataset.burst_members, is_rare=dataset.is_rare, sources=sources)
    mixture = (mixture_weights(resolved.sampler.mixture, sources[: dataset.n_corpus], steps=resolved.steps,
                               seed=resolved.seed) if resolved.sampler.kind == "mixture" else None)
    declared = _declared_events(resolved, plan, sources, mixture is not None)

    torch.manual_seed(resolved.seed)  # inside train_with_sharding's fork_rng: the caller's RNG is untouched
    model = build_model(resolved, dataset.tokenizer.vocab_size, pad_token_id=dataset.tokenizer.pad_id)
    model = model.to(device=device, dtype=DTYPES[resolved.model.dtype])
    model.train()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not named:
        raise ValueError("the model has no trainable parameters")
    optimizer = sharding.build_optimizer(model, resolved)
    trainer = TrainingStep(model, optimizer, sharding, backend=backend, clip_mode=resolved.optimizer.clip_mode)
    policy = clip_policy(resolved.optimizer, resolved.max_norm)
    watch = SpikeWatch(resolved.record.spike_ratio, resolved.record.spike_window,
                       resolved.optimizer.skip_spike_ratio, declared)
    inputs, targets = (torch.from_numpy(a).to(device) for a in (dataset.train.inputs, dataset.train.targets))

    metrics, compositions = MetricsRecorder(), CompositionRecorder(
        dataset, {i for members in dataset.burst_members.values() for i in members}, mixture)
    events = EventRecorder(resolved, dataset, plan, model, optimizer, sharding, named)
    evals = EvalRecorder(resolved, declared, model, *(torch.from_numpy(a).to(device) for a in
                                                      (dataset.eval.inputs, dataset.eval.targets)),
                         active=sharding.is_recorder)
    first_nonfinite, stop_reason, skipped_steps, stopped_by_callback, train_seconds = None, None, [], False, 0.0

    for step in range(1, resolved.steps + 1):
        t0 = time.perf_counter()
        lr = lr_at(step, base_lr=resolved.optimizer.lr, total_steps=resolved.steps, spec=resolved.schedule)
        index = torch.tensor(plan[step - 1], device=device)
        s = trainer.forward_backward_clip(step, plan[step - 1], inputs[index], targets[index],
                                          lr=lr, max_norm=policy.limit())
        policy.observe(s.grad_norm_pre)
        compositions.add(s)
        verdict = watch.judge(s)
        if events.after_clip(s, verdict) is not None and verdict.is_spike:
            evals.spike_at(step)
        if verdict.nonfinite:  # recorded, not stepped: the run stops here
            first_nonfinite = {"step": step, **locate_nonfinite(model, s.x, s.y, named)}
            stop_reason = "non-finite loss" if not math.isfinite(s.loss) else "non-finite gradient norm"
            metrics.add(s, clip_factor=float(s.clip.scale), grad_norm_post=s.grad_norm_post,
                        eval_loss=float("nan"), adam_v_norm=float("nan"))
            train_seconds += time.perf_counter() - t0
            break
        events.before_update(s, verdict)
        trainer.update(skip=verdict.skip)
        events.after_update(s)
        if verdict.skip:
            skipped_steps.append(step)
        v_sum = sharding.adam_v_sum(optimizer)
        train_seconds += time.perf_counter() - t0
        watch.observe(s)
        row = metrics.add(s, clip_factor=0.0 if verdict.skip else float(s.clip.scale),
                          # a skipped step hands the optimizer nothing
                          grad_norm_post=0.0 if verdict.skip else s.grad_norm_post,
                          eval_loss=evals.after_update(step), adam_v_norm=math.sqrt(v_sum))
        if callbacks:
            ctx = StepContext(step, row, plan[step - 1], resolved, model, optimizer, dataset)
            for cb in callbacks:
                cb(ctx)
            if ctx.stop_requested:
                stopped_by_callback = True
                break

    stopped_at = first_nonfinite["step"] if first_nonfinite else None
    meta = {
        "package_version": __version__, "torch_version": torch.__version__, "python": platform.python_version(),
        "backend": backend, "device": str(device), "threads": threads, "distributed": sharding.describe(),
        "content_hash": original.content_hash(), "breaks": [b.describe() for b in original.breaks],
        "parameters": sum(p.numel() for _, p in named), "vocab_size": dataset.tokenizer.vocab_size,
        "seconds": time.perf_counter() - started, "train_seconds": train_seconds,
        "stopped_at": stopped_at,
        "stop_reason": stop_reason,
        "stopped_by": "callback" if stopped_by_callback else None,
        "declared_events": sorted(declared), "first_nonfinite": first_nonfinite,
        "first_step_update": events.first_step_update, "skipped_steps": skipped_steps,
        "lockin": (lockin_stats(model, dataset, device)
                   if sharding.is_recorder and stopped_at is None and hasattr(model, "config") else None),
    }
    return Run(scenario=resolved.replace(name=original.name), metrics=metrics.arrays(), batches=compositions.batches,
               events=events.events, meta=meta)


def _declared_events(resolved: Scenario, plan: list[list[int]], sources: list[str], mixture: bool) -> dict[int, str]:
    """Events known before training: bursts, and the step a late source first reaches a batch."""
    declared = {b.at_step: "burst" for b in resolved.sampler.bursts}
    new_source = resolved.sampler.mixture.new_source if mixture else None
    entry = next((k + 1 for k, batch in enumerate(plan) if any(sources[i] == new_source for i in batch)), None)
    if entry is not None:
        declared[entry] = "new_source"
    return declared
