"""Typed view of the recipe's ``diva:`` config block.

The yaml in ``recipe/diva_grpo/config/diva_grpo.yaml`` is the user-facing source of truth; these
dataclasses give every consumer (advantage, difficulty service, dataset, trainer) the same typed
values and the paper's defaults (docs/algo/diva_grpo.md); each consumer checks the ranges it needs.

Use :func:`diva_config_from` to build a :class:`DivaConfig` from a ``DictConfig``, a plain dict or
``None`` (all defaults). Unknown keys raise, so a typo in an override never passes silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from verl.base_config import BaseConfig


@dataclass
class AdvantageConfig(BaseConfig):
    """Knobs of :func:`verl_ext.algos.compute_diva_advantage` (docs/algo/diva_grpo.md)."""

    k: float = 0.1
    local_coef: float = 1.0
    global_coef: float = 1.0
    batch_norm: bool = True
    rrb: bool = True
    reward_max: float = 1.0
    epsilon: float = 1e-6


@dataclass
class DifficultyConfig(BaseConfig):
    """Per-question difficulty tracking (docs/algo/diva_grpo.md)."""

    # "continuous" (paper: D + eta * (0.5 - alpha)) or "binned" (authors' released five-bin table).
    rule: str = "continuous"
    # "accuracy" (paper: fraction correct) or "reward" (released: mean total reward).
    alpha_source: str = "accuracy"
    eta: float = 4.0
    d_min: float = 1.0
    d_max: float = 9.0
    d_init: float = 5.0
    # Upper bin edges (inclusive) and the difficulty change of each bin, for rule="binned".
    bin_edges: tuple[float, ...] = (0.05, 0.3, 0.5, 0.7, 1.0)
    bin_changes: tuple[float, ...] = (2.0, 1.0, 0.0, -1.0, -2.0)
    # Ray actor name of the service; namespaced by the job so experiments never share state.
    service_name: str = "diva_difficulty"
    max_restarts: int = 3


@dataclass
class VariantConfig(BaseConfig):
    """Variant planning and online image perturbation (docs/algo/diva_grpo.md)."""

    variants_per_question: int = 1
    # "paper" or "released".
    planner: str = "paper"
    seed: int = 0
    # Gaussian-noise sigma range on a 0..1 pixel scale.
    noise_sigma: tuple[float, float] = (0.30, 0.50)
    # Rotation angle range in degrees (the released code wrongly passed the 0.3-0.5 intensity as degrees).
    rotation_degrees: tuple[float, float] = (15.0, 45.0)
    max_pixels: int = 1048576


@dataclass
class DivaConfig(BaseConfig):
    """All DIVA knobs, as found under the recipe's top-level ``diva:`` key."""

    # Run the CPU preflight instead of training (the launcher sets it for DRY_RUN=1).
    dry_run: bool = False
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    difficulty: DifficultyConfig = field(default_factory=DifficultyConfig)
    variants: VariantConfig = field(default_factory=VariantConfig)


def build_config(cls: type, values: Any, path: str):
    """Instantiate the dataclass ``cls`` from a mapping; an unknown key raises ``ValueError`` naming ``path``."""
    if values is None:
        return cls()
    if isinstance(values, cls):
        return values
    if hasattr(values, "items") is False:
        raise ValueError(f"config '{path}' must be a mapping, got {type(values).__name__}")
    known = {f.name: f for f in fields(cls) if not f.name.startswith("_")}
    unknown = sorted(set(values.keys()) - set(known))
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} under '{path}'; valid keys: {sorted(known)}")
    kwargs = {}
    for name, value in values.items():
        f = known[name]
        default = f.default_factory() if callable(f.default_factory) else f.default
        if is_dataclass(default):
            kwargs[name] = build_config(type(default), value, f"{path}.{name}")
        elif isinstance(default, tuple):
            kwargs[name] = tuple(value)
        else:
            kwargs[name] = value
    return cls(**kwargs)


def config_block(cls: type, values: Any, key: str):
    """Typed view of a top-level config block (``DictConfig``, dict or ``None`` for all defaults)."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(values, DictConfig):
        values = OmegaConf.to_container(values, resolve=True)
    return build_config(cls, values, key)


def diva_config_from(values: Any = None) -> DivaConfig:
    """Build a :class:`DivaConfig` from the ``diva:`` block (``DictConfig``, dict or ``None``)."""
    return config_block(DivaConfig, values, "diva")


def parameter_sync_step(full_config: Any) -> int:
    """``trainer.v1.sync.parameter_sync_step`` (default 1): how many advantage computations and actor updates the
    toolkit's trainers make per batch. verl reads it under ``trainer.v1.<trainer_mode>``, and the toolkit's trainers
    answer ``trainer_mode == "sync"`` whatever name they are registered as, so it is the ``sync`` block for them."""
    return full_config.trainer.v1.get("sync", {}).get("parameter_sync_step", 1)
