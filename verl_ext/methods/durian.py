"""Durian on the toolkit's advantage path: GRPO plus perceptual and reasoning buckets sharing the std.

The math is :func:`verl_ext.algos.compute_durian_advantage`; the prompt's visual entropy comes from the
``visual_entropy`` column ``diva-prep entropy`` adds to the parquet (it reaches ``extra_info``), the confidence
from verl's old log-probs.
"""

from __future__ import annotations

from dataclasses import dataclass

from verl.base_config import BaseConfig

from verl_ext.algos import compute_durian_advantage, durian_metrics
from verl_ext.methods.base import AdvantageInputs, AdvantageMethod, AdvantageResult, knobs_of, register_method
from verl_ext.methods.metrics import advantage_summary

NAME = "durian"


@dataclass
class DurianConfig(BaseConfig):
    """Durian's knobs (docs/algo/durian.md). The paper does not state its main run's weights or bucket count:
    these defaults are its best ablation rows (Table 3 for the weights, Table 2 for the buckets)."""

    # Weight of verl's GRPO term (Eq. 20).
    alpha_ori: float = 0.1
    # Weight of the perceptual term: std pooled over prompts of similar visual entropy (3 quantile buckets).
    alpha_percep: float = 0.2
    # Weight of the reasoning term: std pooled over prompts of similar confidence.
    alpha_reason: float = 0.7
    # Number of equal-frequency confidence buckets (Table 2 sweeps 4..48; best 12).
    reason_buckets: int = 12
    # Added to every std, as verl's GRPO.
    epsilon: float = 1e-6


def compute(inputs: AdvantageInputs, config: DurianConfig) -> AdvantageResult:
    entropy = _visual_entropy(inputs) if config.alpha_percep != 0 else None
    old_log_probs = inputs.tensor("old_log_probs")
    args = (inputs.token_level_rewards, inputs.response_mask, old_log_probs, inputs.index, entropy)
    advantages, returns = compute_durian_advantage(*args, **knobs_of(config))
    stats = durian_metrics(*args, reason_buckets=config.reason_buckets, epsilon=config.epsilon)
    metrics = {f"durian/{key}": float(value) for key, value in stats.items()}
    metrics.update(advantage_summary("durian/advantage", advantages, inputs.response_mask))
    return AdvantageResult(advantages, returns, metrics)


def _visual_entropy(inputs: AdvantageInputs) -> list[float]:
    values = inputs.info_values("visual_entropy", NAME)
    for row, value in enumerate(values):
        if value is None:
            question = inputs.extra_info[row].get("question_id", "?")
            raise ValueError(
                f"durian: response {row} (question {question!r}) has no extra_info.visual_entropy; compute it for "
                "the training parquet with `diva-prep entropy --model <policy> --input F --output F`, or set "
                "durian.alpha_percep=0"
            )
    return [float(value) for value in values]


METHOD = register_method(
    AdvantageMethod(
        name=NAME,
        compute=compute,
        config_cls=DurianConfig,
        needs=frozenset({"old_log_probs", "extra_info"}),
    )
)
