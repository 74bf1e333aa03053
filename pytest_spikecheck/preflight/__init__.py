"""``spikecheck preflight``: will a Hugging Face model config stay stable at scale, and which
defence does it need? (docs/preflight.md)

:func:`preflight` reads a ``config.json`` and a recipe, builds proxies of the config with
``transformers``' own classes at a few widths (:mod:`.hf_config`'s scaling rule), trains each at
an LR grid around the recipe's LR with and without each defence on two corpora, through the
sweep engine (:mod:`.study`), and judges the runs (:mod:`.verdict`): the first failing LR per
width and defence, its trend with width, and the extrapolation to the config's own width.
:func:`assert_preflight` asserts on the result in CI.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

from pytest_spikecheck.preflight.hf_config import HFConfig, read_config, scaling_rule_lines
from pytest_spikecheck.preflight.recipe import Recipe, read_recipe, recipe_from_dict
from pytest_spikecheck.preflight.result import PreflightResult, assert_preflight
from pytest_spikecheck.preflight.study import BLOCK_SIZE, StudyPlan, plan_study, point_coordinates, study_sweep
from pytest_spikecheck.preflight.verdict import LOGIT_LIMIT, verdict

__all__ = [
    "HFConfig",
    "PreflightResult",
    "Recipe",
    "StudyPlan",
    "assert_preflight",
    "plan",
    "preflight",
    "read_config",
    "read_recipe",
    "recipe_from_dict",
]


def _config(config: str | Path | HFConfig) -> HFConfig:
    return config if isinstance(config, HFConfig) else read_config(config, BLOCK_SIZE)


def _recipe(recipe: str | Path | Recipe | dict) -> Recipe:
    if isinstance(recipe, Recipe):
        return recipe
    if isinstance(recipe, dict):
        return recipe_from_dict(recipe)
    return read_recipe(recipe)


def plan(
    config: str | Path | HFConfig, recipe: str | Path | Recipe | dict, *, allow_untested: bool = False, **options: Any
) -> tuple[StudyPlan, list[str]]:
    """The study's plan and the lines that describe it (config, scaling rule, recipe, grid),
    every input checked (one line each) before anything trains. ``options``: :func:`.study.plan_study`'s."""
    from pytest_spikecheck.integrations.hf_proxy import check_transformers

    version = check_transformers(allow_untested)
    cfg, rec = _config(config), _recipe(recipe)
    study = plan_study(cfg, rec, **options)
    lines = scaling_rule_lines(cfg, study.widths, layers=study.layers, heads=study.heads, head_dim=study.head_dim)
    lines.append(
        f"recipe {rec.source}: {rec.describe()}"
        + (f" (TrainingArguments keys ignored: {', '.join(rec.ignored)})" if rec.ignored else "")
    )
    lines.append(
        f"study: widths {', '.join(map(str, study.widths))} x lr {', '.join(f'{lr:.3g}' for lr in study.lrs)} "
        f"x defences {', '.join(study.defences)} x seeds {', '.join(map(str, study.seeds))} x corpora "
        f"{', '.join(study.corpora)}, {study.steps} steps each: {study.n_points} points"
        + (" (--quick)" if study.quick else "")
        + f"; transformers {version}"
    )
    lines.append(
        f"a point fails when it diverges, ends no lower than it started, or its largest attention logit passes {LOGIT_LIMIT:g}"
    )
    lines.extend(f"note: {n}" for n in study.notes)
    return study, lines


def preflight(
    config: str | Path | HFConfig,
    recipe: str | Path | Recipe | dict,
    *,
    widths: Sequence[int] | None = None,
    quick: bool = False,
    executor: str = "local",
    jobs: int | None = None,
    address: str | None = None,
    out: str | Path | None = None,
    fresh: bool = False,
    store: str | Path | None = None,
    progress: Any = True,
    allow_untested: bool = False,
    session: Any = None,
    **options: Any,
) -> PreflightResult:
    """Plan, train and judge a preflight study (the module docstring). ``executor``, ``jobs``,
    ``address``, ``out``, ``fresh``, ``store`` and ``progress`` are :func:`pytest_spikecheck.sweep.sweep`'s
    (with ``out``, finished points are cached in its run store: a rerun trains only what is
    missing); ``out`` also receives preflight.json, preflight.md and index.html. ``session``: the
    ``spikecheck`` fixture; each point is then the session's run (:mod:`.session`: trained once
    per point under ``pytest --spikecheck -n N``), and ``executor`` is not used."""
    from pytest_spikecheck.integrations.hf_proxy import transformers_version
    from pytest_spikecheck.sweep.engine import sweep

    study, lines = plan(config, recipe, allow_untested=allow_untested, widths=widths, quick=quick, **options)
    plan_sweep = study_sweep(study, transformers_version() or "")
    started = time.perf_counter()
    if session is not None:
        from pytest_spikecheck.preflight.session import SessionExecutor

        executor = SessionExecutor(session)
    result = sweep(
        plan_sweep,
        executor=executor,
        jobs=jobs,
        address=address,
        out=Path(out) / "sweep" if out is not None else None,
        fresh=fresh,
        store=store,
        progress=progress,
    )
    rows = [
        {
            **point_coordinates(p),
            **{
                k: r.get(k)
                for k in ("status", "final_eval_loss", "initial_loss", "max_attn_logit", "diverged", "seconds", "error")
            },
        }
        for p, r in zip(result.points, result.rows)
    ]
    judged = verdict(rows, user_lr=study.recipe.lr, target_width=study.config.hidden_size)
    found = PreflightResult(
        study.config.source,
        study.recipe.describe(),
        study.recipe.lr,
        study.config.hidden_size,
        lines,
        rows,
        judged,
        time.perf_counter() - started,
        result.counts_text(),
        sweep=result,
    )
    if out is not None:
        found.write(out)
    return found
