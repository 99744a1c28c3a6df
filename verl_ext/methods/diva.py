"""DIVA-GRPO on the toolkit's advantage path: prompt and question groups, difficulty weighting, RRB.

The math is :func:`verl_ext.algos.compute_diva_advantage`; the knobs are the ``diva:`` block
(:class:`verl_ext.config.DivaConfig`). The difficulty service, the question-block sampler and the variant
dataset are DIVA's own trainer's (``recipe/diva_grpo/trainer.py``), which runs this method.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from verl_ext.algos import advantage_collapse_rate, compute_diva_advantage
from verl_ext.config import DivaConfig
from verl_ext.methods.base import AdvantageInputs, AdvantageMethod, AdvantageResult, knobs_of, register_method
from verl_ext.methods.metrics import advantage_summary

NAME = "diva_grpo"


def compute(inputs: AdvantageInputs, config: DivaConfig) -> AdvantageResult:
    question_ids = np.array(inputs.info_values("question_id", NAME), dtype=object)
    difficulty = np.array([float(d) for d in inputs.info_values("variant_difficulty", NAME)])
    advantages, returns = compute_diva_advantage(
        inputs.token_level_rewards,
        inputs.response_mask,
        inputs.index,
        question_ids,
        difficulty,
        **knobs_of(config.advantage),
    )
    metrics = _metrics(inputs, advantages, question_ids)
    return AdvantageResult(advantages, returns, metrics, per_response={"question_id": question_ids})


def _metrics(inputs: AdvantageInputs, advantages, question_ids: np.ndarray) -> dict:
    """``diva/*`` metrics: collapse rates of both group kinds, advantage statistics, the variant mix."""
    scores = inputs.scores
    infos = inputs.extra_info
    kinds = Counter(info.get("variant_kind", "original") for info in infos)
    total = sum(kinds.values()) or 1
    out = {
        "diva/collapse_rate/local": advantage_collapse_rate(scores, inputs.index),
        "diva/collapse_rate/global": advantage_collapse_rate(scores, question_ids),
        **advantage_summary("diva/advantage", advantages, inputs.response_mask),
        "diva/questions_in_batch": len(set(question_ids.tolist())),
        "diva/variant_fallbacks": sum(1 for info in infos if info.get("variant_fallback")),
    }
    out.update({f"diva/variant_mix/{kind}": count / total for kind, count in sorted(kinds.items())})
    return out


METHOD = register_method(
    AdvantageMethod(
        name=NAME,
        compute=compute,
        config_cls=DivaConfig,
        config_key="diva",
        needs=frozenset({"extra_info", "reward_extra_info"}),
        metric_prefix="diva",
        trainer_mode="diva_grpo",
    )
)
