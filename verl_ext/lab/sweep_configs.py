"""The seed sweep's configurations: each a method, DIVA-GRPO's additions it removes, extra overrides and its response
budget (:data:`CONFIGS`, in the order they run), GRPO the baseline every difference is paired with by seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

VAL_SAMPLES = 4  # the paper's "mean over k samples per question", k small enough for two CPU cores


@dataclass(frozen=True)
class SweepConfig:
    """One configuration: the method, DIVA-GRPO's additions removed, extra overrides, and the responses per question
    as a multiple of the comparison's ``2 n``."""

    method: str
    without: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()
    budget: int = 1
    note: str = ""
    tags: tuple[str, ...] = field(default=())


_RC = "algorithm.rollout_correction"  # verl 0.9.1's rollout correction (verl/trainer/ppo/rollout_corr_helper.py)

# In the order they run (each for every seed before the next), most informative first: GRPO, DIVA-GRPO with the
# paper's defaults, DIVA-GRPO without each addition, GRPO with twice the responses (the slowest run), the authors'
# released options, the toolkit's methods.
CONFIGS: dict[str, SweepConfig] = {
    "grpo": SweepConfig("grpo", note="verl's GRPO, 2n responses per question (the baseline)"),
    "diva_grpo": SweepConfig("diva_grpo", note="DIVA-GRPO, the paper's defaults"),
    "diva_no_variants": SweepConfig("diva_grpo", without=("variants",), note="no variants: 2n on the original"),
    "diva_no_global_stream": SweepConfig("diva_grpo", without=("global_stream",), note="global_coef=0"),
    "diva_no_difficulty_weighting": SweepConfig("diva_grpo", without=("difficulty_weighting",), note="k=0"),
    "diva_no_batch_norm": SweepConfig("diva_grpo", without=("batch_norm",), note="batch_norm=false"),
    "diva_no_rrb": SweepConfig("diva_grpo", without=("rrb",), note="rrb=false"),
    "grpo_2x": SweepConfig("grpo", budget=2, note="verl's GRPO with twice the responses per question (4n)"),
    "diva_binned_rule": SweepConfig(
        "diva_grpo",
        extra=("diva.difficulty.rule=binned", "diva.difficulty.alpha_source=reward"),
        note="the released difficulty update: five bins of the mean reward",
    ),
    "diva_released_planner": SweepConfig(
        "diva_grpo", extra=("diva.variants.planner=released",), note="the released variant planner"
    ),
    "avspo": SweepConfig("avspo"),
    "codapo": SweepConfig("codapo"),
    "durian": SweepConfig("durian"),
    "pgpo": SweepConfig("pgpo"),
    "mupo": SweepConfig("mupo"),
    "noise_contrastive_grpo": SweepConfig(
        "noise_contrastive_grpo",
        extra=("noise_contrastive_grpo.noise_scale=2.0", f"{_RC}.rollout_is=null"),
        note="NC-GRPO, c=2, no rollout correction (noisy half trained as the clean policy's own samples)",
    ),
    # NC-GRPO's scale and verl's rollout correction (issue 44), each pinned here so that a configuration keeps its
    # meaning when the method's defaults change. The correction weighs each token by old_log_probs (the clean
    # actor) against rollout_log_probs (the policy that sampled it: the displaced one for the noisy half, hf_cpu and
    # vLLM alike), truncated at 2; the clean half's weights are 1 up to weight-sync rounding.
    "nc_grpo_rc": SweepConfig(
        "noise_contrastive_grpo",
        extra=(
            "noise_contrastive_grpo.noise_scale=2.0",
            f"{_RC}.rollout_is=sequence",
            f"{_RC}.rollout_is_threshold=2.0",
        ),
        note="NC-GRPO, c=2, verl's sequence-level truncated IS (min(prod pi_old/pi_rollout, 2))",
    ),
    "nc_grpo_rc_token": SweepConfig(
        "noise_contrastive_grpo",
        extra=("noise_contrastive_grpo.noise_scale=2.0", f"{_RC}.rollout_is=token", f"{_RC}.rollout_is_threshold=2.0"),
        note="NC-GRPO, c=2, verl's token-level truncated IS (min(pi_old/pi_rollout, 2) per token)",
    ),
    "nc_grpo_c1": SweepConfig(
        "noise_contrastive_grpo",
        extra=("noise_contrastive_grpo.noise_scale=1.0", f"{_RC}.rollout_is=null"),
        note="NC-GRPO, c=1, no rollout correction",
    ),
    "nc_grpo_c05": SweepConfig(
        "noise_contrastive_grpo",
        extra=("noise_contrastive_grpo.noise_scale=0.5", f"{_RC}.rollout_is=null"),
        note="NC-GRPO, c=0.5, no rollout correction",
    ),
    "nc_grpo_rc_c1": SweepConfig(
        "noise_contrastive_grpo",
        extra=(
            "noise_contrastive_grpo.noise_scale=1.0",
            f"{_RC}.rollout_is=sequence",
            f"{_RC}.rollout_is_threshold=2.0",
        ),
        note="NC-GRPO, c=1, verl's sequence-level truncated IS",
    ),
    "nc_grpo_rc_c05": SweepConfig(
        "noise_contrastive_grpo",
        extra=(
            "noise_contrastive_grpo.noise_scale=0.5",
            f"{_RC}.rollout_is=sequence",
            f"{_RC}.rollout_is_threshold=2.0",
        ),
        note="NC-GRPO, c=0.5, verl's sequence-level truncated IS",
    ),
}
BASELINE = "grpo"
