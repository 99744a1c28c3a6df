"""MUPO on the toolkit's advantage path: several groups per prompt and a diversity reward.

Per step, in the shared advantage step (the partition needs all of a prompt's responses, which the per-response
reward workers never see): decode the responses, embed their ``<think>`` spans, partition each prompt's responses
(:func:`verl_ext.algos.mupo_partition`), add ``lambda_t * acc * diversity`` to each sequence score, then GRPO within
each (prompt, group) times the load-balance weight (:func:`verl_ext.algos.compute_mupo_advantage`). The embedding
backend is the ``mupo.embedding`` block's; a failing endpoint fails the step, never falls back to GRPO.
"""

from __future__ import annotations

from verl_ext.algos import compute_mupo_advantage
from verl_ext.methods.base import AdvantageInputs, AdvantageMethod, AdvantageResult, register_method
from verl_ext.methods.metrics import advantage_summary
from verl_ext.mupo import (
    MupoConfig,
    add_sequence_bonus,
    check_embedder,
    check_rollout_n,
    decode_responses,
    mupo_step,
    shared_embedder,
)

NAME = "mupo"


def compute(inputs: AdvantageInputs, config: MupoConfig) -> AdvantageResult:
    acc = inputs.reward_values("acc")
    if acc is None:
        raise KeyError(
            "mupo needs the reward function's 'acc' extra (0/1 accuracy) for its diversity reward; "
            "verl_ext.reward.compute_score returns it"
        )
    texts = decode_responses(inputs.tensor("responses"), inputs.response_mask, inputs.tokenizer)
    scores = inputs.token_level_rewards.sum(-1)
    new_scores, partition, metrics = mupo_step(
        texts,
        scores,
        acc,
        inputs.index,
        inputs.global_step,
        inputs.total_steps,
        config,
        shared_embedder(config.embedding),
    )
    bonus = new_scores - scores
    rewards = add_sequence_bonus(inputs.token_level_rewards, inputs.response_mask, bonus)
    advantages, returns = compute_mupo_advantage(
        rewards, inputs.response_mask, inputs.index, partition, balance_beta=config.balance_beta, epsilon=config.epsilon
    )
    metrics = {f"{NAME}/{key}" if not key.startswith(f"{NAME}/") else key: value for key, value in metrics.items()}
    metrics.update(advantage_summary(f"{NAME}/advantage", advantages, inputs.response_mask))
    return AdvantageResult(advantages, returns, metrics, per_response={"partition": partition, "bonus": bonus})


def check_config(full_config, config: MupoConfig) -> None:
    check_rollout_n(full_config.actor_rollout_ref.rollout.n, config)
    # The embedding backend runs at the first advantage step, after the first rollout: an endpoint that is down or
    # refuses the key fails the trainer's start instead (embeddings are computed in this, the driver's, process).
    check_embedder(config.embedding)


METHOD = register_method(
    AdvantageMethod(
        name=NAME,
        compute=compute,
        config_cls=MupoConfig,
        needs=frozenset({"responses", "reward_extra_info"}),
        check_config=check_config,
    )
)
