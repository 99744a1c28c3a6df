"""The toolkit trainer: verl's synchronous V1 trainer with one advantage step for every toolkit method.

Registered as ``trainer.v1.trainer_mode=toolkit``; ``algorithm.adv_estimator`` picks the method
(:mod:`verl_ext.methods`). It overrides only what the methods change:

* ``_compute_advantage``: runs verl's own advantage step (its in-reward KL penalty and rollout correction, verl's
  code as it is; the method's estimator in it defers, :mod:`verl_ext.deferral`), then fetches from TransferQueue
  what that step wrote plus the fields the method declares (``extra_info``, reward extras, old or blind log-probs,
  response ids), hands the real rows (verl's synthetic padding rows excluded: they get zero advantage and join no
  group) to the method's ``compute``, and writes the advantages back;
* ``_compute_old_log_prob``: then runs the method's extra pass, if any (PGPO's blind log-probs), served by the
  actor worker subclass the method puts in ``role_worker_mapping`` (``_init_resource_pool_mgr``);
* ``_fetch_one_gen_batch``: asks the method's batch planner, if any, which prompts to roll out (CoDaPO's
  resampling), otherwise verl's dataloader;
* ``_save_checkpoint`` / ``_load_checkpoint``: the planner's state travels in the same ``global_step_N``.

Everything else, ``fit()`` included, is verl's. The DIVA trainer (``recipe/diva_grpo/trainer.py``) is this class
plus its variant sampler and difficulty service.
"""

from __future__ import annotations

import logging
import os
import time

import numpy as np
import torch
import transfer_queue as tq
from omegaconf import DictConfig, open_dict
from tensordict import NonTensorStack, TensorDict
from transfer_queue import KVBatchMeta
from verl.protocol import DataProto
from verl.trainer.ppo.v1 import PPOTrainerSync, register_trainer
from verl.workers.utils.padding import response_to_nested

from verl_ext import faults
from verl_ext.cluster.node_watch import NodeWatch
from verl_ext.cluster.storage import RunRecord
from verl_ext.deferral import estimator_deferred
from verl_ext.methods import AdvantageInputs, AdvantageResult, get_method
from verl_ext.methods.base import TENSOR_NEEDS
from verl_ext.plugin import check_registered
from verl_ext.rollout.complete_groups import check_complete_groups
from verl_ext.rollout.replay_buffer import OrderedReplayBuffer, key_order
from verl_ext.rollout.seeds import prompt_uid
from verl_ext.transfer_queue_fields import non_tensor_list

logger = logging.getLogger(__name__)

# The log-prob fields a method may declare (verl_ext.methods.base.TENSOR_NEEDS), cast to float32 for its math.
LOG_PROB_FIELDS = frozenset({"old_log_probs", "blind_log_probs", "rollout_log_probs"})
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))

TRAINER_NAME = "toolkit"

# What verl's own V1 advantage step fetches (KL penalty and rollout correction read the log-prob fields).
_VERL_FIELDS = ("uid", "response_mask", "rm_scores", "rollout_log_probs", "old_log_probs", "ref_log_prob")
# What verl's advantage step writes beside the advantages, when its settings ask for it.
_VERL_STEP_FIELDS = ("token_level_rewards", "rollout_is_weights")


@register_trainer(TRAINER_NAME)
class ToolkitTrainer(PPOTrainerSync):
    """verl's synchronous PPO trainer, with the advantage of the toolkit method named by ``adv_estimator``."""

    # verl branches on ``trainer_mode != "sync"`` (replay buffer kind, refill granularity, TransferQueue
    # checkpoints). The toolkit runs the synchronous schedule, so it answers "sync" whatever name it is registered as.
    @property
    def trainer_mode(self) -> str:
        return "sync"

    @trainer_mode.setter
    def trainer_mode(self, value: str) -> None:
        self.registered_mode = value

    def __init__(self, config: DictConfig):
        check_registered()
        self.method = get_method(config.algorithm.adv_estimator)
        self.method_config = self.method.config_from(config)
        self._check_method_config(config)
        super().__init__(config)
        self.batch_planner = self.method.batch_planner(self.method_config) if self.method.batch_planner else None
        self._uid_fetches = (-1, -1)  # (step, fetches in it) of _run_uids

    def _check_method_config(self, config: DictConfig) -> None:
        mode = config.trainer.v1.trainer_mode
        if self.method.trainer_mode != mode:
            raise ValueError(
                f"algorithm.adv_estimator={self.method.name} runs with "
                f"trainer.v1.trainer_mode={self.method.trainer_mode}, got {mode!r}"
            )
        if self.method.check_config is not None:
            self.method.check_config(config, self.method_config)
        custom = config.trainer.v1.sampler.get("custom_sampler", None) or {}
        filter_groups = config.algorithm.get("filter_groups", None) or {}
        if custom.get("name") and (
            filter_groups.get("enable", False) or config.trainer.v1.sampler.get("sync_refill_failed_groups", False)
        ):
            raise ValueError(
                "algorithm.filter_groups.enable / trainer.v1.sampler.sync_refill_failed_groups: verl passes them only "
                f"to its own replay buffer, not to trainer.v1.sampler.custom_sampler ({custom.get('name')}); unset "
                "the custom sampler (trainer.v1.sampler.custom_sampler.name=null) to use them"
            )

    def _init_dataloader(self):
        super()._init_dataloader()
        # A planner that serves each dataloader batch on several steps (CoDaPO: fresh, then resampled) makes an
        # epoch that many times longer; verl counts steps from the dataloader alone.
        repeat = getattr(self.batch_planner, "steps_per_batch", 1)
        if repeat != 1 and self.config.trainer.total_training_steps is None:
            self.steps_per_epoch *= repeat
            self.total_training_steps *= repeat
            with open_dict(self.config):
                optim = self.config.actor_rollout_ref.actor.get("optim", None)
                if optim is not None:
                    optim.total_training_steps = self.total_training_steps * self.parameter_sync_step
            logger.info("%s: %d steps (%d per dataloader batch)", self.method.name, self.total_training_steps, repeat)

    def _build_replay_buffer(self):
        buffer = super()._build_replay_buffer()
        if isinstance(buffer, OrderedReplayBuffer):
            buffer.watch(self._rollout_actors)
        return buffer

    def on_train_begin(self):
        super().on_train_begin()
        self._report_placement()

    def fit(self, *args, **kwargs):
        try:
            return super().fit(*args, **kwargs)
        except Exception as err:
            # A node lost mid-collective (a checkpoint's barrier) fails this process with an error naming no node
            # before Ray declares it dead: the watch waits for that verdict and names the node instead.
            watch = getattr(self, "node_watch", None)
            if watch is not None:
                watch.name_lost(err)
            raise

    def _placement_groups(self) -> dict[str, list]:
        """The actors whose node the placement report names, by group, each in rank order."""
        manager = getattr(self, "llm_server_manager", None)
        loop = getattr(self, "agent_loop_manager", None)
        return {
            "training ranks": list(getattr(self.actor_rollout_wg, "workers", None) or []),
            "rollout replicas": [replica.servers[0] for replica in (manager.get_replicas() if manager else [])],
            "agent-loop workers": list(getattr(loop, "agent_loop_workers", None) or []),
            "reward workers": list(getattr(loop, "reward_loop_worker_handles", None) or []),
        }

    def _report_placement(self) -> None:
        """Print where the trainer process, the training ranks and the rollout replicas landed (Ray's state API);
        a cluster that cannot answer is noted, never fatal."""
        from verl_ext.cluster.placement import placement, placement_lines

        groups = self._placement_groups()
        if not groups["training ranks"]:
            return  # stand-in workers (the CPU preflight): no Ray actor to place
        try:
            report = placement(groups)
        except Exception as err:  # the state API needs the dashboard; a report is not worth a failed run
            print(f"[cluster] placement unavailable: {type(err).__name__}: {err}", flush=True)
            return
        print("\n".join(placement_lines(report)), flush=True)
        self.placement_report = report
        # A lost node fails the job in bounded time, naming it and what ran there (verl_ext/cluster/node_watch.py).
        self.node_watch = NodeWatch(report)
        self.node_watch.start()

    def _rollout_actors(self) -> list[tuple[str, object]]:
        """The actors a step's rollouts need: rollout servers, agent-loop workers, reward workers (once started)."""
        actors = []
        manager = getattr(self, "llm_server_manager", None)
        for rank, replica in enumerate(manager.get_replicas() if manager is not None else []):
            actors += [(f"rollout server {i} of replica {rank}", server) for i, server in enumerate(replica.servers)]
        loop = getattr(self, "agent_loop_manager", None)
        actors += [(f"agent-loop worker {i}", w) for i, w in enumerate(getattr(loop, "agent_loop_workers", None) or [])]
        rewards = getattr(loop, "reward_loop_worker_handles", None) or []
        actors += [(f"reward worker {i}", worker) for i, worker in enumerate(rewards)]
        # With a placement report, each actor is named with its node: a dead one on a lost node says which node.
        report = getattr(self, "placement_report", None)
        if report is not None:
            node_of = {actor: report["nodes"][node]["name"] for actor, node in report["actors"].items() if node}
            actors = [
                (f"{name} on {node_of[handle._actor_id.hex()]}" if handle._actor_id.hex() in node_of else name, handle)
                for name, handle in actors
            ]
        return actors

    # ------------------------------------------------------------------ advantage

    def _compute_advantage(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        """The method's advantage over the sampled batch, written back to TransferQueue as verl expects.

        Shapes: B trajectories (one per response; synthetic padding rows from ``_balance_batch`` included),
        T = longest response. Padding rows get zero advantage and are not shown to the method.
        """
        t0 = time.perf_counter()
        self._check_single_turn(batch.keys)
        # verl's own step, as verl runs it: the KL penalty in the reward (algorithm.use_kl_in_reward), rollout
        # correction (importance weights, rejection sampling; algorithm.rollout_correction), its metrics and the
        # write-back. Its estimator call for the method defers (zeros, overwritten below: verl_ext/deferral.py).
        with estimator_deferred(self.method.name):
            written = set(super()._compute_advantage(batch, metrics).fields or ())
        needs = self.method.needs
        fields = [*_VERL_FIELDS, *sorted(needs & TENSOR_NEEDS - set(_VERL_FIELDS))]
        # What verl's step wrote for the method: in-reward KL's rewards, rollout correction's weights (its rejection
        # sampling rewrites response_mask in place).
        fields += [name for name in _VERL_STEP_FIELDS if name in written]
        if "extra_info" in needs:
            fields.append("extra_info")
        # The reward extras are always read: the step logs the accuracy of every method (diva-report plots it).
        fields.append("extra_fields")
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        response_mask = data["response_mask"]
        extra_info = non_tensor_list(data.pop("extra_info")) if "extra_info" in needs else None
        rollout_fields = non_tensor_list(data.pop("extra_fields"))
        reward_extras = [self._reward_extras(fields) for fields in rollout_fields]
        uids = np.array(non_tensor_list(data.pop("uid")), dtype=object)

        data = DataProto(batch=data.to_padded_tensor())
        data.non_tensor_batch["uid"] = uids
        data.batch["token_level_scores"] = data.batch["rm_scores"]
        if "token_level_rewards" not in data.batch.keys():
            data.batch["token_level_rewards"] = data.batch["token_level_scores"]

        # The real rows (verl's no-op padding left out) in key order: verl's sequence balancing reorders the batch
        # by rank, and the method's group sums must add in one order at every world size.
        rows = np.array(
            sorted(
                (i for i, tag in enumerate(batch.tags) if not tag.get("is_padding", False)),
                key=lambda i: key_order(batch.keys[i]),
            ),
            dtype=np.int64,
        )
        self._check_groups(uids[rows], [extra_info[i] for i in rows] if extra_info is not None else None)
        idx = torch.as_tensor(rows)
        inputs = AdvantageInputs(
            token_level_rewards=data.batch["token_level_rewards"][idx],
            token_level_scores=data.batch["token_level_scores"][idx],
            response_mask=data.batch["response_mask"][idx],
            index=uids[rows],
            tensors=self._method_tensors(data, needs, idx),
            extra_info=[extra_info[i] for i in rows] if extra_info is not None else None,
            reward_extra_info=[reward_extras[i] for i in rows] if "reward_extra_info" in needs else None,
            rollout_fields=[rollout_fields[i] for i in rows] if "rollout_fields" in needs else None,
            global_step=int(self.global_steps),
            total_steps=int(getattr(self, "total_training_steps", 0) or 0),
            tokenizer=getattr(self, "tokenizer", None),
        )
        result = self.method.compute(inputs, self.method_config)
        advantages = torch.zeros_like(data.batch["token_level_rewards"])
        advantages[idx] = result.advantages.to(advantages.dtype)
        returns = torch.zeros_like(advantages)
        returns[idx] = result.returns.to(returns.dtype)
        data.batch["advantages"] = advantages
        data.batch["returns"] = returns
        t_adv = time.perf_counter()
        self._after_advantage(inputs, result, metrics)
        t_after = time.perf_counter()

        output = TensorDict(
            {name: response_to_nested(data.batch[name], response_mask) for name in ("advantages", "returns")},
            batch_size=len(batch),
        )
        batch = tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=output)

        metrics.update(result.metrics)
        prefix = self.method.prefix
        accuracy = [float(reward_extras[i]["acc"]) for i in rows if "acc" in reward_extras[i]]
        if accuracy:
            metrics[f"{prefix}/accuracy/mean"] = float(np.mean(accuracy))
        metrics[f"{prefix}/timing_s/advantage"] = t_adv - t0
        self._timing_after_advantage(metrics, t_after - t_adv)
        return batch

    def _check_groups(self, uids: np.ndarray, extra_info: list | None) -> None:
        """Every prompt of the step brings its ``rollout.n`` responses (subclasses check more)."""
        check_complete_groups(
            uids,
            int(self.config.actor_rollout_ref.rollout.n),
            "prompts",
            "a rollout request failed or a group was split (see the job's log for the failed requests)",
        )

    def _method_tensors(self, data: DataProto, needs: frozenset, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        """The ``(R, T)`` fields the method declared, and verl's rollout-correction weights when this step computed
        them (``algorithm.rollout_correction.rollout_is``): the weights the actor's loss multiplies in, for the
        method's metrics."""
        tensors = {name: self._response_field(data, name)[idx] for name in sorted(needs & TENSOR_NEEDS)}
        for name in LOG_PROB_FIELDS & tensors.keys():
            # The methods' math takes float32 log-probs. verl's actor returns the logits' dtype when it computes
            # them with torch (logprobs_from_logits without flash-attn's cross entropy: the CPU, or a GPU run with
            # VERL_DISABLE_FLASH_ATTN_CE=1), bf16 under its default mixed precision; flash-attn's kernel returns
            # float32. The loss keeps verl's tensors; only the advantage's copy is cast.
            tensors[name] = tensors[name].float()
        if "rollout_is_weights" in data.batch.keys():
            tensors["rollout_is_weights"] = data.batch["rollout_is_weights"][idx]
        return tensors

    @staticmethod
    def _response_field(data: DataProto, name: str) -> torch.Tensor:
        if name not in data.batch.keys():
            raise KeyError(f"TransferQueue holds no {name!r} for this batch: the step that writes it did not run")
        return data.batch[name]

    @staticmethod
    def _reward_extras(extra_fields) -> dict:
        return extra_fields.get("reward_extra_info", {}) if isinstance(extra_fields, dict) else {}

    @staticmethod
    def _check_single_turn(keys: list[str]) -> None:
        multi = [key for key in keys if not key.endswith("_0")]
        if multi:
            raise ValueError(
                f"the toolkit's advantages score one response per rollout session, but trajectories {multi[:3]} are "
                "later outputs of multi-turn sessions. Use the single-turn agent loop "
                "(actor_rollout_ref.rollout.agent)."
            )

    def _after_advantage(self, inputs: AdvantageInputs, result: AdvantageResult, metrics: dict) -> None:
        """What else the step learns from its advantage: the batch planner observes it (subclasses add more)."""
        if self.batch_planner is not None:
            self.batch_planner.observe(inputs, result)
            metrics.update(self.batch_planner.metrics())

    def _timing_after_advantage(self, metrics: dict, seconds: float) -> None:
        if self.batch_planner is not None:
            metrics[f"{self.method.prefix}/timing_s/planner"] = seconds

    # ------------------------------------------------------------------ extra pass

    def _init_resource_pool_mgr(self):
        super()._init_resource_pool_mgr()
        if self.method.actor_workers is not None:
            self.method.actor_workers(self.role_worker_mapping)

    def _compute_old_log_prob(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        batch = super()._compute_old_log_prob(batch, metrics)
        if self.method.pre_advantage is not None:
            batch = self.method.pre_advantage(self, batch, metrics, self.method_config)
        return batch

    # ------------------------------------------------------------------ batches

    def _fetch_one_gen_batch(self):
        """verl's next dataloader batch, unless the method's planner names the prompts to roll out instead; its
        uids are the run's (:meth:`_run_uids`)."""
        batch = self._planned_or_dataloader_batch()
        batch["uid"] = NonTensorStack(*self._run_uids(len(batch)))
        return batch

    def _planned_or_dataloader_batch(self):
        if self.batch_planner is None:
            return super()._fetch_one_gen_batch()
        size = self.config.data.get("gen_batch_size", None) or self.config.data.train_batch_size
        planned = self.batch_planner.plan(size)
        if planned is None:
            return super()._fetch_one_gen_batch()
        from recipe.diva_grpo.planned_batches import batch_of_questions

        return batch_of_questions(self.train_dataset, planned)

    def _run_uids(self, count: int) -> list[str]:
        """uids of the next ``count`` prompts: from (data.seed, step, fetch of the step, row), not verl's ``uuid4``,
        so that the rollout seeds keyed by them (:mod:`verl_ext.rollout.seeds`) repeat for a seed and on a resume."""
        step = int(self.global_steps)
        fetch = self._uid_fetches[1] + 1 if self._uid_fetches[0] == step else 0
        self._uid_fetches = (step, fetch)
        seed = int(self.config.data.get("seed", 0) or 0)
        return [prompt_uid(seed, step, fetch, row) for row in range(count)]

    # ------------------------------------------------------------------ checkpoints

    def _planner_state_path(self, step_folder: str) -> str:
        return os.path.join(step_folder, f"{self.method.name}_planner.json")

    def _step_folder(self) -> str:
        """Absolute ``<default_local_dir>/global_step_N`` of the current step (where verl saves it). Absolute: a Ray
        actor that writes into it (DIVA's difficulty service) need not share this process's working directory."""
        return os.path.abspath(os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}"))

    def _checkpoint_folder(self) -> str:
        """Absolute step folder verl resumed from (``resume_from_path``, or the latest under ``default_local_dir``)."""
        if self.config.trainer.resume_mode == "resume_path":
            return os.path.abspath(self.config.trainer.resume_from_path)
        return self._step_folder()

    def _save_checkpoint(self):
        # Before verl's save, which ends by marking the step folder as the latest checkpoint.
        if self.batch_planner is not None:
            from verl_ext.difficulty.persistence import save_state

            save_state(self.batch_planner.state_dict(), self._planner_state_path(self._step_folder()))
        faults.inject("checkpoint_save", self.global_steps)
        super()._save_checkpoint()
        # After verl marked the step the latest: the run's record of what it saved (verl_ext/cluster/storage.py).
        RunRecord(self.config.trainer.default_local_dir).saved(self.global_steps)

    def _load_checkpoint(self):
        super()._load_checkpoint()
        if self.global_steps > 0 and self.batch_planner is not None:
            from verl_ext.difficulty.persistence import load_state

            path = self._planner_state_path(self._checkpoint_folder())
            state = load_state(
                path,
                what=f"{self.method.name} batch planner state",
                required="the method's planner saves it with every checkpoint; without it the resume would roll "
                "out other prompts than the run it continues. Resume from another checkpoint step.",
            )
            self.batch_planner.load_state_dict(state)
            logger.info("%s batch planner restored from %s", self.method.name, path)
