"""The training engine: builds data, sampler, model and optimizer from a scenario, trains,
and records every step into a :class:`~pytest_spikecheck.records.run.Run`.

The loop is straight-line (nanoGPT style) and never forks on breaks: a break has already
changed the scenario (a config switch, a sampler change) before the engine sees it. The
clipping backend is a name passed to :func:`pytest_spikecheck.clipping.clip_grads_`; the
engine does not know which one runs. Order matters (Seed B): clipping happens after
backward and strictly before AdamW touches ``m``, ``v`` or any parameter.

Determinism: the same scenario, seed, thread count and backend give bit-identical metrics
on CPU. torch's intra-op thread count changes reduction order, so it is pinned (default 1)
for the run and restored afterwards.

Several processes (``train(..., nproc=2)``) run this same loop. What differs is delegated to a
:class:`Sharding` object at the few points where a rank's work is not the whole model's:
forward/backward (a rank's part of the batch, then its shard of the summed gradient), the
clip (the norm over every shard), the optimizer step (a rank updates its shard, then every
rank gathers the weights), the logged Σv of Adam, and the gradients and Adam moments the
event records read. Only the recorder (rank 0) evaluates and writes records. The default,
:class:`SingleProcess`, runs exactly the lines the loop ran before sharding existed;
:class:`pytest_spikecheck.training.distributed.FlatShard` is the N-rank one.
"""

from __future__ import annotations

import dataclasses
import math
import platform
import statistics
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol

import numpy as np
import torch
import torch.nn.functional as F

from pytest_spikecheck import __version__
from pytest_spikecheck.clipping import ClipResult, clip_grads_, resolve_backend
from pytest_spikecheck.data.dataset import IGNORE_INDEX, Dataset, build_dataset
from pytest_spikecheck.training.clip_policy import clip_policy
from pytest_spikecheck.data.samplers import batch_composition, mixture_weights, plan_batches
from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.records.run import METRIC_KEYS, Run
from pytest_spikecheck.scenario import Scenario
from pytest_spikecheck.training.schedule import lr_at

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

#: |g| / sqrt(v̂) above this means Adam takes a near-maximal step on that weight.
ADAM_SURPRISE_THRESHOLD = 10.0


def build_model(scenario: Scenario, vocab_size: int, pad_token_id: int = -1) -> torch.nn.Module:
    if scenario.model_factory is not None:
        return scenario.model_factory(vocab_size)
    from pytest_spikecheck.models.gpt import GPT

    config = scenario.model
    if config.vocab_size not in (0, vocab_size):
        raise ValueError(f"model.vocab_size is {config.vocab_size} but the tokenizer has {vocab_size} tokens")
    return GPT(dataclasses.replace(config, vocab_size=vocab_size, pad_token_id=pad_token_id))


def parameter_groups(model: torch.nn.Module, scenario: Scenario) -> list[dict[str, Any]]:
    """AdamW's parameter groups. nanoGPT's rule: decay every matrix (embeddings included),
    never biases or norm gains."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return [{"params": decay, "weight_decay": scenario.optimizer.weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: torch.nn.Module, scenario: Scenario,
                    groups: list[dict[str, Any]] | None = None) -> torch.optim.AdamW:
    """The scenario's AdamW over ``groups`` (default: :func:`parameter_groups` of ``model``)."""
    o = scenario.optimizer
    groups = parameter_groups(model, scenario) if groups is None else groups
    return torch.optim.AdamW(groups, lr=o.lr, betas=o.betas, eps=o.eps, foreach=True)


@dataclass
class EventView:
    """What the record of an event step reads, per trainable parameter (in the model's order): the
    gradients AdamW is about to see (post-clip), their norms before the clip, and AdamW's state
    (``exp_avg_sq`` and ``step``; empty before the first step). ``logits`` are the whole batch's;
    ranks other than the recorder may leave them None."""

    logits: torch.Tensor | None
    grads: list[torch.Tensor | None]
    pre_clip_norms: torch.Tensor
    states: list[dict[str, Any]]


class Sharding(Protocol):
    """How one training step is split across processes (see the module docstring)."""

    #: True on the process that records the run (rank 0).
    is_recorder: bool

    def check(self, resolved: Scenario) -> None:
        """Raise ConfigError if this sharding cannot train ``resolved``."""

    def build_optimizer(self, model: torch.nn.Module, scenario: Scenario) -> torch.optim.Optimizer: ...

    def forward_backward(self, model: torch.nn.Module, x: torch.Tensor,
                         y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This process's logits and the whole batch's mean loss, with the gradients ready to clip."""

    def clip(self, max_norm: float, *, backend: str, mode: str) -> ClipResult:
        """Clip in place; the result holds the norm of the whole model's gradient."""

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None: ...

    def adam_v_sum(self, optimizer: torch.optim.Optimizer) -> float:
        """Σv over every AdamW second moment of the model."""

    def event_view(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
                   y: torch.Tensor, logits: torch.Tensor, clip: ClipResult) -> EventView: ...

    def describe(self) -> dict[str, Any] | None:
        """The run's ``meta["distributed"]`` (None: one process)."""


class SingleProcess:
    """The default :class:`Sharding`: one process holds the whole model, its gradients and its
    optimizer; each method is what the loop ran inline before there was a choice."""

    is_recorder = True

    def check(self, resolved: Scenario) -> None:
        if resolved.optimizer.clip_mode == "shard_local":
            raise ConfigError("ShardLocalNorm (clip_mode shard_local) needs nproc >= 2: on one process the shard is "
                              "the whole gradient, so there is no per-rank norm to get wrong")

    def build_optimizer(self, model: torch.nn.Module, scenario: Scenario) -> torch.optim.Optimizer:
        self.params = [p for p in model.parameters() if p.requires_grad]
        return build_optimizer(model, scenario)

    def forward_backward(self, model: torch.nn.Module, x: torch.Tensor,
                         y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits, loss = model(x, y)
        loss.backward()
        return logits, loss

    def clip(self, max_norm: float, *, backend: str, mode: str) -> ClipResult:
        return clip_grads_(self.params, max_norm, backend=backend, mode=mode)

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()

    def adam_v_sum(self, optimizer: torch.optim.Optimizer) -> float:
        second_moments = [optimizer.state[p]["exp_avg_sq"] for p in self.params if p in optimizer.state]
        # One concatenated sum is ~2.5x cheaper than foreach L1 norms on a tiny model.
        return float(torch.cat([v.view(-1) for v in second_moments]).float().sum()) if second_moments else 0.0

    def event_view(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
                   y: torch.Tensor, logits: torch.Tensor, clip: ClipResult) -> EventView:
        grads = [p.grad for p in self.params]
        # Global clipping scales every tensor alike, so the pre-clip norms are the post-clip ones ÷ scale.
        return EventView(logits, grads, torch.stack(torch._foreach_norm(grads)) / clip.scale,
                         [optimizer.state.get(p, {}) for p in self.params])

    def describe(self) -> None:
        return None


class _EvalSchedule:
    """Sparse evaluation, dense around declared events and after detected spikes."""

    def __init__(self, scenario: Scenario, declared_steps: Iterable[int]) -> None:
        r = scenario.record
        self.every, self.before, self.after = r.eval_every, r.dense_before, r.dense_after
        self.last_step = scenario.steps
        self.dense: set[int] = set()
        for step in declared_steps:
            self.dense.update(range(step - self.before, step + self.after + 1))

    def spike_at(self, step: int) -> None:
        self.dense.update(range(step, step + self.after + 1))

    def due(self, step: int) -> bool:
        return step in self.dense or step % self.every == 0 or step == self.last_step


#: Eval samples per forward pass. The whole eval set at once (96 x 32 x vocab logits) leaves
#: allocations behind that slow the next training steps by ~10%; batches of 16 do not.
EVAL_CHUNK = 16


def _mean_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Mean loss over every non-ignored target of the eval set (evaluated in chunks)."""
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, x.size(0), EVAL_CHUNK):
            xs, ys = x[start:start + EVAL_CHUNK], y[start:start + EVAL_CHUNK]
            n = int((ys != IGNORE_INDEX).sum())
            if n:
                _, loss = model(xs, ys)
                total += float(loss) * n
                count += n
    return total / count if count else math.nan


def _target_counts(dataset: Dataset, batches: list[list[int]]) -> np.ndarray:
    """How often each token was a training target in ``batches`` (0 = never trained on).
    Computed on the few event steps from the batch plan, not accumulated every step."""
    counts = np.zeros(dataset.tokenizer.vocab_size, dtype=np.int64)
    if batches:
        targets = dataset.train.targets[np.concatenate(batches)]
        counts += np.bincount(targets[targets != IGNORE_INDEX], minlength=counts.size)
    return counts


def _token_loss_table(logits: torch.Tensor, targets: torch.Tensor, dataset: Dataset, batch: list[int], top: int,
                      seen_before: np.ndarray) -> dict[str, Any]:
    """Per-token losses of one batch: the worst tokens with their strings, per-piece totals,
    and the share of the batch loss carried by rare tokens and by tokens never trained on
    before this step (``seen_before[t]`` counts earlier target occurrences of token t)."""
    losses = F.cross_entropy(logits.detach().view(-1, logits.size(-1)), targets.reshape(-1),
                             ignore_index=IGNORE_INDEX, reduction="none").view(targets.shape)
    mask = targets != IGNORE_INDEX
    flat = losses[mask]
    flat_targets = targets[mask].cpu().numpy()
    flat_np = flat.double().cpu().numpy()
    total = float(flat_np.sum()) or float("nan")
    rare_mask = np.isin(flat_targets, np.fromiter(dataset.rare_tokens, dtype=np.int64, count=len(dataset.rare_tokens)))
    novel_mask = seen_before[flat_targets] == 0
    tok = dataset.tokenizer
    rows, cols = torch.nonzero(mask, as_tuple=True)
    worst = torch.argsort(flat, descending=True)[:top]
    per_piece: dict[str, list[float]] = {}
    for r, c, v in zip(rows.tolist(), cols.tolist(), flat.tolist()):
        per_piece.setdefault(tok.token(int(targets[r, c])), []).append(v)
    pieces = sorted(((p, len(v), sum(v)) for p, v in per_piece.items()), key=lambda t: -t[2])[:top]
    quantiles = torch.quantile(flat, torch.tensor([0.5, 0.9, 0.99], dtype=flat.dtype)).tolist()
    return {
        "mean": float(flat.mean()), "p50": quantiles[0], "p90": quantiles[1], "p99": quantiles[2],
        "max": float(flat.max()), "n_tokens": int(flat.numel()),
        "rare_loss_share": float(flat_np[rare_mask].sum()) / total,
        "novel_loss_share": float(flat_np[novel_mask].sum()) / total,
        "novel_tokens": int(novel_mask.sum()),
        "worst": [
            {"sample": dataset.pool[batch[int(rows[i])]].id, "position": int(cols[i]),
             "token": tok.token(int(targets[rows[i], cols[i]])), "loss": float(flat[i]),
             "rare": int(targets[rows[i], cols[i]]) in dataset.rare_tokens,
             "novel": bool(seen_before[int(targets[rows[i], cols[i]])] == 0)}
            for i in worst.tolist()
        ],
        "by_token": [{"token": p, "count": n, "total_loss": s, "mean_loss": s / n} for p, n, s in pieces],
    }


def _adam_surprise(optimizer: torch.optim.AdamW, named: list[tuple[str, torch.nn.Parameter]],
                   view: EventView) -> dict[str, Any]:
    """How far this step's (clipped) gradient exceeds Adam's memory of it: the share of weights
    with |g| / sqrt(v̂) > ADAM_SURPRISE_THRESHOLD, using v̂ from before this step."""
    total = surprised = 0
    per_param: dict[str, float] = {}
    for (name, p), grad, state in zip(named, view.grads, view.states):
        if grad is None:
            continue
        if "exp_avg_sq" not in state:
            continue
        beta2 = optimizer.param_groups[0]["betas"][1]
        steps_so_far = float(state["step"])
        v_hat = state["exp_avg_sq"] / (1 - beta2 ** steps_so_far)
        ratio = grad.abs() / (v_hat.sqrt() + optimizer.param_groups[0]["eps"])
        hit = int((ratio > ADAM_SURPRISE_THRESHOLD).sum())
        per_param[name] = hit / p.numel()
        surprised += hit
        total += p.numel()
    return {"threshold": ADAM_SURPRISE_THRESHOLD, "share": surprised / total if total else 0.0,
            "by_param": dict(sorted(per_param.items(), key=lambda kv: -kv[1])[:8])}


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


_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _locate_nonfinite(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                      named: list[tuple[str, torch.nn.Parameter]]) -> dict[str, str]:
    """Where the first non-finite value of a step came from, found after the fact (no cost on
    healthy steps): parameters already non-finite, else the first module whose forward output
    is non-finite (replayed with forward hooks on the same batch), else the backward pass."""
    bad_params = [n for n, p in named if not torch.isfinite(p).all()]
    if bad_params:
        return {"tensor": "weight", "module": bad_params[0],
                "detail": f"{len(bad_params)} parameter tensor(s) were already non-finite before this step's forward "
                          f"pass (the previous optimizer update wrote them): {', '.join(bad_params[:4])}"}
    found: dict[str, str] = {}

    def nonfinite(values: Any) -> bool:
        items = values if isinstance(values, tuple) else (values,)
        return any(torch.is_tensor(t) and t.is_floating_point() and not torch.isfinite(t).all() for t in items)

    def hook(name: str):
        def check(module: torch.nn.Module, inputs: tuple, output: Any) -> None:
            if found or not nonfinite(output):
                return
            if nonfinite(inputs):  # the value came in broken: it arose in the parent's own code
                parent = name.rsplit(".", 1)[0] if "." in name else "(model)"
                found.update(tensor="output", module=parent,
                             detail=f"non-finite already in the input of {name}: it arose in {parent}'s own "
                                    f"computation (e.g. an attention softmax), not in a submodule")
            else:
                found.update(tensor="output", module=name,
                             detail=f"{type(module).__name__} {name} turned finite inputs into a non-finite output")
        return check

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules() if n]
    try:
        with torch.no_grad():
            model(x, y)
    finally:
        for h in handles:
            h.remove()
    if found:
        return found
    bad_grads = [n for n, p in named if p.grad is not None and not torch.isfinite(p.grad).all()]
    if bad_grads:
        return {"tensor": "grad", "module": bad_grads[0],
                "detail": f"the forward pass is finite; the backward pass made {len(bad_grads)} gradient(s) "
                          f"non-finite: {', '.join(bad_grads[:4])}"}
    return {"tensor": "loss", "module": "(loss)", "detail": "every module output is finite; the loss itself is not"}


def _update_stats(before: list[torch.Tensor], named: list[tuple[str, torch.nn.Parameter]]) -> dict[str, Any]:
    """Largest per-weight change of one optimizer step, overall and per tensor."""
    per = {n: float((p.detach() - b).abs().max()) for (n, p), b in zip(named, before)}
    top = dict(sorted(per.items(), key=lambda kv: -kv[1])[:5])
    return {"max_abs": max(per.values()) if per else 0.0, "by_param": top}


def _lockin_stats(model: torch.nn.Module, dataset: Dataset, device: torch.device, prompts: int = 16,
                  prompt_tokens: int = 3, new_tokens: int = 24) -> dict[str, Any]:
    """Greedy samples from ``prompts`` eval samples spread over the whole eval set (so every
    source is prompted), each cut to its first ``prompt_tokens`` tokens, and how repetitive
    they are: the share of the most frequent generated token and distinct-1 / distinct-2
    over all generated tokens. A model in repetition lock-in emits one token whatever the
    prompt (share near 1, distinct-n near 0)."""
    tok = dataset.tokenizer
    block = model.config.block_size if hasattr(model, "config") else 32
    texts = [s.text for s in dataset.eval_samples if s.text]
    chosen = [texts[i] for i in np.linspace(0, len(texts) - 1, num=min(prompts, len(texts))).astype(int)]
    starts = [ids[:prompt_tokens] for ids in (tok.encode(t) for t in chosen) if len(ids) >= prompt_tokens]
    idx = torch.tensor(starts, device=device)
    model.eval()
    with torch.no_grad():
        for _ in range(new_tokens):
            logits, _ = model(idx[:, -block:])
            idx = torch.cat([idx, logits[:, -1, :].float().argmax(-1, keepdim=True)], dim=1)
    model.train()
    generated = idx[:, prompt_tokens:].tolist()
    flat = [t for row in generated for t in row]
    counts = np.bincount(flat, minlength=tok.vocab_size)
    bigrams = [(a, b) for row in generated for a, b in zip(row, row[1:])]
    top = int(counts.argmax())
    return {
        "top_token": tok.token(top), "top_token_share": float(counts[top] / len(flat)),
        "distinct_1": len(set(flat)) / len(flat), "distinct_2": len(set(bigrams)) / max(1, len(bigrams)),
        "samples": [tok.decode(row) for row in idx[:: max(1, len(starts) // 4)].tolist()][:4],
    }


def _train(resolved: Scenario, original: Scenario, backend: str, device: torch.device, threads: int,
           callbacks: list[StepCallback], sharding: Sharding) -> Run:
    started = time.perf_counter()
    dataset = build_dataset(resolved)
    sources = [s.source for s in dataset.pool]
    plan = plan_batches(resolved.sampler, steps=resolved.steps, seed=resolved.seed, n_corpus=dataset.n_corpus,
                        burst_members=dataset.burst_members, is_rare=dataset.is_rare, sources=sources)
    mixture = (mixture_weights(resolved.sampler.mixture, sources[: dataset.n_corpus], steps=resolved.steps,
                               seed=resolved.seed) if resolved.sampler.kind == "mixture" else None)
    burst_ids = {i for members in dataset.burst_members.values() for i in members}
    # Events known before training: bursts, and the step a late source first reaches a batch.
    declared = {b.at_step: "burst" for b in resolved.sampler.bursts}
    new_source = resolved.sampler.mixture.new_source if mixture else None
    entry = next((k + 1 for k, batch in enumerate(plan) if any(sources[i] == new_source for i in batch)), None)
    if entry is not None:
        declared[entry] = "new_source"

    torch.manual_seed(resolved.seed)  # inside train_with_sharding's fork_rng: the caller's RNG is untouched
    model = build_model(resolved, dataset.tokenizer.vocab_size, pad_token_id=dataset.tokenizer.pad_id)
    model = model.to(device=device, dtype=_DTYPES[resolved.model.dtype])
    model.train()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    if not params:
        raise ValueError("the model has no trainable parameters")
    optimizer = sharding.build_optimizer(model, resolved)
    policy = clip_policy(resolved.optimizer, resolved.max_norm)
    skip_ratio = resolved.optimizer.skip_spike_ratio
    clip_mode = "global" if resolved.optimizer.clip_mode == "adaptive" else resolved.optimizer.clip_mode

    inputs = torch.from_numpy(dataset.train.inputs).to(device)
    targets = torch.from_numpy(dataset.train.targets).to(device)
    eval_x = torch.from_numpy(dataset.eval.inputs).to(device)
    eval_y = torch.from_numpy(dataset.eval.targets).to(device)

    columns: dict[str, list[float]] = {k: [] for k in METRIC_KEYS}
    batches: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    evals = _EvalSchedule(resolved, declared)
    recent_norms: deque[float] = deque(maxlen=resolved.record.spike_window)
    stopped_at: int | None = None
    stop_reason: str | None = None
    first_nonfinite: dict[str, Any] | None = None
    first_step_update: dict[str, Any] | None = None
    skipped_steps: list[int] = []
    stopped_by_callback = False
    train_seconds = 0.0

    for step in range(1, resolved.steps + 1):
        t0 = time.perf_counter()
        lr = lr_at(step, base_lr=resolved.optimizer.lr, total_steps=resolved.steps, spec=resolved.schedule)
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = plan[step - 1]
        index = torch.tensor(batch, device=device)
        x, y = inputs[index], targets[index]
        logits, loss = sharding.forward_backward(model, x, y)
        per_tensor_mode = clip_mode == "per_tensor"
        # Per-tensor norms cost a pass over the gradients; global clipping scales every tensor
        # alike, so they are recovered after the clip (÷ scale) on the few steps that need them.
        per_tensor_pre = torch.stack(torch._foreach_norm([p.grad for p in params])) if per_tensor_mode else None
        limit = policy.limit()
        clip = sharding.clip(limit, backend=backend, mode=clip_mode)
        grad_norm_post = clip.total_norm * clip.scale  # exact definition; no second pass
        loss_value, norm_pre = float(loss.detach()), float(clip.total_norm)
        policy.observe(norm_pre)
        composition = batch_composition(batch, pool=dataset.pool, rare_token_counts=dataset.rare_token_counts,
                                        burst_ids=burst_ids, weights=mixture[step - 1] if mixture else None)
        batches.append({"step": step, **composition})

        nonfinite = not math.isfinite(loss_value) or bool(clip.nonfinite)
        baseline = statistics.median(recent_norms) if len(recent_norms) >= 10 else math.nan
        ratio = norm_pre / baseline if baseline > 0 else math.nan
        is_spike = not nonfinite and ratio >= resolved.record.spike_ratio
        skip = not nonfinite and skip_ratio is not None and ratio >= skip_ratio
        event = step in declared or is_spike or nonfinite
        record: dict[str, Any] | None = None
        if event:  # every rank: gathering a sharded view is a collective
            view = sharding.event_view(model, optimizer, x, y, logits, clip)
        if event and sharding.is_recorder:
            if per_tensor_pre is None:
                per_tensor_pre = view.pre_clip_norms
            kinds = [k for k, on in ((declared.get(step), step in declared), ("spike", is_spike),
                                     ("nonfinite", nonfinite)) if on]
            record = {
                "step": step, "kinds": kinds, "loss": loss_value, "grad_norm_pre": norm_pre,
                "baseline_grad_norm": baseline, "clip_factor": float(clip.scale), "max_norm": limit,
                "skipped": skip,
                "token_losses": _token_loss_table(view.logits.float(), y, dataset, batch, resolved.record.top_tokens,
                                                  _target_counts(dataset, plan[: step - 1])),
                "param_grad_norms": dict(sorted(
                    ((n, float(v)) for (n, _), v in zip(named, per_tensor_pre.tolist())), key=lambda kv: -kv[1])),
                "adam_surprise": _adam_surprise(optimizer, named, view) if not nonfinite else None,
            }
            events.append(record)
            if is_spike:
                evals.spike_at(step)
        if nonfinite:
            first_nonfinite = {"step": step, **_locate_nonfinite(model, x, y, named)}
            stopped_at, stop_reason = step, ("non-finite loss" if not math.isfinite(loss_value) else "non-finite gradient norm")
            row = {"step": step, "loss": loss_value, "grad_norm_pre": norm_pre, "grad_norm_post": float(grad_norm_post),
                   "clip_factor": float(clip.scale), "lr": lr, "eval_loss": math.nan, "adam_v_norm": math.nan}
            for k in METRIC_KEYS:
                columns[k].append(row[k])
            train_seconds += time.perf_counter() - t0
            break
        track_update = step == 1 or record is not None
        before = [p.detach().clone() for p in params] if track_update and not skip else None
        if skip:  # the guard drops the step: nothing reaches the weights or Adam's moments
            skipped_steps.append(step)
            grad_norm_post = clip.total_norm * 0
            clip_factor = 0.0
        else:
            sharding.optimizer_step(optimizer)
            clip_factor = float(clip.scale)
        optimizer.zero_grad(set_to_none=True)
        if before is not None:
            stats = _update_stats(before, named)
            if step == 1:
                first_step_update = {"lr": lr, **stats}
            if record is not None:
                record["update"] = stats
        v_sum = sharding.adam_v_sum(optimizer)
        train_seconds += time.perf_counter() - t0
        recent_norms.append(norm_pre)

        eval_loss = _mean_loss(model, eval_x, eval_y) if sharding.is_recorder and evals.due(step) else math.nan
        row = {"step": step, "loss": loss_value, "grad_norm_pre": norm_pre, "grad_norm_post": float(grad_norm_post),
               "clip_factor": clip_factor, "lr": lr, "eval_loss": eval_loss, "adam_v_norm": math.sqrt(v_sum)}
        for k in METRIC_KEYS:
            columns[k].append(row[k])
        if callbacks:
            ctx = StepContext(step, row, batch, resolved, model, optimizer, dataset)
            for cb in callbacks:
                cb(ctx)
            if ctx.stop_requested:
                stopped_by_callback = True
                break

    lockin = (_lockin_stats(model, dataset, device)
              if sharding.is_recorder and stopped_at is None and hasattr(model, "config") else None)
    metrics = {k: np.asarray(v, dtype=np.int64 if k == "step" else np.float64) for k, v in columns.items()}
    meta = {
        "package_version": __version__,
        "torch_version": torch.__version__,
        "python": platform.python_version(),
        "backend": backend,
        "device": str(device),
        "threads": threads,
        "distributed": sharding.describe(),
        "content_hash": original.content_hash(),
        "breaks": [b.describe() for b in original.breaks],
        "parameters": sum(p.numel() for p in params),
        "vocab_size": dataset.tokenizer.vocab_size,
        "seconds": time.perf_counter() - started,
        "train_seconds": train_seconds,
        "stopped_at": stopped_at,
        "stop_reason": stop_reason,
        "stopped_by": "callback" if stopped_by_callback else None,
        "declared_events": sorted(declared),
        "first_nonfinite": first_nonfinite,
        "first_step_update": first_step_update,
        "skipped_steps": skipped_steps,
        "lockin": lockin,
    }
    return Run(scenario=resolved.replace(name=original.name), metrics=metrics, batches=batches, events=events, meta=meta)
