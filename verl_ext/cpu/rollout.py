"""A rollout backend generating with Hugging Face transformers on the CPU (``actor_rollout_ref.rollout.name=hf_cpu``).

verl 0.9.1's rollout backends are vLLM, SGLang and TRT-LLM. vLLM's CPU build serves a tiny model, but verl's
weight sync into it fails (on CPU vLLM packs linear weights into oneDNN handles, so in-place reloading is
impossible). This backend plugs into verl's public rollout registries with the three pieces verl expects:

* :class:`HFCpuServer` (a Ray actor): holds a copy of the policy and answers the calls of verl's
  ``LLMServerClient`` / ``CheckpointEngineManager``: ``generate`` (token ids in, token ids and log-probs out),
  ``sleep`` / ``wake_up``, ``set_global_steps``, ``update_weights``, ...;
* :class:`HFCpuReplica` (``RolloutReplicaRegistry``): launches one server per replica on the node of its hybrid
  actor workers;
* :class:`HFCpuServerAdapter` (``_ROLLOUT_REGISTRY``): lives in the actor worker process; verl's
  ``update_weights`` hands it the trained weights, which it sends to the server.

Log-probs are those the actor computes: ``log_softmax(logits / temperature)`` of the sampled token, over
the whole vocabulary. Vision special tokens are never sampled (a random model emits them, and they break
Qwen2-VL's rope index), a difference of a few parts in a million from the actor's distribution.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import threading
from typing import Any

import ray
import torch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import HFModelConfig, RolloutConfig
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutMode, RolloutReplica, TokenOutput

from verl_ext import faults
from verl_ext.cpu.names import ROLLOUT_NAME
from verl_ext.nc_grpo.hf_hook import prefill_noise
from verl_ext.nc_grpo.noise import request_noise

NOISE_RECORDS = 256

logger = logging.getLogger(__name__)


def _server_actor_name(replica_rank: int) -> str:
    return f"{ROLLOUT_NAME}_server_{replica_rank}_0"


def _request_key(prompt_ids, sampling_params: dict) -> str:
    """What identifies a request across its retries (same prompt, same params: the seed among them), for the request
    fault points of :mod:`verl_ext.faults`."""
    digest = hashlib.blake2b(repr((list(prompt_ids), sorted(sampling_params.items()))).encode(), digest_size=8)
    return f"seed {sampling_params.get('seed')} prompt+params {digest.hexdigest()}"


def _load_policy(model_path: str, attn_implementation: str = "sdpa"):
    """The model, tokenizer and (for a VLM) processor from ``model_path``, float32, eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

    config = AutoConfig.from_pretrained(model_path)
    is_vlm = hasattr(config, "vision_config")
    model_cls = AutoModelForImageTextToText if is_vlm else AutoModelForCausalLM
    model = model_cls.from_pretrained(model_path, dtype=torch.float32, attn_implementation=attn_implementation)
    model.eval()
    processor = AutoProcessor.from_pretrained(model_path) if is_vlm else None
    return model, AutoTokenizer.from_pretrained(model_path), processor, config


def _never_sampled(config) -> list[int]:
    """Vision special tokens (image/video pads, vision start/end) of a VLM config; empty for a text model."""
    names = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
    return sorted({int(getattr(config, name)) for name in names if getattr(config, name, None) is not None})


@ray.remote(num_cpus=0)
class HFCpuServer:
    """One rollout server: a transformers copy of the policy that samples one request at a time."""

    def __init__(self, config: RolloutConfig, model_config: HFModelConfig, replica_rank: int, mode: RolloutMode):
        self.config: RolloutConfig = omega_conf_to_dataclass(config)
        self.model_config: HFModelConfig = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        self.replica_rank = replica_rank
        self.mode = mode
        attn = (self.model_config.override_config or {}).get("attn_implementation", "sdpa")
        if attn == "flash_attention_2":
            attn = "sdpa"
        self.model, self.tokenizer, self.processor, hf_config = _load_policy(self.model_config.local_path, attn)
        # A request without a seed of its own (verl's agent loop sends none; the recipe's seeded loop does, see
        # verl_ext/rollout/agent_loop.py) draws from this process's stream: rollout.seed + replica rank, as vLLM's.
        torch.manual_seed(int(self.config.seed) + replica_rank)
        self.suppressed = torch.tensor(_never_sampled(hf_config), dtype=torch.long)
        self.image_token_id = getattr(hf_config, "image_token_id", None)
        # verl leaves max_model_len unset by default: a request may use the prompt plus the response budget.
        self.max_model_len = self.config.max_model_len or (self.config.prompt_length + self.config.response_length)
        # Model weights version, an integer as verl's metrics expect; set by the adapter after each sync.
        self.global_steps = 0
        # NC-GRPO's applied displacements, the last NOISE_RECORDS (tests compare them with vLLM's, with the tensors:
        # nc_grpo_keep_tensors).
        self.nc_grpo_applied: list[dict] = []
        self.nc_grpo_keep_tensors = False
        self._lock = threading.Lock()
        self._generation_allowed = asyncio.Event()
        self._generation_allowed.set()

    def get_server_address(self) -> str:
        return f"{ROLLOUT_NAME}://replica-{self.replica_rank}"

    # ------------------------------------------------------------------ generation

    def _vision_inputs(self, prompt_ids: list[int], image_data, video_data, mm_processor_kwargs) -> dict:
        """Pixel values and grids of the request's images, and ``mm_token_type_ids`` (1 on image tokens): without
        it transformers' Qwen2-VL silently falls back to 1-D positions for the image, not the M-RoPE the actor
        uses (a random model's log-probs then differ by only ~1e-3 per token, so the mistake would hide)."""
        if video_data:
            raise NotImplementedError("the hf_cpu rollout serves images only, not videos")
        if not image_data:
            return {}
        out = self.processor.image_processor(images=image_data, return_tensors="pt", **(mm_processor_kwargs or {}))
        ids = torch.tensor([prompt_ids], dtype=torch.long)
        token_types = (ids == self.image_token_id).to(torch.int32)
        return {
            "pixel_values": out["pixel_values"],
            "image_grid_thw": out["image_grid_thw"],
            "mm_token_type_ids": token_types,
        }

    @torch.no_grad()
    def _sample(
        self, prompt_ids: list[int], sampling_params: dict, vision: dict, request_id: str = ""
    ) -> tuple[list[int], list[float]]:
        """Sample with ``model.generate``; returns the new token ids and their log-probs (shape: one per token)."""
        max_tokens = sampling_params.get("max_tokens") or sampling_params.get("max_new_tokens")
        budget = min(self.config.response_length, self.max_model_len - len(prompt_ids))
        max_tokens = max(0, min(int(max_tokens), budget) if max_tokens else budget)
        if max_tokens == 0:
            return [], []
        temperature = float(sampling_params.get("temperature", 1.0))
        greedy = temperature <= 0
        top_k = int(sampling_params.get("top_k", -1))
        input_ids = torch.tensor([prompt_ids], dtype=torch.long)
        kwargs: dict[str, Any] = {
            "max_new_tokens": max_tokens,
            "do_sample": not greedy,
            "output_logits": True,
            "return_dict_in_generate": True,
            "suppress_tokens": self.suppressed.tolist() or None,
            "eos_token_id": self.tokenizer.eos_token_id,
            "pad_token_id": self.tokenizer.pad_token_id,
        }
        if not greedy:
            kwargs.update(temperature=temperature, top_p=float(sampling_params.get("top_p", 1.0)))
            kwargs["top_k"] = top_k if top_k > 0 else None
        seed = sampling_params.get("seed")
        # A seeded request draws from its own stream (as vLLM's per-request generator): fork_rng restores the
        # process's stream afterwards, so an unseeded request's draws do not depend on the seeded ones.
        # NC-GRPO: a flagged request's prefill displaces its prompt (verl_ext/nc_grpo/hf_hook.py): a decoder layer's
        # input at every prompt position (whose keys and values decoding then attends to), or the final hidden state.
        noise = request_noise(sampling_params)
        with (
            torch.random.fork_rng(devices=[], enabled=seed is not None),
            prefill_noise(
                self.model,
                noise,
                len(prompt_ids),
                request_id=request_id,
                records=self.nc_grpo_applied,
                keep_tensors=self.nc_grpo_keep_tensors,
            ),
        ):
            if seed is not None:
                torch.manual_seed(int(seed))
            out = self.model.generate(
                input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **vision, **kwargs
            )
        del self.nc_grpo_applied[:-NOISE_RECORDS]
        new_ids = out.sequences[0, input_ids.shape[1] :]
        # Raw logits of each step (B=1, V) -> the actor's log-prob of the sampled token.
        logits = torch.stack(out.logits, dim=0)[:, 0, :].float()
        scale = temperature if not greedy else 1.0
        log_probs = torch.log_softmax(logits / scale, dim=-1).gather(-1, new_ids[: len(logits), None]).squeeze(-1)
        return new_ids.tolist(), log_probs.tolist()

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: list[Any] | None = None,
        video_data: list[Any] | None = None,
        audio_data: list[Any] | None = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
        **kwargs,
    ) -> TokenOutput:
        await self._generation_allowed.wait()
        faults.inject("rollout_generate", self.global_steps)
        faults.fail_request(self.global_steps, lambda: _request_key(prompt_ids, sampling_params))
        vision = self._vision_inputs(list(prompt_ids), image_data, video_data, mm_processor_kwargs)

        def run():
            with self._lock:  # one request at a time: the CPU has no room for concurrent forward passes
                return self._sample(list(prompt_ids), dict(sampling_params), vision, request_id)

        token_ids, log_probs = await asyncio.to_thread(run)
        stop = "completed" if token_ids and token_ids[-1] == self.tokenizer.eos_token_id else "length"
        return TokenOutput(
            token_ids=token_ids,
            log_probs=log_probs if sampling_params.get("logprobs") else None,
            stop_reason=stop,
            extra_fields={"global_steps": self.global_steps},
        )

    # ------------------------------------------------------------------ weights and life cycle

    def update_weights(self, state: dict[str, torch.Tensor]) -> int:
        """Copy the actor's weights (HF names, full tensors) into the served model; returns the count copied.

        Every parameter of the served model must be covered: a partial sync would leave stale weights."""
        own = self.model.state_dict()
        unknown = sorted(set(state) - set(own))
        if unknown:
            raise ValueError(f"hf_cpu rollout: weights {unknown[:5]} from the actor are not in the served model")
        missing = sorted(name for name, _ in self.model.named_parameters() if name not in state)
        if missing:
            raise ValueError(f"hf_cpu rollout: the actor sent no weights for {missing[:5]}")
        with self._lock, torch.no_grad():
            for name, tensor in state.items():
                own[name].copy_(tensor.to(own[name].dtype))
        return len(state)

    def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = int(global_steps)

    def get_global_steps(self) -> int:
        return self.global_steps

    def nc_grpo_applied_noise(self) -> list[dict]:
        """NC-GRPO's recent displacements (:func:`verl_ext.nc_grpo.noise.applied_record`), oldest first."""
        return list(self.nc_grpo_applied)

    # Memory release makes no sense for a CPU copy; generation is gated so no request runs during a sync.
    async def sleep(self):
        return None

    async def wake_up(self, tags: list[str] | None = None):
        return None

    async def clear_kv_cache(self):
        return None

    async def release_kv_cache(self):
        return None

    async def resume_kv_cache(self):
        return None

    async def abort_all_requests(self, reject_request: bool = False):
        self._generation_allowed.clear()

    async def resume_generation(self):
        self._generation_allowed.set()

    async def start_profile(self, **kwargs):
        return None

    async def stop_profile(self):
        return None


class HFCpuReplica(RolloutReplica):
    """A replica of one :class:`HFCpuServer`, on the node of its hybrid actor workers."""

    def rollout_worker_use_gpu(self) -> bool:
        return False

    async def launch_servers(self):
        if self.rollout_mode != RolloutMode.HYBRID:
            # Standalone / colocated replicas get their weights through a checkpoint engine's receiving worker,
            # which this backend has not: the server would silently keep its first weights.
            raise NotImplementedError(
                f"hf_cpu serves verl's hybrid (colocated, synchronous) mode only, not {self.rollout_mode}; use "
                "trainer.v1.trainer_mode=sync, diva_grpo or toolkit"
            )
        # Beside the replica's first worker, on its node (as verl places its vLLM servers): the weights it is sent
        # after each update come from that worker's process, and on a cluster the trainer's node holds no worker.
        node = await self.workers[0].__ray_call__.remote(lambda worker: ray.get_runtime_context().get_node_id())
        server = HFCpuServer.options(
            name=_server_actor_name(self.replica_rank),
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False),
            max_concurrency=self.max_concurrency,
        ).remote(self.config, self.model_config, self.replica_rank, self.rollout_mode)
        self.servers = [server]
        self._server_handle = server
        self._server_address = await server.get_server_address.remote()


class HFCpuServerAdapter(BaseRollout):
    """The actor worker's side: receives the trained weights from verl and sends them to the replica's server.

    verl's colocated ("naive") sync calls :meth:`update_weights` on every actor rank with a generator of
    ``(name, full tensor)``: FSDP gathers each tensor collectively, so every rank drains the generator and
    rank 0 of the replica sends.
    """

    def __init__(self, config: RolloutConfig, model_config: HFModelConfig, device_mesh, replica_rank: int = -1):
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", 0))
        world = self.config.tensor_model_parallel_size * self.config.data_parallel_size
        world *= self.config.pipeline_model_parallel_size
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self.is_sender = rank % world == 0
        self._server = None

    def _server_handle(self):
        if self._server is None:
            self._server = ray.get_actor(_server_actor_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]):
        return None

    async def release(self):
        return None

    @torch.no_grad()
    async def update_weights(self, weights, global_steps: int | None = None, wire_format: str = "named_tensors", **kw):
        if wire_format != "named_tensors":
            raise NotImplementedError(f"hf_cpu rollout syncs full tensors only, not wire_format={wire_format!r}")
        if kw.get("peft_config") is not None:
            raise NotImplementedError("hf_cpu rollout: LoRA adapters are not supported; merge them (model.lora.merge)")
        state = {name: tensor.detach().to("cpu", copy=True) for name, tensor in weights}
        if not self.is_sender:
            return
        server = self._server_handle()
        await server.update_weights.remote(state)
        if global_steps is not None:
            await server.set_global_steps.remote(global_steps)
