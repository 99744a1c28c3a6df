"""CoDaPO on the toolkit's advantage path: confidence- and difficulty-weighted GRPO plus resampling.

The weighting is :func:`verl_ext.algos.compute_codapo_advantage` (old log-probs, the reward's ``acc``); the
resampling is :class:`verl_ext.data.codapo_resampler.CoDaPOResampler`, driven through the toolkit trainer's batch
planner hook: every training batch is rolled out twice, fresh from verl's dataloader and then as a resampled pass
of its highest-weight questions; the planner's state is saved with each checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from verl.base_config import BaseConfig

from verl_ext.algos import advantage_collapse_rate, compute_codapo_advantage
from verl_ext.config import parameter_sync_step
from verl_ext.data.codapo_resampler import CoDaPOResampler
from verl_ext.methods.base import AdvantageInputs, AdvantageMethod, AdvantageResult, register_method
from verl_ext.methods.metrics import advantage_summary, summary

NAME = "codapo"


@dataclass
class CodapoConfig(BaseConfig):
    """CoDaPO's knobs (docs/algo/codapo.md; the authors' code's defaults)."""

    # Floor added to confidence x V_d, so every group keeps some signal: w in [offset, 1 + offset].
    weight_offset: float = 0.1
    # Added to the group std, as verl's GRPO.
    epsilon: float = 1e-6
    # Use every training batch twice, the second time only for its highest-weight questions (paper: on).
    resample: bool = True
    # Questions whose weight is at least this quantile of the batch's weights are resampled.
    percentile: float = 0.75
    # Copies of each kept question in the resampled pass (cycled until the batch is full).
    repeat_count: int = 4


def compute(inputs: AdvantageInputs, config: CodapoConfig) -> AdvantageResult:
    acc = inputs.reward_values("acc")
    advantages, returns, weights = compute_codapo_advantage(
        inputs.token_level_rewards,
        inputs.response_mask,
        inputs.tensor("old_log_probs"),
        inputs.index,
        None if acc is None else [float(a) for a in acc],
        weight_offset=config.weight_offset,
        epsilon=config.epsilon,
    )
    # One weight per prompt group for the statistics (weights are repeated on the group's responses).
    _, first = np.unique(np.asarray(inputs.index, dtype=object).astype(str), return_index=True)
    metrics = {"codapo/collapse_rate": advantage_collapse_rate(inputs.scores, inputs.index)}
    metrics.update(summary("codapo/weight", weights[first]))
    metrics.update(advantage_summary("codapo/advantage", advantages, inputs.response_mask))
    return AdvantageResult(advantages, returns, metrics, per_response={"weights": weights})


class CodapoPlanner:
    """The toolkit trainer's batch planner for CoDaPO: fresh batch, then its resampled pass, and so on."""

    # Each dataloader batch trains two steps, so an epoch of total_epochs has twice the dataloader's steps.
    steps_per_batch = 2

    def __init__(self, config: CodapoConfig):
        self.resampler = CoDaPOResampler(config.percentile, config.repeat_count)
        self._serving_resampled = False

    def plan(self, batch_size: int) -> list | None:
        """Question ids of the resampled pass when one is due, else ``None`` (verl's dataloader serves)."""
        self._serving_resampled = self.resampler.resampled_next
        return self.resampler.plan(batch_size) if self._serving_resampled else None

    def observe(self, inputs: AdvantageInputs, result: AdvantageResult) -> None:
        # Only fresh batches select questions; a resampled pass's weights select nothing.
        if not self._serving_resampled:
            question_ids = inputs.info_values("question_id", NAME)
            self.resampler.observe(question_ids, result.per_response["weights"], group_index=inputs.index)

    def metrics(self) -> dict[str, float]:
        out = self.resampler.metrics()
        out["codapo/resample/resampled_step"] = float(self._serving_resampled)
        return out

    def state_dict(self) -> dict:
        return self.resampler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.resampler.load_state_dict(state)


def check_config(full_config, config: CodapoConfig) -> None:
    if not config.resample:
        return
    sync_step = parameter_sync_step(full_config)
    if sync_step != 1:
        raise ValueError(
            f"codapo.resample=true selects each batch's questions from one advantage computation, but "
            f"trainer.v1.sync.parameter_sync_step={sync_step} computes several per batch: keep it 1 (or set "
            "codapo.resample=false)"
        )
    gen = full_config.data.get("gen_batch_size", None)
    if gen is not None and gen != full_config.data.train_batch_size:
        raise ValueError(
            f"codapo.resample=true plans whole training batches, but data.gen_batch_size={gen} splits each into "
            f"fetches of {gen}: leave data.gen_batch_size unset (or equal to data.train_batch_size)"
        )


def planner(config: CodapoConfig) -> CodapoPlanner | None:
    return CodapoPlanner(config) if config.resample else None


METHOD = register_method(
    AdvantageMethod(
        name=NAME,
        compute=compute,
        config_cls=CodapoConfig,
        needs=frozenset({"old_log_probs", "reward_extra_info", "extra_info"}),
        check_config=check_config,
        batch_planner=planner,
    )
)
