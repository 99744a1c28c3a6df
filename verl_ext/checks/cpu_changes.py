"""The ledger's data: each thing the CPU run on verl's vLLM rollout changes in the method's GPU job, and why.

:mod:`verl_ext.checks.ledger` composes both runs and checks that every config value that differs is an entry of
:data:`VLLM_CPU_CHANGES`, and that each entry still differs for some method; docs/stack.md's table ("The CPU
changes") is written from it. The settings themselves are the backend's (:mod:`verl_ext.cpu.vllm_launcher`,
:mod:`verl_ext.cpu.overrides`).
"""

from __future__ import annotations

from dataclasses import dataclass

from verl_ext.cpu.overrides import POLL_INTERVAL_S


@dataclass(frozen=True)
class CpuChange:
    """One thing the CPU run on verl's vLLM rollout changes in the GPU launcher's run: ``setting`` (a launcher
    variable or a Hydra override), the config ``keys`` it changes (leaf paths or their prefixes), and ``why``."""

    setting: str
    keys: tuple[str, ...]
    why: str


_AR = "actor_rollout_ref"
# Everything a CPU and a tiny model force on the GPU launcher's run: the launcher's variables first
# (vllm_launcher_env), then the Hydra overrides it has no variable for (vllm_cpu_overrides). A test composes both
# runs and checks that every config value that differs is listed here; docs/stack.md's table shows the same list.
VLLM_CPU_CHANGES: tuple[CpuChange, ...] = (
    CpuChange(
        "MODEL_PATH",
        (f"{_AR}.model.path",),
        "size: the tiny Qwen2.5-VL (the 7B's class, shrunk) built locally (no hub)",
    ),
    CpuChange("TRAIN_FILES, VAL_FILES", ("data.train_files", "data.val_files"), "the tiny `diva-prep synth` set"),
    CpuChange(
        "N_GPUS_PER_NODE (tiny_cpu.sh: GPUS_PER_NODE; NODES and TP as NNODES and TP_SIZE)",
        ("trainer.n_gpus_per_node",),
        "device: the local cluster's logical GPUs (default one node, one GPU)",
    ),
    CpuChange(
        "QUESTIONS_PER_STEP=2, ROLLOUT_N",
        ("data.train_batch_size", f"{_AR}.actor.ppo_mini_batch_size", f"{_AR}.rollout.n"),
        "size: 2 questions and 8 responses per question per step (DIVA: 2 prompts x 4)",
    ),
    CpuChange(
        "MAX_PROMPT_LENGTH=1024, MAX_RESPONSE_LENGTH=24, MAX_PIXELS=7056",
        ("data.max_prompt_length", "data.max_response_length", "diva.variants.max_pixels"),
        "size: 84 x 84 images, 24 new tokens",
    ),
    CpuChange(
        "LR=1e-3",
        (f"{_AR}.actor.optim.lr",),
        "tiny model: one update must move the log-probs far beyond float rounding, or the log-prob check could not "
        "tell synced weights from stale ones (1e-6 moves them by ~1e-5)",
    ),
    CpuChange(
        "SAVE_FREQ=1, TEST_FREQ=<steps>",
        ("trainer.save_freq", "trainer.test_freq"),
        "the run's checks: each step's weights for the log-prob check; validation before training (the launcher's "
        "default) and at the end of each part, for diva-report",
    ),
    CpuChange(
        "CKPT_DIR, EXPERIMENT_NAME, METRICS_LOG=",
        ("trainer.default_local_dir", "trainer.experiment_name", "ray_kwargs.ray_init.runtime_env.env_vars"),
        "the run folder; verl's own metrics file per experiment (the trained and the resumed part)",
    ),
    CpuChange("trainer.device=cpu", ("trainer.device",), "device"),
    CpuChange(
        "TOTAL_EPOCHS=100, trainer.total_training_steps",
        ("trainer.total_training_steps", "trainer.total_epochs"),
        "size: a few steps over 16 questions",
    ),
    CpuChange(
        "attn_implementation=sdpa, use_remove_padding=false",
        (f"{_AR}.model.override_config", f"{_AR}.model.use_remove_padding"),
        "attention: flash-attention needs CUDA (sdpa instead); the packed sequences run on the CPU with "
        "USE_REMOVE_PADDING=1 (verl's patched attention, a torch stand-in for flash-attn) and match the padded run to "
        "float tolerance; padded stays the default so that the recorded runs repeat",
    ),
    CpuChange(
        "fsdp_config.mixed_precision fp32, rollout.dtype=float32",
        (f"{_AR}.actor.fsdp_config.mixed_precision", f"{_AR}.ref.fsdp_config.mixed_precision", f"{_AR}.rollout.dtype"),
        "the run's checks: fp32 keeps the actor's and the rollout's log-probs equal to float rounding; PRECISION=bf16 "
        "runs verl's default, the GPU job's (bf16 compute, fp32 reduce; a PGPO run at world size 2 in CI), with the "
        "rollout still fp32",
    ),
    CpuChange(
        "use_torch_compile=false, rollout.enforce_eager=true",
        (
            f"{_AR}.actor.fsdp_config.use_torch_compile",
            f"{_AR}.ref.fsdp_config.use_torch_compile",
            f"{_AR}.actor.use_torch_compile",
            f"{_AR}.rollout.enforce_eager",
        ),
        "time: compiling on 2 cores costs more than the run",
    ),
    CpuChange(
        "micro-batch sizes 8 / 16 (at most each rank's rows), data.dataloader_num_workers=0",
        (
            f"{_AR}.actor.ppo_micro_batch_size_per_gpu",
            f"{_AR}.rollout.log_prob_micro_batch_size_per_gpu",
            f"{_AR}.ref.log_prob_micro_batch_size_per_gpu",
            "data.dataloader_num_workers",
        ),
        "size: 16 responses per step over the ranks; no loader processes on 2 cores",
    ),
    CpuChange(
        "rollout.enable_sleep_mode=false, rollout.free_cache_engine=false",
        (f"{_AR}.rollout.enable_sleep_mode", f"{_AR}.rollout.free_cache_engine"),
        "device: vLLM's CPU platform has no sleep mode ('Sleep mode is not supported on current platform', which "
        "Ray reports as \"cannot pickle 'pydantic_core._pydantic_core.ArgsKwargs'\")",
    ),
    CpuChange(
        f"sampler_kwargs.poll_interval_s={POLL_INTERVAL_S}",
        ("trainer.v1.sampler.sampler_kwargs.poll_interval_s",),
        "time: verl's replay buffer sleeps 2.0 s between looks at a step's rollouts, most of a tiny step; the batch "
        "it takes is the same at any interval (the synchronous buffer waits for every trajectory of the step)",
    ),
    CpuChange("rollout.max_num_seqs=16", (f"{_AR}.rollout.max_num_seqs",), "size: one step's 16 requests at once"),
    CpuChange(
        "rollout.engine_kwargs.vllm.worker_extension_cls (NC-GRPO: WORKER_EXTENSION)",
        (f"{_AR}.rollout.engine_kwargs.vllm.worker_extension_cls",),
        "device: vLLM's CPU build drops linear weights after loading (patch keep_cpu_linear_weights) and warms up "
        "with autograd on, which tensor parallel 2 refuses (patch warm_up_in_inference_mode; NC-GRPO: its noise "
        "extension with both patches, CpuNoiseWorkerExtension)",
    ),
    CpuChange(
        "actor.checkpoint.save_contents+=hf_model",
        (f"{_AR}.actor.checkpoint.save_contents",),
        "the run's checks: the rollout's log-probs and each step's weights (verl_ext.checks.logprob_check)",
    ),
    CpuChange(
        "agent.num_workers=<nodes>, reward.num_workers=1, one TransferQueue storage unit",
        (
            f"{_AR}.rollout.agent.num_workers",
            "reward.num_workers",
            "transfer_queue.backend.SimpleStorage.num_data_storage_units",
        ),
        "memory: verl starts 8 of each (~10 GB)",
    ),
    CpuChange(
        "reward: verl_ext.cpu.reward.separating_score",
        ("reward.custom_reward_function.path", "reward.custom_reward_function.name"),
        "tiny model: a random model never writes \\boxed{}",
    ),
    CpuChange(
        "MUPO: mupo.embedding.backend=hashing, mupo.min_size=2n/3",
        ("mupo.embedding.backend", "mupo.min_size"),
        "no embedding model is served on the CPU; k groups of min_size fit 2n responses",
    ),
)
