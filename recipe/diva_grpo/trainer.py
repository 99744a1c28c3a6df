"""The DIVA-GRPO trainer: the toolkit trainer with DIVA's variant sampler and difficulty service.

Registered as ``trainer.v1.trainer_mode=diva_grpo``. The advantage step is the toolkit's shared one
(:class:`recipe.diva_grpo.toolkit_trainer.ToolkitTrainer`, method :mod:`verl_ext.methods.diva`); this class adds
only what DIVA changes around it:

* ``_init_dataloader``: the train sampler yields each question's original and variants contiguously
  (:class:`verl_ext.data.sampler.QuestionBlockSampler`), so a whole question group reaches one step;
  the difficulty service is started and its state copied into the dataset's shared table.
* ``_after_advantage``: sends each question's accuracy to the difficulty service (one batched call per step).
* ``_save_checkpoint`` / ``_load_checkpoint``: the difficulty state travels with verl's checkpoint,
  in the same ``global_step_N`` folder.
* ``on_step_end``: collects the difficulty update, refreshes the shared table the data workers read,
  and stashes ``diva/*`` metrics for the step's log line.

Everything else, ``fit()`` included, is verl's.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
import time

import numpy as np
import torch
from omegaconf import DictConfig
from torchdata.stateful_dataloader import StatefulDataLoader
from verl.trainer.ppo.v1 import register_trainer
from verl.utils.dataset.rl_dataset import collate_fn

from recipe.diva_grpo.toolkit_trainer import ToolkitTrainer
from verl_ext import faults
from verl_ext.config import diva_config_from, parameter_sync_step
from verl_ext.data.dataset import DivaDataset
from verl_ext.data.sampler import QuestionBlockSampler, check_batch_size
from verl_ext.difficulty.alphas import per_response_values, question_alphas
from verl_ext.difficulty.service import DifficultyService, PendingUpdate
from verl_ext.methods import AdvantageInputs, AdvantageResult
from verl_ext.plugin import ADV_ESTIMATOR_NAME, check_registered
from verl_ext.rollout.complete_groups import check_complete_groups

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))

TRAINER_NAME = "diva_grpo"


@register_trainer(TRAINER_NAME)
class DivaTrainer(ToolkitTrainer):
    """The toolkit trainer with DIVA-GRPO's question-block sampler and difficulty tracking."""

    def __init__(self, config: DictConfig):
        check_registered()
        self.diva = diva_config_from(config.get("diva"))
        self._check_config(config)
        super().__init__(config)
        self.difficulty: DifficultyService | None = None
        self._pending_update: PendingUpdate | None = None
        self._diva_step_metrics: dict = {}

    # ------------------------------------------------------------------ setup

    def _check_config(self, config: DictConfig) -> None:
        """Refuse settings that would silently split a question's prompts or bypass DIVA."""
        if config.algorithm.adv_estimator != ADV_ESTIMATOR_NAME:
            raise ValueError(
                f"trainer.v1.trainer_mode={TRAINER_NAME} needs algorithm.adv_estimator={ADV_ESTIMATOR_NAME}, "
                f"got {config.algorithm.adv_estimator!r}"
            )
        filter_groups = config.algorithm.get("filter_groups", None)
        if filter_groups is not None and filter_groups.get("enable", False):
            raise ValueError(
                "algorithm.filter_groups.enable=True (DAPO) evicts single prompt groups and would split a question's "
                "original from its variants; DIVA's variants already fight advantage collapse. Disable it."
            )
        if config.trainer.v1.sampler.get("sync_refill_failed_groups", False):
            raise ValueError(
                "trainer.v1.sampler.sync_refill_failed_groups=True refills single prompts and would split question "
                "groups; keep it False with the DIVA trainer."
            )
        if parameter_sync_step(config) != 1:
            raise ValueError(
                "trainer.v1.sync.parameter_sync_step must be 1 with the DIVA trainer: sub-batches could split question "
                "groups, and the difficulty service expects one update per step"
            )
        check_batch_size(
            config.data.train_batch_size,
            self.diva.variants.variants_per_question,
            config.data.get("gen_batch_size", None),
        )

    def _init_dataloader(self):
        super()._init_dataloader()
        block = 1 + self.diva.variants.variants_per_question
        if not isinstance(self.train_dataset, DivaDataset) or self.train_dataset.block_size != block:
            raise ValueError(
                f"the DIVA trainer needs data.custom_cls={{path: pkg://verl_ext.data.dataset, name: DivaDataset}} "
                f"reading the same diva block (data.diva: ${{diva}}), with {block} prompts per question; got "
                f"{type(self.train_dataset).__name__}"
            )
        # verl's RandomSampler would scatter a question's prompts over several steps; replace it with a
        # sampler that keeps each question's original and variants contiguous. Same loader settings otherwise.
        loader = self.train_dataloader
        sampler = QuestionBlockSampler(
            self.train_dataset, shuffle=self.config.data.shuffle, seed=self.config.data.get("seed") or 0
        )
        self.train_dataloader = StatefulDataLoader(
            dataset=self.train_dataset,
            batch_size=loader.batch_size,
            num_workers=loader.num_workers,
            drop_last=True,
            collate_fn=collate_fn,
            sampler=sampler,
        )
        # The actor keeps a running record in a folder of this launch only: a restarted actor resumes from it,
        # while a new launch starts from the checkpoint (or from scratch), never from a stale record.
        live_dir = tempfile.mkdtemp(prefix="diva_difficulty_live_")
        atexit.register(shutil.rmtree, live_dir, ignore_errors=True)
        self.difficulty = DifficultyService.get_or_create(
            f"{self.config.trainer.project_name}/{self.config.trainer.experiment_name}",
            self.diva.difficulty,
            live_dir=live_dir,
        )
        # Each update's reply carries the changed entries, copied into the table the data workers read.
        self.difficulty.attach_table(self.train_dataset.difficulty_table)

    def _check_groups(self, uids: np.ndarray, extra_info: list | None) -> None:
        """Every prompt brings its ``rollout.n`` responses and every question its original and variants: DIVA's
        global group and difficulty update are over the whole question."""
        super()._check_groups(uids, extra_info)
        block = 1 + self.diva.variants.variants_per_question
        check_complete_groups(
            [info["question_id"] for info in extra_info],
            block * int(self.config.actor_rollout_ref.rollout.n),
            "questions",
            f"each question's {block} prompt(s) x rollout.n responses must reach one step (QuestionBlockSampler)",
        )

    def _placement_groups(self) -> dict[str, list]:
        return {**super()._placement_groups(), "difficulty service": [self.difficulty.handle]}

    def _load_checkpoint(self):
        super()._load_checkpoint()
        if self.global_steps > 0:
            folder = self._checkpoint_folder()
            self.difficulty.load(folder)
            logger.info("DIVA difficulty state restored from %s", folder)

    def _save_checkpoint(self):
        # Before verl's save, which ends by marking the step folder as the latest checkpoint: a crash in between
        # must not leave a "latest" checkpoint without its difficulty state.
        # The state saved must include this step's update: wait for it first.
        self._finish_difficulty_update()
        self.difficulty.save(self._step_folder())
        super()._save_checkpoint()

    # ------------------------------------------------------------------ step

    def _after_advantage(self, inputs: AdvantageInputs, result: AdvantageResult, metrics: dict) -> None:
        """Send the step's per-question accuracy to the difficulty service (outcome scores before any KL penalty:
        what the difficulty rule measures)."""
        super()._after_advantage(inputs, result, metrics)
        self._send_difficulty_update(
            result.per_response["question_id"],
            inputs.scores,
            inputs.reward_extra_info,
            [float(d) for d in inputs.info_values("question_difficulty", ADV_ESTIMATOR_NAME)],
        )

    def _timing_after_advantage(self, metrics: dict, seconds: float) -> None:
        metrics["diva/timing_s/difficulty_send"] = seconds

    # ------------------------------------------------------------------ difficulty service

    def _send_difficulty_update(
        self, question_ids: np.ndarray, scores: torch.Tensor, reward_extras: list, planned_difficulty: list[float]
    ) -> None:
        """One batched, non-blocking update: per-question alpha over its original and variants.

        ``planned_difficulty`` (per response: the question's difficulty the dataset planned with) is the starting
        point of questions the service has not seen yet, so an initial difficulty from the parquet is honoured.
        """
        source = self.diva.difficulty.alpha_source
        accuracy = [self._response_accuracy(extras) for extras in reward_extras] if source == "accuracy" else None
        values = per_response_values(accuracy, scores.double().numpy(), source)
        ids, alphas = question_alphas(question_ids.tolist(), values)
        first_plan: dict = {}
        for qid, planned in zip(question_ids.tolist(), planned_difficulty, strict=True):
            first_plan.setdefault(qid, planned)
        priors = [first_plan[q] for q in ids]
        self._pending_update = self.difficulty.update_async(ids, alphas, step=self.global_steps, priors=priors)

    @staticmethod
    def _response_accuracy(info: dict) -> float:
        if "acc" not in info:
            raise KeyError(
                "diva.difficulty.alpha_source=accuracy needs the reward function to return an 'acc' key "
                "(verl_ext.reward.compute_score does); set diva.difficulty.alpha_source=reward to use the total reward"
            )
        return float(info["acc"])

    def _finish_difficulty_update(self) -> None:
        if self._pending_update is None:
            return
        t0 = time.perf_counter()
        # Waits for the actor and copies the changed difficulties into the shared table.
        step_metrics = self.difficulty.finish(self._pending_update)
        self._pending_update = None
        faults.inject("after_difficulty_update", self.global_steps)
        step_metrics["diva/timing_s/difficulty_finish"] = time.perf_counter() - t0
        self._diva_step_metrics.update(step_metrics)

    def on_step_end(self):
        super().on_step_end()
        self._finish_difficulty_update()

    def _consume_sync_metrics(self) -> dict:
        metrics = super()._consume_sync_metrics()
        metrics.update(self._diva_step_metrics)
        self._diva_step_metrics = {}
        return metrics
