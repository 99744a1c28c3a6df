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
    """``diva/*`` metrics: collapse rates of both group kinds, advantage statistics, the variant mix, and (when the
    reward returns ``acc``) accuracy per variant kind and the difficulty of solved and failed questions."""
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
    accuracy = inputs.reward_values("acc")
    if accuracy is not None:
        out.update(variant_accuracy_metrics(np.asarray(accuracy, dtype=np.float64), infos, question_ids))
    return out


def variant_accuracy_metrics(accuracy: np.ndarray, infos: list[dict], question_ids: np.ndarray) -> dict:
    """What the variants do to accuracy and how the difficulty table follows it, for one step's ``R`` responses.

    * ``diva/accuracy/<kind>``: mean accuracy of the responses to prompts of that variant kind, and
      ``diva/accuracy/<kind>/responses`` their number (to average over a run, weighted);
    * ``diva/accuracy_gap/<kind>`` (kinds other than ``original``): over the step's questions that drew the kind,
      the mean of (accuracy on the variant - accuracy on the same question's original): the variant's effect with
      the question held fixed (hints go to hard questions and perturbations to easy ones, so the per-kind means
      alone compare different questions);
    * ``diva/difficulty/solved_mean`` / ``failed_mean``: mean difficulty the step's questions were planned with,
      over those answered correctly by more / less than half of their responses (original and variants), that is
      where the difficulty table had put them from their earlier accuracy.
    """
    kinds = np.array([info.get("variant_kind", "original") for info in infos], dtype=object)
    out: dict[str, float] = {}
    for kind in sorted(set(kinds.tolist())):
        chosen = kinds == kind
        out[f"diva/accuracy/{kind}"] = float(accuracy[chosen].mean())
        out[f"diva/accuracy/{kind}/responses"] = float(chosen.sum())
    gaps: dict[str, list[float]] = {}
    solved, failed = [], []
    planned = np.array([float(info.get("question_difficulty", np.nan)) for info in infos])
    for qid in dict.fromkeys(question_ids.tolist()):
        mine = question_ids == qid
        original = mine & (kinds == "original")
        for kind in set(kinds[mine].tolist()) - {"original"}:
            if original.any():
                gaps.setdefault(kind, []).append(
                    float(accuracy[mine & (kinds == kind)].mean() - accuracy[original].mean())
                )
        alpha = float(accuracy[mine].mean())
        difficulty = float(planned[mine][0])
        if np.isfinite(difficulty) and alpha != 0.5:
            (solved if alpha > 0.5 else failed).append(difficulty)
    out.update({f"diva/accuracy_gap/{kind}": float(np.mean(values)) for kind, values in sorted(gaps.items())})
    if solved:
        out["diva/difficulty/solved_mean"] = float(np.mean(solved))
    if failed:
        out["diva/difficulty/failed_mean"] = float(np.mean(failed))
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
