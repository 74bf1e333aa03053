"""The preflight study: proxy widths x an LR grid around the recipe's LR x defences x seeds, on
the two corpora that show the two failure kinds, as one sweep through the sweep engine (its run
store, resume, local and Ray executors). docs/preflight.md, "The study".

Each point is the ``phase-19`` preset (its tokenizer, eval set, batching) with the recipe's
optimizer and schedule, the HF proxy of one width as the model (``model_factory``
:data:`~pytest_spikecheck.integrations.hf_proxy.PROXY_FACTORY`), one learning rate and one seed;
each defence is one of the sweep's recipes (a list of breaks added to the point):

* ``as-given``: the recipe alone (its clip, z-loss and QK-Clip included);
* ``qk-norm``: :class:`QKLayerNorm` (RMSNorm on each head's q and k before RoPE); left out for a
  config that has q/k-norm (Qwen3), and for a recipe with QK-Clip (the norm undoes the clip);
* ``qk-clip``: :class:`QKClip` at tau (default 100, Kimi K2's); left out under q/k-norm and
  where the recipe already clips at that tau;
* ``z-loss``: :class:`ZLoss` 1e-4 (PaLM's); left out where the recipe has one;
* ``clip-1``: global clip 1.0 (:class:`ClipAt`), only where the recipe has no clip.

Corpora: ``phase19`` (Seed A's 240 sentences with a three-sample rare-token burst at 2/3 of the
steps: the loss-spike kind) and ``induction`` (2,000 copy sequences in batches of 32, which need
attention: the attention-logit-growth kind, docs/fidelity.md's Muon grid).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.integrations.hf_proxy import PROXY_FACTORY, TESTED_TRANSFORMERS
from pytest_spikecheck.preflight.hf_config import PROXY_LAYERS, HFConfig, check_widths, proxy_config
from pytest_spikecheck.preflight.recipe import Recipe
from pytest_spikecheck.scenario import ClipAt, NoClip, QKClip, QKLayerNorm, Scenario, ZLoss
from pytest_spikecheck.sweep.spec import Sweep

#: The proxy widths unless given.
DEFAULT_WIDTHS = (64, 128, 256, 512)
#: The LR grid: the recipe's LR times these (log-spaced, x2 apart, 1/8 ... 8).
DEFAULT_LR_FACTORS = tuple(2.0**k for k in range(-3, 4))
DEFENCES = ("as-given", "qk-norm", "qk-clip", "z-loss", "clip-1")
CORPORA = ("phase19", "induction")
#: Training steps per point (the full study, and --quick).
STEPS, QUICK_STEPS = 150, 100
#: The proxies' sequence length (block size): the Phase-19 preset's.
BLOCK_SIZE = 32
#: --quick: the documented subset (docs/preflight.md, "--quick"): the two smallest widths, three
#: LRs (the recipe's, x2 and x4: does it fail at its LR, and is there a 2x margin), two defences,
#: one seed, :data:`QUICK_STEPS` steps; sized to finish in <= 15 min on 2 loaded cores (measured).
QUICK = {"widths": 2, "lr_factors": (1.0, 2.0, 4.0), "defences": ("as-given", "qk-norm"), "seeds": (0,)}


@dataclass(frozen=True)
class StudyPlan:
    """What a preflight trains, checked before anything trains."""

    config: HFConfig
    recipe: Recipe
    widths: tuple[int, ...]
    lr_factors: tuple[float, ...]
    defences: tuple[str, ...]
    seeds: tuple[int, ...]
    corpora: tuple[str, ...]
    steps: int
    layers: int = PROXY_LAYERS
    heads: str = "scale"
    head_dim: int | None = None
    qk_clip_tau: float = 100.0
    quick: bool = False
    notes: tuple[str, ...] = field(default=())

    @property
    def lrs(self) -> tuple[float, ...]:
        return tuple(self.recipe.lr * f for f in self.lr_factors)

    @property
    def n_points(self) -> int:
        return len(self.widths) * len(self.lrs) * len(self.defences) * len(self.seeds) * len(self.corpora)


def plan_study(
    config: HFConfig,
    recipe: Recipe,
    *,
    widths: Sequence[int] | None = None,
    lr_factors: Sequence[float] | None = None,
    defences: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
    corpora: Sequence[str] | None = None,
    steps: int | None = None,
    layers: int = PROXY_LAYERS,
    heads: str = "scale",
    head_dim: int | None = None,
    qk_clip_tau: float = 100.0,
    quick: bool = False,
) -> StudyPlan:
    """The study's plan; ``quick`` fills what is not given from :data:`QUICK`. One line for any
    bad value (widths, heads, defences, corpora, steps)."""
    if widths is None:
        widths = [w for w in DEFAULT_WIDTHS if w <= config.hidden_size]
        widths = widths[: QUICK["widths"]] if quick else widths
    widths = tuple(widths)
    check_widths(config, widths, heads, head_dim)
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise ConfigError(f"the proxy depth (layers) must be a positive integer, was {layers!r}")
    if recipe.lr_transfer == "mup" and heads != "scale":
        raise ConfigError(
            "lr_transfer mup needs heads that scale with width (head_dim kept, heads: scale); with the "
            "head counts kept the head size grows and muP would need a 1/d attention scale these "
            "classes do not have"
        )
    lr_factors = tuple(
        float(f) for f in (lr_factors if lr_factors is not None else (QUICK["lr_factors"] if quick else DEFAULT_LR_FACTORS))
    )
    if not lr_factors or any(not (f > 0 and math.isfinite(f)) for f in lr_factors) or list(lr_factors) != sorted(set(lr_factors)):
        raise ConfigError(f"the LR grid's factors must be increasing numbers > 0, were {list(lr_factors)}")
    asked = tuple(defences if defences is not None else (QUICK["defences"] if quick else DEFENCES))
    unknown = [d for d in asked if d not in DEFENCES]
    if unknown:
        raise ConfigError(f"unknown defence {unknown[0]!r}; the defences are {', '.join(DEFENCES)}")
    chosen, notes = [], []
    for d in asked:
        why = _not_applicable(d, config, recipe, qk_clip_tau)
        if why:
            notes.append(f"defence {d} left out: {why}")
        else:
            chosen.append(d)
    seeds = tuple(seeds if seeds is not None else (QUICK["seeds"] if quick else (0, 1, 2)))
    if not seeds or any(isinstance(s, bool) or not isinstance(s, int) for s in seeds):
        raise ConfigError(f"seeds must be a non-empty list of integers, were {list(seeds)}")
    corpora = tuple(corpora if corpora is not None else CORPORA)
    if not corpora or any(c not in CORPORA for c in corpora):
        raise ConfigError(f"corpora must be some of {', '.join(CORPORA)}, were {list(corpora)}")
    steps = steps if steps is not None else (QUICK_STEPS if quick else STEPS)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 10:
        raise ConfigError(f"steps must be an integer >= 10, was {steps!r}")
    return StudyPlan(
        config,
        recipe,
        widths,
        lr_factors,
        tuple(chosen),
        seeds,
        corpora,
        steps,
        layers,
        heads,
        head_dim,
        float(qk_clip_tau),
        quick,
        tuple(notes),
    )


def _not_applicable(defence: str, config: HFConfig, recipe: Recipe, tau: float) -> str | None:
    if defence == "qk-norm" and config.qk_norm:
        return f"the {config.model_type} config has q/k-norm already (the config as given is that defence)"
    if defence == "qk-norm" and recipe.qk_clip is not None:
        return "the recipe has QK-Clip, which q/k-norm would undo"
    if defence == "qk-clip" and config.qk_norm:
        return f"the {config.model_type} config has q/k-norm, which undoes QK-Clip's scale"
    if defence == "qk-clip" and recipe.qk_clip == tau:
        return f"the recipe already has QK-Clip tau {tau:g}"
    if defence == "z-loss" and recipe.z_loss:
        return f"the recipe has z-loss {recipe.z_loss:g} already"
    if defence == "clip-1" and recipe.grad_clip is not None:
        return f"the recipe clips at {recipe.grad_clip:g} already"
    return None


def defence_breaks(defence: str, tau: float) -> list[Any]:
    return {
        "as-given": [],
        "qk-norm": [QKLayerNorm()],
        "qk-clip": [QKClip(tau=tau)],
        "z-loss": [ZLoss()],
        "clip-1": [ClipAt(max_norm=1.0)],
    }[defence]


def proxy_kwargs(plan: StudyPlan, width: int, transformers: str = TESTED_TRANSFORMERS) -> dict[str, Any]:
    """The model factory's keyword arguments at ``width`` (μP's factors when the recipe asks)."""
    kwargs: dict[str, Any] = {
        "config": proxy_config(plan.config, width, layers=plan.layers, heads=plan.heads, head_dim=plan.head_dim),
        "transformers": transformers,
    }
    if plan.recipe.lr_transfer == "mup":
        m = width / plan.widths[0]
        kwargs.update(output_multiplier=1.0 / m, hidden_lr_scale=1.0 / m, hidden_init_scale=1.0 / math.sqrt(m))
    return kwargs


def base_scenario(plan: StudyPlan) -> Scenario:
    """The recipe on the phase-19 preset (its clip as a break: no clip, or clip at its norm)."""
    r = plan.recipe
    base = Scenario.preset("phase-19").replace(
        steps=plan.steps,
        model_factory=PROXY_FACTORY,
        model_kwargs=proxy_kwargs(plan, plan.widths[0]),
        **r.scenario_changes(plan.steps),
    )
    breaks: list[Any] = [NoClip()] if r.grad_clip is None else [ClipAt(max_norm=float(r.grad_clip))]
    if r.z_loss:
        breaks.append(ZLoss(coefficient=r.z_loss))
    if r.qk_clip is not None:
        breaks.append(QKClip(tau=r.qk_clip))
    return base.with_breaks(*breaks)


def corpus_values(corpus: str, steps: int) -> dict[str, Any]:
    """The dotted overrides of a corpus (the module docstring)."""
    if corpus == "induction":
        return {"data.corpus": "induction", "data.n_sentences": 2000, "sampler.batch_size": 32}
    return {"data.corpus": "phase19", "sampler.bursts": [{"at_step": 2 * steps // 3, "count": 3, "content": "greek"}]}


def study_sweep(plan: StudyPlan, transformers: str = TESTED_TRANSFORMERS) -> Sweep:
    """The plan as one sweep: explicit points (corpus x width x lr x seed), the defences as recipes."""
    points = [
        {**corpus_values(c, plan.steps), "model.kwargs": proxy_kwargs(plan, w, transformers), "optimizer.lr": lr, "seed": s}
        for c in plan.corpora
        for w in plan.widths
        for lr in plan.lrs
        for s in plan.seeds
    ]
    recipes = {d: defence_breaks(d, plan.qk_clip_tau) for d in plan.defences}
    return Sweep(
        base_scenario(plan),
        points=points,
        recipes=recipes,
        name=f"preflight-{plan.config.model_type}",
        where=f"preflight of {plan.config.source}",
    )


def point_coordinates(point: Any) -> dict[str, Any]:
    """(corpus, width, lr, seed, defence) of a study point, read from its scenario."""
    s = point.scenario
    return {
        "corpus": s.data.corpus,
        "width": int(s.model_kwargs["config"]["hidden_size"]),
        "lr": float(s.optimizer.lr),
        "seed": int(s.seed),
        "defence": point.recipe,
    }
