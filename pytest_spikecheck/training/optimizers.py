"""The optimizer a scenario trains with (``optimizer.name``), built as one object for the engine.

- ``adamw``: AdamW with nanoGPT's parameter groups (decay every matrix, embeddings included;
  never biases or norm gains). The default recipe, built exactly as it always was.
- ``sgd``: SGD with ``momentum`` (Nesterov if ``nesterov``) over the same groups; its weight
  decay is torch's (L2, coupled to the gradient).
- ``muon``: ``torch.optim.Muon`` on the hidden matrices, AdamW at ``adamw_lr`` on the rest. Which
  matrices are hidden is decided by role, structurally: every 2-D parameter except those of
  ``nn.Embedding`` modules, the output head (the last ``nn.Linear`` with vocabulary-sized
  outputs; without one, the last matrix with a vocabulary-sized side) and anything tied to them; 1-D parameters (norms, biases) never (torch's Muon refuses them, and silently
  accepts embeddings and heads, so the rule must exclude them). ``optimizer.muon_params``, a
  regular expression over parameter names, replaces the rule. A parameter that stacks several
  matrices by rows (the GPT's fused q/k/v, declared by the model's
  ``spikecheck_fused_projections``) is handed to Muon as one view per matrix, so q, k and v are
  orthogonalised separately.

QK-Clip (``optimizer.qk_clip``) runs as the optimizer's after-step hook (:mod:`.qk_clip`), as
Kimi's MuonClip and Megatron-LM run it: right after the update, on the logits of the step's own
forward. Several parts or a hook make an :class:`OptimizerSet`: one object with ``step``,
``zero_grad``, ``param_groups``, ``state`` and ``state_dict``, so the training step, probes,
sweeps, recorders and the N-rank path never ask which optimizer runs. The schedule sets each
group's lr through :func:`set_learning_rate` (a group with ``lr_scale`` gets lr times it: Muon's
AdamW part follows the same schedule at its own peak).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.records.facts import OptimizerGroup
from pytest_spikecheck.scenario import Scenario
from pytest_spikecheck.training.qk_clip import QKClipHook


#: The method a model implements to give some parameters their own learning-rate factor:
#: ``spikecheck_lr_scales() -> {parameter name: factor}`` (the preflight's muP proxies).
LR_SCALES_HOOK = "spikecheck_lr_scales"


def parameter_groups(
    model: torch.nn.Module, scenario: Scenario, params: Sequence[torch.nn.Parameter] | None = None
) -> list[dict[str, Any]]:
    """AdamW's (and SGD's) parameter groups over ``params`` (default: every trainable parameter).
    nanoGPT's rule: decay every matrix (embeddings included), never biases or norm gains. A model
    with the :data:`LR_SCALES_HOOK` gets each group split by its parameters' factors, a factor
    other than 1 as the group's ``lr_scale`` (which :func:`set_learning_rate` applies)."""
    params = [p for p in model.parameters() if p.requires_grad] if params is None else list(params)
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": scenario.optimizer.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    hook = getattr(model, LR_SCALES_HOOK, None)
    scales = dict(hook()) if callable(hook) else {}
    if not scales:  # every model without the hook: the groups exactly as they always were
        return groups
    # a model's own per-parameter lr factors (the preflight's muP proxies): each group split by factor
    by_id = {id(p): float(scales[n]) for n, p in model.named_parameters() if n in scales}
    out = []
    for group in groups:
        for scale in sorted({by_id.get(id(p), 1.0) for p in group["params"]}):
            chosen = [p for p in group["params"] if by_id.get(id(p), 1.0) == scale]
            out.append({**group, "params": chosen, **({"lr_scale": scale} if scale != 1.0 else {})})
    return out


def set_learning_rate(optimizer: Any, lr: float) -> None:
    """The schedule's lr for this step into every group (times the group's ``lr_scale``, if any)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group["lr_scale"] if "lr_scale" in group else lr


@dataclass(frozen=True)
class MuonMatrix:
    """A parameter Muon updates: its name, the parameter, and how many matrices it stacks by rows."""

    name: str
    param: torch.nn.Parameter
    blocks: int = 1

    def rows(self) -> list[slice]:
        n = self.param.shape[0] // self.blocks
        return [slice(i * n, (i + 1) * n) for i in range(self.blocks)]


def _vocab_size(model: torch.nn.Module) -> int | None:
    """The model's vocabulary: its config's, its own ``vocab_size``, else its largest embedding's rows."""
    vocab = getattr(getattr(model, "config", None), "vocab_size", None) or getattr(model, "vocab_size", None)
    if vocab:
        return int(vocab)
    rows = [m.num_embeddings for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    return max(rows) if rows else None


def _output_head(model: torch.nn.Module, named: list[tuple[str, torch.nn.Parameter]]) -> set[int]:
    """The output head's storage: the last ``nn.Linear`` with vocabulary-sized outputs (the layer
    that makes the logits; a hidden matrix may have as many rows, as q/k/v at 3 x 128 = 384 do),
    else the last 2-D parameter with a vocabulary-sized side; nothing without a vocabulary."""
    vocab = _vocab_size(model)
    if vocab is None:
        return set()
    heads = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear) and m.out_features == vocab]
    if not heads:
        heads = [p for _, p in named if p.dim() == 2 and vocab in p.shape]
    return {heads[-1].data_ptr()} if heads else set()


def muon_matrices(model: torch.nn.Module, scenario: Scenario) -> list[MuonMatrix]:
    """The hidden matrices Muon updates (the module docstring's role rule, or ``muon_params``);
    one line when the model has none or the pattern picks a parameter Muon cannot take."""
    pattern = scenario.optimizer.muon_params
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if pattern:
        chosen = [(n, p) for n, p in named if re.fullmatch(pattern, n)]
        for n, p in chosen:
            if p.dim() != 2:
                raise ConfigError(
                    f"optimizer.muon_params {pattern!r} matches {n} of shape {tuple(p.shape)}: Muon "
                    f"takes 2-D matrices only (norms and biases go to AdamW)"
                )
        if not chosen:
            raise ConfigError(
                f"optimizer.muon_params {pattern!r} matches no trainable parameter; the model has "
                f"{', '.join(n for n, _ in named[:6])}{', ...' if len(named) > 6 else ''}"
            )
    else:
        embedded = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
        outside = {p.data_ptr() for _, p in named if id(p) in embedded} | _output_head(model, named)
        chosen = [(n, p) for n, p in named if p.dim() == 2 and p.data_ptr() not in outside]
        if not chosen:
            raise ConfigError(
                f"optimizer.name muon: the role rule found no hidden 2-D matrix in "
                f"{type(getattr(model, 'inner', model)).__name__} (embeddings, the output head, norms "
                f"and biases go to AdamW); name Muon's matrices with optimizer.muon_params"
            )
    fused = dict(getattr(model, "spikecheck_fused_projections", None) or {})
    out = []
    for n, p in chosen:
        blocks = next((b for suffix, b in fused.items() if n.endswith(suffix)), 1)
        if p.shape[0] % blocks:
            raise ConfigError(f"spikecheck_fused_projections: {n} has {p.shape[0]} rows, not {blocks} equal blocks")
        out.append(MuonMatrix(n, p, blocks))
    return out


#: A tensor Muon updates and where its gradient comes from at each step: None (it is a parameter,
#: autograd fills its ``.grad``), a tensor (a fixed view of a gradient buffer) or a callable.
MuonTensor = tuple[torch.Tensor, Any]


def muon_tensors(matrices: Sequence[MuonMatrix]) -> list[MuonTensor]:
    """What Muon is handed on one process: each parameter itself, or one view per stacked matrix
    (the view's gradient is the same rows of the parameter's, set at each step)."""
    out: list[MuonTensor] = []
    for m in matrices:
        if m.blocks == 1:
            out.append((m.param, None))
            continue
        for rows in m.rows():
            out.append((m.param.detach()[rows], lambda p=m.param, rows=rows: None if p.grad is None else p.grad[rows]))
    return out


def build_muon(
    tensors: Sequence[MuonTensor],
    adamw_groups: list[dict[str, Any]],
    scenario: Scenario,
    *,
    parents: Sequence[torch.Tensor] = (),
    after_step: Callable[[], dict[str, float]] | None = None,
) -> OptimizerSet:
    """Muon over ``tensors`` and AdamW (at ``adamw_lr``, following the schedule) over ``adamw_groups``."""
    o = scenario.optimizer
    muon = torch.optim.Muon(
        [t for t, _ in tensors],
        lr=o.lr,
        weight_decay=o.weight_decay,
        momentum=o.momentum,
        nesterov=o.nesterov,
        adjust_lr_fn=o.adjust_lr_fn,
    )
    groups = [{**g, "lr": o.adamw_lr, "lr_scale": o.adamw_lr / o.lr} for g in adamw_groups if g["params"]]
    parts: dict[str, torch.optim.Optimizer] = {"muon": muon}
    if groups:
        parts["adamw"] = torch.optim.AdamW(groups, lr=o.adamw_lr, betas=o.betas, eps=o.eps, foreach=True)
    return OptimizerSet(parts, views=[(t, g) for t, g in tensors if g is not None], parents=parents, after_step=after_step)


class FrozenStepAdamW(torch.optim.AdamW):
    """SkipStepCounter, the bug (OLMo-core PR 317): torch's AdamW whose per-tensor step counter
    never advances from its initial 0 (torch adds 1 before using it, so every step's bias
    corrections are those of step 1, 1 - beta1 and 1 - beta2, while the moments accumulate): the
    update is larger than AdamW's in the first steps. Otherwise torch's AdamW, step for step."""

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = super().step(closure)
        for group in self.param_groups:
            for p in group["params"]:
                step = self.state[p].get("step") if p in self.state else None
                if torch.is_tensor(step):
                    step.fill_(0.0)
        return loss


def clip_muon_update_(muon: torch.optim.Optimizer, others: Sequence[torch.optim.Optimizer], max_norm: float) -> float:
    """ClipMuonUpdate, the bug (DeepSpeed issue 8439): Muon steps on its unclipped gradients, then
    the global clip is taken over Muon's orthogonalised update (what it applied, the weight decay
    aside, divided by the lr: DeepSpeed orthogonalises into the gradient buffer) together with the
    other parts' gradients, and its coefficient min(1, max_norm / (norm + 1e-6)) scales both:
    Muon's update is divided by the norm of the update itself. Returns that norm (the "grad norm"
    such an engine reports). The other parts step after, on their clipped gradients."""
    done = []
    with torch.no_grad():
        for group in muon.param_groups:
            lr, decay = group["lr"], 1.0 - group["lr"] * group["weight_decay"]
            for p in group["params"]:
                if p.grad is not None:
                    done.append((p, p.detach().clone().mul_(decay), lr))
        muon.step()
        squares = [((decayed - p) / lr).double().pow(2).sum() for p, decayed, lr in done]
        grads = [p.grad for o in others for g in o.param_groups for p in g["params"] if p.grad is not None]
        squares += [g.double().pow(2).sum() for g in grads]
        norm = float(torch.stack(squares).sum().sqrt()) if squares else 0.0
        coef = min(1.0, max_norm / (norm + 1e-6))
        for p, decayed, _ in done:  # decayed - coef * (decayed - p): the update scaled, the decay kept
            p.sub_(decayed).mul_(coef).add_(decayed)
        for g in grads:
            g.mul_(coef)
        for o in others:
            o.step()
    return norm


@dataclass(frozen=True)
class OptimizerKind:
    """What an ``optimizer.name`` builds, and what it declares to a sharding (the N-rank path
    asks these, never the name)."""

    name: str
    #: Builds it over parameter groups, each of any part of any tensor (an elementwise update:
    #: AdamW, SGD, so a rank's flat shard of them computes what the whole does); None: not elementwise.
    elementwise: Callable[[list[dict[str, Any]], Any], torch.optim.Optimizer] | None
    #: The matrices its update needs whole (Muon orthogonalises each): the N-rank path keeps
    #: them replicated and gathers their gradients; None: none.
    whole_matrices: Callable[[torch.nn.Module, Scenario], list[MuonMatrix]] | None
    #: It keeps Adam's second moment ``v`` (the ``adam_v_norm`` column, the diagnosis' rung 6).
    adam_moments: bool


#: One per optimizer.name (scenario.sections.OPTIMIZERS, in its order).
OPTIMIZER_KINDS: dict[str, OptimizerKind] = {
    "adamw": OptimizerKind(
        "adamw",
        lambda groups, o: (FrozenStepAdamW if o.step_counter == "frozen" else torch.optim.AdamW)(
            groups, lr=o.lr, betas=o.betas, eps=o.eps, foreach=True
        ),
        None,
        adam_moments=True,
    ),
    "muon": OptimizerKind("muon", None, lambda model, scenario: muon_matrices(model, scenario), adam_moments=True),
    "sgd": OptimizerKind(
        "sgd",
        lambda groups, o: torch.optim.SGD(
            groups, lr=o.lr, momentum=o.momentum, nesterov=o.nesterov and o.momentum > 0, foreach=True
        ),
        None,
        adam_moments=False,
    ),
}


def optimizer_kind(name: str) -> OptimizerKind:
    """The :class:`OptimizerKind` of ``optimizer.name``; an unknown name is one line naming the known ones."""
    if name not in OPTIMIZER_KINDS:
        raise ConfigError(f"optimizer.name must be one of {', '.join(OPTIMIZER_KINDS)}, was {name!r}")
    return OPTIMIZER_KINDS[name]


def build_optimizer(model: torch.nn.Module, scenario: Scenario, groups: list[dict[str, Any]] | None = None) -> Any:
    """The scenario's optimizer for ``model``: a torch optimizer, or an :class:`OptimizerSet` when
    it has several parts or QK-Clip. ``groups`` (an elementwise optimizer only) replaces
    :func:`parameter_groups` (the N-rank path passes its shards)."""
    o = scenario.optimizer
    kind = optimizer_kind(o.name)
    after_step = QKClipHook(model, o.qk_clip, o.qk_clip_alpha, o.qk_clip_per_head) if o.qk_clip is not None else None
    if kind.elementwise is None:  # Muon: whole matrices, its AdamW part on the rest
        if groups is not None:
            raise ValueError(f"build_optimizer(groups=...) is for elementwise optimizers; {o.name}'s parts are built by role")
        matrices = kind.whole_matrices(model, scenario)
        taken = {id(m.param) for m in matrices}
        rest = [p for p in model.parameters() if p.requires_grad and id(p) not in taken]
        return build_muon(
            muon_tensors(matrices),
            parameter_groups(model, scenario, rest),
            scenario,
            parents=[m.param for m in matrices if m.blocks > 1],
            after_step=after_step,
        )
    optimizer = kind.elementwise(parameter_groups(model, scenario) if groups is None else groups, o)
    if after_step is None:
        return optimizer
    return OptimizerSet({o.name: optimizer}, after_step=after_step)


class _MergedState(Mapping):
    """The parts' ``state`` as one mapping (tensor -> its state dict; ``{}`` for a tensor no part
    holds state for, as torch's defaultdict answers, without inserting anything)."""

    def __init__(self, parts: Sequence[torch.optim.Optimizer]) -> None:
        self._parts = parts

    def __getitem__(self, key: torch.Tensor) -> dict[str, Any]:
        for part in self._parts:
            if key in part.state:
                return part.state[key]
        return {}

    def __contains__(self, key: object) -> bool:
        return any(key in part.state for part in self._parts)

    def __iter__(self) -> Iterator[torch.Tensor]:
        for part in self._parts:
            yield from part.state

    def __len__(self) -> int:
        return sum(len(part.state) for part in self._parts)


class OptimizerSet:
    """Several torch optimizers, and an after-step hook, acting as one optimizer.

    ``step`` hands the stacked-matrix views their gradients, steps every part, then runs the
    hook (QK-Clip) and keeps what it reports in :attr:`last_report` (the engine records it:
    ``qk_clipped_heads``). ``zero_grad`` drops every part's gradients and the views' and parents'.
    """

    def __init__(
        self,
        parts: Mapping[str, torch.optim.Optimizer],
        *,
        views: Sequence[MuonTensor] = (),
        parents: Sequence[torch.Tensor] = (),
        after_step: Callable[[], dict[str, float]] | None = None,
    ) -> None:
        self.parts = dict(parts)
        self._views, self._parents, self.after_step = list(views), list(parents), after_step
        self._parents_group = {"params": self._parents, "lr": 0.0, "stacked": True}  # never stepped
        self.last_report: dict[str, float] = {}
        #: ClipMuonUpdate (the bug): the step's max_norm, applied to Muon's update by
        #: :func:`clip_muon_update_` (None: the parts step as they are, on clipped gradients).
        self.clip_update: float | None = None

    @property
    def report_keys(self) -> tuple[str, ...]:
        """The keys :attr:`last_report` holds (0 at a skipped step): the hook's (QK-Clip's
        ``qk_clipped_heads``), and under ClipMuonUpdate the norm its clip divided by (``update_clip_norm``)."""
        return (("qk_clipped_heads",) if self.after_step is not None else ()) + (
            ("update_clip_norm",) if self.clip_update is not None else ()
        )

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """Every part's groups, then (with stacked matrices) one group of their parameters: Muon
        holds views of them, which get their gradients only at ``step``, so whatever walks the
        groups' gradients before the step (a loss scaler's unscale) finds them here."""
        groups = [g for part in self.parts.values() for g in part.param_groups]
        return groups + ([self._parents_group] if self._parents else [])

    @property
    def state(self) -> _MergedState:
        return _MergedState(list(self.parts.values()))

    def observe_forward(self, head_logits: torch.Tensor | None) -> None:
        """The per-head largest attention logits of the step's forward, for the after-step hook
        (the training step hands them over before ``step``; without them the hook reads the
        model's last stats)."""
        if self.after_step is not None and hasattr(self.after_step, "observe"):
            self.after_step.observe(head_logits)

    @torch.no_grad()
    def step(self) -> None:
        for view, source in self._views:
            view.grad = source() if callable(source) else source
        report: dict[str, float] = {}
        if self.clip_update is not None and "muon" in self.parts:
            report["update_clip_norm"] = clip_muon_update_(
                self.parts["muon"], [p for n, p in self.parts.items() if n != "muon"], self.clip_update
            )
        else:
            for part in self.parts.values():
                part.step()
        self.last_report = {**(self.after_step() if self.after_step is not None else {}), **report}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for part in self.parts.values():
            part.zero_grad(set_to_none=set_to_none)
        for tensor in [v for v, _ in self._views] + self._parents:
            tensor.grad = None

    def state_dict(self) -> dict[str, Any]:
        return {name: part.state_dict() for name, part in self.parts.items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if set(state) != set(self.parts):
            raise ValueError(f"state for parts {sorted(state)}, this optimizer has {sorted(self.parts)}")
        for name, part in self.parts.items():
            part.load_state_dict(state[name])

    def __repr__(self) -> str:
        hook = f", after_step={type(self.after_step).__name__}" if self.after_step is not None else ""
        return f"OptimizerSet({', '.join(f'{n}: {type(p).__name__}' for n, p in self.parts.items())}{hook})"


def observed_groups(optimizer: Any) -> tuple[OptimizerGroup, ...] | None:
    """The parameter groups of ``optimizer`` as run facts, read from the object itself: a torch
    optimizer (its class is the group's name: ``torch.optim.Muon``'s groups are ``muon``), an
    :class:`OptimizerSet` or any object with ``parts`` (a mapping) or ``optimizers`` (a list)
    of them, or a wrapper holding one as ``.optimizer`` (accelerate's, Lightning's). None for
    anything else: unknown, not guessed."""
    if optimizer is None:
        return None
    parts = getattr(optimizer, "parts", None)
    if isinstance(parts, Mapping):
        found = [observed_groups(part) for part in parts.values()]
        return None if any(f is None for f in found) else tuple(g for f in found for g in f)
    many = getattr(optimizer, "optimizers", None)
    if isinstance(many, (list, tuple)) and many:
        found = [observed_groups(part) for part in many]
        return None if any(f is None for f in found) else tuple(g for f in found for g in f)
    if not isinstance(optimizer, torch.optim.Optimizer):
        inner = getattr(optimizer, "optimizer", None)
        return observed_groups(inner) if inner is not None and inner is not optimizer else None
    name = type(optimizer).__name__.lower()

    def number(value: Any) -> float | None:
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    out = []
    for group in optimizer.param_groups:
        betas = group.get("betas")
        out.append(
            OptimizerGroup(
                name=name,
                lr=number(group.get("initial_lr", group.get("lr"))),
                betas=(float(betas[0]), float(betas[1])) if isinstance(betas, (tuple, list)) and len(betas) == 2 else None,
                momentum=number(group.get("momentum")),
                weight_decay=number(group.get("weight_decay")),
                tensors=len(group["params"]),
            )
        )
    return tuple(out)
