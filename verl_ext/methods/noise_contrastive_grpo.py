"""NC-GRPO (``noise_contrastive_grpo``) on the toolkit's advantage path: verl's GRPO over the whole group.

The method's change is in the rollout (:mod:`verl_ext.nc_grpo`): a seeded ``noisy_fraction`` of each prompt's
responses branch from a displaced final hidden state at the prompt's last position. The trainer sees plain GRPO
over both halves pooled (the objective is untouched; the actor's ``old_log_probs`` are recomputed without noise,
as verl does for every method), checks that each group holds exactly ``noisy_fraction * n`` flagged responses
(the flag comes with each trajectory's ``extra_fields``), and logs the noisy fraction, each half's accuracy and
score, the collapse rate, the advantage statistics (``noise_contrastive_grpo/advantage/zero_fraction``) and the
rollout-vs-actor log-prob gap of the noisy first tokens apart from every other token
(``noise_contrastive_grpo/rollout_logprob_gap/{noisy_first_token,other_tokens}``: how far off-policy the branch
point is, and the weight-sync check on the rest).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from verl.base_config import BaseConfig
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

from verl_ext.algos import advantage_collapse_rate
from verl_ext.algos.collapse import in_collapsed_group
from verl_ext.algos.noise_contrastive_grpo import check_group_flags, half_metrics, rollout_gaps
from verl_ext.methods.base import AdvantageInputs, AdvantageMethod, AdvantageResult, register_method
from verl_ext.methods.metrics import advantage_summary
from verl_ext.nc_grpo.noise import (
    AGENT_LOOP_NAME,
    CPU_NOISE_WORKER_EXTENSION,
    FLAG_FIELD,
    LAYERS,
    NOISE_WORKER_EXTENSION,
    noisy_count,
)

NAME = "noise_contrastive_grpo"


@dataclass
class NoiseContrastiveConfig(BaseConfig):
    """NC-GRPO's knobs (METHODS.md section 6). The paper (abstract only) states none of their values."""

    # c in h~ = h + c * (||h|| / sqrt(d)) * xi. ||xi|| ~ sqrt(d), so the displacement's norm is ~ c * ||h||: c is the
    # relative size of the kick. Not stated by the paper; 0.1 displaces the departure state by a tenth of its own
    # norm, which moves the first-token logits by about a tenth of their spread (README, NC-GRPO), diversifying the
    # branch point without replacing it by noise.
    noise_scale: float = 0.1
    # Share of each prompt's rollout.n responses that are noised (a seeded choice per prompt and step);
    # noisy_fraction * n must be whole (0.5: n even).
    noisy_fraction: float = 0.5
    # Where the noise goes: "final", the final hidden state after the last decoder layer and its norm (the LM
    # head's input) at the prompt's last position, in the prefill only. The only layer implemented.
    layer: str = "final"


def compute(inputs: AdvantageInputs, config: NoiseContrastiveConfig) -> AdvantageResult:
    flags = _flags(inputs)
    check_group_flags(flags, inputs.index, config.noisy_fraction)
    advantages, returns = compute_grpo_outcome_advantage(
        inputs.token_level_rewards, inputs.response_mask, inputs.index, norm_adv_by_std_in_grpo=True
    )
    scores = inputs.scores
    accuracy = inputs.reward_values("acc")
    metrics = {f"{NAME}/{key}": value for key, value in half_metrics(scores, flags, accuracy).items()}
    gaps = rollout_gaps(inputs.tensor("rollout_log_probs"), inputs.tensor("old_log_probs"), inputs.response_mask, flags)
    metrics.update({f"{NAME}/rollout_logprob_gap/{key}": value for key, value in gaps.items()})
    metrics[f"{NAME}/collapse_rate"] = advantage_collapse_rate(scores, inputs.index)
    # verl's GRPO: equal-score groups count as zero whatever its float32 rounding leaves (as the grpo baseline).
    zero = in_collapsed_group(scores, inputs.index)
    metrics.update(advantage_summary(f"{NAME}/advantage", advantages, inputs.response_mask, zero=zero))
    return AdvantageResult(advantages, returns, metrics, per_response={"noisy": flags})


def _flags(inputs: AdvantageInputs) -> list[bool]:
    if inputs.rollout_fields is None:
        raise KeyError(f"{NAME} needs rollout_fields, which its AdvantageMethod does not declare")
    flags = []
    for row, fields in enumerate(inputs.rollout_fields):
        if not isinstance(fields, dict) or FLAG_FIELD not in fields:
            raise KeyError(
                f"{NAME}: response {row} carries no {FLAG_FIELD!r} in its extra_fields: the rollout's agent loop must "
                f"be {AGENT_LOOP_NAME} (actor_rollout_ref.rollout.agent.default_agent_loop; "
                f"run_scripts/qwen25vl7b_{NAME}.sh sets it)"
            )
        flags.append(bool(fields[FLAG_FIELD]))
    return flags


def check_config(full_config, method_config: NoiseContrastiveConfig) -> None:
    if not full_config.algorithm.get("norm_adv_by_std_in_grpo", True):
        raise ValueError(f"algorithm.norm_adv_by_std_in_grpo=false: {NAME}'s advantage is verl's std-normalised GRPO")
    if not (math.isfinite(method_config.noise_scale) and method_config.noise_scale >= 0):
        raise ValueError(f"{NAME}.noise_scale={method_config.noise_scale}: must be finite and >= 0")
    if method_config.layer not in LAYERS:
        raise ValueError(f"{NAME}.layer={method_config.layer!r}: implemented layers are {list(LAYERS)}")
    rollout = full_config.actor_rollout_ref.rollout
    noisy_count(int(rollout.n), method_config.noisy_fraction)
    if not rollout.get("calculate_log_probs", True):
        raise ValueError(
            f"{NAME} logs the rollout-vs-actor log-prob gap of its noisy first tokens: keep "
            "actor_rollout_ref.rollout.calculate_log_probs=true (verl's default)"
        )
    agent = rollout.get("agent", {}) or {}
    if agent.get("default_agent_loop") != AGENT_LOOP_NAME:
        raise ValueError(
            f"{NAME} flags its noisy responses in the agent loop: set actor_rollout_ref.rollout.agent."
            f"default_agent_loop={AGENT_LOOP_NAME} (got {agent.get('default_agent_loop')!r})"
        )
    name = rollout.get("name", "vllm")
    if name == "vllm":
        engine = ((rollout.get("engine_kwargs", {}) or {}).get("vllm", {}) or {}).get("worker_extension_cls")
        if engine not in (NOISE_WORKER_EXTENSION, CPU_NOISE_WORKER_EXTENSION):
            raise ValueError(
                f"{NAME} on vLLM needs its worker extension, which applies the noise: set "
                f"actor_rollout_ref.rollout.engine_kwargs.vllm.worker_extension_cls={NOISE_WORKER_EXTENSION} "
                f"(vLLM's CPU build: {CPU_NOISE_WORKER_EXTENSION}); got {engine!r}"
            )
        if rollout.get("enable_prefix_caching", True):
            raise ValueError(
                f"{NAME} on vLLM: set actor_rollout_ref.rollout.enable_prefix_caching=false, so that no noisy prefill "
                "is shared with a clean request"
            )
    elif name != "hf_cpu":
        raise ValueError(f"{NAME} applies its noise in the vllm and hf_cpu rollouts only, not {name!r}")


METHOD = register_method(
    AdvantageMethod(
        name=NAME,
        compute=compute,
        config_cls=NoiseContrastiveConfig,
        needs=frozenset({"rollout_fields", "reward_extra_info", "rollout_log_probs", "old_log_probs"}),
        check_config=check_config,
    )
)
