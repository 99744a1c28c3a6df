"""Difficulty update rules: pure functions of (difficulty, alpha), vectorised over questions.

``alpha`` is the question's success rate in one step, in [0, 1] (see :mod:`verl_ext.difficulty.alphas`).
A high difficulty means a hard question, so a question answered well gets easier (D goes down).

- ``continuous`` (paper, the default): ``D_new = clip(D + eta * (0.5 - alpha), d_min, d_max)``.
- ``binned`` (the authors' released code): ``D_new = clip(D + change[bin(alpha)], d_min, d_max)`` where
  ``bin(alpha)`` is the first bin whose inclusive upper edge is >= alpha. Released table:
  ``[0, .05] +2, (.05, .3] +1, (.3, .5] 0, (.5, .7] -1, (.7, 1] -2`` (an edge value falls in the lower bin).

Shapes: ``difficulty`` and ``alpha`` are float64 arrays of shape ``(Q,)``; results have shape ``(Q,)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

RULES = ("continuous", "binned")

UpdateRule = Callable[[np.ndarray, np.ndarray], np.ndarray]


def continuous_update(difficulty: np.ndarray, alpha: np.ndarray, eta: float, d_min: float, d_max: float) -> np.ndarray:
    """``clip(D + eta * (0.5 - alpha), d_min, d_max)``, elementwise over shape ``(Q,)``."""
    difficulty = np.asarray(difficulty, dtype=np.float64)
    alpha = np.asarray(alpha, dtype=np.float64)
    return np.clip(difficulty + eta * (0.5 - alpha), d_min, d_max)


def bin_index(alpha: np.ndarray, bin_edges: Sequence[float]) -> np.ndarray:
    """Index of the bin of each alpha: the first inclusive upper edge ``>= alpha``.

    ``np.searchsorted(edges, alpha, side="left")`` returns exactly that index, so an alpha equal to an
    edge lands in the lower bin, as in the released code.
    """
    return np.searchsorted(np.asarray(bin_edges, dtype=np.float64), np.asarray(alpha, dtype=np.float64), side="left")


def binned_update(
    difficulty: np.ndarray,
    alpha: np.ndarray,
    bin_edges: Sequence[float],
    bin_changes: Sequence[float],
    d_min: float,
    d_max: float,
) -> np.ndarray:
    """``clip(D + bin_changes[bin_index(alpha)], d_min, d_max)``, elementwise over shape ``(Q,)``."""
    difficulty = np.asarray(difficulty, dtype=np.float64)
    change = np.asarray(bin_changes, dtype=np.float64)[bin_index(alpha, bin_edges)]
    return np.clip(difficulty + change, d_min, d_max)


def validate_rule_config(config) -> None:
    """Check the rule knobs of a :class:`~verl_ext.config.DifficultyConfig`; raise ``ValueError`` naming the key."""
    if config.rule not in RULES:
        raise ValueError(f"diva.difficulty.rule must be one of {RULES}, got {config.rule!r}")
    if config.alpha_source not in ("accuracy", "reward"):
        raise ValueError(f"diva.difficulty.alpha_source must be 'accuracy' or 'reward', got {config.alpha_source!r}")
    for key in ("eta", "d_min", "d_max", "d_init"):
        if not np.isfinite(float(getattr(config, key))):
            raise ValueError(f"diva.difficulty.{key} must be finite, got {getattr(config, key)!r}")
    if not config.d_min <= config.d_init <= config.d_max:
        raise ValueError(
            f"diva.difficulty needs d_min <= d_init <= d_max, got d_min={config.d_min}, d_init={config.d_init}, "
            f"d_max={config.d_max}"
        )
    if config.rule == "binned":
        edges, changes = tuple(config.bin_edges), tuple(config.bin_changes)
        if len(edges) == 0 or len(edges) != len(changes):
            raise ValueError(
                f"diva.difficulty.bin_edges ({len(edges)} values) and bin_changes ({len(changes)} values) must be "
                "non-empty and of equal length: one change per bin"
            )
        if any(b <= a for a, b in zip(edges, edges[1:], strict=False)):
            raise ValueError(f"diva.difficulty.bin_edges must be strictly increasing, got {list(edges)}")
        if edges[-1] < 1.0:
            raise ValueError(
                f"diva.difficulty.bin_edges must end at 1.0 or above so every alpha in [0, 1] has a bin, "
                f"got last edge {edges[-1]}"
            )


def make_update_rule(config) -> UpdateRule:
    """The update rule selected by ``config.rule``, with its knobs bound: ``rule(difficulty, alpha) -> new``."""
    validate_rule_config(config)
    d_min, d_max = float(config.d_min), float(config.d_max)
    if config.rule == "continuous":
        eta = float(config.eta)
        return lambda difficulty, alpha: continuous_update(difficulty, alpha, eta, d_min, d_max)
    edges, changes = tuple(map(float, config.bin_edges)), tuple(map(float, config.bin_changes))
    return lambda difficulty, alpha: binned_update(difficulty, alpha, edges, changes, d_min, d_max)
