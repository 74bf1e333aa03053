"""Record someone else's training loop the way the engine records its own.

A :class:`Recorder` sits beside any loop that owns a torch model and optimizer. At each step
it measures, itself, what a diagnosis needs: the pre- and post-clip global gradient norms
(never the trainer's own number): before the clip, per-tensor norms (float32, as the engine's
event records measure them) combined in float64, and where that norm is not finite whether every
gradient element was finite all the same (``grad_finite_pre``); after the clip, the float64 norm of the
gradients as the optimizer receives them (the engine's measurement); the per-tensor norms, the lr, Σv of Adam, the batch's
samples and rare tokens; and at declared and spike steps the per-token losses and Adam's
surprise, read with the engine's own helpers (:mod:`pytest_spikecheck.training.recorders`).
:meth:`Recorder.save` writes a run folder that ``spikecheck diagnose``/``compare`` and every
assertion read unchanged.

A plain loop::

    rec = record(model, optimizer, max_norm=1.0, catalog=catalog, stream=stream)
    for x, y in loader:
        logits = model(x); loss = F.cross_entropy(...); loss.backward()
        with rec.clipping():                     # before_clip() ... after_clip()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        rec.step(loss=loss, logits=logits, targets=y)   # before zero_grad
        optimizer.zero_grad()
    rec.save("runs/mine")

The framework callbacks (:mod:`.hf`, :mod:`.lightning`) drive the same object from their hooks.
"""

from __future__ import annotations

import dataclasses
import math
import platform
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import torch

from pytest_spikecheck import __version__
from pytest_spikecheck.data.corpus import Sample
from pytest_spikecheck.data.samplers import batch_composition
from pytest_spikecheck.errors import ClipBeforeUnscaleWarning, ConfigError, SpikeCheckError
from pytest_spikecheck.models.config import IGNORE_INDEX
from pytest_spikecheck.integrations.burst import BurstStream
from pytest_spikecheck.judge.text import fmt_scale
from pytest_spikecheck.records.events import Event
from pytest_spikecheck.records.facts import ModelFacts, QKClipFacts, RunFacts
from pytest_spikecheck.records.run import MODEL_STAT_KEYS, TRAINER_NAMES, Run
from pytest_spikecheck.scenario.sections import ClipSpec, RecordSpec, SamplerSpec, check_max_norm
from pytest_spikecheck.training.optimizers import observed_groups
from pytest_spikecheck.training.qk_clip import QKClipHook
from pytest_spikecheck.training.recorders import MetricsRecorder, adam_surprise, token_loss_table
from pytest_spikecheck.training.sharding import EventView, SingleProcess, float64_norm
from pytest_spikecheck.training.step import SKIPPED_OVERFLOW, SpikeWatch, StepVerdict, combine_stats, model_stats


@dataclass(frozen=True)
class SampleCatalog:
    """What the records need to know about each sample of your dataset (row i = dataset index
    i): an id, a source, the target token ids, which tokens are rare, and token strings.

    ``ids`` and ``sources`` name each sample and where it comes from; ``targets`` its token ids;
    ``rare_tokens`` the token ids counted as rare and ``rare_token_counts`` how many of them each
    sample carries; ``vocab_size`` the tokenizer's; ``token_str`` turns a token id into text for
    the records. :meth:`from_tokens` computes them as the engine does."""

    ids: tuple[str, ...]
    sources: tuple[str, ...]
    targets: tuple[np.ndarray, ...]
    rare_tokens: frozenset[int]
    rare_token_counts: tuple[int, ...]
    vocab_size: int
    token_str: Callable[[int], str] = str

    @classmethod
    def from_tokens(
        cls,
        tokens: Sequence[Sequence[int]],
        *,
        vocab_size: int,
        ids: Sequence[str] | None = None,
        sources: Sequence[str] | None = None,
        token_str: Callable[[int], str] = str,
        rare_doc_freq: int = SamplerSpec.rare_doc_freq,
        rarity_excludes: Iterable[int] = (),
        ignore: Iterable[int] = (IGNORE_INDEX,),
    ) -> SampleCatalog:
        """``tokens[i]``: the token ids sample i is trained to predict (ignored ids dropped). A
        token is rare when at most ``rare_doc_freq`` samples contain it, counted as the engine
        counts (data/dataset.py) over the samples not in ``rarity_excludes`` (pass the injected
        burst's samples: a token only they carry is rare however many of them share it)."""
        n = len(tokens)
        ids = tuple(ids) if ids is not None else tuple(f"sample-{i}" for i in range(n))
        sources = tuple(sources) if sources is not None else ("data",) * n
        if len(ids) != n or len(sources) != n:
            raise ConfigError(f"SampleCatalog: {n} token lists but {len(ids)} ids and {len(sources)} sources")
        drop = np.fromiter(set(ignore), dtype=np.int64)
        targets = tuple(a[~np.isin(a, drop)] for a in (np.asarray(t, dtype=np.int64).reshape(-1) for t in tokens))
        excluded = set(rarity_excludes)
        doc_freq = np.zeros(vocab_size, dtype=np.int64)
        for i, t in enumerate(targets):
            if i not in excluded:
                doc_freq[np.unique(t)] += 1
        present = np.unique(np.concatenate(targets)) if targets else np.zeros(0, np.int64)
        rare = frozenset(int(t) for t in present if doc_freq[t] <= rare_doc_freq)
        rare_arr = np.fromiter(rare, dtype=np.int64, count=len(rare))
        counts = tuple(int(np.isin(t, rare_arr).sum()) for t in targets)
        return cls(ids, sources, targets, rare, counts, vocab_size, token_str)

    @property
    def pool(self) -> tuple[Sample, ...]:
        return tuple(Sample(id=i, text="", source=s) for i, s in zip(self.ids, self.sources))

    def target_counts(self, batches: Iterable[Sequence[int]]) -> np.ndarray:
        """How often each token was a target in ``batches`` (0: never trained on)."""
        counts = np.zeros(self.vocab_size, dtype=np.int64)
        chosen = [self.targets[i] for batch in batches for i in batch]
        if chosen:
            counts += np.bincount(np.concatenate(chosen), minlength=self.vocab_size)[: self.vocab_size]
        return counts


@dataclass
class _Pending:
    """One step between :meth:`Recorder.before_clip` and :meth:`Recorder.step`."""

    step: int
    grad_norm_pre: float
    pre_norms: torch.Tensor  # per trainable parameter (0 where no gradient), float64
    has_grad: list[bool]  # per trainable parameter: whether it received a gradient this step
    lr: float
    verdict: StepVerdict
    adam_states: list[dict[str, Any]] | None  # Adam's state before this step's update (event steps only)
    loss_scale: float = math.nan  # the scale of this step's backward (NaN: no loss scaler)
    grad_norm_post: float | None = None
    surprise: dict[str, Any] | None = None
    #: where the pre-clip norm is not finite: 1.0 every gradient element was finite before the clip
    #: (only the norm overflowed), 0.0 one was not; NaN where the pre-clip norm is finite
    grad_finite_pre: float = math.nan


class RecorderOrderWarning(UserWarning):
    """``rec.step()`` ran with no optimizer step since the last one."""


def _show(warning: Warning, stacklevel: int = 2) -> None:
    """Warn without ever raising: under ``filterwarnings = error`` (the README's setting) the warning
    is still shown (and ``pytest.warns`` still catches it) while the training it comes from goes on.
    The run records what it warns about, and the assertions fail on that."""
    try:
        warnings.warn(warning, stacklevel=stacklevel + 1)  # as the filters say (an "ignore" is honoured) ...
    except type(warning):  # ... but an "error" filter is not allowed to stop the training: shown instead
        with warnings.catch_warnings():
            warnings.simplefilter("always", type(warning))
            warnings.warn(warning, stacklevel=stacklevel + 1)


def _joined(logits: Any, targets: Any) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """One logits tensor and one targets tensor from a tensor each or lists of them (one per
    micro-batch), rows concatenated in order; micro-batches padded to different lengths are
    padded to the longest (targets with IGNORE_INDEX, so the padding counts for nothing)."""
    if logits is None or targets is None or torch.is_tensor(logits):
        return logits, targets
    logits, targets = [t.detach() for t in logits], list(targets)
    if not logits:
        return None, None
    length = max(t.shape[1] for t in targets)
    if any(t.shape[1] != length for t in targets):
        logits = [torch.nn.functional.pad(lg, (0, 0, 0, length - lg.shape[1])) for lg in logits]
        targets = [torch.nn.functional.pad(t, (0, length - t.shape[1]), value=IGNORE_INDEX) for t in targets]
    return torch.cat(logits), torch.cat(targets)


def scaler_stage(scaler: Any, optimizer: Any) -> str:
    """``READY`` (the gradients are still scaled), ``UNSCALED`` or ``STEPPED``: where
    ``torch.amp.GradScaler`` is in this iteration for ``optimizer``. torch keeps it in a private
    per-optimizer table with no public accessor; a fresh optimizer has no entry (READY)."""
    state = getattr(scaler, "_per_optimizer_states", {}).get(id(optimizer)) if optimizer is not None else None
    return getattr(state.get("stage"), "name", "READY") if state else "READY"


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch's forward as a trainer hands it over (:meth:`Recorder.gather`)."""

    loss: Any  # a tensor or a number; None: not given
    logits: Any = None
    targets: Any = None
    summed: bool = False  # the micro-batch losses add up to the step's (each already divided)
    #: the model's stats hook after this micro-batch's forward (attn_logit_max, ...; empty without one)
    stats: dict[str, float] = field(default_factory=dict)


def gathered_loss(parts: Sequence[MicroBatch]) -> float:
    """The loss the trainer backpropagated for the optimizer step, from its micro-batches: their
    sum when each is already divided (every part ``summed``: HF's ``num_items_in_batch``, the
    token-weighted mean over the step's batch; Lightning's loss / ``accumulate_grad_batches``,
    the mean of the micro-batch means), else their mean (HF divides each by
    ``gradient_accumulation_steps``: the mean of the micro-batch means). NaN when a micro-batch
    gave no loss."""
    if not parts or any(m.loss is None for m in parts):
        return math.nan
    losses = [float(m.loss.detach()) if hasattr(m.loss, "detach") else float(m.loss) for m in parts]
    return sum(losses) if all(m.summed for m in parts) else sum(losses) / len(losses)


@dataclass
class Recorder:
    """Records your own training loop as a run folder, measuring the gradient norms itself.

    Built by :func:`record`; beside any loop that owns a torch model and optimizer it measures
    the pre- and post-clip global norms, the lr, Adam's √Σv, the batch's samples and rare tokens,
    and at declared and spike steps the per-token losses; :meth:`save` writes a folder that
    ``spikecheck diagnose``/``compare`` and every assertion read (the module docstring has the
    loop). The framework callbacks (Hugging Face, Lightning) drive the same object.

    ``max_norm``: the clip your trainer applies (None, 0 or inf:
    none); it is written into the records, never used to compute a norm. ``stream`` (from
    :func:`~pytest_spikecheck.integrations.burst.inject_burst`) names each step's samples and
    declares its burst; ``catalog`` describes the samples (ids, sources, rare tokens).

    ``accumulation``: micro-batches per optimizer step (call :meth:`step` once per optimizer
    step; a stream must plan the same). ``scaler``: your ``torch.amp.GradScaler``, so that the
    recorded norms are the unscaled ones, the loss scale is a column and the steps it skips are
    marked ``skipped: overflow``. ``seed``: your run's seed, for the record (run.json).
    ``trainer``: ``loop``, ``hf`` or ``lightning``; ``facts``: what the trainer reports about the
    run (the callbacks fill them: lr, max_grad_norm, precision, versions), written to run.json's
    ``recorded``. ``run_facts``: :class:`~pytest_spikecheck.records.facts.RunFacts` fields the
    caller knows and the recorder cannot observe (the callbacks pass the trainer's precision and
    world size); ``qk_clip``: your QK-Clip's tau (or a ``QKClipFacts``), if you run one the
    recorder cannot see (ours, an OptimizerSet's after-step hook, it reads itself). The rest of
    the run facts are observed: the optimizer's class and param groups, the clip, the
    accumulation, the seed; what is neither observed nor given is None."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None = None
    max_norm: float | None = None
    catalog: SampleCatalog | None = None
    stream: BurstStream | None = None
    declared: Mapping[int, str] = field(default_factory=dict)
    #: The run's name (run.json, the report, the verdicts).
    name: str = "your-trainer"
    trainer: str = "loop"
    #: The online detector's bar, as the engine's ``record.spike_ratio``: a step whose pre-clip
    #: norm is this many times the median of the last ``window`` steps gets a detailed event.
    spike_ratio: float = RecordSpec.spike_ratio
    #: The steps that median is taken over (the engine's ``record.spike_window``).
    window: int = RecordSpec.spike_window
    #: Per-token losses kept at each event step (the largest).
    top_tokens: int = RecordSpec.top_tokens
    #: Extra entries for run.json, merged over what the recorder writes.
    meta: dict[str, Any] = field(default_factory=dict)
    accumulation: int = 1
    scaler: Any = None
    seed: int | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    run_facts: Mapping[str, Any] = field(default_factory=dict)
    qk_clip: float | QKClipFacts | None = None

    def __post_init__(self) -> None:
        # the one rule, 0 as trainers spell "no clip" (TrainingArguments(max_grad_norm=0))
        self.max_norm = check_max_norm(self.max_norm, "Recorder max_norm", zero="no_clip")
        if isinstance(self.accumulation, bool) or not isinstance(self.accumulation, int) or self.accumulation < 1:
            raise ConfigError(
                f"record(..., accumulation=...) must be an integer >= 1 (micro-batches per optimizer "
                f"step), was {self.accumulation!r}"
            )
        if self.stream is not None and self.stream.accumulation != self.accumulation:
            raise ConfigError(
                f"the burst stream plans {self.stream.accumulation} micro-batch(es) per optimizer step "
                f"(inject_burst(..., accumulation={self.stream.accumulation})) but the recorder was given "
                f"accumulation={self.accumulation}: give both the same"
            )
        if self.scaler is not None and not all(hasattr(self.scaler, a) for a in ("get_scale", "scale", "unscale_")):
            raise ConfigError(f"record(..., scaler=...) takes a torch.amp.GradScaler, was {type(self.scaler).__name__}")
        self.max_norm = math.inf if self.max_norm is None else float(self.max_norm)
        if self.qk_clip is not None and not isinstance(self.qk_clip, QKClipFacts):
            if isinstance(self.qk_clip, bool) or not isinstance(self.qk_clip, (int, float)) or not 0 < self.qk_clip < math.inf:
                raise ConfigError(
                    f"record(..., qk_clip=...) is your QK-Clip's tau, a number > 0 (or a QKClipFacts), was {self.qk_clip!r}"
                )
            self.qk_clip = QKClipFacts(tau=float(self.qk_clip))
        self._groups = observed_groups(self.optimizer)  # before any step: the groups' lr as built
        self.named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        if not self.named:
            raise ConfigError("Recorder: the model has no trainable parameters")
        self.declared = {**(self.stream.declared if self.stream is not None else {}), **dict(self.declared)}
        self._watch = SpikeWatch(self.spike_ratio, self.window, None, dict(self.declared))
        self._adam_reader = SingleProcess([p for _, p in self.named])
        self._metrics = MetricsRecorder()
        self.events: list[Event] = []
        self._gathered: list[MicroBatch] = []  # the current step's micro-batches (gather, step_gathered)
        self.skipped: dict[int, str] = {}  # step -> why its update was not applied
        self._batch_indices: list[tuple[int, Sequence[int]]] = []  # (step, dataset indices)
        self._pending: _Pending | None = None
        self._tapped: torch.Tensor | None = None  # pre-clip norms measured in backward (tap_gradients)
        self._tap_handles: list[Any] = []
        self._tap_armed: Callable[[], bool] = lambda: True
        self._taps_scaled = False  # the taps measured loss-scaled gradients (a trainer's backward under its scaler)
        self._in_clipping = False
        self._clip_before_unscale_at: list[int] = []
        self._warned_no_step = False
        self._logits_dtype: str | None = None
        self._first_lr = math.nan
        # The post-clip norm is measured when the optimizer's step returns, on what it consumed
        # (after a loss scaler's unscale_, whoever calls it); a step that never returns there was
        # skipped (a loss scaler's overflow). An optimizer without step hooks: measured at step().
        hook = getattr(self.optimizer, "register_step_post_hook", None)
        self._step_hook = hook(self._after_optimizer_step) if callable(hook) else None
        # A model with the spikecheck stats hook (ours, the preflight's proxies, yours) reports its
        # largest attention logit on every training forward: recorded every step, whatever the
        # defences (Megatron-Bridge PR 5329 logged it only with QK-Clip on).
        if hasattr(self.model, "record_stats"):
            self.model.record_stats = True
        self._started = time.perf_counter()

    @property
    def steps_recorded(self) -> int:
        return len(self._metrics.columns["step"])

    @property
    def step_open(self) -> bool:
        """True between the measurement of a step's gradients and :meth:`step`, which closes it."""
        return self._pending is not None

    def _grads(self) -> list[torch.Tensor | None]:
        return [p.grad for _, p in self.named]

    def tap_gradients(self, armed: Callable[[], bool] | None = None, scaled: bool = False) -> None:
        """Measure each parameter's gradient norm in backward, as soon as it is complete
        (a post-accumulate-grad hook), for trainers whose first hook after backward comes after
        their clip (Hugging Face's Trainer): :meth:`before_clip` then uses these norms. Under
        accumulation ``armed()`` says whether the backward running now is the step's last one
        (only that one is measured: once per optimizer step, on the accumulated gradient).
        ``scaled``: the backward runs on the loss-scaled loss (the scale is divided out)."""
        self._tapped = torch.full((len(self.named),), math.nan, dtype=torch.float64)
        self._taps_scaled = scaled
        if armed is not None:
            self._tap_armed = armed
        for k, (_, p) in enumerate(self.named):
            self._tap_handles.append(p.register_post_accumulate_grad_hook(self._tap_hook(k)))

    def _tap_hook(self, k: int) -> Callable[[torch.Tensor], None]:
        def measure(param: torch.Tensor) -> None:
            if self._tap_armed():
                self._tapped[k] = torch.linalg.vector_norm(param.grad, dtype=torch.float64)

        return measure

    def close(self) -> None:
        """Remove the gradient hooks of :meth:`tap_gradients` and the optimizer's step hook."""
        for handle in self._tap_handles:
            handle.remove()
        self._tap_handles = []
        if self._step_hook is not None:
            self._step_hook.remove()
            self._step_hook = None

    # -- the three calls of a step ----------------------------------------------------------
    def before_clip(self) -> None:
        """Measure the gradients as they are before the clip (call after backward; with a
        loss scaler, after ``scaler.unscale_(optimizer)``: if the gradients are still scaled the
        recorder divides the scale out and warns once, since your clip then acts on scaled ones)."""
        still_scaled = self.scaler is not None and scaler_stage(self.scaler, self.optimizer) == "READY"
        if still_scaled and self._in_clipping:
            step = self.steps_recorded + 1
            self._clip_before_unscale_at.append(step)
            if len(self._clip_before_unscale_at) == 1:
                _show(
                    ClipBeforeUnscaleWarning(
                        f"rec.clipping() at step {step}: the gradients are still scaled by the GradScaler "
                        f"(×{fmt_scale(float(self.scaler.get_scale()))}): call scaler.unscale_(optimizer) before clipping, "
                        f"or the clip sees ‖g‖ × scale and the optimizer receives the clipped gradient divided by the scale"
                    ),
                    stacklevel=3,
                )
        self._measure_before_clip(still_scaled)

    def _measure_before_clip(self, still_scaled: bool) -> None:
        step = self.steps_recorded + 1
        grads = self._grads()
        has_grad = [g is not None for g in grads]
        tapped = self._tapped is not None and not self._tapped[torch.tensor(has_grad)].isnan().any()
        if tapped:
            per = torch.where(torch.tensor(has_grad), self._tapped, 0.0)
        elif all(has_grad):  # measured now (no tap, or a gradient the backward hooks never saw)
            per = torch.stack(torch._foreach_norm(grads)).double()
        else:
            per = torch.zeros(len(grads), dtype=torch.float64)
            if any(has_grad):
                per[torch.tensor(has_grad)] = torch.stack(torch._foreach_norm([g for g in grads if g is not None])).double()
        if self._tapped is not None:
            self._tapped.fill_(math.nan)
        scale = float(self.scaler.get_scale()) if self.scaler is not None else math.nan
        if self.scaler is not None and ((tapped and self._taps_scaled) or (not tapped and still_scaled)):
            per = per / scale  # measured on scaled gradients: the unscaled norms (exact for a power-of-two scale)
        pre = float(torch.linalg.vector_norm(per))
        finite_pre = math.nan  # a finite pre-clip norm says every element is finite
        if not math.isfinite(pre):
            # the tapped norms are float64 (they overflow only on an inf element); norms measured
            # now are in the gradients' dtype (a float32 norm overflows above ~1.8e19 with every
            # element finite), so the elements are measured again, in float64, before the clip
            measured = per if tapped else float64_norm([g for g in grads if g is not None]).reshape(1)
            finite_pre = 1.0 if bool(torch.isfinite(measured).all()) else 0.0
        if self.scaler is not None and not math.isfinite(pre) and finite_pre != 1.0:
            # an inf or NaN element: the scaler skips this step (no spike, no failure). Finite elements
            # whose norm overflowed are not what a scaler checks: it steps, and the norm is judged.
            verdict = self._watch.overflowed(step)
        else:
            verdict = self._watch.judge_norm(step, pre, nonfinite=not math.isfinite(pre))
        states = None
        if verdict.is_event and self.optimizer is not None:
            # cloned now: a trainer whose hook after the clip comes after the update (Lightning)
            # would otherwise show the surprise against a v that already holds this gradient
            states = [
                {"exp_avg_sq": st["exp_avg_sq"].clone(), "step": float(st["step"])} if "exp_avg_sq" in st else {}
                for st in (self.optimizer.state.get(p, {}) for _, p in self.named)
            ]
        lr = float(self.optimizer.param_groups[0]["lr"]) if self.optimizer is not None else math.nan
        self._pending = _Pending(step, pre, per, has_grad, lr, verdict, states, loss_scale=scale, grad_finite_pre=finite_pre)

    def after_clip(self) -> None:
        """The clip is done. The post-clip norm is measured on what the optimizer consumes: when
        its step returns (an optimizer step hook), else at :meth:`step`."""
        if self._pending is None:
            raise SpikeCheckError("Recorder.after_clip called without before_clip for this step")

    def _measure_after_clip(self) -> None:
        p = self._pending
        grads = self._grads()
        p.grad_norm_post = float(float64_norm([g for g in grads if g is not None]))
        if p.adam_states is not None and not (p.verdict.nonfinite or p.verdict.overflow):
            p.surprise = adam_surprise(self.optimizer, self.named, EventView(None, grads, p.pre_norms, p.adam_states))

    def _after_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._pending is None:  # no rec.clipping() this step (an unclipped loop): nothing clipped in between
            self._measure_before_clip(still_scaled=False)
        self._measure_after_clip()

    @contextmanager
    def clipping(self) -> Iterator[Recorder]:
        """``with rec.clipping(): clip(...)``: before_clip on entry, after_clip on exit."""
        self._in_clipping = True
        try:
            self.before_clip()
        finally:
            self._in_clipping = False
        yield self
        self.after_clip()

    def step(
        self,
        *,
        loss: Any,
        lr: float | None = None,
        batch: Sequence[int] | None = None,
        logits: Any = None,
        targets: Any = None,
        eval_loss: float = math.nan,
        stats: Mapping[str, float] | None = None,
    ) -> dict[str, float]:
        """Close the optimizer step: its row, its batch composition and (at an event step) its
        event record. Call it after the optimizer's step and before zero_grad, once per optimizer
        step (with accumulation, after the last micro-batch). Without an earlier
        before_clip/after_clip it measures both now (an unclipped loop needs nothing else).
        ``batch``: the dataset indices of the step's samples (default: the stream's plan);
        ``logits``/``targets`` aligned (targets[..., t] is what logits[..., t, :] predicts; -100
        ignored) for the per-token losses, or a list of them, one per micro-batch. ``stats``: the
        model's stats of the step (default: what its stats hook left after the last forward)."""
        if self._pending is None:
            self._measure_before_clip(still_scaled=False)
        p = self._pending
        why_skipped = None
        if p.grad_norm_post is None:
            if self._step_hook is not None:  # the optimizer's step never returned: it did not step
                why_skipped = SKIPPED_OVERFLOW if self.scaler is not None else "no optimizer step"
                if self.scaler is None and not self._warned_no_step:
                    self._warned_no_step = True
                    warnings.warn(
                        f"rec.step() at step {p.step}: the optimizer did not step since the last rec.step() "
                        f"(recorded as skipped); call rec.step() after optimizer.step(), once per optimizer "
                        f"step",
                        RecorderOrderWarning,
                        stacklevel=2,
                    )
            elif p.verdict.overflow:
                why_skipped = SKIPPED_OVERFLOW
            if why_skipped is None:
                self._measure_after_clip()
        logits, targets = _joined(logits, targets)
        if self._logits_dtype is None and logits is not None:
            self._logits_dtype = str(logits.dtype).removeprefix("torch.")
        if self.steps_recorded == 0:
            self._first_lr = p.lr if lr is None else float(lr)
        loss_value = float(loss.detach()) if torch.is_tensor(loss) else float(loss)
        indices = list(batch) if batch is not None else (self.stream.batch_at(p.step) if self.stream is not None else None)
        if indices is not None:
            self._batch_indices.append((p.step, indices))
        if why_skipped is not None:  # nothing reached the weights: as the engine records a skipped step
            self.skipped[p.step] = why_skipped
            post, clip_factor = 0.0, 0.0
        else:
            post, clip_factor = p.grad_norm_post, _clip_factor(p.grad_norm_pre, p.grad_norm_post)
        if p.verdict.is_event:
            self.events.append(
                self._event(p, loss_value, clip_factor, post, indices, logits, targets, skipped=why_skipped is not None)
            )
        v_sum = self._adam_reader.adam_v_sum(self.optimizer) if self.optimizer is not None else math.nan
        row = self._metrics.add_row(
            step=p.step,
            loss=loss_value,
            grad_norm_pre=p.grad_norm_pre,
            grad_norm_post=post,
            clip_factor=clip_factor,
            lr=p.lr if lr is None else float(lr),
            eval_loss=float(eval_loss),
            adam_v_norm=math.sqrt(v_sum),
            loss_scale=p.loss_scale,
            clip_limit=self.max_norm,
            grad_finite_pre=p.grad_finite_pre,
            **self._model_stats(stats),
        )
        if not p.verdict.overflow:
            self._watch.observe_norm(p.step, p.grad_norm_pre)
        self._pending = None
        return row

    def _model_stats(self, stats: Mapping[str, float] | None) -> dict[str, float]:
        """The step's model-stat columns (MODEL_STAT_KEYS) the model reported; none without a stats hook."""
        stats = model_stats(self.model) if stats is None else stats
        return {k: float(stats[k]) for k in MODEL_STAT_KEYS if k in stats}

    # -- micro-batches handed over one at a time (the HF and Lightning callbacks) --------------
    def gather(self, *, loss: Any = None, logits: Any = None, targets: Any = None, summed: bool = False) -> None:
        """One micro-batch of the optimizer step now running, for a trainer that hands its
        forwards over one at a time (the HF and Lightning callbacks gather here): its loss (None:
        not given), and its logits and targets aligned (see :meth:`step`). ``summed``: the
        micro-batch losses add up to the step's loss (each is already divided: HF's
        ``num_items_in_batch``, Lightning's loss / ``accumulate_grad_batches``); else the step's
        loss is their mean. :meth:`step_gathered` closes the step with them."""
        self._gathered.append(MicroBatch(loss, logits, targets, summed, model_stats(self.model)))

    @property
    def gathered(self) -> int:
        """How many micro-batches of the running step were gathered so far."""
        return len(self._gathered)

    def step_gathered(self, **options: Any) -> dict[str, float]:
        """:meth:`step` with the gathered micro-batches: the step's loss from theirs
        (:func:`gathered_loss`), their logits and targets where every one has both (else no
        per-token losses); the gatherer starts empty for the next step."""
        parts, self._gathered = self._gathered, []
        both = bool(parts) and all(m.logits is not None and m.targets is not None for m in parts)
        # the step's stats from its micro-batches' (a largest value the largest, others their mean)
        stats = combine_stats([(m.stats, 1 / len(parts)) for m in parts]) if parts and all(m.stats for m in parts) else None
        return self.step(
            loss=gathered_loss(parts),
            logits=[m.logits for m in parts] if both else None,
            targets=[m.targets for m in parts] if both else None,
            stats=stats,
            **options,
        )

    def set_eval_loss(self, step: int, value: float) -> None:
        """The eval loss measured after step ``step`` (a trainer that evaluates on its own schedule)."""
        steps = self._metrics.columns["step"]
        if step in steps:
            self._metrics.columns["eval_loss"][steps.index(step)] = float(value)

    # -- what the step leaves behind ----------------------------------------------------------
    @property
    def batches(self) -> list[dict[str, Any]]:
        """Each step's batch composition (built when asked: it costs a step nothing)."""
        if self.catalog is None:
            return []
        pool, burst = self.catalog.pool, set(self.stream.burst_ids) if self.stream is not None else set()
        out = []
        for step, indices in self._batch_indices:
            composition = batch_composition(indices, pool=pool, rare_token_counts=self.catalog.rare_token_counts, burst_ids=burst)
            # the injected samples by name (the engine's batches count them; a user's burst names them)
            injected = [self.catalog.ids[i] for i in indices if i in burst]
            out.append({"step": step, **composition, **({"injected": injected} if injected else {})})
        return out

    def _event(
        self,
        p: _Pending,
        loss: float,
        clip_factor: float,
        post: float,
        indices: Sequence[int] | None,
        logits: torch.Tensor | None,
        targets: torch.Tensor | None,
        *,
        skipped: bool,
    ) -> Event:
        table = None
        if logits is not None and targets is not None:
            cat = self.catalog
            ids = (
                [cat.ids[i] for i in indices]
                if cat is not None and indices is not None
                else [f"row-{r}" for r in range(targets.shape[0])]
            )
            seen = (
                cat.target_counts([b for _, b in self._batch_indices[:-1]])
                if cat is not None and indices is not None
                else np.ones(int(logits.shape[-1]), dtype=np.int64)
            )  # unknown history: nothing counts as novel
            table = token_loss_table(
                logits.detach().float().contiguous(),
                targets,
                sample_ids=ids,
                rare_tokens=cat.rare_tokens if cat is not None else frozenset(),
                token_str=cat.token_str if cat is not None else str,
                top=self.top_tokens,
                seen_before=seen,
            )
        names = [n for n, _ in self.named]
        has_grad = p.has_grad
        return Event(
            step=p.step,
            kinds=tuple(p.verdict.kinds),
            loss=loss,
            grad_norm_pre=p.grad_norm_pre,
            baseline_grad_norm=p.verdict.baseline,
            clip_factor=clip_factor,
            max_norm=self.max_norm,
            grad_norm_post=post,
            skipped=skipped,
            token_losses=table,
            param_grad_norms=dict(
                sorted(((n, float(v)) for n, v, g in zip(names, p.pre_norms.tolist(), has_grad) if g), key=lambda kv: -kv[1])
            ),
            adam_surprise=p.surprise,
        )

    def run(self) -> Run:
        """The recorded steps as a :class:`~pytest_spikecheck.Run` (what assertions take)."""
        recorded = self.recorded_facts()
        record = {"spike_ratio": self.spike_ratio, "spike_window": self.window, "top_tokens": self.top_tokens}
        where_post = (
            "when the optimizer's step returned, on the gradients it consumed"
            if self._step_hook is not None
            else "at rec.step(), on the gradients as the optimizer left them"
        )
        meta = {
            "package_version": __version__,
            "torch_version": torch.__version__,
            "python": platform.python_version(),
            "name": self.name,
            "trainer": self.trainer,
            "recorded": recorded,
            "record": record,
            "backend": f"{self.trainer} (recorded)",
            "device": str(self.named[0][1].device),
            "threads": torch.get_num_threads(),
            "distributed": None,
            "breaks": [],
            "parameters": sum(p.numel() for _, p in self.named),
            "seconds": time.perf_counter() - self._started,
            "stopped_at": None,
            "stop_reason": None,
            "stopped_by": None,
            "declared_events": sorted(self.declared),
            "skipped_steps": sorted(self.skipped),
            "burst_samples": sorted(self.catalog.ids[i] if self.catalog is not None else str(i) for i in self.stream.burst_ids)
            if self.stream is not None
            else [],
            "grad_norms": f"measured by pytest_spikecheck in float64, of the unscaled gradients: pre-clip before the "
            f"trainer's clip, post-clip {where_post}",
            "reproduce": f"rerun the training that recorded this ({TRAINER_NAMES.get(self.trainer, self.trainer)})",
            **({"clip_before_unscale_at": list(self._clip_before_unscale_at)} if self._clip_before_unscale_at else {}),
            **self.meta,
        }
        return Run(
            scenario=None,
            metrics=self._metrics.arrays(),
            batches=self.batches,
            events=list(self.events),
            meta=meta,
            skipped=dict(self.skipped),
            facts=self.observed_facts(),
        )

    def observed_facts(self) -> RunFacts:
        """The run facts as the recorder observed them (see the class docstring)."""
        qk = self.qk_clip
        hook = getattr(self.optimizer, "after_step", None)
        if isinstance(hook, QKClipHook):
            qk = QKClipFacts(hook.tau, hook.alpha, hook.per_head)
        micro = self.stream.batch_size if self.stream is not None else None
        config = getattr(self.model, "config", None)  # a transformers model's
        known = {
            "arch": type(self.model).__name__,
            "parameters": sum(p.numel() for _, p in self.named),
            **{
                name: getattr(config, key, None)
                for name, key in (
                    ("n_layer", "num_hidden_layers"),
                    ("n_head", "num_attention_heads"),
                    ("n_kv_head", "num_key_value_heads"),
                    ("n_embd", "hidden_size"),
                    ("vocab_size", "vocab_size"),
                )
            },
        }
        facts = RunFacts(
            source={"loop": "recorder"}.get(self.trainer, self.trainer),
            model=ModelFacts(**{k: v for k, v in known.items() if isinstance(v, (int, str))}),
            optimizers=self._groups,
            clip=ClipSpec(kind="global", max_norm=self.max_norm) if math.isfinite(self.max_norm) else ClipSpec("none", None),
            qk_clip=qk,
            loss_scale="dynamic" if self.scaler is not None else None,
            accumulation=self.accumulation,
            batch_size=micro * self.accumulation if micro is not None else None,
            seed=self.seed,
            spike_ratio=self.spike_ratio,
            package_version=__version__,
            torch_version=torch.__version__,
            python=platform.python_version(),
        )
        try:
            return dataclasses.replace(facts, **self.run_facts)
        except TypeError:
            known_fields = ", ".join(f.name for f in dataclasses.fields(RunFacts))
            unknown = sorted(set(self.run_facts) - {f.name for f in dataclasses.fields(RunFacts)})
            raise ConfigError(
                f"Recorder run_facts: unknown field {unknown[0] if unknown else '?'!r}; known: {known_fields}"
            ) from None

    def recorded_facts(self) -> dict[str, Any]:
        """What the run was, as the trainer reports it (run.json ``recorded``): the trainer, the
        seed, the lr, the clip, the batch and accumulation, the precision."""
        micro = self.stream.batch_size if self.stream is not None else None
        precision = (f"{self._logits_dtype} logits" if self._logits_dtype else "not reported") + (
            ", loss scaled by a GradScaler" if self.scaler is not None else ""
        )
        return {
            "trainer": self.trainer,
            "seed": self.seed,
            "lr": self._first_lr,
            "max_grad_norm": self.max_norm if math.isfinite(self.max_norm) else None,
            "accumulation": self.accumulation,
            "micro_batch_size": micro,
            "batch_size": micro * self.accumulation if micro is not None else None,
            "precision": precision,
            **self.facts,
        }

    def save(self, directory: str | Path) -> Path:
        """Write the run folder (``spikecheck diagnose DIRECTORY`` reads it)."""
        return self.run().save(directory)


#: Untouched gradients measure the same before and after the clip up to the float32 rounding of
#: the per-tensor pre-clip norms; a ratio this close to 1 is no clip.
UNCLIPPED_RTOL = 1e-5


def _clip_factor(pre: float, post: float) -> float:
    """post / pre, the factor the clip applied, as measured (1.0: the gradients went through as they were)."""
    if not (pre > 0 and math.isfinite(pre) and math.isfinite(post)):
        return 1.0
    ratio = post / pre
    return 1.0 if ratio >= 1.0 - UNCLIPPED_RTOL else ratio


def record(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, **options: Any) -> Recorder:
    """A :class:`Recorder` for ``model`` trained with ``optimizer``: the one call a loop needs.

    ``options`` are the Recorder's keyword arguments (``max_norm``, ``catalog``, ``stream``,
    ``accumulation``, ``scaler``, ``seed``, ...). Returns the recorder; wrap your clip in
    ``with rec.clipping():``, call ``rec.step(loss=..., logits=..., targets=...)`` once per
    optimizer step (before ``zero_grad``), then ``rec.save(folder)``. A mismatch with the
    stream (another accumulation) raises ``ConfigError`` here, before any step::

        rec = record(model, optimizer, max_norm=1.0, catalog=catalog, stream=stream)
    """
    return Recorder(model, optimizer, **options)
