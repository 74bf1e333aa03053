"""Breaks: the ways a scenario is deliberately broken, as frozen dataclasses.

A break never touches the training loop. ``apply(scenario)`` returns a new scenario with a
config switch flipped (``NoClip`` sets ``optimizer.grad_clip`` to None) or the sampler
changed (``RareTokenBurst`` adds a burst). Seed A's control is ``preset + burst``; its
break is ``preset + burst + NoClip()`` — the same batches, one safety net removed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.scenario.break_base import Break
from pytest_spikecheck.scenario.sections import (
    BASE_SOURCES,
    BURST_CONTENTS,
    CLIP_KINDS,
    NEW_SOURCES,
    BurstSpec,
    MixtureSpec,
    check_max_norm,
)
from pytest_spikecheck.scenario.spec import Scenario


@dataclass(frozen=True)
class NoClip(Break):
    """Seed A's break: train without gradient clipping (``grad_clip: null``)."""

    config_name: ClassVar[str] = "no_clip"

    def apply(self, scenario: Scenario) -> Scenario:
        return scenario.replace(optimizer__grad_clip=None)


@dataclass(frozen=True)
class ClipAt(Break):
    """Clip at a different ``max_norm`` (e.g. Seed A's lesson: 0.5 sits at the grad-norm baseline),
    of kind ``mode`` (``global``, ``per_tensor``, ``shard_local``: a ClipSpec kind with a fixed limit)."""

    config_name: ClassVar[str] = "clip_at"
    max_norm: float = 0.5
    mode: str = "global"

    def validate(self) -> None:
        if check_max_norm(self.max_norm, "ClipAt(max_norm=...)") is None:
            raise ConfigError(f"ClipAt(max_norm=...) must be finite, was {self.max_norm!r} (for no clipping use NoClip())")
        fixed = [k for k in CLIP_KINDS if k not in ("none", "adaptive")]
        if self.mode not in fixed:
            raise ConfigError(
                f"ClipAt(mode=...) must be one of {', '.join(fixed)}, was {self.mode!r}"
                + (" (use AdaptiveClip)" if self.mode == "adaptive" else "")
            )

    def label(self) -> str:
        return f"clip({self.max_norm:g}" + ("" if self.mode == "global" else f",{self.mode}") + ")"

    def apply(self, scenario: Scenario) -> Scenario:
        return scenario.replace(optimizer__grad_clip=float(self.max_norm), optimizer__clip_kind=self.mode)


@dataclass(frozen=True)
class RareTokenBurst(Break):
    """Concentrate ``count`` rare samples in the batch of step ``at_step``.

    ``content`` picks them: ``"greek"`` (default, the calibrated Phase-19 content: English
    sentences in Greek script, whose bytes the model has never seen), ``"caps"`` (ALL-CAPS
    English, never seen) or ``"written"`` (Seed A's own rare family: the corpus sentences
    with *written*, held out until the burst). See docs/fidelity.md for what each does.
    """

    config_name: ClassVar[str] = "rare_token_burst"
    count: int = 3
    at_step: int = 312
    content: str = "greek"

    def validate(self) -> None:
        if self.content not in BURST_CONTENTS:
            raise ConfigError(f"RareTokenBurst content must be one of {', '.join(BURST_CONTENTS)}, was {self.content!r}")
        if self.count < 1 or self.at_step < 1:
            raise ConfigError(f"RareTokenBurst needs count >= 1 and at_step >= 1, was count={self.count}, at_step={self.at_step}")

    def label(self) -> str:
        return f"burst({self.count}×{self.content}@{self.at_step})"

    def apply(self, scenario: Scenario) -> Scenario:
        burst = BurstSpec(at_step=self.at_step, count=self.count, content=self.content)
        return scenario.replace(sampler__bursts=scenario.sampler.bursts + (burst,))


@dataclass(frozen=True)
class StratifiedBatches(Break):
    """Not a break but a defence, declared the same way: cap rare samples per batch (Seed A's deeper fix).

    ``rare_cap``: the most samples carrying a rare token one batch may hold (0: none)."""

    config_name: ClassVar[str] = "stratified_batches"
    rare_cap: int = 1

    def validate(self) -> None:
        if self.rare_cap < 0:
            raise ConfigError(f"StratifiedBatches(rare_cap=...) must be >= 0, was {self.rare_cap}")

    def apply(self, scenario: Scenario) -> Scenario:
        return scenario.replace(sampler__kind="stratified", sampler__rare_cap=self.rare_cap)


@dataclass(frozen=True)
class MixtureShift(Break):
    """Seed B's bandit: the mixture of data sources (docs, prose, Q&A) is re-weighted at phase
    boundaries, each phase lasting a length drawn from ``phase_lengths``, the weights drawn
    from Dirichlet(``concentration``). With ``new_source`` (e.g. ``"foreign"``: prose in a
    script the model never saw) that source is held out until the first boundary at or after
    ``new_source_at`` and then tried alone for one phase. Switches the scenario to the
    three-source ``mixture`` corpus."""

    config_name: ClassVar[str] = "mixture_shift"
    phase_lengths: tuple[int, ...] = (7, 14, 21, 28, 42)
    concentration: float = 0.3
    new_source: str | None = None
    new_source_at: int = 312

    def validate(self) -> None:
        if not self.concentration > 0:
            raise ConfigError(f"MixtureShift(concentration=...) must be > 0, was {self.concentration!r}")
        if self.new_source_at < 1:
            raise ConfigError(f"MixtureShift(new_source_at=...) must be >= 1, was {self.new_source_at!r}")
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in self.phase_lengths):
            raise ConfigError(f"MixtureShift phase_lengths must be positive integers, was {self.phase_lengths!r}")
        if self.new_source is not None and self.new_source not in BASE_SOURCES + NEW_SOURCES:
            raise ConfigError(
                f"MixtureShift new_source must be one of {', '.join(BASE_SOURCES + NEW_SOURCES)}, was {self.new_source!r}"
            )
        if not self.phase_lengths or any(n < 1 for n in self.phase_lengths):
            raise ConfigError(f"MixtureShift phase_lengths must be positive integers, was {self.phase_lengths!r}")

    def apply(self, scenario: Scenario) -> Scenario:
        mixture = MixtureSpec(
            phase_lengths=tuple(self.phase_lengths),
            concentration=self.concentration,
            new_source=self.new_source,
            new_source_at=self.new_source_at,
        )
        return scenario.replace(data__corpus="mixture", sampler__kind="mixture", sampler__mixture=mixture)


@dataclass(frozen=True)
class BlankDocument(Break):
    """A data glitch: ``count`` empty documents (a blank line in a shard) in the batch of
    ``at_step``. Each encodes to a row of padding only: harmless, unless the model masks
    padding keys (``MaskPaddingKeys``), where such a row has no key left to attend to."""

    config_name: ClassVar[str] = "blank_document"
    at_step: int = 312
    count: int = 1

    def validate(self) -> None:
        if self.count < 1 or self.at_step < 1:
            raise ConfigError(f"BlankDocument needs count >= 1 and at_step >= 1, was count={self.count}, at_step={self.at_step}")

    def label(self) -> str:
        return f"blank({self.count}@{self.at_step})"

    def apply(self, scenario: Scenario) -> Scenario:
        burst = BurstSpec(at_step=self.at_step, count=self.count, content="blank")
        return scenario.replace(sampler__bursts=scenario.sampler.bursts + (burst,))


@dataclass(frozen=True)
class MaskPaddingKeys(Break):
    """Attention ignores padding keys (as with an attention mask built from the padding). A
    query whose every allowed key is padding gets a softmax over all -inf: NaN."""

    config_name: ClassVar[str] = "mask_padding_keys"

    def apply(self, scenario: Scenario) -> Scenario:
        return scenario.replace(model__mask_padding=True)


@dataclass(frozen=True)
class LeftPadding(Break):
    """Pad sequences on the left (padding first). With ``MaskPaddingKeys`` every padded row
    starts with queries that have no key: NaN at the first step."""

    config_name: ClassVar[str] = "left_padding"

    def apply(self, scenario: Scenario) -> Scenario:
        return scenario.replace(data__padding_side="left")


@dataclass(frozen=True)
class LayerNormEps0(Break):
    """LayerNorm with eps = 0 meeting a constant input. The padding token's embedding is a
    zero row (``padding_idx``) and the model has no learned positions, so every padding
    position feeds the first LayerNorm an exactly constant vector: variance 0, 0/0 = NaN."""

    config_name: ClassVar[str] = "layernorm_eps0"

    def apply(self, scenario: Scenario) -> Scenario:
        return scenario.replace(model__layernorm_eps=0.0, model__pad_embedding="zero", model__pos_embedding="none")


@dataclass(frozen=True)
class HalfPrecision(Break):
    """Pure fp16 training: parameters, activations and AdamW's moments in float16, with no
    fp32 master weights and no loss scaling (the naive way)."""

    config_name: ClassVar[str] = "half_precision"

    def apply(self, scenario: Scenario) -> Scenario:
        return scenario.replace(model__dtype="float16")


@dataclass(frozen=True)
class NoWarmup(Break):
    """Start at the full learning rate (Seed B: warmup is one of v2's two guards)."""

    config_name: ClassVar[str] = "no_warmup"

    def apply(self, scenario: Scenario) -> Scenario:
        return scenario.replace(schedule__warmup_steps=0)


@dataclass(frozen=True)
class NoWeightDecay(Break):
    """AdamW without weight decay (ANDREA v1's recipe)."""

    config_name: ClassVar[str] = "no_weight_decay"

    def apply(self, scenario: Scenario) -> Scenario:
        return scenario.replace(optimizer__weight_decay=0.0)


@dataclass(frozen=True)
class SkipSpikes(Break):
    """A defence: skip the optimizer step when the pre-clip norm is >= ``ratio`` x the median
    of the previous 50 steps (nothing reaches the weights or Adam's moments)."""

    config_name: ClassVar[str] = "skip_spikes"
    ratio: float = 5.0

    def validate(self) -> None:
        if not self.ratio > 1:
            raise ConfigError(f"SkipSpikes(ratio=...) must be > 1, was {self.ratio!r}")

    def apply(self, scenario: Scenario) -> Scenario:
        return scenario.replace(optimizer__skip_spike_ratio=float(self.ratio))


@dataclass(frozen=True)
class AdaptiveClip(Break):
    """A defence in the style of ZClip: clip at EMA mean + ``z`` x EMA std of the pre-clip
    norm (decay ``alpha``); the scenario's fixed ``grad_clip`` (inf if none) applies until the
    EMA has 25 steps."""

    config_name: ClassVar[str] = "adaptive_clip"
    z: float = 2.5
    alpha: float = 0.97

    def validate(self) -> None:
        if not (self.z > 0 and 0 < self.alpha < 1):
            raise ConfigError(f"AdaptiveClip needs z > 0 and alpha in (0, 1), was z={self.z!r}, alpha={self.alpha!r}")

    def apply(self, scenario: Scenario) -> Scenario:
        return scenario.replace(
            optimizer__clip_kind="adaptive", optimizer__adaptive_z=float(self.z), optimizer__adaptive_alpha=float(self.alpha)
        )


@dataclass(frozen=True)
class ShardLocalNorm(Break):
    """The per-rank-norm bug of sharded training (FSDP, ZeRO): each rank clips its gradient
    shard to the norm of that shard alone, skipping the all-reduce of the squared norms, so
    global clipping silently becomes per-shard clipping (Megatron-LM and llm.c all-reduce the
    squared norm for this reason). Needs ``train(..., nproc=2)`` or more; the run records the
    true global norms, so ``assert_clip_contains`` sees what the buggy clip let through."""

    config_name: ClassVar[str] = "shard_local_norm"

    def apply(self, scenario: Scenario) -> Scenario:
        return scenario.replace(optimizer__clip_kind="shard_local")


# -- high-learning-rate instabilities (Wortsman et al. 2023) and their defences --------------


def _positive_number(b: Break, name: str) -> None:
    """Check that ``b.<name>`` is a finite number > 0 and store it as a float (YAML reads 1e-4 as a string)."""
    value = getattr(b, name)
    try:
        number = float(value) if isinstance(value, (int, float, str)) and not isinstance(value, bool) else None
    except ValueError:
        number = None
    if number is None or not 0 < number < float("inf"):
        raise ConfigError(f"{type(b).__name__} {name} must be a finite number > 0, was {value!r}")
    object.__setattr__(b, name, number)


@dataclass(frozen=True)
class HighLR(Break):
    """Train at a high peak learning rate (``optimizer.lr``). At ``lr=0.1`` the Phase-19 model's
    attention logits grow to thousands within ~50 steps and the run stays stuck near the loss
    of the unigram distribution: attention-logit growth (Dehghani et al. 2023, Wortsman et al.
    2023). No multiplier anywhere: the dynamics do it."""

    config_name: ClassVar[str] = "high_lr"
    lr: float = 0.1

    def __post_init__(self) -> None:
        _positive_number(self, "lr")

    def apply(self, scenario: Scenario) -> Scenario:
        return scenario.replace(optimizer__lr=float(self.lr))


@dataclass(frozen=True)
class QKLayerNorm(Break):
    """A defence: LayerNorm on each attention head's queries and keys, so the attention logits
    stay bounded however far a high learning rate pushes the weights (Dehghani et al. 2023)."""

    config_name: ClassVar[str] = "qk_layernorm"

    def apply(self, scenario: Scenario) -> Scenario:
        return scenario.replace(model__qk_layernorm=True)


@dataclass(frozen=True)
class ZLoss(Break):
    """A defence: the auxiliary loss ``coefficient * mean(log(Z)^2)`` on the output logits keeps
    log Z near 0 (PaLM, Chowdhery et al. 2022: 1e-4). The ``loss`` columns stay the
    cross-entropy; the term is recorded as ``z_loss``."""

    config_name: ClassVar[str] = "z_loss"
    coefficient: float = 1e-4

    def __post_init__(self) -> None:
        _positive_number(self, "coefficient")

    def apply(self, scenario: Scenario) -> Scenario:
        return scenario.replace(model__z_loss=float(self.coefficient))


@dataclass(frozen=True)
class LogitSoftcap(Break):
    """A defence: output logits pass through ``cap * tanh(logits / cap)`` (Gemma 2 uses 30), so
    no logit, and no log Z, can run away."""

    config_name: ClassVar[str] = "logit_softcap"
    cap: float = 30.0

    def __post_init__(self) -> None:
        _positive_number(self, "cap")

    def apply(self, scenario: Scenario) -> Scenario:
        return scenario.replace(model__logit_softcap=float(self.cap))


# -- defence bugs of the training step as people write it: accumulation and loss scaling ------


@dataclass(frozen=True)
class ClipBeforeUnscale(Break):
    """The classic AMP bug: the clip runs on the loss-scaled gradients, before
    ``GradScaler.unscale_``. It then compares ‖g‖·scale with ``max_norm``, so at a scale of 65536
    the optimizer receives gradients ~65536× too small (over-clipped), or, with a scale below
    1, above ``max_norm``. Turns on fp16 autocast with dynamic loss scaling unless the scenario
    already scales its loss. The records keep the unscaled norms, so ``assert_clip_contains``
    sees what the optimizer received."""

    config_name: ClassVar[str] = "clip_before_unscale"

    def apply(self, scenario: Scenario) -> Scenario:
        amp = {} if scenario.amp.loss_scale is not None else {"amp__dtype": "float16", "amp__loss_scale": "dynamic"}
        return scenario.replace(optimizer__clip_when="before_unscale", **amp)


@dataclass(frozen=True)
class ClipEachMicrobatch(Break):
    """Gradient accumulation's clipping bug: each micro-batch's gradient is clipped to
    ``max_norm`` on its own and the clipped parts are summed, so the step's gradient can reach
    ``accumulation × max_norm``. Needs ``sampler.accumulation`` >= 2."""

    config_name: ClassVar[str] = "clip_each_microbatch"

    def apply(self, scenario: Scenario) -> Scenario:
        return scenario.replace(optimizer__clip_when="per_microbatch")


@dataclass(frozen=True)
class AccumulateSum(Break):
    """Gradient accumulation's normalisation bug (transformers PRs 34191, 35207): the
    micro-batches' mean losses are summed instead of averaged, so the loss and the gradient
    are ``accumulation`` times too large. Needs ``sampler.accumulation`` >= 2;
    ``assert_accumulation_invariant`` catches it."""

    config_name: ClassVar[str] = "accumulate_sum"

    def apply(self, scenario: Scenario) -> Scenario:
        return scenario.replace(sampler__accumulate="sum")


# -- the attention max-logit explosion under Muon (Kimi K2) and its defences -------------------


@dataclass(frozen=True)
class QKClip(Break):
    """A defence (Kimi K2's QK-Clip, the "Clip" of MuonClip): after each optimizer update, every
    head whose largest attention logit in that step's forward exceeded ``tau`` gets its query rows
    scaled by gamma^alpha and its key rows by gamma^(1 - alpha), gamma = tau / that logit, so the
    head's logits on the same input come back to tau. ``per_head=False`` uses one gamma per layer
    (its largest head's). A head whose largest logit is <= 0 or not finite is left alone (Megatron's
    PR 7382 fixed the NaN that made). The logits are the forward's own (no second forward); the
    column ``qk_clipped_heads`` counts the heads clipped at each step. Kimi K2: tau 100, alpha 0.5.
    A custom model takes it through ``spikecheck_qk_projections()`` (README, "Your own model")."""

    config_name: ClassVar[str] = "qk_clip"
    tau: float = 100.0
    alpha: float = 0.5
    per_head: bool = True

    def __post_init__(self) -> None:
        _positive_number(self, "tau")
        alpha = self.alpha
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha <= 1:
            raise ConfigError(f"QKClip alpha must be a number in [0, 1], was {alpha!r}")
        if not isinstance(self.per_head, bool):
            raise ConfigError(f"QKClip per_head must be true or false, was {self.per_head!r}")
        object.__setattr__(self, "alpha", float(alpha))

    def label(self) -> str:
        return f"qk_clip({self.tau:g}" + ("" if self.per_head else ",per-layer") + ")"

    def apply(self, scenario: Scenario) -> Scenario:
        return scenario.replace(
            optimizer__qk_clip=float(self.tau), optimizer__qk_clip_alpha=self.alpha, optimizer__qk_clip_per_head=self.per_head
        )


@dataclass(frozen=True)
class GatedAttention(Break):
    """A defence (Qiu et al. 2025): a per-head sigmoid gate on each attention output, computed from
    the block's input (``model.attn_gate``). A head can close its gate instead of growing its
    logits to park its attention somewhere harmless (the attention sink)."""

    config_name: ClassVar[str] = "gated_attention"

    def apply(self, scenario: Scenario) -> Scenario:
        return scenario.replace(model__attn_gate=True)


# -- defence bugs that shipped in the frameworks (docs/defence-bugs.md) ------------------------


@dataclass(frozen=True)
class ClipMuonUpdate(Break):
    """DeepSpeed issue 8439 (fix: PR 7776): under Muon the engine's ``gradient_clipping`` is taken
    over Muon's orthogonalised update instead of the gradient, so every Muon step is divided by
    the norm of that update, a property of the model's shape (DeepSpeed's table: 4.22x at hidden
    128, 85.6x at 8192), and the step size no longer follows the lr. Muon's matrices step on their
    unclipped gradients; the clip's norm is recorded as ``update_clip_norm``;
    ``assert_muon_update_scale`` catches it. Needs ``optimizer.name: muon`` and a global clip."""

    config_name: ClassVar[str] = "clip_muon_update"

    def apply(self, scenario: Scenario) -> Scenario:
        return scenario.replace(optimizer__clip_when="muon_update")


@dataclass(frozen=True)
class SkipStepCounter(Break):
    """OLMo-core PR 317 (the fix: PR 309): a skip-step AdamW (here SkipSpikes at ``ratio``) whose
    step counter never advanced, so Adam's bias correction stays that of step 1 while its
    moments accumulate (the PR's note: an effective lr about 2.2x the one specified). The
    optimizer's own count is recorded (``optimizer_steps``); ``assert_optimizer_steps`` catches it."""

    config_name: ClassVar[str] = "skip_step_counter"
    ratio: float = 5.0

    def validate(self) -> None:
        if not self.ratio > 1:
            raise ConfigError(f"SkipStepCounter(ratio=...) must be > 1, was {self.ratio!r}")

    def apply(self, scenario: Scenario) -> Scenario:
        return scenario.replace(optimizer__skip_spike_ratio=float(self.ratio), optimizer__step_counter="frozen")


@dataclass(frozen=True)
class ClipInfToLog(Break):
    """A run that does not clip but calls ``torch.nn.utils.clip_grad_norm_(params,
    max_norm=float('inf'))`` every step only to log the norm (a review comment on Skovorp/feral
    PR 16). It is no read-only measurement: when the total norm is infinite, torch's coefficient
    ``max_norm / (norm + 1e-6)`` is inf/inf = NaN and every gradient, the finite ones too, is
    multiplied by it. torch sums the squares in the gradients' dtype, so the norm of finite float32
    gradients is already inf above ~1.8e19 (a diverging run gets there). ``assert_clip_keeps_finite``
    fails it (finite gradients before the call, the recorded ``grad_finite_pre``; NaN after) and
    ``assert_finite`` names the same cause; the fix logs the norm with
    ``torch.nn.utils.get_total_norm``, which leaves the gradients alone."""

    config_name: ClassVar[str] = "clip_inf_to_log"

    def apply(self, scenario: Scenario) -> Scenario:
        return scenario.replace(optimizer__grad_clip=None, optimizer__clip_when="inf_to_log")
