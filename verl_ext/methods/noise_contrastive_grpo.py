"""NC-GRPO (``noise_contrastive_grpo``) on the toolkit's advantage path: verl's GRPO over the whole group.

The method's change is in the rollout (:mod:`verl_ext.nc_grpo`): a seeded ``noisy_fraction`` of each prompt's
responses branch from a displaced prompt (by default the residual stream entering the last decoder layer at every
prompt position, in the prefill; ``target=final_hidden``: the final hidden state at the prompt's last position).
The trainer sees plain GRPO over both halves pooled: the objective is untouched and the actor's ``old_log_probs``
are recomputed without noise (as verl does for every method). The noisy responses were sampled by the displaced
policy: the method's launchers set verl's rollout correction (:data:`ROLLOUT_IS`), which weighs each response's loss
by how likely the clean policy is to draw it (``rollout_correction_overrides``; with ``rollout_is=null`` the noisy
half is trained on as the clean policy's own samples), and the method logs those weights over the displaced tokens
and the others (``noise_contrastive_grpo/rollout_is_weight/*``). It checks that each group holds exactly
``noisy_fraction * n`` flagged responses (the flag comes with each trajectory's ``extra_fields``) and logs the noisy
fraction, each half's accuracy and score, the collapse rate, the advantage statistics
(``noise_contrastive_grpo/advantage/zero_fraction``), the branch metrics
(``noise_contrastive_grpo/branch/{rate,first_token,first_difference_mean,probed}``: how many noisy responses
differ from the clean response of their own seed, :mod:`verl_ext.nc_grpo.branching`; a console warning when almost
none do), and the rollout-vs-actor log-prob gap of the displaced tokens apart from every other token
(``noise_contrastive_grpo/rollout_logprob_gap/{displaced_tokens,other_tokens}``: how far off the clean policy the
noisy responses were sampled, and the weight-sync check on the rest).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

from verl.base_config import BaseConfig
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

from verl_ext.algos import advantage_collapse_rate
from verl_ext.algos.collapse import in_collapsed_group
from verl_ext.algos.noise_contrastive_grpo import (
    check_group_flags,
    displaced_tokens,
    half_metrics,
    is_weight_metrics,
    rollout_gaps,
)
from verl_ext.methods.base import AdvantageInputs, AdvantageMethod, AdvantageResult, register_method
from verl_ext.methods.metrics import advantage_summary
from verl_ext.nc_grpo.branching import FIRST_DIFFERENCE_FIELD, NOT_PROBED, branch_metrics, branch_warning
from verl_ext.nc_grpo.noise import (
    AGENT_LOOP_NAME,
    CPU_NOISE_WORKER_EXTENSION,
    FLAG_FIELD,
    LAYER_INPUT,
    NOISE_WORKER_EXTENSION,
    TARGETS,
    noisy_count,
    resolve_layer,
)

NAME = "noise_contrastive_grpo"

# verl's rollout correction (``algorithm.rollout_correction``, verl/trainer/ppo/rollout_corr_helper.py) that the
# method's launchers set (docs/algo/noise_contrastive_grpo.md, "Fidelity"; issue 44). The noisy half is sampled by
# the displaced policy, whose log-probs the rollout returns (vLLM and hf_cpu alike), and trained by the clean one:
# each response's loss is weighted by min(prod_t pi_old(y_t) / pi_rollout(y_t), 2), computed once per step from
# the clean actor's old_log_probs; the clean half's weights are 1 up to weight-sync rounding. Not in the recipe's
# algorithm block, which every method shares (it would reweigh the other methods' vLLM rounding too).
ROLLOUT_IS = "sequence"
ROLLOUT_IS_THRESHOLD = 2.0


def rollout_correction_overrides(rollout_is: str | None = ROLLOUT_IS, threshold: float = ROLLOUT_IS_THRESHOLD):
    """The Hydra overrides of the method's rollout correction (``rollout_is=None``: none)."""
    level = "null" if rollout_is is None else rollout_is
    return [
        f"algorithm.rollout_correction.rollout_is={level}",
        f"algorithm.rollout_correction.rollout_is_threshold={threshold}",
    ]


@dataclass
class NoiseContrastiveConfig(BaseConfig):
    """NC-GRPO's knobs (docs/algo/noise_contrastive_grpo.md). The paper (abstract only) states none of their values."""

    # c in h~_p = h_p + c * (||h_p|| / sqrt(d)) * xi_p. ||xi_p|| ~ sqrt(d), so each displacement's norm is
    # ~ c * ||h_p||: c is the relative size of the kick. Not stated by the paper; chosen by measured branching
    # (docs/algo/noise_contrastive_grpo.md, "Choosing the reading and the scale"): on the tiny swatch model, with
    # the last layer's input displaced, c = 2 branches most noisy rollouts (63-74%) and halves the zero-advantage
    # fraction while the noisy half stays within 10 points of its undisplaced accuracy; c <= 0.5 branches <= 9%,
    # c = 4 replaces the policy by noise (accuracy -15 to -20 points).
    noise_scale: float = 2.0
    # Share of each prompt's rollout.n responses that are noised (a seeded choice per prompt and step);
    # noisy_fraction * n must be whole (0.5: n even).
    noisy_fraction: float = 0.5
    # Where the noise goes, in the prefill only. "layer_input": the residual stream entering decoder layer `layer`,
    # at every prompt position (each its own xi_p); that layer's keys and values of the prompt are displaced, so
    # every decoding step attends to them and a rollout can branch at any token. "final_hidden": the final hidden
    # state (after the last decoder layer and its norm) at the prompt's last position; only the first generated
    # token's distribution moves (when the format forces that token, no rollout changes).
    target: str = LAYER_INPUT
    # The decoder layer of target=layer_input: 0-based, negative counts from the end (-1: the last layer, the
    # paper's "last hidden layer"). Ignored by final_hidden.
    layer: int = -1
    # Each noisy request is also sent without its noise (the same seed), for at most this many tokens, to log how
    # many noisy rollouts branch (branch/rate, branch/first_token, branch/first_difference_mean). 0: no probe.
    branch_probe_tokens: int = 32


def compute(inputs: AdvantageInputs, config: NoiseContrastiveConfig) -> AdvantageResult:
    flags = _flags(inputs)
    check_group_flags(flags, inputs.index, config.noisy_fraction)
    advantages, returns = compute_grpo_outcome_advantage(
        inputs.token_level_rewards, inputs.response_mask, inputs.index, norm_adv_by_std_in_grpo=True
    )
    scores = inputs.scores
    accuracy = inputs.reward_values("acc")
    metrics = {f"{NAME}/{key}": value for key, value in half_metrics(scores, flags, accuracy).items()}
    displaced = displaced_tokens(inputs.response_mask, flags, config.target)
    gaps = rollout_gaps(
        inputs.tensor("rollout_log_probs"), inputs.tensor("old_log_probs"), inputs.response_mask, displaced
    )
    metrics.update({f"{NAME}/rollout_logprob_gap/{key}": value for key, value in gaps.items()})
    if "rollout_is_weights" in inputs.tensors:  # verl's rollout correction is on: the weights the actor applies
        weights = is_weight_metrics(inputs.tensors["rollout_is_weights"], inputs.response_mask, displaced)
        metrics.update({f"{NAME}/rollout_is_weight/{key}": value for key, value in weights.items()})
    branches = branch_metrics(
        [fields.get(FIRST_DIFFERENCE_FIELD, NOT_PROBED) for fields in inputs.rollout_fields], flags
    )
    metrics.update({f"{NAME}/{key}": value for key, value in branches.items()})
    warning = branch_warning(branches, config.branch_probe_tokens, f"step {inputs.global_step}", config.target)
    if warning:
        print(warning, flush=True)
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


def check_knobs(knobs: NoiseContrastiveConfig, num_layers: int | None = None) -> None:
    """``ValueError`` naming the key for a knob out of range (``num_layers``: the model's, when known)."""
    if not (math.isfinite(knobs.noise_scale) and knobs.noise_scale >= 0):
        raise ValueError(f"{NAME}.noise_scale={knobs.noise_scale}: must be finite and >= 0")
    if knobs.target not in TARGETS:
        hint = " (the former layer: final is target: final_hidden)" if knobs.target == "final" else ""
        raise ValueError(f"{NAME}.target={knobs.target!r}: the readings implemented are {list(TARGETS)}{hint}")
    if isinstance(knobs.layer, bool) or not isinstance(knobs.layer, int):
        hint = "; the first-token reading is target: final_hidden" if knobs.layer == "final" else ""
        raise ValueError(f"{NAME}.layer={knobs.layer!r}: a decoder layer index (int; -1 is the last){hint}")
    if num_layers is not None:
        resolve_layer(knobs.layer, num_layers)
    if isinstance(knobs.branch_probe_tokens, bool) or not (
        isinstance(knobs.branch_probe_tokens, int) and knobs.branch_probe_tokens >= 0
    ):
        raise ValueError(f"{NAME}.branch_probe_tokens={knobs.branch_probe_tokens!r}: a token count >= 0 (0: no probe)")


def _num_layers(model_path: str) -> int | None:
    """The decoder layers of the model at ``model_path`` when it is a local folder (its config.json), else ``None``."""
    path = os.path.join(os.path.expanduser(str(model_path)), "config.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        config = json.load(f)
    text = config.get("text_config") or config
    layers = text.get("num_hidden_layers", config.get("num_hidden_layers"))
    return int(layers) if layers is not None else None


def check_config(full_config, method_config: NoiseContrastiveConfig) -> None:
    if not full_config.algorithm.get("norm_adv_by_std_in_grpo", True):
        raise ValueError(f"algorithm.norm_adv_by_std_in_grpo=false: {NAME}'s advantage is verl's std-normalised GRPO")
    model_path = ((full_config.actor_rollout_ref.get("model", {}) or {}).get("path")) or ""
    check_knobs(method_config, _num_layers(model_path) if model_path else None)
    rollout = full_config.actor_rollout_ref.rollout
    noisy_count(int(rollout.n), method_config.noisy_fraction)
    if not rollout.get("calculate_log_probs", True):
        raise ValueError(
            f"{NAME} logs the rollout-vs-actor log-prob gap of its displaced tokens: keep "
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
                f"{NAME} on vLLM: set actor_rollout_ref.rollout.enable_prefix_caching=false, so that no displaced "
                "prefill (its keys and values) is shared with another request"
            )
        if method_config.target == LAYER_INPUT and not rollout.get("enforce_eager", False):
            raise ValueError(
                f"{NAME}.target={LAYER_INPUT} on vLLM: set actor_rollout_ref.rollout.enforce_eager=true (the "
                "method's launcher does). The noise is added by a hook inside the model's forward, which vLLM's "
                "torch.compile (traced once, run without guards) and CUDA graphs (replayed kernels) would not run "
                "per step: the flagged requests would be sampled clean"
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
