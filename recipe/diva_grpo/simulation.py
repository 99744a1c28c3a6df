"""Stand-ins for the GPU parts of a verl run, so the DIVA trainer's real step logic runs on a CPU.

Only two things are simulated, exactly where verl needs GPUs:

* the rollout: :class:`SimulatedAgentLoopManager` replaces vLLM servers and the agent loop. For each
  prompt it writes ``rollout.n`` scripted responses into TransferQueue with the same keys, fields and
  tags as verl's ``AgentLoopWorkerTQ``, scored by the real reward function;
* the FSDP workers: :class:`SimulatedActorWorkerGroup` answers ``compute_log_prob`` / ``update_actor``
  / checkpoint calls without a model, and records the advantages each update consumed.

Everything else is verl's: TransferQueue, the ReplayBuffer, the dataloader, ``fit()``, the metrics.
The CPU preflight and the integration tests use this module.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import torch
import transfer_queue as tq
from tensordict import NonTensorData, NonTensorStack, TensorDict
from transfer_queue import KVBatchMeta
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from verl_ext.transfer_queue_fields import non_tensor_list


def byte_tokenizer():
    """A model-free byte-level tokenizer (256 byte tokens + pad/eos) built locally: no hub needed."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"<0x{i:02X}>": i for i in range(256)}
    vocab.update({"<pad>": 256, "<eos>": 257, "<unk>": 258})
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.ByteFallback()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    return tok


def encode_bytes(text: str) -> list[int]:
    """Token ids of ``text`` under :func:`byte_tokenizer` (one id per UTF-8 byte)."""
    return list(text.encode("utf-8"))


class ScriptedPolicy:
    """A deterministic pretend-model: answers correctly with a probability that falls with difficulty.

    Each question gets a hidden true difficulty ``h_q`` in [1, 9] (from its id); a variant shifts it by its
    planned shift. ``P(correct) = clip((9.5 - h) / 9, 0.02, 0.98)``. Draws depend only on
    (question id, variant slot, session, step), so runs are reproducible.
    """

    def __init__(self, seed: int = 0):
        self.seed = seed

    def hidden_difficulty(self, question_id: str) -> float:
        return 1.0 + (zlib.crc32(f"{self.seed}/{question_id}".encode()) % 801) / 100.0

    def respond(self, extra_info: dict, ground_truth: str, session: int, step: int) -> tuple[str, bool]:
        qid = str(extra_info["question_id"])
        shift = float(extra_info.get("variant_difficulty", 5.0)) - float(extra_info.get("question_difficulty", 5.0))
        h = self.hidden_difficulty(qid) + shift
        p = float(np.clip((9.5 - h) / 9.0, 0.02, 0.98))
        slot = int(extra_info.get("variant_slot", 0))
        rng = np.random.default_rng(zlib.crc32(f"{self.seed}/{qid}/{slot}/{session}/{step}".encode()))
        correct = bool(rng.random() < p)
        answer = ground_truth if correct else f"{ground_truth}1"
        return (
            f"<think>Let me work through the figure step by step.</think> The answer is \\boxed{{{answer}}}.",
            correct,
        )


def _row(batch: TensorDict, i: int) -> dict:
    """Sample ``i`` of a dataloader batch as plain values (as verl's AgentLoopWorkerTQ unpacks it)."""
    out = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor):
            out[key] = value[i]
        elif isinstance(value, NonTensorStack):
            out[key] = value[i].data
        elif isinstance(value, NonTensorData):
            out[key] = value.data
    return out


def scripted_log_probs(input_ids: torch.Tensor) -> torch.Tensor:
    """The stand-in actor's log-probs of one sequence, aligned as a model's output: position ``j`` scores token
    ``j + 1`` (verl's ``response_from_nested`` shifts by one), ``-(0.05 + (token % 13) / 20)``; the last is 0."""
    following = torch.roll(input_ids.to(torch.int64), -1)
    out = -(0.05 + (following % 13).to(torch.float32) / 20)
    out[-1] = 0.0
    return out


BLIND_SHIFTED_TOKEN = 7


def scripted_blind_log_probs(input_ids: torch.Tensor) -> torch.Tensor:
    """The stand-in actor's blind log-probs: :func:`scripted_log_probs`, 1.5 lower where the scored token is a
    multiple of :data:`BLIND_SHIFTED_TOKEN` (the tokens that "depend on the image")."""
    following = torch.roll(input_ids.to(torch.int64), -1)
    out = scripted_log_probs(input_ids) - 1.5 * (following % BLIND_SHIFTED_TOKEN == 0).to(torch.float32)
    out[-1] = 0.0
    return out


class SimulatedAgentLoopManager:
    """Stands in for ``AgentLoopManagerTQ`` + vLLM: writes scored trajectories into TransferQueue.

    Args:
        reward_fn: verl custom reward function ``(data_source, solution_str, ground_truth, extra_info) -> dict``.
        n: rollouts per prompt (``actor_rollout_ref.rollout.n``).
        policy: decides each response.
        rollout_fields: what the configured agent loop adds to each trajectory's ``extra_fields`` (NC-GRPO's noise
            flag), from the request's fields (``uid``, ``global_steps``, ``session_id``, ...); ``None``: nothing.
    """

    def __init__(
        self,
        reward_fn: Callable,
        n: int,
        policy: ScriptedPolicy | None = None,
        rollout_fields: Callable[[dict], dict] | None = None,
    ):
        self.reward_fn = reward_fn
        self.n = n
        self.policy = policy or ScriptedPolicy()
        self.rollout_fields = rollout_fields
        self.prompts_seen: list[dict] = []

    def generate_sequences(self, batch: TensorDict) -> None:
        validate = bool(batch["validate"]) if "validate" in batch.keys() else False
        partition = "val" if validate else "train"
        for i in range(len(batch)):
            prompt = _row(batch, i)
            self.prompts_seen.append(prompt)
            step = int(prompt.get("global_steps", 0))
            tq.kv_put(key=prompt["uid"], partition_id=partition, tag={"status": "running"})
            keys, fields, tags = [], [], []
            for session in range(self.n):
                key, field, tag = self._trajectory(prompt, session, step)
                keys.append(key)
                fields.append(field)
                tags.append(tag)
            tq.kv_batch_put(keys=keys, fields=list_of_dict_to_tensordict(fields), tags=tags, partition_id=partition)
            tq.kv_put(key=prompt["uid"], partition_id=partition, tag={"status": "finished"})

    def _trajectory(self, prompt: dict, session: int, step: int) -> tuple[str, dict, dict]:
        extra_info = dict(prompt["extra_info"])
        ground_truth = str(prompt["reward_model"]["ground_truth"])
        text, _ = self.policy.respond(extra_info, ground_truth, session, step)
        result = self.reward_fn(prompt["data_source"], text, ground_truth, extra_info)
        prompt_ids = encode_bytes(str(prompt.get("raw_prompt", ""))[:256]) or [0]
        response_ids = encode_bytes(text)
        output = AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response_ids,
            response_mask=[1] * len(response_ids),
            response_logprobs=[0.0] * len(response_ids),
            reward_score=float(result["score"]),
            num_turns=2,
            metrics=AgentLoopMetrics(),
            extra_fields={
                "reward_extra_info": {k: v for k, v in result.items() if k != "score"},
                "min_global_steps": step,
                "max_global_steps": step,
            },
        )
        if self.rollout_fields is not None:
            output.extra_fields.update(self.rollout_fields({**prompt, "session_id": session}))
        field = output.as_dict()
        for name in ("uid", "extra_info", "data_source", "reward_model", "index", "global_steps"):
            if name in prompt:
                field[name] = prompt[name]
        field["session_id"] = session
        field["loss_mask"] = field["response_mask"]
        input_ids = torch.cat([field["prompts"], field["responses"]])
        field["input_ids"] = input_ids
        field["position_ids"] = torch.arange(input_ids.numel())
        prompt_len, response_len = len(prompt_ids), len(response_ids)
        tag = {
            "status": "success",
            "prompt_len": prompt_len,
            "response_len": response_len,
            "seq_len": prompt_len + response_len,
            "global_steps": step,
            "min_global_steps": step,
            "max_global_steps": step,
        }
        return f"{prompt['uid']}_{session}_0", field, tag


class SimulatedActorWorkerGroup:
    """Stands in for the FSDP actor worker group: no model, same TransferQueue contract.

    ``compute_log_prob`` writes scripted log-probs (:func:`scripted_log_probs`: a fixed function of each next
    token, so responses differ in confidence as a model's would) and zero entropy; ``update_actor`` reads the
    advantages verl's update would consume and keeps them in ``updates`` (one dict per step) for inspection.
    """

    def __init__(self, dp_size: int = 1):
        self.dp_size = dp_size
        self._dispatch_info: dict = {}
        self.updates: list[dict] = []
        self.saved: list[str] = []

    def _query_dispatch_info(self, role: str) -> list[int]:
        return list(range(self.dp_size))

    def compute_log_prob(self, batch: KVBatchMeta) -> KVBatchMeta:
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["input_ids"])
        sequences = data["input_ids"].unbind()
        log_probs = torch.nested.as_nested_tensor([scripted_log_probs(ids) for ids in sequences], layout=torch.jagged)
        entropy = torch.nested.as_nested_tensor(
            [torch.zeros(ids.numel(), dtype=torch.float32) for ids in sequences], layout=torch.jagged
        )
        tq.kv_batch_put(
            keys=batch.keys,
            partition_id=batch.partition_id,
            fields=TensorDict({"log_probs": log_probs, "entropy": entropy}, batch_size=len(batch)),
        )
        return batch

    def compute_blind_log_prob(self, batch: KVBatchMeta) -> KVBatchMeta:
        """PGPO's blind pass (``verl_ext.pgpo``): :func:`scripted_blind_log_probs`, response-aligned as verl's
        TransferQueue bridge writes the real worker's ``blind_log_probs``."""
        from verl.workers.utils.padding import response_from_nested

        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["input_ids", "response_mask"]
        )
        full = torch.nested.as_nested_tensor(
            [scripted_blind_log_probs(ids) for ids in data["input_ids"].unbind()], layout=torch.jagged
        )
        blind = response_from_nested(full, data["response_mask"])
        tq.kv_batch_put(
            keys=batch.keys,
            partition_id=batch.partition_id,
            fields=TensorDict({"blind_log_probs": blind}, batch_size=len(batch)),
        )
        return batch

    def update_actor(self, batch: KVBatchMeta) -> dict:
        fields = ["advantages", "response_mask", "responses", "rm_scores", "old_log_probs", "uid", "extra_info"]
        fields.append("extra_fields")
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        record = {name: non_tensor_list(data.pop(name)) for name in ("uid", "extra_info", "extra_fields")}
        padded = data.to_padded_tensor()
        record.update(
            keys=list(batch.keys),
            tags=list(batch.tags),
            advantages=padded["advantages"].clone(),
            response_mask=padded["response_mask"].clone(),
            rm_scores=padded["rm_scores"].clone(),
            old_log_probs=padded["old_log_probs"].clone(),
            responses=padded["responses"].clone(),
        )
        self.updates.append(record)
        return {"metrics": {"mfu": 0.0, "pg_loss": 0.0}}

    def save_checkpoint(self, local_path, remote_path=None, global_step=0, max_ckpt_to_keep=None):
        os.makedirs(local_path, exist_ok=True)
        with open(os.path.join(local_path, "simulated_actor.txt"), "w") as f:
            f.write(str(global_step))
        self.saved.append(local_path)

    def load_checkpoint(self, local_path, del_local_after_load=False):
        if not os.path.exists(os.path.join(local_path, "simulated_actor.txt")):
            raise FileNotFoundError(f"no simulated actor checkpoint in {local_path}")


class _SimulatedWeightSync:
    def update_weights(self, global_steps: int) -> None:
        return None

    def sleep_replicas(self) -> None:
        return None


class _SimulatedRewardLoop:
    # Non-None handles tell verl that rewards were computed during rollout (as the reward loop workers do).
    reward_loop_worker_handles: list = []


class _SimulatedResourcePool:
    def get_n_gpus(self) -> int:
        return 1


# verl's RLHFDataset only asserts that a processor exists for image rows; the processor itself runs in the
# agent loop, which is simulated here. Used when no real processor is given.
PROCESSOR_STAND_IN = SimpleNamespace(image_processor=SimpleNamespace(patch_size=14))


def build_simulated_trainer(trainer_cls, config, tokenizer=None, processor=None, dp_size: int = 1):
    """Build a trainer as ``PPOTrainer._setup`` does, with the GPU parts replaced by the stand-ins above.

    Returns the trainer, ready for ``fit(SimulatedAgentLoopManager(...))`` or single ``step`` calls.
    """
    trainer = trainer_cls(config)
    trainer.tokenizer = tokenizer if tokenizer is not None else byte_tokenizer()
    trainer.processor = processor if processor is not None else PROCESSOR_STAND_IN
    trainer._init_dataloader()
    trainer._init_dump_executor()
    trainer.actor_rollout_wg = SimulatedActorWorkerGroup(dp_size)
    trainer.checkpoint_manager = _SimulatedWeightSync()
    trainer.reward_loop_manager = _SimulatedRewardLoop()
    trainer.resource_pool_manager = _SimulatedResourcePool()
    trainer._load_checkpoint()
    return trainer
