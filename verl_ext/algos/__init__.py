"""DIVA-GRPO advantage math: pure functions on (B, T) tensors and per-response id arrays."""

from verl_ext.algos.avspo import avspo_collapse_rates, compute_avspo_advantage
from verl_ext.algos.codapo import compute_codapo_advantage
from verl_ext.algos.collapse import advantage_collapse_rate
from verl_ext.algos.diva_advantage import compute_diva_advantage
from verl_ext.algos.durian import compute_durian_advantage, durian_metrics
from verl_ext.algos.mupo import (
    add_diversity_reward,
    compute_mupo_advantage,
    mupo_diversity,
    mupo_lambda,
    mupo_metrics,
    mupo_partition,
)
from verl_ext.algos.pgpo import compute_pgpo_advantage, pgpo_metrics, pgpo_token_weights, visual_dependency

__all__ = [
    "avspo_collapse_rates",
    "compute_avspo_advantage",
    "compute_codapo_advantage",
    "advantage_collapse_rate",
    "compute_diva_advantage",
    "compute_durian_advantage",
    "durian_metrics",
    "add_diversity_reward",
    "compute_mupo_advantage",
    "mupo_diversity",
    "mupo_lambda",
    "mupo_metrics",
    "mupo_partition",
    "compute_pgpo_advantage",
    "pgpo_metrics",
    "pgpo_token_weights",
    "visual_dependency",
]
