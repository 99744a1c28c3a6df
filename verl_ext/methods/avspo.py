"""AVSPO on the toolkit's advantage path: virtual scores for collapsed groups (:mod:`verl_ext.algos.avspo`).

AVSPO needs only ``uid``, so it also runs through verl's plain dispatcher (``trainer.v1.trainer_mode=sync``),
with the paper's defaults; the toolkit trainer adds its knobs (``avspo:``) and its collapse-rate metrics.
"""

from __future__ import annotations

from dataclasses import dataclass

from verl.base_config import BaseConfig

from verl_ext.algos import avspo_collapse_rates, compute_avspo_advantage
from verl_ext.methods.base import AdvantageInputs, AdvantageMethod, AdvantageResult, knobs_of, register_method
from verl_ext.methods.metrics import advantage_summary

NAME = "avspo"


@dataclass
class AvspoConfig(BaseConfig):
    """Knobs of :func:`verl_ext.algos.compute_avspo_advantage` (docs/algo/avspo.md; issue part 1's reading)."""

    # "paper": K = max(1, min(G, ceil(G * ACR**alpha))) stratified/anchored virtual scores; "released": the
    # authors' shipped rule, one virtual score of the opposite reward.
    mode: str = "paper"
    # Exponent of the batch ACR in the paper's count rule.
    alpha: float = 0.5
    # Largest sequence reward: "all correct" means a group mean >= reward_max / 2.
    reward_max: float = 1.0
    # All-wrong groups: virtual scores at r + anchor * reward_max.
    anchor: float = 0.1
    # A group of >= 2 responses is collapsed when max - min of its scores is at most this.
    collapse_tol: float = 1e-6
    # Added to the std, as verl's GRPO.
    epsilon: float = 1e-6


def compute(inputs: AdvantageInputs, config: AvspoConfig) -> AdvantageResult:
    knobs = knobs_of(config)
    advantages, returns = compute_avspo_advantage(
        inputs.token_level_rewards, inputs.response_mask, inputs.index, **knobs
    )
    rates = avspo_collapse_rates(
        inputs.token_level_rewards,
        inputs.index,
        **{k: v for k, v in knobs.items() if k != "epsilon"},
    )
    metrics = {
        "avspo/collapse_rate/before": rates["acr_before"],
        "avspo/collapse_rate/after": rates["acr_after"],
        "avspo/groups": float(rates["groups"]),
        "avspo/collapsed_groups": float(rates["collapsed"]),
        "avspo/virtual_samples": float(rates["virtual_samples"]),
        "avspo/virtual_per_collapsed": rates["virtual_per_collapsed"],
    }
    metrics.update(advantage_summary("avspo/advantage", advantages, inputs.response_mask))
    return AdvantageResult(advantages, returns, metrics)


def plain_estimator(token_level_rewards, response_mask, index, config=None, **kwargs):
    """``adv_estimator=avspo`` in verl's own trainers: the paper's defaults (verl passes no AVSPO knobs)."""
    return compute_avspo_advantage(token_level_rewards, response_mask, index)


METHOD = register_method(
    AdvantageMethod(name=NAME, compute=compute, config_cls=AvspoConfig, plain_estimator=plain_estimator)
)
