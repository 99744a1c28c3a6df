"""PGPO on the toolkit's advantage path: each response's advantage reshaped over its tokens by visual dependency.

The math is :func:`verl_ext.algos.compute_pgpo_advantage`. Its extra input, ``blind_log_probs`` (the old policy's
log-probs with the visual tokens hidden), is written by one more actor pass after verl's old log-probs
(:func:`verl_ext.pgpo.compute_blind_log_probs`, the method's ``pre_advantage``), run by verl's actor worker plus
``compute_blind_log_prob`` (:class:`verl_ext.pgpo.PgpoActorRolloutRefWorker`, put in the trainer's
``role_worker_mapping`` by the method's ``actor_workers`` hook).
"""

from __future__ import annotations

from dataclasses import dataclass

from verl.base_config import BaseConfig

from verl_ext.algos import advantage_collapse_rate, compute_pgpo_advantage, pgpo_metrics, pgpo_token_weights
from verl_ext.methods.base import AdvantageInputs, AdvantageMethod, AdvantageResult, knobs_of, register_method
from verl_ext.methods.metrics import advantage_summary

NAME = "pgpo"


@dataclass
class PgpoConfig(BaseConfig):
    """PGPO's knobs (arXiv 2604.01840, Eqs. 1-8; docs/algo/pgpo.md)."""

    # Gate threshold on the normalised dependency I: below it tokens are damped (w = I / tau), above amplified.
    tau: float = 0.4
    # Amplification above tau: w = 1 + beta * (I - tau) / (1 - tau).
    beta: float = 2.0
    # Clamp of the k3 dependency estimate S_t (a huge blind/sighted log-ratio gives kl_max, never NaN).
    kl_max: float = 10.0
    # verl's GRPO std epsilon, and the weights' epsilon.
    epsilon: float = 1e-6


def compute(inputs: AdvantageInputs, config: PgpoConfig) -> AdvantageResult:
    old, blind = inputs.tensor("old_log_probs"), inputs.tensor("blind_log_probs")
    knobs = knobs_of(config)
    advantages, returns = compute_pgpo_advantage(
        inputs.token_level_rewards, inputs.response_mask, inputs.index, old, blind, **knobs
    )
    weights = pgpo_token_weights(old, blind, inputs.response_mask, **knobs)
    metrics = pgpo_metrics(old, blind, inputs.response_mask, weights, **knobs)
    metrics["pgpo/collapse_rate"] = advantage_collapse_rate(inputs.scores, inputs.index)
    metrics.update(advantage_summary("pgpo/advantage", advantages, inputs.response_mask))
    return AdvantageResult(advantages, returns, metrics)


def check_config(full_config, config: PgpoConfig) -> None:
    correction = full_config.algorithm.get("rollout_correction", None)
    if correction is not None and correction.get("bypass_mode", False):
        raise ValueError(
            "pgpo needs the sighted and blind log-probs from the same model: algorithm.rollout_correction.bypass_mode"
            "=true makes the sighted ones the rollout server's while the blind pass runs the FSDP actor, and their "
            "numeric mismatch would count as visual dependency. Leave bypass_mode false with pgpo."
        )


def blind_pass(trainer, batch, metrics, config):
    from verl_ext.pgpo import compute_blind_log_probs

    return compute_blind_log_probs(trainer, batch, metrics, config)


def actor_workers(role_worker_mapping: dict) -> None:
    from verl_ext.pgpo import use_blind_pass_worker

    use_blind_pass_worker(role_worker_mapping)


METHOD = register_method(
    AdvantageMethod(
        name=NAME,
        compute=compute,
        config_cls=PgpoConfig,
        needs=frozenset({"old_log_probs", "blind_log_probs"}),
        check_config=check_config,
        pre_advantage=blind_pass,
        actor_workers=actor_workers,
    )
)
