"""The DIVA-GRPO trainer: verl's synchronous V1 trainer with the DIVA advantage and a difficulty service.

Registered as ``trainer.v1.trainer_mode=diva_grpo``. It overrides only what DIVA changes:

* ``_init_dataloader``: the train sampler yields each question's original and variants contiguously
  (:class:`verl_ext.data.sampler.QuestionBlockSampler`), so a whole question group reaches one step;
  the difficulty service is started and its state copied into the dataset's shared table.
* ``_compute_advantage``: reads ``extra_info`` (question id, variant difficulty) and the reward
  extras with the rewards from TransferQueue, calls :func:`verl_ext.algos.compute_diva_advantage`,
  and sends each question's accuracy to the difficulty service (one batched call per step).
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
from collections import Counter

import numpy as np
import torch
import transfer_queue as tq
from omegaconf import DictConfig
from tensordict import TensorDict
from torchdata.stateful_dataloader import StatefulDataLoader
from transfer_queue import KVBatchMeta
from verl.protocol import DataProto
from verl.trainer.ppo.ray_trainer import apply_kl_penalty
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
from verl.trainer.ppo.v1 import PPOTrainerSync, register_trainer
from verl.utils.dataset.rl_dataset import collate_fn
from verl.workers.utils.padding import response_to_nested

from verl_ext.algos import advantage_collapse_rate, compute_diva_advantage
from verl_ext.config import diva_config_from
from verl_ext.data.dataset import DivaDataset
from verl_ext.data.sampler import QuestionBlockSampler, check_batch_size
from verl_ext.difficulty.alphas import per_response_values, question_alphas
from verl_ext.difficulty.service import DifficultyService, PendingUpdate
from verl_ext.plugin import ADV_ESTIMATOR_NAME, check_registered
from verl_ext.transfer_queue_fields import non_tensor_list

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))

TRAINER_NAME = "diva_grpo"


@register_trainer(TRAINER_NAME)
class DivaTrainer(PPOTrainerSync):
    """verl's synchronous PPO trainer with DIVA-GRPO's advantage and difficulty tracking."""

    # verl branches on ``trainer_mode != "sync"`` (replay buffer kind, refill granularity, TransferQueue
    # checkpoints). DIVA runs the synchronous schedule, so it answers "sync" while registered as "diva_grpo".
    @property
    def trainer_mode(self) -> str:
        return "sync"

    @trainer_mode.setter
    def trainer_mode(self, value: str) -> None:
        self.registered_mode = value

    def __init__(self, config: DictConfig):
        check_registered()
        self.diva = diva_config_from(config.get("diva"))
        self._check_config(config)
        super().__init__(config)
        self.difficulty: DifficultyService | None = None
        self._pending_update: PendingUpdate | None = None
        self._diva_step_metrics: dict = {}
        self._advantage_kwargs = {k: v for k, v in self.diva.advantage.items() if not k.startswith("_")}

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
        if config.trainer.v1.get("sync", {}).get("parameter_sync_step", 1) != 1:
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

    def _load_checkpoint(self):
        super()._load_checkpoint()
        if self.global_steps > 0:
            if self.config.trainer.resume_mode == "resume_path":
                folder = self.config.trainer.resume_from_path
            else:
                folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
            self.difficulty.load(os.path.abspath(folder))
            logger.info("DIVA difficulty state restored from %s", folder)

    def _save_checkpoint(self):
        # Before verl's save, which ends by marking the step folder as the latest checkpoint: a crash in between
        # must not leave a "latest" checkpoint without its difficulty state. Absolute path: the service actor's
        # working directory need not be this process's.
        folder = os.path.abspath(
            os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        )
        # The state saved must include this step's update: wait for it first.
        self._finish_difficulty_update()
        self.difficulty.save(folder)
        super()._save_checkpoint()

    # ------------------------------------------------------------------ step

    def _compute_advantage(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        """DIVA advantage over the sampled batch, written back to TransferQueue as verl expects.

        Shapes: B trajectories (one per response; synthetic padding rows from ``_balance_batch`` included),
        T = longest response. Padding rows get zero advantage and join no group.
        """
        t0 = time.perf_counter()
        fields = ["uid", "response_mask", "rm_scores", "rollout_log_probs", "old_log_probs", "ref_log_prob"]
        fields += ["extra_info", "extra_fields"]
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        response_mask = data["response_mask"]
        extra_info = non_tensor_list(data.pop("extra_info"))
        extra_fields = non_tensor_list(data.pop("extra_fields"))
        uids = np.array(non_tensor_list(data.pop("uid")), dtype=object)

        self._check_single_turn(batch.keys)
        data = DataProto(batch=data.to_padded_tensor())
        data.non_tensor_batch["uid"] = uids
        data.batch["token_level_scores"] = data.batch["rm_scores"]
        if self.config.algorithm.use_kl_in_reward:
            data, kl_metrics = apply_kl_penalty(
                data, kl_ctrl=self.kl_ctrl_in_reward, kl_penalty=self.config.algorithm.kl_penalty
            )
            metrics.update(kl_metrics)
        else:
            data.batch["token_level_rewards"] = data.batch["token_level_scores"]

        rollout_corr_config = self.config.algorithm.get("rollout_correction", None)
        bypass = rollout_corr_config and rollout_corr_config.get("bypass_mode", False)
        rollout_correction = rollout_corr_config is not None and "rollout_log_probs" in data.batch and not bypass
        if rollout_correction:
            data, is_metrics = compute_rollout_correction_and_add_to_batch(data, rollout_corr_config)
            metrics.update(is_metrics)

        # Synthetic padding rows (verl's _balance_batch) copy a real row's extra_info: keep them out of every group.
        rows = np.flatnonzero([not tag.get("is_padding", False) for tag in batch.tags])
        idx = torch.as_tensor(rows)
        infos = [extra_info[i] for i in rows]
        question_ids = np.array([info["question_id"] for info in infos], dtype=object)
        difficulty = np.array([float(info["variant_difficulty"]) for info in infos])
        mask = data.batch["response_mask"][idx]
        advantages = torch.zeros_like(data.batch["token_level_rewards"])
        adv_real, _ = compute_diva_advantage(
            data.batch["token_level_rewards"][idx], mask, uids[rows], question_ids, difficulty, **self._advantage_kwargs
        )
        advantages[idx] = adv_real
        data.batch["advantages"] = advantages
        data.batch["returns"] = advantages
        t_adv = time.perf_counter()

        # Outcome scores before any KL penalty: what the difficulty rule and the collapse diagnostics measure.
        scores = data.batch["token_level_scores"][idx].sum(-1)
        self._send_difficulty_update(
            question_ids,
            scores,
            [extra_fields[i] for i in rows],
            [float(info["question_difficulty"]) for info in infos],
        )
        t_send = time.perf_counter()

        out_fields = ["advantages", "returns"]
        if self.config.algorithm.use_kl_in_reward:
            out_fields.append("token_level_rewards")
        if rollout_correction:
            out_fields.append("response_mask")
            if "rollout_is_weights" in data.batch:
                out_fields.append("rollout_is_weights")
        output = TensorDict(
            {name: response_to_nested(data.batch[name], response_mask) for name in out_fields}, batch_size=len(batch)
        )
        batch = tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=output)

        metrics.update(self._advantage_metrics(scores, adv_real, mask, uids[rows], question_ids, infos))
        metrics["diva/timing_s/advantage"] = t_adv - t0
        metrics["diva/timing_s/difficulty_send"] = t_send - t_adv
        return batch

    @staticmethod
    def _check_single_turn(keys: list[str]) -> None:
        multi = [key for key in keys if not key.endswith("_0")]
        if multi:
            raise ValueError(
                f"DIVA-GRPO scores one response per rollout session, but trajectories {multi[:3]} are later outputs "
                "of multi-turn sessions. Use the single-turn agent loop (actor_rollout_ref.rollout.agent)."
            )

    def _advantage_metrics(self, scores, advantages, mask, uids, question_ids, infos) -> dict:
        """``diva/*`` metrics of the real rows: (R,) scores, (R, T) advantages and mask, R ids and extra_infos."""
        per_response = (advantages * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        kinds = Counter(info.get("variant_kind", "original") for info in infos)
        total = sum(kinds.values()) or 1
        out = {
            "diva/collapse_rate/local": advantage_collapse_rate(scores, uids),
            "diva/collapse_rate/global": advantage_collapse_rate(scores, question_ids),
            "diva/advantage/mean": per_response.mean().item(),
            "diva/advantage/std": per_response.std().item() if per_response.numel() > 1 else 0.0,
            "diva/advantage/max": per_response.max().item(),
            "diva/advantage/min": per_response.min().item(),
            "diva/advantage/zero_fraction": (per_response == 0).float().mean().item(),
            "diva/questions_in_batch": len(set(question_ids.tolist())),
            "diva/variant_fallbacks": sum(1 for info in infos if info.get("variant_fallback")),
        }
        out.update({f"diva/variant_mix/{kind}": count / total for kind, count in sorted(kinds.items())})
        return out

    # ------------------------------------------------------------------ difficulty service

    def _send_difficulty_update(
        self, question_ids: np.ndarray, scores: torch.Tensor, extra_fields: list, planned_difficulty: list[float]
    ) -> None:
        """One batched, non-blocking update: per-question alpha over its original and variants.

        ``planned_difficulty`` (per response: the question's difficulty the dataset planned with) is the starting
        point of questions the service has not seen yet, so an initial difficulty from the parquet is honoured.
        """
        source = self.diva.difficulty.alpha_source
        accuracy = [self._response_accuracy(fields) for fields in extra_fields] if source == "accuracy" else None
        values = per_response_values(accuracy, scores.double().numpy(), source)
        ids, alphas = question_alphas(question_ids.tolist(), values)
        first_plan: dict = {}
        for qid, planned in zip(question_ids.tolist(), planned_difficulty, strict=True):
            first_plan.setdefault(qid, planned)
        priors = [first_plan[q] for q in ids]
        self._pending_update = self.difficulty.update_async(ids, alphas, step=self.global_steps, priors=priors)

    @staticmethod
    def _response_accuracy(extra_fields) -> float:
        info = extra_fields.get("reward_extra_info", {}) if isinstance(extra_fields, dict) else {}
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
