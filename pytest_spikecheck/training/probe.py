"""One-step probes from a cached checkpoint: what would step S do with *this* batch?

Training a scenario to step S costs seconds; asking what one batch would do there costs
milliseconds. :func:`probe_at` trains the scenario once per process to just before step S
(an engine callback stops the loop after step S-1: the loop is extended, never forked) and
keeps the model and optimizer state in memory. A :class:`Probe` then runs step S on any batch
exactly as the engine would — learning rate of step S, forward and backward in the scenario's
micro-batches and precision, clip, the optimizer's step (AdamW, SGD or Muon, QK-Clip when on;
skipped on a non-finite norm or a loss-scaler overflow, as the engine does) — measures it, and
restores the model, optimizer and loss-scaler state bit for bit. Nothing ever trains past S-1.

The probe of the batch the sampler really serves at S reproduces the engine's step S to
the last bit (same ops, same thread count; ``tests`` and ``scenarios/test_fuzz.py`` check
it), so a probe answers "what if this batch had come at step S" about the real run.

A Probe holds live torch state: it is not thread-safe, and one process probes one batch at
a time.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch
import torch.nn.functional as F

from pytest_spikecheck.judge.analysis import BASELINE_WINDOW, baseline
from pytest_spikecheck.clipping import resolve_backend
from pytest_spikecheck.data.dataset import Dataset
from pytest_spikecheck.models.config import IGNORE_INDEX
from pytest_spikecheck.data.samplers import plan_batches
from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.scenario import Scenario
from pytest_spikecheck.scenario.sections import check_max_norm
from pytest_spikecheck.training.schedule import lr_at
from pytest_spikecheck.training.sharding import SingleProcess
from pytest_spikecheck.training.step import TrainingStep

__all__ = ["SCENARIO_CLIP", "Probe", "ProbeResult", "TokenLoss", "measure_probe_rate", "probe_at"]

#: ``Probe(batch, max_norm=SCENARIO_CLIP)`` (the default) clips as the scenario does.
SCENARIO_CLIP: Any = object()

#: How many checkpoints :func:`probe_at` keeps in memory (least recently used goes first).
#: A Phase-19 checkpoint (model, AdamW moments, a copy of both) is ~2 MB.
CHECKPOINT_CACHE_SIZE = 8


def _check_probe(resolved: Scenario, at_step: int) -> None:
    """What a probe can replay, checked before anything trains (one line otherwise)."""
    if not 2 <= at_step <= resolved.steps:
        raise ConfigError(f"at_step must be between 2 and the scenario's {resolved.steps} steps, was {at_step}")
    # Both decide step S from the run's history (an EMA, the last 50 norms) that lives
    # inside the engine's loop; a probe that guessed it would not be step S.
    if resolved.optimizer.clip.kind == "adaptive":
        raise ConfigError(
            "the probe cannot replay an adaptive clip (its limit is the run's EMA state); "
            "probe the scenario with a fixed grad_clip"
        )
    if resolved.optimizer.skip_spike_ratio is not None:
        raise ConfigError(
            "the probe cannot replay SkipSpikes (its verdict depends on the run's last 50 norms); probe the scenario without it"
        )


@dataclass(frozen=True)
class TokenLoss:
    """The loss of one target token of a probed batch."""

    sample: int  # pool index
    position: int  # target position in the sample's row
    token: str
    loss: float
    rare: bool


@dataclass(frozen=True)
class ProbeResult:
    """What step S would do with one batch.

    ``ratio`` is ``grad_norm_pre`` over the median pre-clip norm of the ``BASELINE_WINDOW``
    steps before S in the real run (the spike ratio of :mod:`pytest_spikecheck.judge.analysis`).
    ``update_*`` measure ``θ_after − θ_before`` of the optimizer's step (weight decay included);
    both are 0 when the step is skipped because the gradient norm is non-finite.
    """

    indices: tuple[int, ...]
    loss: float
    grad_norm_pre: float
    grad_norm_post: float
    clip_scale: float
    nonfinite: bool  # the gradient norm was NaN or inf, so no step was taken
    ratio: float
    update_max_abs: float  # the largest |Δθ| over every weight
    update_norm: float  # ‖Δθ‖₂ over all parameters
    params_finite: bool  # every parameter is finite after the step
    token_losses: tuple[TokenLoss, ...] = ()  # filled with ``token_losses=True``, worst first


def _resolve_device(device: str) -> str:
    """``auto`` as the engine resolves it: CUDA when available, else the CPU."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


@contextlib.contextmanager
def _torch_threads(threads: int) -> Iterator[None]:
    # The thread count changes reduction order; the engine pins it, so the probe does too.
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


class Probe:
    """Step S of ``scenario`` on any batch, from the state after step S-1.

    Build one with :func:`probe_at` (cached per process). Call it with a batch — a sequence
    of pool indices of :attr:`dataset` or a :class:`~pytest_spikecheck.fuzz.strategies.Composition`
    — to get a :class:`ProbeResult`. ``max_norm`` overrides the scenario's clip for that
    probe (``None`` or ``inf``: no clip).

    Restored after every probe: parameters, the optimizer's state, module buffers (a user model's
    BatchNorm statistics) and the torch RNG (each probe starts from the RNG state the real
    step S started from, so a model with dropout is probed reproducibly).
    """

    def __init__(self, scenario: Scenario, at_step: int, *, backend: str = "auto", device: str = "cpu", threads: int = 1) -> None:
        resolved = scenario.resolved()
        _check_probe(resolved, at_step)
        device = _resolve_device(device)
        self.scenario = resolved
        self.at_step = at_step
        self.threads = threads
        self.backend = resolve_backend(backend, device)
        self.device = torch.device(device)
        captured = self._train_to_checkpoint(scenario, device)
        self.model: torch.nn.Module = captured["model"]
        self.optimizer: torch.optim.Optimizer = captured["optimizer"]
        self.dataset: Dataset = captured["dataset"]
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self._precision = captured["precision"]
        self._trainer = TrainingStep(
            self.model,
            self.optimizer,
            SingleProcess(self.params),
            backend=self.backend,
            clip=resolved.optimizer.clip,
            accumulation=resolved.sampler.accumulation,
            accumulate=resolved.sampler.accumulate,
            precision=self._precision,
        )
        self._save_checkpoint()
        self._cpu_rng, self._cuda_rng = captured["cpu_rng"], captured["cuda_rng"]
        self._inputs = torch.from_numpy(self.dataset.train.inputs).to(self.device)
        self._targets = torch.from_numpy(self.dataset.train.targets).to(self.device)
        self.lr = lr_at(at_step, base_lr=resolved.optimizer.lr, total_steps=resolved.steps, spec=resolved.schedule)
        #: Median pre-clip norm of the BASELINE_WINDOW steps before S (the ratio's denominator).
        self.baseline_grad_norm = baseline(self.history.metrics, "grad_norm_pre", at_step, BASELINE_WINDOW)
        #: The batch the scenario's sampler serves at step S.
        self.real_batch: tuple[int, ...] = self._batch_served_at(at_step)

    def _train_to_checkpoint(self, scenario: Scenario, device: str) -> dict[str, Any]:
        """Train ``scenario`` with ``train()`` up to step S-1 and return what it left there: the
        model, optimizer, dataset and precision, and the RNG states (:attr:`history` keeps the run)."""
        from pytest_spikecheck.training.launch import train

        at_step = self.at_step
        captured: dict[str, Any] = {}

        def stop_before_step_s(ctx) -> None:
            if ctx.step == at_step - 1:
                captured.update(
                    model=ctx.model,
                    optimizer=ctx.optimizer,
                    dataset=ctx.dataset,
                    precision=ctx.precision,
                    cpu_rng=torch.get_rng_state(),
                    cuda_rng=torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None,
                )
                ctx.stop()

        started = time.perf_counter()
        self.history = train(scenario, backend=self.backend, device=device, threads=self.threads, callbacks=[stop_before_step_s])
        self.checkpoint_seconds = time.perf_counter() - started
        if not captured:
            raise ValueError(
                f"{scenario.name} stopped at step {self.history.meta.get('stopped_at')} "
                f"({self.history.meta.get('stop_reason')}) before reaching step {at_step - 1}"
            )
        return captured

    def _save_checkpoint(self) -> None:
        """Copies of everything a probe step changes (each call restores them): the loss scaler,
        the parameters, the optimizer's state and the model's buffers."""
        self._saved_scaler = self._precision.state_dict() if self._precision is not None else None
        self._saved_params = [p.detach().clone() for p in self.params]
        # Every tensor the optimizer keeps state for: the parameters, and Muon's views of stacked matrices.
        self._saved_state = [
            (self.optimizer.state[key], {k: v.clone() for k, v in self.optimizer.state[key].items() if torch.is_tensor(v)})
            for key in self.optimizer.state
        ]
        self._buffers = list(self.model.buffers())
        self._saved_buffers = [b.clone() for b in self._buffers]

    def _batch_served_at(self, step: int) -> tuple[int, ...]:
        resolved = self.scenario
        plan = plan_batches(
            resolved.sampler,
            steps=resolved.steps,
            seed=resolved.seed,
            n_corpus=self.dataset.n_corpus,
            burst_members=self.dataset.burst_members,
            is_rare=self.dataset.is_rare,
            sources=[sample.source for sample in self.dataset.pool],
        )
        return tuple(plan[step - 1])

    @property
    def pool_size(self) -> int:
        return len(self.dataset.pool)

    def __call__(self, batch: Any, *, max_norm: float | None = SCENARIO_CLIP, token_losses: bool = False) -> ProbeResult:
        indices = tuple(int(i) for i in getattr(batch, "indices", batch))
        if not indices:
            raise ValueError("a probed batch needs at least one sample")
        bad = [i for i in indices if not 0 <= i < self.pool_size]
        if bad:
            raise ValueError(f"pool index {bad[0]} is out of range: the pool has {self.pool_size} samples")
        if max_norm is SCENARIO_CLIP:
            limit = self.scenario.max_norm
        else:  # the scenario's rule (a probe is one of its steps): 0 is refused, None or inf is no clip
            checked = check_max_norm(max_norm, "probe(..., max_norm=...)")
            limit = math.inf if checked is None else checked
        cuda_devices = [self.device] if self._cuda_rng is not None else []
        with _torch_threads(self.threads), torch.random.fork_rng(devices=cuda_devices):
            torch.set_rng_state(self._cpu_rng)
            if self._cuda_rng is not None:
                torch.cuda.set_rng_state(self._cuda_rng, self.device)
            try:
                return self._step(indices, limit, token_losses)
            finally:
                self._restore()

    def _step(self, indices: tuple[int, ...], max_norm: float, want_token_losses: bool) -> ProbeResult:
        # Step S as the engine runs it: the one TrainingStep (lr, forward, backward, clip, measure, update).
        index = torch.tensor(indices, device=self.device)
        self.model.train()
        s = self._trainer.forward_backward_clip(
            self.at_step, list(indices), self._inputs[index], self._targets[index], lr=self.lr, max_norm=max_norm
        )
        if s.nonfinite or s.overflow:  # the engine stops or skips here without stepping; so does the probe
            update_max_abs = update_norm = 0.0
            self._trainer.update(skip=True)
        else:
            self._trainer.update()
            deltas = torch._foreach_sub([p.detach() for p in self.params], self._saved_params)
            update_max_abs = float(max(d.abs().max() for d in deltas))
            update_norm = float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(deltas))))
        params_finite = all(bool(torch.isfinite(p).all()) for p in self.params)
        base = self.baseline_grad_norm
        return ProbeResult(
            indices=indices,
            loss=s.loss,
            grad_norm_pre=s.grad_norm_pre,
            grad_norm_post=s.grad_norm_post,
            clip_scale=float(s.clip.scale),
            nonfinite=s.nonfinite or s.overflow,  # no step taken either way (an overflow: the loss scaler skips it)
            ratio=s.grad_norm_pre / base if base > 0 else math.nan,
            update_max_abs=update_max_abs,
            update_norm=update_norm,
            params_finite=params_finite,
            token_losses=self._token_losses(s.logits.detach(), s.y, indices) if want_token_losses else (),
        )

    def _token_losses(self, logits: torch.Tensor, targets: torch.Tensor, indices: tuple[int, ...]) -> tuple[TokenLoss, ...]:
        losses = F.cross_entropy(
            logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="none"
        ).view(targets.shape)
        rows, cols = torch.nonzero(targets != IGNORE_INDEX, as_tuple=True)
        tok, rare = self.dataset.tokenizer, self.dataset.rare_tokens
        out = [
            TokenLoss(
                sample=indices[r],
                position=c,
                token=tok.token(int(targets[r, c])),
                loss=float(losses[r, c]),
                rare=int(targets[r, c]) in rare,
            )
            for r, c in zip(rows.tolist(), cols.tolist())
        ]
        return tuple(sorted(out, key=lambda t: -t.loss))

    def _restore(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            torch._foreach_copy_(self.params, self._saved_params)
            for buffer, saved_buffer in zip(self._buffers, self._saved_buffers):
                buffer.copy_(saved_buffer)
            for state, saved in self._saved_state:
                for key, value in saved.items():
                    state[key].copy_(value)
        if self._precision is not None:
            self._precision.load_state_dict(self._saved_scaler)


_CHECKPOINTS: OrderedDict[tuple, Probe] = OrderedDict()


def probe_at(scenario: Scenario, at_step: int, *, backend: str = "auto", device: str = "cpu", threads: int = 1) -> Probe:
    """The :class:`Probe` of ``scenario`` at step ``at_step``, trained once per process.

    Cached in memory by the scenario's content hash, ``at_step``, backend, device and
    threads (the last ``CHECKPOINT_CACHE_SIZE`` are kept), so every test and every
    Hypothesis example of a session shares one checkpoint.
    """
    device = _resolve_device(device)
    key = (scenario.content_hash(), at_step, resolve_backend(backend, device), device, threads)
    if key in _CHECKPOINTS:
        _CHECKPOINTS.move_to_end(key)
        return _CHECKPOINTS[key]
    probe = Probe(scenario, at_step, backend=backend, device=device, threads=threads)
    _CHECKPOINTS[key] = probe
    while len(_CHECKPOINTS) > CHECKPOINT_CACHE_SIZE:
        _CHECKPOINTS.popitem(last=False)
    return probe


def measure_probe_rate(probe: Probe, batches: Sequence[Sequence[int]], *, repeats: int = 1) -> float:
    """Probes per second over ``batches`` (each probed ``repeats`` times), wall clock."""
    started = time.perf_counter()
    for _ in range(repeats):
        for batch in batches:
            probe(batch)
    elapsed = time.perf_counter() - started
    return repeats * len(batches) / elapsed if elapsed > 0 else math.inf
