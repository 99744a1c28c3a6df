"""DIVA-GRPO advantage math: pure functions on (B, T) tensors and per-response id arrays."""

from verl_ext.algos.collapse import advantage_collapse_rate
from verl_ext.algos.diva_advantage import compute_diva_advantage

__all__ = ["advantage_collapse_rate", "compute_diva_advantage"]
