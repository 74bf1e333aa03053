"""What the engine records while a scenario trains, one small recorder per concern.

The loop (:func:`pytest_spikecheck.training.engine.run_loop`) calls each recorder at two
points of a step: after the clip (gradients clipped, AdamW's state and the weights not yet
touched: what an event record must read) and after the update. Recorders only read the
model, the optimizer and the step's outcome; none changes what trains, so adding one never
changes a run's numbers.

- :class:`MetricsRecorder`: one row per step (the ``metrics.jsonl`` columns).
- :class:`CompositionRecorder`: each batch's samples, sources and rare-token counts.
- :class:`EventRecorder`: the detail of declared events, spikes and non-finite steps (per-token
  losses, per-tensor gradient norms, Adam's surprise, the update's size) and the first step's update.
- :class:`EvalRecorder`: the eval loss, sparse, dense around events (and on the repeated half,
  on the induction corpus).
- :class:`AttentionRecorder`: where the run's largest attention logit was (step, layer, head).
- :class:`UpdateRecorder`: the update the optimizer applied (Muon's against its expected scale,
  the update's RMS) and the optimizer's own step count, on runs where they can go wrong.
- :func:`lockin_stats`, :func:`locate_nonfinite`: read once, at the end or at the stop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np
import torch
import torch.nn.functional as F

from pytest_spikecheck.data.dataset import Dataset
from pytest_spikecheck.models.config import IGNORE_INDEX
from pytest_spikecheck.data.samplers import batch_composition
from pytest_spikecheck.records.events import Event
from pytest_spikecheck.records.run import METRIC_KEYS, MODEL_STAT_KEYS, SETUP_KEYS
from pytest_spikecheck.scenario import Scenario
from pytest_spikecheck.training.sharding import EventView, Sharding
from pytest_spikecheck.training.step import StepOutcome, StepVerdict, model_stats

#: |g| / sqrt(v̂) above this means Adam takes a near-maximal step on that weight.
ADAM_SURPRISE_THRESHOLD = 10.0


class MetricsRecorder:
    """The per-step columns of ``metrics.jsonl`` (:data:`~pytest_spikecheck.records.run.METRIC_KEYS`)."""

    def __init__(self) -> None:
        self.columns: dict[str, list[float]] = {k: [] for k in METRIC_KEYS + MODEL_STAT_KEYS + SETUP_KEYS}

    def add(
        self,
        s: StepOutcome,
        *,
        clip_factor: float,
        grad_norm_post: float,
        eval_loss: float,
        adam_v_norm: float,
        clip_limit: float | None = None,
        **setup: float,
    ) -> dict[str, float]:
        """One step's row; ``setup`` holds the other :data:`~pytest_spikecheck.records.run.SETUP_KEYS`
        columns this run has (QK-Clip's count, the repeated half's eval loss)."""
        return self.add_row(
            step=s.step,
            loss=s.loss,
            grad_norm_pre=s.grad_norm_pre,
            grad_norm_post=grad_norm_post,
            clip_factor=clip_factor,
            lr=s.lr,
            eval_loss=eval_loss,
            adam_v_norm=adam_v_norm,
            loss_scale=s.loss_scale,
            clip_limit=math.nan if clip_limit is None else clip_limit,
            grad_finite_pre=s.grad_finite_pre,
            **{k: s.stats[k] for k in MODEL_STAT_KEYS if k in s.stats},
            **setup,
        )

    def add_row(self, **row: float) -> dict[str, float]:
        """One row, every :data:`~pytest_spikecheck.records.run.METRIC_KEYS` column given by name;
        the model's stats (:data:`~pytest_spikecheck.records.run.MODEL_STAT_KEYS`) where it reported them,
        the set-up's columns (:data:`~pytest_spikecheck.records.run.SETUP_KEYS`) where the run has them."""
        for k in MODEL_STAT_KEYS + SETUP_KEYS:
            row.setdefault(k, math.nan)
        for k, column in self.columns.items():
            column.append(row[k])
        return row

    def arrays(self) -> dict[str, np.ndarray]:
        """The columns; a model stat the model never reported, or a set-up column the run does not
        have (no loss scale, no adaptive limit, no QK-Clip, no induction corpus), is left out (not a
        column of NaN)."""
        return {
            k: np.asarray(v, dtype=np.int64 if k == "step" else np.float64)
            for k, v in self.columns.items()
            if k in METRIC_KEYS or not all(math.isnan(x) for x in v)
        }


class CompositionRecorder:
    """Each batch's composition (sample ids, sources, rare tokens, burst members, mixture weights)."""

    def __init__(self, dataset: Dataset, burst_ids: set[int], mixture: np.ndarray | None) -> None:
        self.dataset, self.burst_ids, self.mixture = dataset, burst_ids, mixture
        self.batches: list[dict[str, Any]] = []

    def add(self, s: StepOutcome) -> None:
        composition = batch_composition(
            s.batch,
            pool=self.dataset.pool,
            rare_token_counts=self.dataset.rare_token_counts,
            burst_ids=self.burst_ids,
            weights=self.mixture[s.step - 1] if self.mixture is not None else None,
        )
        self.batches.append({"step": s.step, **composition})


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
            xs, ys = x[start : start + EVAL_CHUNK], y[start : start + EVAL_CHUNK]
            n = int((ys != IGNORE_INDEX).sum())
            if n:
                _, loss = model(xs, ys)
                total += (float(loss) - model_stats(model).get("z_loss", 0.0)) * n  # the cross-entropy
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


def token_loss_table(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    sample_ids: list[str],
    rare_tokens: frozenset[int],
    token_str: Callable[[int], str],
    top: int,
    seen_before: np.ndarray,
) -> dict[str, Any]:
    """Per-token losses of one batch: the worst tokens with their strings, per-piece totals,
    and the share of the batch loss carried by rare tokens and by tokens never trained on
    before this step (``seen_before[t]`` counts earlier target occurrences of token t).
    ``sample_ids[r]`` names row r of the batch; ``token_str`` turns a token id into its string."""
    losses = F.cross_entropy(
        logits.detach().view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="none"
    ).view(targets.shape)
    mask = targets != IGNORE_INDEX
    flat = losses[mask]
    flat_targets = targets[mask].cpu().numpy()
    flat_np = flat.double().cpu().numpy()
    total = float(flat_np.sum()) or float("nan")
    rare_mask = np.isin(flat_targets, np.fromiter(rare_tokens, dtype=np.int64, count=len(rare_tokens)))
    novel_mask = seen_before[flat_targets] == 0
    rows, cols = torch.nonzero(mask, as_tuple=True)
    worst = torch.argsort(flat, descending=True)[:top]
    per_piece: dict[str, list[float]] = {}
    for r, c, v in zip(rows.tolist(), cols.tolist(), flat.tolist()):
        per_piece.setdefault(token_str(int(targets[r, c])), []).append(v)
    pieces = sorted(((p, len(v), sum(v)) for p, v in per_piece.items()), key=lambda t: -t[2])[:top]
    quantiles = torch.quantile(flat, torch.tensor([0.5, 0.9, 0.99], dtype=flat.dtype)).tolist()
    return {
        "mean": float(flat.mean()),
        "p50": quantiles[0],
        "p90": quantiles[1],
        "p99": quantiles[2],
        "max": float(flat.max()),
        "n_tokens": int(flat.numel()),
        "rare_loss_share": float(flat_np[rare_mask].sum()) / total,
        "novel_loss_share": float(flat_np[novel_mask].sum()) / total,
        "novel_tokens": int(novel_mask.sum()),
        "worst": [
            {
                "sample": sample_ids[int(rows[i])],
                "position": int(cols[i]),
                "token": token_str(int(targets[rows[i], cols[i]])),
                "loss": float(flat[i]),
                "rare": int(targets[rows[i], cols[i]]) in rare_tokens,
                "novel": bool(seen_before[int(targets[rows[i], cols[i]])] == 0),
            }
            for i in worst.tolist()
        ],
        "by_token": [{"token": p, "count": n, "total_loss": s, "mean_loss": s / n} for p, n, s in pieces],
    }


def adam_surprise(optimizer: torch.optim.AdamW, named: list[tuple[str, torch.nn.Parameter]], view: EventView) -> dict[str, Any]:
    """How far this step's (clipped) gradient exceeds Adam's memory of it: the share of weights
    with |g| / sqrt(v̂) > ADAM_SURPRISE_THRESHOLD, using v̂ from before this step."""
    total = surprised = 0
    per_param: dict[str, float] = {}
    adam = next((g for g in optimizer.param_groups if "betas" in g), None)  # Muon's AdamW part, or AdamW
    if adam is None:
        return {"threshold": ADAM_SURPRISE_THRESHOLD, "share": math.nan, "by_param": {}}
    for (name, p), grad, state in zip(named, view.grads, view.states):
        if grad is None:
            continue
        if "exp_avg_sq" not in state:
            continue
        beta2 = adam["betas"][1]
        steps_so_far = float(state["step"])
        v_hat = state["exp_avg_sq"] / (1 - beta2**steps_so_far)
        ratio = grad.abs() / (v_hat.sqrt() + adam["eps"])
        hit = int((ratio > ADAM_SURPRISE_THRESHOLD).sum())
        per_param[name] = hit / p.numel()
        surprised += hit
        total += p.numel()
    return {
        "threshold": ADAM_SURPRISE_THRESHOLD,
        "share": surprised / total if total else 0.0,
        "by_param": dict(sorted(per_param.items(), key=lambda kv: -kv[1])[:8]),
    }


def _mean_losses(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, part: torch.Tensor) -> tuple[float, float]:
    """(mean loss over every non-ignored target, mean loss over the targets ``part`` marks) of the
    eval set, from per-token cross-entropies (evaluated in chunks)."""
    total = within = 0.0
    count = count_within = 0
    with torch.no_grad():
        for start in range(0, x.size(0), EVAL_CHUNK):
            xs, ys, ps = x[start : start + EVAL_CHUNK], y[start : start + EVAL_CHUNK], part[start : start + EVAL_CHUNK]
            counted = ys != IGNORE_INDEX
            logits, _ = model(xs)
            losses = (
                F.cross_entropy(
                    logits.float().reshape(-1, logits.size(-1)), ys.reshape(-1), ignore_index=IGNORE_INDEX, reduction="none"
                )
                .view(ys.shape)
                .double()
            )
            total, count = total + float(losses[counted].sum()), count + int(counted.sum())
            within, count_within = within + float(losses[ps & counted].sum()), count_within + int((ps & counted).sum())
    return (total / count if count else math.nan), (within / count_within if count_within else math.nan)


class EvalRecorder:
    """The eval loss after the update: sparse (every ``record.eval_every`` steps), dense around
    declared events and after each detected spike; only the recording rank evaluates. With a
    ``repeat_mask`` (the induction corpus: the targets of each eval sequence's repeated half) the
    loss on those targets too, as the ``eval_loss_repeat`` column."""

    def __init__(
        self,
        scenario: Scenario,
        declared_steps: Iterable[int],
        model: torch.nn.Module,
        eval_x: torch.Tensor,
        eval_y: torch.Tensor,
        *,
        active: bool,
        repeat_mask: torch.Tensor | None = None,
    ) -> None:
        self.schedule = _EvalSchedule(scenario, declared_steps)
        self.model, self.eval_x, self.eval_y, self.active = model, eval_x, eval_y, active
        self.repeat_mask = repeat_mask
        self._repeat = math.nan

    def spike_at(self, step: int) -> None:
        self.schedule.spike_at(step)

    def after_update(self, step: int) -> float:
        self._repeat = math.nan
        if not (self.active and self.schedule.due(step)):
            return math.nan
        if self.repeat_mask is None:
            return _mean_loss(self.model, self.eval_x, self.eval_y)
        full, self._repeat = _mean_losses(self.model, self.eval_x, self.eval_y, self.repeat_mask)
        return full

    def optional_columns(self) -> dict[str, float]:
        """The step's ``eval_loss_repeat`` (NaN where not evaluated), on the induction corpus only."""
        return {} if self.repeat_mask is None else {"eval_loss_repeat": self._repeat}


class AttentionRecorder:
    """Where the run's largest attention logit was: the step, and that step's per-head largest
    logits (layers x heads), for the diagnosis to name the head. Reads a float per step and keeps
    a reference to the step's (small, on-device) per-head tensor only when it is the largest yet."""

    def __init__(self) -> None:
        self._value, self._step, self._heads = -math.inf, None, None

    def add(self, s: StepOutcome) -> None:
        value = s.stats.get("attn_logit_max", math.nan)
        if s.head_logits is not None and value > self._value:
            self._value, self._step, self._heads = value, s.step, s.head_logits

    def largest(self) -> dict[str, Any] | None:
        """``{"step", "value", "per_head"}`` (None without per-head logits)."""
        if self._heads is None:
            return None
        return {"step": self._step, "value": self._value, "per_head": self._heads.tolist()}


def muon_expected_rms(lr: float, adjust_lr_fn: str | None, shape: tuple[int, ...]) -> float:
    """The RMS of the update torch.optim.Muon applies to an (m, n) matrix, its weight decay aside:
    its adjusted lr (``adjust_lr`` rule: lr x sqrt(max(1, m/n)), or lr x 0.2 x sqrt(max(m, n))
    for ``match_rms_adamw``) times the RMS of an orthogonal m x n matrix, 1 / sqrt(max(m, n))."""
    from torch.optim._muon import _adjust_lr  # torch's own rule, not a copy of it

    return _adjust_lr(lr, adjust_lr_fn, torch.Size(shape)) / math.sqrt(max(shape[:2]))


class UpdateRecorder:
    """What the optimizer did to the weights, read around its step (never changing it):

    - ``muon_update_ratio`` (a Muon run): the median over Muon's matrices of RMS(ΔW) over
      :func:`muon_expected_rms` at the step's lr; about 1 (Newton-Schulz gives singular values of
      about 0.7 to 1.2), far below when something scales Muon's update (ClipMuonUpdate);
    - ``optimizer_steps`` and ``update_rms`` (a run that can skip steps, SkipSpikes or a loss
      scale, or declares a step counter): the largest ``step`` in the optimizer's state (its own
      count of the steps it applied, the one Adam's bias correction reads) and the RMS of ΔW over
      every trainable parameter. A skipped step changes nothing: ``update_rms`` 0."""

    def __init__(self, scenario: Scenario, optimizer: Any, named: list[tuple[str, torch.nn.Parameter]]) -> None:
        o = scenario.optimizer
        self.optimizer, self.named = optimizer, named
        parts = getattr(optimizer, "parts", {})
        self.muon = parts.get("muon") if isinstance(parts, dict) else None
        self.steps = o.skip_spike_ratio is not None or scenario.amp.loss_scale is not None or o.step_counter != "advance"
        self._muon_before: list[tuple[torch.Tensor, torch.Tensor, float]] = []
        self._before: list[torch.Tensor] = []

    def before_update(self) -> None:
        if self.muon is not None:
            self._muon_before = [
                (p, p.detach().clone(), muon_expected_rms(g["lr"], g.get("adjust_lr_fn"), tuple(p.shape)))
                for g in self.muon.param_groups
                for p in g["params"]
            ]
        if self.steps:
            self._before = [p.detach().clone() for _, p in self.named]

    def after_update(self) -> dict[str, float]:
        out: dict[str, float] = {}
        if self.muon is not None:
            ratios = [float((p.detach() - b).pow(2).mean().sqrt()) / expected for p, b, expected in self._muon_before]
            out["muon_update_ratio"] = float(np.median(ratios)) if ratios else math.nan
        if self.steps:
            squares = sum(float((p.detach() - b).double().pow(2).sum()) for (_, p), b in zip(self.named, self._before))
            out["update_rms"] = math.sqrt(squares / max(sum(p.numel() for _, p in self.named), 1))
            counts = [float(st["step"]) for st in self.optimizer.state.values() if "step" in st]
            out["optimizer_steps"] = max(counts) if counts else math.nan
        self._muon_before, self._before = [], []
        return out


@dataclass
class EventRecorder:
    """The detail of each event step (declared, spike, non-finite), read after the clip and
    before the update, plus the size of that step's update (and of step 1's, always)."""

    scenario: Scenario
    dataset: Dataset
    plan: list[list[int]]
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    sharding: Sharding
    named: list[tuple[str, torch.nn.Parameter]]
    events: list[Event] = field(default_factory=list)
    first_step_update: dict[str, Any] | None = None
    _record: Event | None = None
    _before: list[torch.Tensor] | None = None

    def after_clip(self, s: StepOutcome, v: StepVerdict) -> Event | None:
        """The event record of this step (None when it is no event, or on a rank that does not
        record). Every rank must call it: gathering a sharded view is a collective."""
        self._record = None
        if not v.is_event:
            return None
        view = self.sharding.event_view(self.model, self.optimizer, s.x, s.y, s.logits, s.clip)
        if not self.sharding.is_recorder:
            return None
        self._record = Event(
            step=s.step,
            kinds=tuple(v.kinds),
            loss=s.loss,
            grad_norm_pre=s.grad_norm_pre,
            baseline_grad_norm=v.baseline,
            clip_factor=float(s.clip.scale),
            max_norm=s.max_norm,
            grad_norm_post=s.grad_norm_post,
            skipped=v.skipped is not None,
            token_losses=token_loss_table(
                view.logits.float(),
                s.y,
                sample_ids=[self.dataset.pool[i].id for i in s.batch],
                rare_tokens=self.dataset.rare_tokens,
                token_str=self.dataset.tokenizer.token,
                top=self.scenario.record.top_tokens,
                seen_before=_target_counts(self.dataset, self.plan[: s.step - 1]),
            ),
            param_grad_norms=dict(
                sorted(
                    (
                        (n, float(g))
                        for (n, _), g, post in zip(self.named, view.pre_clip_norms.tolist(), view.grads)
                        if post is not None
                    ),
                    key=lambda kv: -kv[1],
                )
            ),
            adam_surprise=adam_surprise(self.optimizer, self.named, view) if not (v.nonfinite or v.overflow) else None,
            # which layer and head hold the largest attention logit
            attn_logit_max_per_head=s.head_logits.tolist() if s.head_logits is not None else None,
        )
        self.events.append(self._record)
        return self._record

    def before_update(self, s: StepOutcome, v: StepVerdict) -> None:
        track = s.step == 1 or self._record is not None
        self._before = [p.detach().clone() for _, p in self.named] if track and v.skipped is None else None

    def after_update(self, s: StepOutcome) -> None:
        if self._before is None:
            return
        stats = _update_stats(self._before, self.named)
        if s.step == 1:
            self.first_step_update = {"lr": s.lr, **stats}
        if self._record is not None:  # the event is the list's last (after_clip appended it)
            self._record = self.events[-1] = self._record.replace(update=stats)
        self._before = None


def _first_nonfinite_module_output(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, str]:
    """Replays the forward pass with a hook on every module and names the first whose output is
    non-finite (or its parent, when the value already came in broken); empty when all are finite."""
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
                found.update(
                    tensor="output",
                    module=parent,
                    detail=f"non-finite already in the input of {name}: it arose in {parent}'s own "
                    f"computation (e.g. an attention softmax), not in a submodule",
                )
            else:
                found.update(
                    tensor="output",
                    module=name,
                    detail=f"{type(module).__name__} {name} turned finite inputs into a non-finite output",
                )

        return check

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules() if n]
    try:
        with torch.no_grad():
            model(x, y)
    finally:
        for h in handles:
            h.remove()
    return found


def locate_nonfinite(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, named: list[tuple[str, torch.nn.Parameter]]
) -> dict[str, str]:
    """Where the first non-finite value of a step came from, found after the fact (no cost on
    healthy steps): parameters already non-finite, else the first module whose forward output
    is non-finite (replayed with forward hooks on the same batch), else the backward pass."""
    bad_params = [n for n, p in named if not torch.isfinite(p).all()]
    if bad_params:
        return {
            "tensor": "weight",
            "module": bad_params[0],
            "detail": f"{len(bad_params)} parameter tensor(s) were already non-finite before this step's forward "
            f"pass (the previous optimizer update wrote them): {', '.join(bad_params[:4])}",
        }
    found = _first_nonfinite_module_output(model, x, y)
    if found:
        return found
    bad_grads = [n for n, p in named if p.grad is not None and not torch.isfinite(p.grad).all()]
    if bad_grads:
        return {
            "tensor": "grad",
            "module": bad_grads[0],
            "detail": f"the forward pass is finite; {len(bad_grads)} gradient(s) were non-finite after the backward "
            f"pass and the clip: {', '.join(bad_grads[:4])}",
        }
    return {
        "tensor": "loss",
        "module": "(loss)",
        "detail": "every module output and every gradient is finite: the loss or the gradients' norm overflowed",
    }


def _update_stats(before: list[torch.Tensor], named: list[tuple[str, torch.nn.Parameter]]) -> dict[str, Any]:
    """Largest per-weight change of one optimizer step, overall and per tensor."""
    per = {n: float((p.detach() - b).abs().max()) for (n, p), b in zip(named, before)}
    top = dict(sorted(per.items(), key=lambda kv: -kv[1])[:5])
    return {"max_abs": max(per.values()) if per else 0.0, "by_param": top}


def lockin_stats(
    model: torch.nn.Module,
    dataset: Dataset,
    device: torch.device,
    prompts: int = 16,
    prompt_tokens: int = 3,
    new_tokens: int = 24,
) -> dict[str, Any]:
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
        "top_token": tok.token(top),
        "top_token_share": float(counts[top] / len(flat)),
        "distinct_1": len(set(flat)) / len(flat),
        "distinct_2": len(set(bigrams)) / max(1, len(bigrams)),
        "samples": [tok.decode(row) for row in idx[:: max(1, len(starts) // 4)].tolist()][:4],
    }
