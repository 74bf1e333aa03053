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
from pytest_spikecheck.records.facts import facts_from_scenario
from pytest_spikecheck.records.run import Run
from pytest_spikecheck.scenario import Scenario
from pytest_spikecheck.training.build import DTYPES, build_model
from pytest_spikecheck.training.clip_policy import clip_policy
from pytest_spikecheck.training.recorders import (
    AttentionRecorder,
    CompositionRecorder,
    EvalRecorder,
    EventRecorder,
    MetricsRecorder,
    UpdateRecorder,
    locate_nonfinite,
    lockin_stats,
)
from pytest_spikecheck.training.optimizers import observed_groups
from pytest_spikecheck.training.precision import Precision
from pytest_spikecheck.training.qk_clip import qk_weight_norm
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
    precision: Precision | None = None  # the run's autocast and loss scaler (a probe restores the scaler too)

    def stop(self) -> None:
        self.stop_requested = True


#: Called after every step with a StepContext.
StepCallback = Callable[[StepContext], None]


def validate_nproc(nproc: Any) -> int:
    """``nproc`` if it is a positive integer (a bool is not), else ConfigError."""
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ConfigError(f"nproc must be a positive integer, was {nproc!r}")
    return nproc


def train_with_sharding(
    scenario: Scenario,
    sharding: Sharding,
    *,
    backend: str = "auto",
    device: str = "cpu",
    threads: int = 1,
    callbacks: Iterable[StepCallback] = (),
) -> Run:
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


@dataclass
class _Training:
    """Everything one run trains and records with, built from the resolved scenario."""

    dataset: Dataset
    plan: list[list[int]]
    declared: dict[int, str]
    model: torch.nn.Module
    named: list[tuple[str, torch.nn.Parameter]]
    optimizer: torch.optim.Optimizer
    trainer: TrainingStep
    watch: SpikeWatch
    inputs: torch.Tensor
    targets: torch.Tensor
    metrics: MetricsRecorder
    compositions: CompositionRecorder
    events: EventRecorder
    evals: EvalRecorder
    attention: AttentionRecorder
    updates: UpdateRecorder

    @classmethod
    def build(cls, resolved: Scenario, device: torch.device, sharding: Sharding, backend: str) -> _Training:
        dataset, plan, mixture, declared = _batches(resolved)
        torch.manual_seed(resolved.seed)  # inside train_with_sharding's fork_rng: the caller's RNG is untouched
        model, named = _model(resolved, dataset, device, sharding)
        optimizer = sharding.build_optimizer(model, resolved)
        precision = Precision.from_spec(resolved.amp, device, sharding)
        burst_ids = {i for members in dataset.burst_members.values() for i in members}
        to_device = lambda a: torch.from_numpy(a).to(device)  # noqa: E731
        return cls(
            dataset,
            plan,
            declared,
            model,
            named,
            optimizer,
            trainer=TrainingStep(
                model,
                optimizer,
                sharding,
                backend=backend,
                clip=resolved.optimizer.clip,
                accumulation=resolved.sampler.accumulation,
                accumulate=resolved.sampler.accumulate,
                precision=precision,
            ),
            watch=SpikeWatch(
                resolved.record.spike_ratio, resolved.record.spike_window, resolved.optimizer.skip_spike_ratio, declared
            ),
            inputs=to_device(dataset.train.inputs),
            targets=to_device(dataset.train.targets),
            metrics=MetricsRecorder(),
            compositions=CompositionRecorder(dataset, burst_ids, mixture),
            events=EventRecorder(resolved, dataset, plan, model, optimizer, sharding, named),
            evals=EvalRecorder(
                resolved,
                declared,
                model,
                to_device(dataset.eval.inputs),
                to_device(dataset.eval.targets),
                active=sharding.is_recorder,
                repeat_mask=None if dataset.eval_repeat is None else to_device(dataset.eval_repeat),
            ),
            attention=AttentionRecorder(),
            updates=UpdateRecorder(resolved, optimizer, named),
        )


def _batches(resolved: Scenario) -> tuple[Dataset, list[list[int]], Any, dict[int, str]]:
    """The data of a run: the dataset, the batch plan (the pool's indices, step by step), a
    mixture's source weights (None without one) and the events declared before training."""
    dataset = build_dataset(resolved)
    sources = [s.source for s in dataset.pool]
    plan = plan_batches(
        resolved.sampler,
        steps=resolved.steps,
        seed=resolved.seed,
        n_corpus=dataset.n_corpus,
        burst_members=dataset.burst_members,
        is_rare=dataset.is_rare,
        sources=sources,
    )
    mixture = (
        mixture_weights(resolved.sampler.mixture, sources[: dataset.n_corpus], steps=resolved.steps, seed=resolved.seed)
        if resolved.sampler.kind == "mixture"
        else None
    )
    return dataset, plan, mixture, _declared_events(resolved, plan, sources, mixture is not None)


def _model(
    resolved: Scenario, dataset: Dataset, device: torch.device, sharding: Sharding
) -> tuple[torch.nn.Module, list[tuple[str, torch.nn.Parameter]]]:
    """The model in training mode on ``device``, and its trainable parameters by name."""
    model = build_model(resolved, dataset.tokenizer.vocab_size, pad_token_id=dataset.tokenizer.pad_id)
    model = model.to(device=device, dtype=DTYPES[resolved.model.dtype])
    model.train()
    # The stats hook (models.gpt.GPT's docstring), on one process only: a rank's forward sees
    # its part of the batch, so its attention logits and log Z are not the batch's.
    if hasattr(model, "record_stats") and isinstance(sharding, SingleProcess):
        model.record_stats = True
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not named:
        raise ValueError("the model has no trainable parameters")
    return model, named


def _train(
    resolved: Scenario,
    original: Scenario,
    backend: str,
    device: torch.device,
    threads: int,
    callbacks: list[StepCallback],
    sharding: Sharding,
) -> Run:
    started = time.perf_counter()
    t = _Training.build(resolved, device, sharding, backend)
    groups = observed_groups(t.optimizer)  # before the first step: each group's peak lr
    policy = clip_policy(resolved.optimizer.clip)
    stop: dict[str, Any] = {"first_nonfinite": None, "stop_reason": None, "stopped_by": None}
    skipped: dict[int, str] = {}  # step -> why its update was not applied (an overflow, SkipSpikes)
    train_seconds = 0.0
    for step in range(1, resolved.steps + 1):
        t0 = time.perf_counter()
        row = _one_step(t, step, resolved, policy, device, sharding, stop, skipped)
        train_seconds += time.perf_counter() - t0
        if row is None:  # a non-finite step: recorded, not stepped; the run stops here
            break
        if callbacks and _stop_requested(
            callbacks,
            StepContext(step, row, t.plan[step - 1], resolved, t.model, t.optimizer, t.dataset, precision=t.trainer.precision),
        ):
            stop["stopped_by"] = "callback"
            break
        if step == resolved.stop_after and step < resolved.steps:  # a prefix of the steps-step run
            stop["stopped_by"] = "stop_after"
            break
    meta = _meta(
        t,
        original,
        backend,
        device,
        threads,
        sharding,
        stop,
        sorted(skipped),
        seconds=time.perf_counter() - started,
        train_seconds=train_seconds,
    )
    facts = facts_from_scenario(
        resolved,
        parameters=meta["parameters"],
        vocab_size=meta["vocab_size"],
        world_size=getattr(sharding, "world_size", 1),
        groups=groups,
        versions=meta,
    )
    return Run(
        scenario=resolved.replace(name=original.name),
        metrics=t.metrics.arrays(),
        batches=t.compositions.batches,
        events=t.events.events,
        meta=meta,
        skipped=skipped,
        facts=facts,
    )


def _one_step(
    t: _Training,
    step: int,
    resolved: Scenario,
    policy: Any,
    device: torch.device,
    sharding: Sharding,
    stop: dict[str, Any],
    skipped: dict[int, str],
) -> dict[str, Any] | None:
    """Step ``step`` of the loop, up to the clip and the spike verdict (the update:
    :func:`_update`); its metrics row, or None for a non-finite step (recorded in ``stop``, not
    stepped)."""
    lr = lr_at(step, base_lr=resolved.optimizer.lr, total_steps=resolved.steps, spec=resolved.schedule)
    index = torch.tensor(t.plan[step - 1], device=device)
    s = t.trainer.forward_backward_clip(step, t.plan[step - 1], t.inputs[index], t.targets[index], lr=lr, max_norm=policy.limit())
    policy.observe(s.grad_norm_pre)
    t.compositions.add(s)
    verdict = t.watch.judge(s)
    if t.events.after_clip(s, verdict) is not None and verdict.is_spike:
        t.evals.spike_at(step)
    if verdict.nonfinite:
        stop.update(
            first_nonfinite={"step": step, **locate_nonfinite(t.model, s.x, s.y, t.named)},
            stop_reason="non-finite loss" if not math.isfinite(s.loss) else "non-finite gradient norm",
        )
        t.metrics.add(
            s,
            clip_factor=float(s.clip.scale),
            grad_norm_post=s.grad_norm_post,
            eval_loss=math.nan,
            adam_v_norm=math.nan,
            clip_limit=s.max_norm,
        )
        return None
    return _update(t, step, s, verdict, sharding, skipped)


def _update(t: _Training, step: int, s: Any, verdict: Any, sharding: Sharding, skipped: dict[int, str]) -> dict[str, Any]:
    """The rest of a finite step: the update (or its skip), the recorders around it, and the metrics row."""
    why_skipped = verdict.skipped
    t.events.before_update(s, verdict)
    t.updates.before_update()
    update_report = t.trainer.update(skip=why_skipped is not None)  # QK-Clip's qk_clipped_heads, when on
    t.events.after_update(s)
    update_report.update(t.updates.after_update())
    if why_skipped is not None:
        skipped[step] = why_skipped
    v_sum = sharding.adam_v_sum(t.optimizer)
    t.watch.observe(s)
    # clip_limit: the limit this step's clip applied (inf: none), fixed or adaptive
    row = t.metrics.add(
        s,
        clip_factor=0.0 if why_skipped else float(s.clip.scale),
        grad_norm_post=0.0 if why_skipped else s.grad_norm_post,  # a skipped step hands the optimizer nothing
        eval_loss=t.evals.after_update(step),
        adam_v_norm=math.sqrt(v_sum),
        clip_limit=s.max_norm,
        **t.evals.optional_columns(),
        **update_report,
    )
    t.attention.add(s)
    return row


def _stop_requested(callbacks: list[StepCallback], ctx: StepContext) -> bool:
    for cb in callbacks:
        cb(ctx)
    return ctx.stop_requested


def _meta(
    t: _Training,
    original: Scenario,
    backend: str,
    device: torch.device,
    threads: int,
    sharding: Sharding,
    stop: dict[str, Any],
    skipped_steps: list[int],
    *,
    seconds: float,
    train_seconds: float,
) -> dict[str, Any]:
    first_nonfinite = stop["first_nonfinite"]
    stopped_at = first_nonfinite["step"] if first_nonfinite else None
    return {
        "package_version": __version__,
        "torch_version": torch.__version__,
        "python": platform.python_version(),
        "backend": backend,
        "device": str(device),
        "threads": threads,
        "distributed": sharding.describe(),
        "name": original.name,
        "description": original.describe_setup(),
        "content_hash": original.content_hash(),
        "breaks": [b.describe() for b in original.breaks],
        "parameters": sum(p.numel() for _, p in t.named),
        "vocab_size": t.dataset.tokenizer.vocab_size,
        "seconds": seconds,
        "train_seconds": train_seconds,
        "stopped_at": stopped_at,
        "stop_reason": stop["stop_reason"],
        "stopped_by": stop["stopped_by"],
        "declared_events": sorted(t.declared),
        "first_nonfinite": first_nonfinite,
        "largest_attn_logit": t.attention.largest(),
        "first_step_update": t.events.first_step_update,
        "skipped_steps": skipped_steps,
        "qk_weight_norm": qk_weight_norm(t.model),
        "lockin": (
            lockin_stats(t.model, t.dataset, device)
            if sharding.is_recorder and stopped_at is None and hasattr(t.model, "config")
            else None
        ),
    }


def _declared_events(resolved: Scenario, plan: list[list[int]], sources: list[str], mixture: bool) -> dict[int, str]:
    """Events known before training: bursts, and the step a late source first reaches a batch."""
    declared = {b.at_step: "burst" for b in resolved.sampler.bursts}
    new_source = resolved.sampler.mixture.new_source if mixture else None
    entry = next((k + 1 for k, batch in enumerate(plan) if any(sources[i] == new_source for i in batch)), None)
    if entry is not None:
        declared[entry] = "new_source"
    return declared
