"""verl's GRPO on the toolkit's advantage path: the baseline every toolkit method is compared against.

``algorithm.adv_estimator=grpo`` names verl's own estimator; under ``trainer.v1.trainer_mode=toolkit`` the toolkit
trainer runs it through the shared advantage step so that the baseline logs what the other methods log: the
collapse rate of its prompt groups (``grpo/collapse_rate``, DIVA's ``diva/collapse_rate/local`` counterpart, which
``diva-report`` overlays), its training accuracy and its advantage statistics. ``grpo/advantage/zero_fraction``
counts the responses of equal-score groups (:func:`verl_ext.algos.collapse.in_collapsed_group`: verl's float32
z-score leaves them a rounding residue rather than an exact 0). The advantages are verl's
``compute_grpo_outcome_advantage`` itself, with verl's ``epsilon``; ``trainer_mode=sync`` runs verl's own trainer
with the same estimator and none of these metrics.

Only the std-normalised GRPO is served here: ``algorithm.norm_adv_by_std_in_grpo=false`` (Dr. GRPO's mean-only
advantage) is refused at start-up rather than silently normalised.
"""

from __future__ import annotations

from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

from verl_ext.algos import advantage_collapse_rate
from verl_ext.algos.collapse import in_collapsed_group
from verl_ext.methods.base import AdvantageInputs, AdvantageMethod, AdvantageResult, register_method
from verl_ext.methods.metrics import advantage_summary

NAME = "grpo"


def compute(inputs: AdvantageInputs, config: None) -> AdvantageResult:
    advantages, returns = compute_grpo_outcome_advantage(
        inputs.token_level_rewards, inputs.response_mask, inputs.index, norm_adv_by_std_in_grpo=True
    )
    metrics = {"grpo/collapse_rate": advantage_collapse_rate(inputs.scores, inputs.index)}
    # Zero: the responses of equal-score groups. Their advantage is 0 in exact arithmetic, but verl's float32 z-score
    # can leave them a constant residue (-0.0074 for eight scores of 0.1), which an exact == 0 would count as signal.
    zero = in_collapsed_group(inputs.scores, inputs.index)
    metrics.update(advantage_summary("grpo/advantage", advantages, inputs.response_mask, zero=zero))
    return AdvantageResult(advantages, returns, metrics)


def check_config(full_config, method_config) -> None:
    if not full_config.algorithm.get("norm_adv_by_std_in_grpo", True):
        raise ValueError(
            "algorithm.norm_adv_by_std_in_grpo=false: the toolkit trainer's grpo is verl's std-normalised GRPO. "
            "Run the mean-only variant on verl's own trainer (trainer.v1.trainer_mode=sync)."
        )


# verl registers "grpo" itself: register_method leaves verl's registry entry as it is and adds the toolkit's view.
METHOD = register_method(AdvantageMethod(name=NAME, compute=compute, check_config=check_config))
