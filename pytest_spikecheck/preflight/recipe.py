"""The optimizer recipe a preflight studies: a small YAML, or the keys of Hugging Face
``TrainingArguments`` (docs/preflight.md, "The recipe"). No torch.

Own keys::

    optimizer: adamw        # adamw | muon (Muon on the attention/MLP matrices, AdamW on the rest)
    lr: 3.0e-4              # the peak LR at your scale (muon: Muon's)
    betas: [0.9, 0.95]      # adamw (and muon's AdamW part)
    eps: 1.0e-8
    weight_decay: 0.1
    momentum: 0.95          # muon
    adamw_lr: 3.0e-4        # muon: its AdamW part's peak LR (default: lr)
    warmup: 0.05            # warmup as a fraction of the steps (each proxy trains the same fraction)
    schedule: cosine        # cosine | constant
    min_lr_ratio: 0.1       # cosine's floor
    grad_clip: 1.0          # global-L2 max norm; null = none
    z_loss: 0.0             # PaLM's z-loss coefficient; 0 = none
    qk_clip: null           # QK-Clip tau; null = none
    lr_transfer: standard   # standard | mup

TrainingArguments keys (``learning_rate``, ``warmup_ratio``, ``warmup_steps`` with
``max_steps``, ``lr_scheduler_type``, ``weight_decay``, ``max_grad_norm`` (0 = none),
``adam_beta1``/``adam_beta2``, ``adam_epsilon``, ``optim``) map onto the same fields; the
arguments that do not shape the optimizer (batch sizes, logging, output folders, precision)
are listed as ignored. Any other key is one line.

LR transfer across widths: ``standard`` trains every proxy at the same LR grid; ``mup`` (AdamW
only) is μP relative to the smallest proxy width w0 (Yang et al. 2022, Tensor Programs V,
table 3, with the readout multiplier): at width w, m = w / w0, every hidden matrix (attention
and MLP) gets LR x 1/m and init std x 1/sqrt(m), the logits are multiplied by 1/m, and the
embeddings, norms and biases keep their LR and init.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.scenario.config import read_yaml
from pytest_spikecheck.scenario.sections import SCHEDULES

OPTIMIZERS = ("adamw", "muon")
LR_TRANSFERS = ("standard", "mup")
#: TrainingArguments' scheduler names and the schedule the engine trains for each.
HF_SCHEDULERS = {"cosine": "cosine", "cosine_with_min_lr": "cosine", "constant": "constant", "constant_with_warmup": "constant"}
#: TrainingArguments' optimizer names the recipe's AdamW stands for.
HF_ADAMW = ("adamw_torch", "adamw_torch_fused", "adamw_hf", "adamw")
#: TrainingArguments keys that do not shape the optimizer: read and left aside (listed).
HF_IGNORED = (
    "output_dir",
    "per_device_train_batch_size",
    "per_device_eval_batch_size",
    "gradient_accumulation_steps",
    "num_train_epochs",
    "logging_steps",
    "save_steps",
    "eval_steps",
    "seed",
    "bf16",
    "fp16",
    "tf32",
    "report_to",
    "run_name",
    "save_total_limit",
    "eval_strategy",
    "save_strategy",
    "logging_dir",
    "dataloader_num_workers",
    "gradient_checkpointing",
    "push_to_hub",
    "remove_unused_columns",
)
HF_KEYS = (
    "learning_rate",
    "warmup_ratio",
    "warmup_steps",
    "max_steps",
    "lr_scheduler_type",
    "weight_decay",
    "max_grad_norm",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "optim",
    "lr_transfer",
)


@dataclass(frozen=True)
class Recipe:
    """One optimizer recipe (the module docstring's keys), checked when built."""

    lr: float
    optimizer: str = "adamw"
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    momentum: float = 0.95
    adamw_lr: float | None = None
    warmup: float = 0.05
    schedule: str = "cosine"
    min_lr_ratio: float = 0.1
    grad_clip: float | None = 1.0
    z_loss: float = 0.0
    qk_clip: float | None = None
    lr_transfer: str = "standard"
    source: str = "recipe"
    ignored: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        w = self.source
        if isinstance(self.lr, bool) or not isinstance(self.lr, (int, float)) or not (self.lr > 0 and math.isfinite(self.lr)):
            raise ConfigError(f"{w}: the learning rate must be a number > 0, was {self.lr!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"{w}: unknown optimizer {self.optimizer!r}; preflight studies {', '.join(OPTIMIZERS)}")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"{w}: schedule {self.schedule!r} is not one the engine trains ({', '.join(SCHEDULES)})")
        if self.lr_transfer not in LR_TRANSFERS:
            raise ConfigError(f"{w}: lr_transfer must be one of {', '.join(LR_TRANSFERS)}, was {self.lr_transfer!r}")
        if self.lr_transfer == "mup" and self.optimizer != "adamw":
            raise ConfigError(
                f"{w}: lr_transfer mup is defined for AdamW here; Muon's update is already scaled by "
                f"the matrix shape: use lr_transfer standard with muon"
            )
        if not 0 <= self.warmup < 1:
            raise ConfigError(f"{w}: warmup is a fraction of the steps in [0, 1), was {self.warmup!r}")
        for name in ("grad_clip", "qk_clip", "adamw_lr"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(f"{w}: {name} must be > 0 or null, was {value!r}")
        if self.z_loss < 0:
            raise ConfigError(f"{w}: z_loss must be >= 0, was {self.z_loss!r}")
        object.__setattr__(self, "lr", float(self.lr))
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))

    def scenario_changes(self, steps: int) -> dict[str, Any]:
        """The scenario fields (``Scenario.replace`` keywords) this recipe sets, for a run of ``steps``."""
        changes: dict[str, Any] = {
            "optimizer__name": self.optimizer,
            "optimizer__lr": self.lr,
            "optimizer__betas": self.betas,
            "optimizer__eps": float(self.eps),
            "optimizer__weight_decay": float(self.weight_decay),
            "schedule__name": self.schedule,
            "schedule__warmup_steps": int(round(self.warmup * steps)),
            "schedule__min_lr_ratio": float(self.min_lr_ratio),
        }
        if self.optimizer == "muon":
            changes.update(
                optimizer__momentum=float(self.momentum),
                optimizer__adamw_lr=float(self.adamw_lr if self.adamw_lr is not None else self.lr),
            )
        return changes

    def describe(self) -> str:
        parts = [f"{self.optimizer} lr {self.lr:g}"]
        if self.optimizer == "muon":
            parts.append(f"momentum {self.momentum:g}, AdamW part lr {self.adamw_lr or self.lr:g}")
        else:
            parts.append(f"betas {self.betas[0]:g}/{self.betas[1]:g}, eps {self.eps:g}")
        parts += [
            f"weight decay {self.weight_decay:g}",
            f"{self.schedule} schedule, warmup {self.warmup:g} of the steps",
            f"clip {self.grad_clip:g}" if self.grad_clip is not None else "no clip",
        ]
        if self.z_loss:
            parts.append(f"z-loss {self.z_loss:g}")
        if self.qk_clip is not None:
            parts.append(f"QK-Clip tau {self.qk_clip:g}")
        parts.append(f"LR transfer {self.lr_transfer}")
        return ", ".join(parts)


OWN_KEYS = tuple(f.name for f in fields(Recipe) if f.name not in ("source", "ignored"))


def recipe_from_dict(raw: Any, where: str = "recipe") -> Recipe:
    """A recipe from its YAML mapping (own keys, or TrainingArguments keys; the module docstring)."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: a recipe is a mapping of keys (optimizer, lr, ...), was {type(raw).__name__}")
    if not any(k in raw for k in ("lr", "learning_rate")):
        raise ConfigError(f"{where}: the recipe has no learning rate (lr, or TrainingArguments' learning_rate)")
    if "learning_rate" in raw:
        return _from_training_arguments(raw, where)
    unknown = [k for k in raw if k not in OWN_KEYS]
    if unknown:
        raise ConfigError(
            f"{where}: unknown recipe key {unknown[0]!r}; the keys are {', '.join(OWN_KEYS)} (or "
            f"TrainingArguments' learning_rate, warmup_ratio, ...)"
        )
    values = dict(raw)
    if "betas" in values:
        betas = values["betas"]
        if not isinstance(betas, (list, tuple)) or len(betas) != 2:
            raise ConfigError(f"{where}: betas must be two numbers, was {betas!r}")
    for name in ("lr", "eps", "weight_decay", "momentum", "warmup", "min_lr_ratio", "z_loss"):
        if name in values and (isinstance(values[name], bool) or not isinstance(values[name], (int, float))):
            raise ConfigError(f"{where}: {name} must be a number, was {values[name]!r}")
    return Recipe(**values, source=where)


def _from_training_arguments(raw: Mapping[str, Any], where: str) -> Recipe:
    unknown = [k for k in raw if k not in HF_KEYS + HF_IGNORED]
    if unknown:
        raise ConfigError(
            f"{where}: {unknown[0]!r} is not a TrainingArguments key preflight reads; it reads "
            f"{', '.join(HF_KEYS)} and ignores {len(HF_IGNORED)} others (batch sizes, logging, ...)"
        )
    values: dict[str, Any] = {"lr": raw["learning_rate"]}
    optim = raw.get("optim", "adamw_torch")
    if optim not in HF_ADAMW:
        raise ConfigError(
            f"{where}: unknown optimizer optim={optim!r}; preflight reads AdamW ({', '.join(HF_ADAMW)}) "
            f"from TrainingArguments (for Muon, write the recipe's own keys)"
        )
    scheduler = raw.get("lr_scheduler_type", "linear")
    if scheduler not in HF_SCHEDULERS:
        raise ConfigError(f"{where}: lr_scheduler_type {scheduler!r} is not one the engine trains ({', '.join(HF_SCHEDULERS)})")
    values["schedule"] = HF_SCHEDULERS[scheduler]
    values["min_lr_ratio"] = 0.0 if scheduler == "cosine" else 0.1
    if "warmup_ratio" in raw:
        values["warmup"] = raw["warmup_ratio"]
    elif raw.get("warmup_steps"):
        if not raw.get("max_steps"):
            raise ConfigError(
                f"{where}: warmup_steps {raw['warmup_steps']} needs max_steps to become a fraction of "
                f"the proxies' steps (or give warmup_ratio)"
            )
        values["warmup"] = raw["warmup_steps"] / raw["max_steps"]
    else:
        values["warmup"] = 0.0
    clip = raw.get("max_grad_norm", 1.0)
    values["grad_clip"] = None if clip in (0, None) or (isinstance(clip, float) and math.isinf(clip)) else clip
    values["weight_decay"] = raw.get("weight_decay", 0.0)
    values["betas"] = (raw.get("adam_beta1", 0.9), raw.get("adam_beta2", 0.999))
    values["eps"] = raw.get("adam_epsilon", 1e-8)
    values["lr_transfer"] = raw.get("lr_transfer", "standard")
    return Recipe(**values, source=where, ignored=tuple(k for k in raw if k in HF_IGNORED))


def read_recipe(path: str | Path) -> Recipe:
    """Read a recipe YAML (own keys or TrainingArguments keys)."""
    return recipe_from_dict(read_yaml(Path(path)), str(path))
