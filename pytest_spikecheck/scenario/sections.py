"""The sections of a scenario (model, data, sampler, optimizer, schedule, record, amp) as frozen
specs, and their checks: each field has its default's type, and every value is in range.

A field is added here (with an inline comment on its default and its check in
:func:`check_section_values`); the YAML codec (:mod:`.config`) and the derived names
(:mod:`.naming`) pick it up from the dataclass. No torch here.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from pytest_spikecheck.errors import ConfigError, shown
from pytest_spikecheck.models.config import GPTConfig

if TYPE_CHECKING:
    from pytest_spikecheck.scenario.spec import Scenario

#: Rare content a RareTokenBurst can inject (built by pytest_spikecheck.data.corpus). ``written``
#: is Seed A's own rare family (corpus sentences held out until the burst); ``caps`` and
#: ``greek`` are fresh sentences the model has never seen: ALL-CAPS English and English
#: transliterated into Greek script; ``blank`` is an empty document (a blank line in a data
#: shard), which encodes to a row of padding only: harmless unless the model masks padding
#: keys (then a numeric break).
BURST_CONTENTS = ("written", "caps", "greek", "blank")
#: The three sources of Seed B's mixture corpus (pytest_spikecheck.data.sources builds them).
BASE_SOURCES = ("docs", "prose", "qa")
#: Sources that can enter the mixture late, never seen before (MixtureShift(new_source=...)).
NEW_SOURCES = ("foreign",)


def check(condition: bool, message: str) -> None:
    """Raise ConfigError(``message``) unless ``condition`` holds."""
    if not condition:
        raise ConfigError(message)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


#: Where the import path of a model factory must look like ``pkg.module:function``.
IMPORT_PATH = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


@dataclass(frozen=True)
class BurstSpec:
    """Put ``count`` samples of rare ``content`` into the batch of step ``at_step``.

    ``content="written"`` holds Seed A's *written* sentences out of the rotation until the
    burst (first seen there) and lets them rejoin afterwards; ``caps``/``greek`` inject
    fresh sentences that appear at the burst only (a contaminated batch).
    """

    at_step: int
    count: int = 3
    content: str = "greek"

    def __post_init__(self) -> None:
        check(is_int(self.at_step) and self.at_step >= 1, f"burst at_step must be an integer >= 1, was {self.at_step!r}")
        check(is_int(self.count) and self.count >= 1, f"burst count must be an integer >= 1, was {self.count!r}")
        check(self.content in BURST_CONTENTS, f"burst content must be one of {', '.join(BURST_CONTENTS)}, was {self.content!r}")


#: ClipSpec.kind: what the limit applies to and how it is set. ``none``: no clip; ``global``: the
#: global L2 norm of the whole gradient at a fixed max_norm; ``per_tensor``: each tensor's own norm
#: at max_norm; ``shard_local``: on several ranks, each rank's shard at its own norm (the bug of
#: ShardLocalNorm); ``adaptive``: the global norm at a limit set each step from an EMA of the
#: pre-clip norms (ZClip style; max_norm applies until the EMA is warm).
CLIP_KINDS = ("none", "global", "per_tensor", "shard_local", "adaptive")
#: ClipSpec.when: on the step's whole, unscaled gradient (``after_unscale``, the right place);
#: on the loss-scaled gradients (``before_unscale``: ClipBeforeUnscale, a bug); on each
#: micro-batch's gradient before they are summed (``per_microbatch``: ClipEachMicrobatch, a bug); on
#: Muon's orthogonalised update in place of its matrices' gradients (``muon_update``: ClipMuonUpdate,
#: the bug of DeepSpeed issue 8439); no clip, but torch's ``clip_grad_norm_`` called at max_norm inf
#: only to log the norm (``inf_to_log``: ClipInfToLog; an infinite norm makes its coefficient
#: inf/inf = NaN and every gradient NaN).
CLIP_WHENS = ("after_unscale", "before_unscale", "per_microbatch", "muon_update", "inf_to_log")
#: The YAML spelling before ClipSpec (``optimizer.clip_mode``), still read: each old value as
#: (clip_kind, clip_when). Documented in docs/run-format.md.
CLIP_MODE_ALIAS = {
    "global": ("global", "after_unscale"),
    "per_tensor": ("per_tensor", "after_unscale"),
    "adaptive": ("adaptive", "after_unscale"),
    "shard_local": ("shard_local", "after_unscale"),
    "before_unscale": ("global", "before_unscale"),
    "each_microbatch": ("global", "per_microbatch"),
}


#: What a max norm of 0 means, by the caller's convention (:func:`check_max_norm`'s ``zero``).
MAX_NORM_ZERO = ("refused", "clips", "no_clip")


def check_max_norm(value: Any, label: str = "max_norm", *, zero: str = "refused") -> float | None:
    """The one rule for a clip limit, used wherever a limit is checked (the spec, ``ClipSpec``,
    ``ClipAt``, the CLI's ``--grad-clip``, the recorder and the callbacks, ``assert_clip_contains``,
    the probe, and ``clipping.clip_grad_norm_``/``clip_grads_`` through
    :func:`~pytest_spikecheck.clipping.validate_max_norm`): a number > 0, or inf or None for no
    clipping (returned as None); anything else is one ConfigError naming ``label``.

    ``zero`` is what 0 means, the only place the callers' conventions differ: ``"refused"``
    (a scenario's, a recorder's or an assertion's limit: 0 would zero every update, never what
    is meant); ``"clips"`` (returned as 0.0: ``torch.nn.utils.clip_grad_norm_(max_norm=0)`` is
    legal and zeroes the gradient, so our drop-in clip functions accept it as torch does, and
    the conformance kit tests that case); ``"no_clip"`` (returned as None: a trainer's spelling
    of no clip, ``TrainingArguments(max_grad_norm=0)``, Lightning's ``gradient_clip_val=0``)."""
    check(zero in MAX_NORM_ZERO, f"check_max_norm zero= must be one of {', '.join(MAX_NORM_ZERO)}, was {zero!r}")
    # numbers.Real: a numpy scalar is a number (torch's clip takes one); a bool or a string is not
    check(
        value is None or isinstance(value, numbers.Real) and not isinstance(value, bool),
        f"{label} must be a number, inf or None (no clipping), was {value!r}",
    )
    if value is None or math.isinf(value) and value > 0:
        return None
    check(not math.isnan(value), f"{label} must be a number, inf or None, was nan")
    if value == 0 and zero != "refused":
        return 0.0 if zero == "clips" else None
    if zero == "clips":  # torch's rule: any limit >= 0
        check(value >= 0, f"{label} must be >= 0 (inf or None for no clipping), was {value!r}")
        return float(value)
    check(
        value > 0,
        f"{label} must be > 0, was {value!r} (0 would zero every update; to clip as hard as "
        f"possible use a tiny max_norm such as 1e-3, for no clipping use None or inf)",
    )
    return float(value)


@dataclass(frozen=True)
class ClipSpec:
    """How a run clips its gradient, as one structured value (what the engine trains with and
    what run.json's facts record). ``max_norm`` None means no fixed limit: kind ``none``, or an
    adaptive clip that leaves the gradient alone until its EMA is warm. ``z`` and ``alpha`` are
    the adaptive clip's (limit = EMA mean + z x EMA std, decay alpha); None for other kinds."""

    kind: str = "global"  # one of CLIP_KINDS
    max_norm: float | None = 1.0
    when: str = "after_unscale"  # one of CLIP_WHENS
    z: float | None = None  # adaptive only
    alpha: float | None = None  # adaptive only

    def __post_init__(self) -> None:
        check(self.kind in CLIP_KINDS, f"clip kind must be one of {', '.join(CLIP_KINDS)}, was {self.kind!r}")
        check(self.when in CLIP_WHENS, f"clip when must be one of {', '.join(CLIP_WHENS)}, was {self.when!r}")
        object.__setattr__(self, "max_norm", check_max_norm(self.max_norm, "clip max_norm"))
        check(
            self.kind != "none" or self.max_norm is None,
            f"clip kind none with max_norm {self.max_norm!r}: a limit needs a kind (global, per_tensor, ...)",
        )
        check(
            self.kind in ("none", "adaptive") or self.max_norm is not None,
            f"clip kind {self.kind} needs a max_norm (for no clipping use kind none)",
        )
        if self.kind == "adaptive":
            check(
                is_number(self.z) and self.z > 0 and is_number(self.alpha) and 0 < self.alpha < 1,
                f"an adaptive clip needs z > 0 and alpha in (0, 1), was z={self.z!r}, alpha={self.alpha!r}",
            )

    @property
    def limit(self) -> float:
        """The fixed limit as a number (inf: no clip, or an adaptive clip before it is warm)."""
        return math.inf if self.max_norm is None else self.max_norm

    @property
    def scope(self) -> str:
        """What the norm is taken over when clipping: ``global`` (adaptive clips too), ``per_tensor``
        or ``shard_local``; the clipping layer's mode."""
        return "global" if self.kind in ("none", "adaptive") else self.kind

    def describe(self) -> str:
        if self.kind == "none":
            return "no clip"
        what = (
            f"adaptive (z {self.z:g}, alpha {self.alpha:g}" + (f", {self.max_norm:g} until warm)" if self.max_norm else ")")
            if self.kind == "adaptive"
            else f"{self.max_norm:g} ({self.kind})"
        )
        return f"clip {what}" + ("" if self.when == "after_unscale" else f" {self.when.replace('_', ' ')}")


#: schedule.name values: linear warmup, then cosine decay to lr x min_lr_ratio, or constant.
SCHEDULES = ("cosine", "constant")
#: sampler.accumulate values: how the micro-batch losses of a step combine.
ACCUMULATES = ("mean", "sum")

#: Corpora the engine can build: Seed A's sentences, Seed B's three-source mixture, your own
#: texts, or synthetic sequences whose second half repeats the first (learnt only by attention).
CORPORA = ("phase19", "mixture", "texts", "induction")
#: optimizer.name values: AdamW everywhere; Muon on the hidden matrices with AdamW on the rest;
#: SGD with momentum.
OPTIMIZERS = ("adamw", "muon", "sgd")
#: optimizer.adjust_lr_fn values (torch.optim.Muon's): how Muon's lr is scaled per matrix shape.
ADJUST_LR_FNS = ("original", "match_rms_adamw")


@dataclass(frozen=True)
class DataSpec:
    corpus: str = "phase19"  # phase19 (data.corpus) | mixture (data.sources) | texts (your own, below) | induction
    n_sentences: int = 240  # Seed A: 240 training sentences (mixture: split evenly over its sources; induction: sequences)
    eval_sentences: int = 96  # fixed in-distribution eval set
    vocab_size: int = 384  # byte-level BPE; 312-448 split " written" into Ġwri + tt + en
    corpus_seed: int = 0  # the corpus is fixed; the training seed changes init and batch order
    padding_side: str = "right"  # right | left (left puts padding first: meets mask_padding as all-masked rows)
    texts: tuple[str, ...] = ()  # corpus "texts": your documents; the last eval_sentences are the eval set


@dataclass(frozen=True)
class MixtureSpec:
    """Seed B's bandit: source weights redrawn from Dirichlet(``concentration``) at phase
    boundaries whose lengths are drawn from ``phase_lengths`` (empty: fixed uniform weights).
    ``new_source`` is held out until the first boundary at or after ``new_source_at``, where
    the bandit tries it alone for one phase; it then joins the draws."""

    phase_lengths: tuple[int, ...] = ()
    concentration: float = 0.3
    new_source: str | None = None
    new_source_at: int = 0


@dataclass(frozen=True)
class SamplerSpec:
    kind: str = "shuffle"  # shuffle (epochs in random order) | stratified (caps rare samples per batch) | mixture
    batch_size: int = 8
    rare_cap: int = 1  # stratified: at most this many rare samples per batch
    rare_doc_freq: int = 5  # a token is rare if at most this many training samples contain it
    bursts: tuple[BurstSpec, ...] = ()
    mixture: MixtureSpec = MixtureSpec()
    # Gradient accumulation: each step's batch (batch_size samples) is forward/backward'ed in this many
    # micro-batches of batch_size / accumulation; clip, measure and the optimizer step once per step.
    accumulation: int = 1
    accumulate: str = "mean"  # mean: the loss is the token-weighted mean over the step's whole batch (what
    # accumulation 1 computes) | sum: each micro-batch's mean loss summed, loss and gradient x accumulation
    # (AccumulateSum, the bug)


@dataclass(frozen=True)
class OptimizerSpec:
    name: str = "adamw"  # adamw | muon (torch.optim.Muon on the hidden matrices, AdamW on the rest) | sgd (with momentum)
    lr: float = 1e-2  # peak lr (muon: Muon's; its AdamW part has adamw_lr)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.1  # applied to matrices (embeddings included), not to biases and norms
    grad_clip: float | None = 1.0  # global-L2 max_norm; None (YAML null) or inf = no clipping
    clip_kind: str = "global"  # global | per_tensor | adaptive | shard_local (CLIP_KINDS; "none" is grad_clip null)
    clip_when: str = "after_unscale"  # after_unscale | before_unscale | per_microbatch | muon_update | inf_to_log (CLIP_WHENS; all but the first are bugs)
    adaptive_z: float = 2.5  # adaptive: clip at EMA mean + z * EMA std of the pre-clip norm ...
    adaptive_alpha: float = 0.97  # ... with this EMA decay (ZClip's defaults); grad_clip until warm
    skip_spike_ratio: float | None = None  # skip the optimizer step when pre-clip norm / median >= this
    # Muon and SGD (torch.optim.Muon's defaults):
    momentum: float = 0.95  # muon, sgd: momentum coefficient
    nesterov: bool = True  # muon, sgd: Nesterov momentum
    adjust_lr_fn: str = "original"  # muon: lr * sqrt(max(1, rows/cols)) (Keller Jordan) | match_rms_adamw: lr * 0.2 * sqrt(max(rows, cols)) (Moonlight)
    adamw_lr: float = (
        1e-2  # muon: the peak lr of its AdamW part (embeddings, output head, norms, biases); the schedule scales it as lr
    )
    muon_params: str = (
        ""  # muon: a regular expression (re.fullmatch on parameter names) choosing Muon's matrices; "" = by role (README)
    )
    # QK-Clip (Kimi K2), set by the QKClip break: after each update, each head whose largest
    # attention logit in that step's forward exceeded qk_clip has W_q, W_k scaled back to it.
    qk_clip: float | None = None  # tau; None = off
    qk_clip_alpha: float = 0.5  # W_q gets gamma^alpha, W_k gamma^(1 - alpha), gamma = tau / max logit
    qk_clip_per_head: bool = True  # False: one gamma per layer (its largest head's)
    # AdamW's step counter (Adam's bias correction): advance (torch's) | frozen: it stays at its
    # initial 0, every step's bias correction that of step 1 (SkipStepCounter, the bug of OLMo-core's SkipStepAdamW, PR 317)
    step_counter: str = "advance"

    def __post_init__(self) -> None:
        # One spelling of "no clipping" so equal runs hash equal: inf becomes None.
        object.__setattr__(self, "grad_clip", check_max_norm(self.grad_clip, "optimizer.grad_clip"))

    @property
    def clip(self) -> ClipSpec:
        """The clip these fields declare, as one value (what every reader of the scenario uses)."""
        kind = self.clip_kind
        check(
            kind in CLIP_KINDS and kind != "none",
            f"optimizer.clip_kind must be one of {', '.join(k for k in CLIP_KINDS if k != 'none')}, was {kind!r} "
            f"(for no clipping set grad_clip null)",
        )
        if kind != "adaptive" and self.grad_clip is None:
            kind = "none"
        adaptive = kind == "adaptive"
        return ClipSpec(
            kind=kind,
            max_norm=self.grad_clip,
            when=self.clip_when,
            z=self.adaptive_z if adaptive else None,
            alpha=self.adaptive_alpha if adaptive else None,
        )


@dataclass(frozen=True)
class ScheduleSpec:
    name: str = "cosine"  # cosine | constant
    warmup_steps: int = 20  # linear warmup from lr/warmup_steps to lr
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio at the last step


@dataclass(frozen=True)
class RecordSpec:
    eval_every: int = 20  # evaluate the fixed eval set every N steps ...
    dense_before: int = 10  # ... and at every step from burst-10 ...
    dense_after: int = 50  # ... to burst+50 (and for 50 steps after any detected spike)
    spike_ratio: float = 5.0  # online detector: pre-clip norm / median of the last 50 steps
    spike_window: int = 50
    top_tokens: int = 20  # per-token losses kept at event steps


#: amp.dtype values: float32 is no autocast.
AMP_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class AmpSpec:
    """Mixed precision: the forward and the loss under ``torch.autocast`` at ``dtype``, the
    weights, gradients and optimizer state in float32 (master weights). ``loss_scale``:
    ``dynamic`` (``torch.amp.GradScaler`` at torch's defaults: init 65536, growth 2, backoff 0.5,
    interval 2000), a number (a static scale), or None (no loss scaling). A step whose
    unscaled gradients hold an inf or NaN is skipped (``skipped: overflow``); the recorded norms
    are always those of the unscaled gradients."""

    dtype: str = "float32"  # float32 (no autocast) | bfloat16 | float16
    loss_scale: str | float | None = None  # None | "dynamic" | a number > 0 (static)


SECTIONS: dict[str, type] = {
    "model": GPTConfig,
    "data": DataSpec,
    "sampler": SamplerSpec,
    "optimizer": OptimizerSpec,
    "schedule": ScheduleSpec,
    "record": RecordSpec,
    "amp": AmpSpec,
}

SCALARS = ("name", "steps", "stop_after", "seed")

#: Section fields that may be None (YAML null) besides their type.
NULLABLE = {
    ("optimizer", "grad_clip"),
    ("optimizer", "skip_spike_ratio"),
    ("optimizer", "qk_clip"),
    ("sampler.mixture", "new_source"),
    ("amp", "loss_scale"),
}


def check_types(section: str, spec: Any) -> None:
    """Every field of a section has its default's type: one line naming the field otherwise
    (a string where a number belongs would else fail later as a bare TypeError)."""
    defaults = type(spec)()
    for f in fields(spec):
        value, default = getattr(spec, f.name), getattr(defaults, f.name)
        label = f"{section}.{f.name}"
        if value is None and (section, f.name) in NULLABLE:
            continue
        if (section, f.name) == ("amp", "loss_scale"):  # a word or a number
            check(
                value == "dynamic" or is_number(value),
                f"{label} must be 'dynamic', a number or None (no loss scaling), was {value!r}",
            )
            continue
        if dataclasses.is_dataclass(default):
            check(isinstance(value, type(default)), f"{label} must be a {type(default).__name__}, was {value!r}")
            check_types(label, value)
        elif isinstance(default, bool):
            check(isinstance(value, bool), f"{label} must be True or False, was {value!r}")
        elif isinstance(default, int):
            check(is_int(value), f"{label} must be an integer, was {value!r}")
        elif isinstance(default, float) or (section, f.name) in NULLABLE and default is None and f.name != "new_source":
            check(is_number(value), f"{label} must be a number, was {value!r}")
        elif isinstance(default, str) or f.name == "new_source":
            check(isinstance(value, str), f"{label} must be a string, was {value!r}")
        elif isinstance(default, tuple):
            check(isinstance(value, tuple), f"{label} must be a tuple, was {value!r}")


def check_section_types(scenario: Scenario) -> None:
    """Each section is its spec type and each field has its default's type (one line otherwise)."""
    for section, spec_type in SECTIONS.items():
        check(
            isinstance(getattr(scenario, section), spec_type),
            f"{section} must be a {spec_type.__name__}, was {getattr(scenario, section)!r}",
        )
        check_types(section, getattr(scenario, section))


def check_section_values(scenario: Scenario) -> None:
    """Every section value in range, and the sections agree with each other and with the
    scenario's steps (a burst after the last step, a mixture sampler without the mixture corpus)."""
    _check_sampler(scenario)
    check_amp(scenario)
    _check_optimizer(scenario)
    _check_schedule(scenario)
    _check_data(scenario)


def _check_sampler(scenario: Scenario) -> None:
    """The sampler: its kind against the corpus, the mixture, the bursts, the accumulation."""
    s, o = scenario.sampler, scenario.optimizer
    check(s.kind in ("shuffle", "stratified", "mixture"), f"sampler.kind must be shuffle, stratified or mixture, was {s.kind!r}")
    check(
        (s.kind == "mixture") == (scenario.data.corpus == "mixture"),
        f"sampler.kind mixture goes with data.corpus mixture (was {s.kind!r} with {scenario.data.corpus!r})",
    )
    m = s.mixture
    check(
        all(isinstance(n, int) and n >= 1 for n in m.phase_lengths),
        f"sampler.mixture.phase_lengths must be positive integers, was {m.phase_lengths!r}",
    )
    check(m.concentration > 0, f"sampler.mixture.concentration must be > 0, was {m.concentration}")
    check(
        scenario.data.padding_side in ("right", "left"),
        f"data.padding_side must be right or left, was {scenario.data.padding_side!r}",
    )
    check(s.batch_size >= 1, f"sampler.batch_size must be >= 1, was {s.batch_size}")
    check(s.rare_cap >= 0, f"sampler.rare_cap must be >= 0, was {s.rare_cap}")
    for b in s.bursts:
        check(
            b.content != "written" or scenario.data.corpus == "phase19",
            f"a 'written' burst needs the phase19 corpus (its rare sentences), not {scenario.data.corpus!r}",
        )
        check(b.count >= 1, f"burst count must be >= 1, was {b.count}")
        check(b.count <= s.batch_size, f"burst count {b.count} exceeds the batch size {s.batch_size}")
        check(1 <= b.at_step, f"burst at_step must be >= 1, was {b.at_step}")
        check(
            b.at_step <= scenario.steps,
            f"a burst at step {b.at_step} is after the last step ({scenario.steps} steps): "
            f"move it to a step <= {scenario.steps} or train more steps",
        )
    k = s.accumulation
    check(k >= 1, f"sampler.accumulation must be >= 1, was {k}")
    check(
        s.batch_size % k == 0,
        f"sampler.batch_size {s.batch_size} is not a multiple of sampler.accumulation {k}: "
        f"each micro-batch holds batch_size / accumulation samples",
    )
    check(s.accumulate in ACCUMULATES, f"sampler.accumulate must be {' or '.join(ACCUMULATES)}, was {s.accumulate!r}")
    check(
        s.accumulate == "mean" or k >= 2,
        "sampler.accumulate sum (AccumulateSum) needs sampler.accumulation >= 2: over one micro-batch the sum is the mean",
    )
    check(
        o.clip_when != "per_microbatch" or k >= 2,
        "optimizer.clip_when per_microbatch (ClipEachMicrobatch) needs sampler.accumulation >= 2: "
        "with one micro-batch it is the ordinary clip",
    )


def _check_optimizer(scenario: Scenario) -> None:
    """The optimizer section: ranges, and the defences and defence bugs it can be combined with."""
    o = scenario.optimizer
    check(o.name in OPTIMIZERS, f"optimizer.name must be one of {', '.join(OPTIMIZERS)}, was {o.name!r}")
    check(0 < o.lr < math.inf, f"optimizer.lr must be a finite number > 0, was {o.lr}")
    check(0 < o.adamw_lr < math.inf, f"optimizer.adamw_lr must be a finite number > 0, was {o.adamw_lr}")
    check(0 <= o.momentum < 1, f"optimizer.momentum must be in [0, 1), was {o.momentum}")
    check(
        o.adjust_lr_fn in ADJUST_LR_FNS,
        f"optimizer.adjust_lr_fn must be one of {', '.join(ADJUST_LR_FNS)}, was {o.adjust_lr_fn!r}",
    )
    try:
        re.compile(o.muon_params)
    except re.error as exc:
        raise ConfigError(f"optimizer.muon_params {o.muon_params!r} is not a regular expression ({exc})") from None
    check(
        o.qk_clip is None or 0 < o.qk_clip < math.inf,
        f"optimizer.qk_clip (QK-Clip's tau) must be a finite number > 0 or null, was {o.qk_clip!r}",
    )
    check(0 <= o.qk_clip_alpha <= 1, f"optimizer.qk_clip_alpha must be in [0, 1], was {o.qk_clip_alpha!r}")
    check(
        o.qk_clip is None or not scenario.model.qk_layernorm,
        "QKClip with QKLayerNorm: the norm undoes any scale of W_q and W_k, so every step would clip again and "
        "shrink them geometrically; use one of the two",
    )
    check(
        all(0 <= b < 1 for b in o.betas) and len(o.betas) == 2, f"optimizer.betas must be two numbers in [0, 1), was {o.betas!r}"
    )
    check(o.eps >= 0, f"optimizer.eps must be >= 0, was {o.eps}")
    check(o.weight_decay >= 0, f"optimizer.weight_decay must be >= 0, was {o.weight_decay}")
    check(
        o.adaptive_z > 0 and 0 < o.adaptive_alpha < 1,
        f"optimizer.adaptive_z must be > 0 and adaptive_alpha in (0, 1), was {o.adaptive_z}, {o.adaptive_alpha}",
    )
    check(o.clip_when in CLIP_WHENS, f"optimizer.clip_when must be one of {', '.join(CLIP_WHENS)}, was {o.clip_when!r}")
    check(
        o.clip_when != "muon_update" or (o.name == "muon" and o.grad_clip is not None and o.clip_kind == "global"),
        "optimizer.clip_when muon_update (ClipMuonUpdate) needs optimizer.name muon and a global clip "
        f"(grad_clip a number, clip_kind global), was name {o.name!r}, grad_clip {o.grad_clip!r}, clip_kind {o.clip_kind!r}",
    )
    check(
        o.clip_when != "inf_to_log" or o.grad_clip is None,
        "optimizer.clip_when inf_to_log (ClipInfToLog) is the logging call of a run that does not clip: "
        f"grad_clip must be null, was {o.grad_clip!r}",
    )
    check(o.step_counter in ("advance", "frozen"), f"optimizer.step_counter must be advance or frozen, was {o.step_counter!r}")
    check(
        o.step_counter == "advance" or o.name == "adamw",
        f"optimizer.step_counter frozen (SkipStepCounter) is AdamW's counter; optimizer.name was {o.name!r}",
    )
    o.clip  # noqa: B018 (the kind's check, one line naming the known kinds)
    check(
        o.skip_spike_ratio is None or o.skip_spike_ratio > 1,
        f"optimizer.skip_spike_ratio must be > 1 or null, was {o.skip_spike_ratio!r}",
    )


def _check_schedule(scenario: Scenario) -> None:
    sch = scenario.schedule
    check(sch.name in SCHEDULES, f"schedule.name must be {' or '.join(SCHEDULES)}, was {sch.name!r}")
    check(sch.warmup_steps >= 0, f"schedule.warmup_steps must be >= 0, was {sch.warmup_steps}")
    check(0 <= sch.min_lr_ratio <= 1, f"schedule.min_lr_ratio must be in [0, 1], was {sch.min_lr_ratio}")


def _check_data(scenario: Scenario) -> None:
    """The data section: the corpus, and what each corpus needs of the model and the batch."""
    s = scenario.sampler
    check(scenario.data.corpus in CORPORA, f"data.corpus must be one of {', '.join(CORPORA)}, was {scenario.data.corpus!r}")
    if scenario.data.corpus == "induction":
        check(
            scenario.data.n_sentences >= s.batch_size,
            f"data.n_sentences ({scenario.data.n_sentences} induction sequences) must be >= the batch size {s.batch_size}",
        )
        check(
            scenario.model.block_size >= 5,
            f"the induction corpus needs model.block_size >= 5 (two halves of >= 2 symbols), was {scenario.model.block_size}",
        )
    if scenario.data.corpus == "texts":
        n_train = len(scenario.data.texts) - scenario.data.eval_sentences
        check(
            n_train >= s.batch_size and scenario.data.eval_sentences >= 1,
            f"data.texts needs more than eval_sentences + batch_size texts ({scenario.data.eval_sentences} + "
            f"{s.batch_size}), had {len(scenario.data.texts)}",
        )
        check(all(isinstance(t, str) for t in scenario.data.texts), "data.texts must be strings")


def check_amp(scenario: Scenario) -> None:
    """The amp section in range and consistent with the model and the clip."""
    a, o = scenario.amp, scenario.optimizer
    check(a.dtype in AMP_DTYPES, f"amp.dtype must be one of {', '.join(AMP_DTYPES)}, was {a.dtype!r}")
    if is_number(a.loss_scale):
        check(
            math.isfinite(a.loss_scale) and a.loss_scale > 0,
            f"amp.loss_scale must be 'dynamic' or a finite number > 0, was {a.loss_scale!r}",
        )
    check(
        a.loss_scale is None or a.dtype != "float32",
        "amp.loss_scale needs amp.dtype float16 (or bfloat16): without autocast nothing underflows to scale against",
    )
    check(
        a.dtype == "float32" or scenario.model.dtype == "float32",
        f"amp keeps float32 master weights: model.dtype must be float32 with amp.dtype {a.dtype}, was "
        f"{scenario.model.dtype} (HalfPrecision is pure fp16 without autocast; declare one or the other)",
    )
    check(
        o.clip_when != "before_unscale" or a.loss_scale is not None,
        "optimizer.clip_when before_unscale (ClipBeforeUnscale) needs a loss scale (amp.loss_scale): "
        "without one there is nothing to unscale",
    )
    check(
        o.clip_when != "per_microbatch" or a.loss_scale is None,
        "optimizer.clip_when per_microbatch (ClipEachMicrobatch) is declared without loss scaling",
    )


# -- ranges and limits: every numeric field, checked at load (docs/limits.md) -----------------

#: The most steps one scenario trains: this harness trains tiny models in seconds, and the batch
#: plan and the per-step records grow with the steps.
MAX_STEPS = 1_000_000
#: The largest vocabulary, width, depth, head count and context the engine builds (a model of
#: the widest, deepest shape is already far beyond what this CPU harness trains).
MAX_VOCAB = 1_000_000
MAX_WIDTH = 16_384
MAX_LAYERS = 256
MAX_HEADS = 1_024
MAX_CONTEXT = 65_536
#: The largest batch, and the most sentences a corpus section may ask for.
MAX_BATCH = 65_536
MAX_SENTENCES = 1_000_000
#: Seeds go to numpy and torch, whose seeds are 64-bit.
MAX_SEED = 2**63 - 1


@dataclass(frozen=True)
class Range:
    """The values a numeric field allows: ``low`` to ``high``, each end closed unless marked
    open; never NaN or infinite."""

    low: float
    high: float
    low_open: bool = False
    high_open: bool = False

    def holds(self, value: float) -> bool:
        return (
            math.isfinite(value)
            and (value > self.low if self.low_open else value >= self.low)
            and (value < self.high if self.high_open else value <= self.high)
        )

    def text(self) -> str:
        def number(x: float) -> str:
            return str(x) if isinstance(x, int) else f"{x:g}"

        return f"{'(' if self.low_open else '['}{number(self.low)}, {number(self.high)}{')' if self.high_open else ']'}"


#: Every numeric field (a tuple's elements each) and its range; the clip's fields are checked by
#: their own spec (grad_clip, the adaptive clip, skip_spike_ratio: CLIP_FIELDS). A field added to
#: a section without a range here fails tests/test_limits.py.
RANGES: dict[str, Range] = {
    "steps": Range(1, MAX_STEPS),
    "seed": Range(0, MAX_SEED),
    "model.n_layer": Range(1, MAX_LAYERS),
    "model.n_head": Range(1, MAX_HEADS),
    "model.n_embd": Range(1, MAX_WIDTH),
    "model.block_size": Range(1, MAX_CONTEXT),
    "model.vocab_size": Range(0, MAX_VOCAB),
    "model.n_kv_head": Range(0, MAX_HEADS),
    "model.layernorm_eps": Range(0, 1),
    "model.init_std": Range(0, 10, low_open=True),
    "model.pad_token_id": Range(-1, MAX_VOCAB),
    "model.z_loss": Range(0, 1e6),
    "model.logit_softcap": Range(0, 1e6),
    "data.n_sentences": Range(1, MAX_SENTENCES),
    "data.eval_sentences": Range(1, MAX_SENTENCES),
    "data.vocab_size": Range(258, MAX_VOCAB),
    "data.corpus_seed": Range(0, MAX_SEED),
    "sampler.batch_size": Range(1, MAX_BATCH),
    "sampler.rare_cap": Range(0, MAX_BATCH),
    "sampler.rare_doc_freq": Range(0, MAX_SENTENCES),
    "sampler.accumulation": Range(1, MAX_BATCH),
    "sampler.mixture.phase_lengths": Range(1, MAX_STEPS),
    "sampler.mixture.concentration": Range(0, 1e6, low_open=True),
    "sampler.mixture.new_source_at": Range(0, MAX_STEPS),
    "optimizer.lr": Range(0, 1e6, low_open=True),
    "optimizer.betas": Range(0, 1, high_open=True),
    "optimizer.eps": Range(0, 1),
    "optimizer.weight_decay": Range(0, 1e6),
    "optimizer.momentum": Range(0, 1, high_open=True),
    "optimizer.adamw_lr": Range(0, 1e6, low_open=True),
    "optimizer.qk_clip": Range(0, 1e30, low_open=True),
    "optimizer.qk_clip_alpha": Range(0, 1),
    "schedule.warmup_steps": Range(0, MAX_STEPS),
    "schedule.min_lr_ratio": Range(0, 1),
    "record.eval_every": Range(1, MAX_STEPS),
    "record.dense_before": Range(0, MAX_STEPS),
    "record.dense_after": Range(0, MAX_STEPS),
    "record.spike_ratio": Range(1, 1e30, low_open=True),
    "record.spike_window": Range(1, MAX_STEPS),
    "record.top_tokens": Range(0, MAX_VOCAB),
    "amp.loss_scale": Range(0, 1e30, low_open=True),
}
#: The clip's numeric fields, whose checks are the clip spec's own (OptimizerSpec, check_section_values).
CLIP_FIELDS = ("optimizer.grad_clip", "optimizer.adaptive_z", "optimizer.adaptive_alpha", "optimizer.skip_spike_ratio")


def field_value(scenario: Scenario, path: str) -> Any:
    """The value of a dotted field path (``sampler.mixture.concentration``) of ``scenario``."""
    value: Any = scenario
    for part in path.split("."):
        value = getattr(value, part)
    return value


def check_ranges(scenario: Scenario) -> None:
    """Every numeric field in its :data:`RANGES` (one line naming the field and the range), before
    anything is built or allocated: a vocabulary of 1e11 aborted the process, 10^12 steps built a
    batch plan towards out-of-memory, eval_every 0 divided by zero, spike_window 0 turned the
    online detector off without a word."""
    for path, allowed in RANGES.items():
        value = field_value(scenario, path)
        for v in value if isinstance(value, tuple) else (value,):
            if v is None or isinstance(v, str):  # null where allowed; a word (loss_scale dynamic) is checked by its spec
                continue
            check(
                is_number(v) and allowed.holds(v),
                f"{path} must be {'each ' if isinstance(value, tuple) else ''}in {allowed.text()}, was {shown(v)}"
                + (" (see docs/limits.md)" if is_number(v) and math.isfinite(v) else ""),
            )
    check(
        scenario.model.n_kv_head <= scenario.model.n_head,
        f"model.n_kv_head ({scenario.model.n_kv_head}) must be <= model.n_head ({scenario.model.n_head})",
    )
