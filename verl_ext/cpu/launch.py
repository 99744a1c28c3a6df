"""The settings of a tiny CPU run, in one place: ``python -m verl_ext.cpu.launch`` prints them for the launcher.

:func:`prepare` builds the tiny model (:mod:`verl_ext.cpu.tiny_model`) and a ``diva-prep synth`` data set in a
work folder; :func:`cpu_overrides` returns the Hydra overrides of ``recipe/diva_grpo/config/diva_grpo.yaml`` that
run it on the CPU with verl's real trainer, FSDP2 workers and the ``hf_cpu`` rollout. Two methods share every
setting but the method's own (``METHODS``), at the same response budget per question:

* ``diva``: DIVA-GRPO, ``questions x (original + 1 variant)`` prompts, ``n`` responses each;
* ``grpo``: verl's GRPO baseline (verl's estimator on the toolkit trainer, which logs its collapse rate; verl's
  ``RLHFDataset``), ``questions`` prompts, ``2 n`` responses each;
* any other toolkit method (``verl_ext.methods``): its own trainer mode (``toolkit``), verl's dataset, like GRPO.

Sizes that keep a step to seconds on 2 cores: 2 questions per step, 24 response tokens, 84 x 84 pixels; one
agent-loop worker, one reward worker, one storage unit (verl's defaults start 8 of each: ~10 GB).

``--rollout vllm`` is the main job's own stack (``run_scripts/setup_vllm_cpu.sh``): verl's vLLM rollout on vLLM's
CPU build, configured by the GPU launcher itself (``run_scripts/qwen25vl7b_<method>.sh``). :func:`vllm_launcher_env`
sets the launcher's variables and :func:`vllm_cpu_overrides` adds the Hydra overrides it has no variable for; each
entry of :data:`VLLM_CPU_CHANGES` is one thing a CPU or a tiny model forces, with why (docs/stack.md, "The CPU
changes", lists them).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

from verl_ext.cpu import CPU_ENV, ROLLOUT_NAME, VLLM_WORKER_EXTENSION
from verl_ext.cpu.tiny_model import ARCHS, DEFAULT_ARCH, MAX_PIXELS, build_tiny_vlm, tiny_model_dir_name
from verl_ext.faults import FAULT_DIR_ENV, FAULTS_ENV

TRAIN_QUESTIONS = 16
VAL_QUESTIONS = 4


def prepare(workdir: str, arch: str = DEFAULT_ARCH) -> dict:
    """Tiny model of ``arch`` (:data:`verl_ext.cpu.tiny_model.ARCHS`) and synthetic data under ``workdir`` (reused
    when present); returns their paths. The training set's visual entropies are the model's, so it is per model."""
    from data_prep.synth import synth

    os.makedirs(workdir, exist_ok=True)
    paths = {
        "model": os.path.join(workdir, tiny_model_dir_name(arch)),
        "train": os.path.join(workdir, "synth_train.parquet" if arch == "qwen2_vl" else f"synth_train_{arch}.parquet"),
        "val": os.path.join(workdir, "synth_val.parquet"),
    }
    build_tiny_vlm(paths["model"], arch=arch)
    if not os.path.exists(paths["train"]):
        raw = os.path.join(workdir, "synth_train_raw.parquet")
        synth(raw, TRAIN_QUESTIONS, seed=0, split="train")
        # Durian reads extra_info.visual_entropy: computed by `diva-prep entropy` with the tiny model's vision tower,
        # as a user computes it with the policy's (the other methods ignore the field).
        from pathlib import Path

        from data_prep.entropy import EntropyOptions, run_entropy

        run_entropy(raw, paths["train"], EntropyOptions(model=Path(paths["model"]), device="cpu", progress=False))
    if not os.path.exists(paths["val"]):
        synth(paths["val"], VAL_QUESTIONS, seed=1, split="test")
    return paths


def _is_diva(method: str) -> bool:
    return method in ("diva", "diva_grpo")


def _checked_method(method: str) -> str:
    """``method`` if it is diva or a toolkit method (verl's GRPO included); a ValueError naming them otherwise."""
    from verl_ext.methods import METHODS

    if not _is_diva(method) and method not in METHODS:
        raise ValueError(
            f"METHOD={method} (--method): expected diva, grpo or a toolkit method: {', '.join(sorted(METHODS))}"
        )
    return method


def _mupo_overrides(method: str, rollout_n: int) -> list[str]:
    """MUPO on a CPU: no embedding model is served (hashed trigrams), and k groups of min_size in 2n responses."""
    if method != "mupo":
        return []
    return ["mupo.embedding.backend=hashing", f"mupo.min_size={max(1, (2 * rollout_n) // 3)}"]


def _nc_grpo_overrides(method: str) -> list[str]:
    """NC-GRPO on the hf_cpu rollout: its agent loop flags the noisy requests, and verl's rollout correction weighs
    the noisy half by how likely the clean policy is to draw it (the GPU launcher sets the same)."""
    if method != "noise_contrastive_grpo":
        return []
    from verl_ext.methods.noise_contrastive_grpo import rollout_correction_overrides
    from verl_ext.nc_grpo.noise import AGENT_LOOP_NAME

    return [f"actor_rollout_ref.rollout.agent.default_agent_loop={AGENT_LOOP_NAME}", *rollout_correction_overrides()]


def vllm_worker_extension(method: str) -> str:
    """The worker extension of vLLM's CPU build for ``method``: NC-GRPO's noise extension with the CPU patch, or
    the CPU patch alone (:data:`verl_ext.cpu.VLLM_WORKER_EXTENSION`)."""
    if method == "noise_contrastive_grpo":
        from verl_ext.nc_grpo.noise import CPU_NOISE_WORKER_EXTENSION

        return CPU_NOISE_WORKER_EXTENSION
    return VLLM_WORKER_EXTENSION


# verl's defaults that need an accelerator or more memory, changed by both CPU routes: flash-attention and its
# padding-free packing, bf16 autocast, torch.compile; loader workers, verl's 8 reward workers and storage units
# (~10 GB) sized for the tiny run. Micro-batches and agent-loop workers follow the cluster's shape
# (:func:`cluster_overrides`).
_FP32 = "{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"
PADDED = "actor_rollout_ref.model.use_remove_padding=false"
FP32_ACTOR = (
    f"+actor_rollout_ref.actor.fsdp_config.mixed_precision={_FP32}",
    f"+actor_rollout_ref.ref.fsdp_config.mixed_precision={_FP32}",
)
# The actor's and reference's compute precision (``PRECISION``). fp32 by default: the actor's log-probs then equal
# the fp32 rollout's to float rounding, which the runs' exact checks rely on. bf16 is the GPU job's: verl's FSDP
# default (no mixed_precision key), bf16 parameters in forward and backward (CPU autocast), fp32 gradient reduction,
# fp32 buffers and fp32 master weights. The rollout stays fp32 either way (the log-prob check recomputes it in fp32).
PRECISIONS = ("fp32", "bf16")
# Seconds between the replay buffer's looks at a step's finished rollouts (verl_ext.rollout.replay_buffer): verl's
# 2.0 would make a tiny step (~1 s of work) mostly sleep. It changes when a batch is taken, not what it holds.
POLL_INTERVAL_S = 0.1
ACCELERATOR_FREE_OVERRIDES = (
    "trainer.device=cpu",
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    PADDED,
    *FP32_ACTOR,
    "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",
    "actor_rollout_ref.ref.fsdp_config.use_torch_compile=false",
    "actor_rollout_ref.actor.use_torch_compile=false",
    "data.dataloader_num_workers=0",
    "reward.num_workers=1",
    "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    f"trainer.v1.sampler.sampler_kwargs.poll_interval_s={POLL_INTERVAL_S}",
)


def accelerator_free_overrides(packed: bool = False, precision: str = "fp32") -> list[str]:
    """:data:`ACCELERATOR_FREE_OVERRIDES`; ``packed``: with verl's packed sequences instead (``use_remove_padding``,
    the GPU launchers' setting), through verl's patched attention and the CPU stand-in for flash-attn
    (:mod:`verl_ext.cpu.varlen_attention`); ``precision``: one of :data:`PRECISIONS` (``bf16``: verl's own mixed
    precision, the GPU job's)."""
    if precision not in PRECISIONS:
        raise ValueError(f"PRECISION={precision!r}: expected one of {PRECISIONS} (bf16: the GPU job's mixed precision)")
    packing = "actor_rollout_ref.model.use_remove_padding=true"
    lines = [line for line in ACCELERATOR_FREE_OVERRIDES if precision == "fp32" or line not in FP32_ACTOR]
    return [packing if packed and line == PADDED else line for line in lines]


# The tiny run's responses per step, every method (DIVA: questions x 2 prompts x n; the others: questions x 2n).
RESPONSES_PER_QUESTION = 8
# Micro-batch sizes of one rank at world size 1; a larger world gets the rows each rank has, if fewer.
UPDATE_MICRO_BATCH, LOG_PROB_MICRO_BATCH = 8, 16


@dataclass(frozen=True)
class ClusterShape:
    """The cluster a CPU run trains on: ``nodes`` Ray nodes of ``gpus_per_node`` logical GPUs each (one training
    rank per GPU), rollout replicas of ``tp`` GPUs (tensor parallel; vLLM only)."""

    nodes: int = 1
    gpus_per_node: int = 1
    tp: int = 1

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node

    def check(self, rollout: str) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1 or self.tp < 1:
            raise ValueError(f"NODES={self.nodes}, GPUS_PER_NODE={self.gpus_per_node}, TP={self.tp}: each must be >= 1")
        if self.gpus_per_node % self.tp:
            raise ValueError(
                f"TP={self.tp}: a rollout replica's GPUs sit on one node, so TP must divide GPUS_PER_NODE="
                f"{self.gpus_per_node}"
            )
        if self.tp > 1 and rollout != "vllm":
            raise ValueError(f"TP={self.tp}: tensor-parallel replicas need ROLLOUT=vllm (hf_cpu serves whole models)")


def cluster_overrides(shape: ClusterShape, responses_per_step: int) -> list[str]:
    """What the cluster's shape sets: nodes and GPUs per node, then :func:`worker_overrides`."""
    return [
        f"trainer.nnodes={shape.nodes}",
        f"trainer.n_gpus_per_node={shape.gpus_per_node}",
        *worker_overrides(shape, responses_per_step),
    ]


def worker_overrides(shape: ClusterShape, responses_per_step: int) -> list[str]:
    """One agent-loop worker per node (verl places them round-robin over the nodes), and micro-batch sizes that
    divide each rank's rows (checked before the model loads: :mod:`verl_ext.cluster.batch_arithmetic`)."""
    rows = responses_per_step // shape.world
    return [
        f"actor_rollout_ref.rollout.agent.num_workers={shape.nodes}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={min(UPDATE_MICRO_BATCH, rows)}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={min(LOG_PROB_MICRO_BATCH, rows)}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={min(LOG_PROB_MICRO_BATCH, rows)}",
    ]


def method_overrides(method: str, questions: int, rollout_n: int, without: tuple[str, ...] = ()) -> list[str]:
    """What differs between methods: estimator, trainer, dataset, prompts per step and responses per prompt.

    Every method gets ``2 * rollout_n`` responses per question: DIVA as 2 prompts (original + variant) x n, the
    others as 1 prompt x 2n (verl's dataset, no variants), as the GPU launchers do. ``without``: DIVA-GRPO's
    additions removed (:mod:`verl_ext.cpu.ablations`; DIVA only); without ``variants`` its one prompt per question
    gets the 2n responses.
    """
    from verl_ext.cpu.ablations import addition_overrides, checked_additions

    without = checked_additions(without)
    if _is_diva(_checked_method(method)):
        estimator, trainer_mode = "diva_grpo", "diva_grpo"
    else:
        from verl_ext.methods import get_method

        if without:
            raise ValueError(
                f"WITHOUT={' '.join(without)} (--without): only DIVA-GRPO's additions can be removed, not {method}'s"
            )
        estimator, trainer_mode = method, get_method(method).trainer_mode
    if trainer_mode == "diva_grpo":
        variants = 0 if "variants" in without else 1
        prompts = (1 + variants) * questions
        return [
            f"algorithm.adv_estimator={estimator}",
            "trainer.v1.trainer_mode=diva_grpo",
            f"diva.variants.variants_per_question={variants}",
            f"data.train_batch_size={prompts}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts}",
            f"actor_rollout_ref.rollout.n={2 * rollout_n // (1 + variants)}",
            *addition_overrides(without),
        ]
    return [
        *_mupo_overrides(method, rollout_n),
        *_nc_grpo_overrides(method),
        f"algorithm.adv_estimator={estimator}",
        f"trainer.v1.trainer_mode={trainer_mode}",
        "data.custom_cls.path=pkg://verl_ext.data.pixel_limit",
        "data.custom_cls.name=PixelLimitedDataset",
        "diva.variants.variants_per_question=0",
        f"data.train_batch_size={questions}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={questions}",
        f"actor_rollout_ref.rollout.n={2 * rollout_n}",
    ]


def cpu_overrides(
    paths: dict,
    ckpt_dir: str,
    *,
    method: str = "diva",
    steps: int = 3,
    save_freq: int | None = None,
    questions: int = 2,
    rollout_n: int = 4,
    response_length: int = 24,
    lr: float = 1e-3,
    experiment: str = "tiny_cpu",
    ray_init: bool = True,
    reward: str = "separating",
    test_freq: int | None = None,
    seed: int = 0,
    shape: ClusterShape = ClusterShape(),
    without: tuple[str, ...] = (),
    packed: bool = False,
    precision: str = "fp32",
) -> list[str]:
    """Hydra overrides of a tiny CPU run (see the module docstring).

    ``reward``: ``separating`` (:mod:`verl_ext.cpu.reward`, for the random model) or ``paper`` (the project's
    :func:`verl_ext.reward.compute_score`: ``\\boxed{}`` and math-verify, for the swatch task). Validation runs
    before training and every ``test_freq`` steps (default: at the last step), greedy (temperature 0: the same
    answers for the same weights, so curves move only when the policy does). ``seed`` seeds the data order, the
    variant draws and the rollout sampling. ``shape``: the cluster's nodes and GPUs per node
    (:func:`cluster_overrides`). ``without``: DIVA-GRPO's additions removed (:mod:`verl_ext.cpu.ablations`).
    ``packed``, ``precision``: verl's packed sequences, the actor's mixed precision
    (:func:`accelerator_free_overrides`).

    ``ray_init``: the entry point starts Ray itself (a test); then it gets one logical GPU, 16 logical CPUs
    (TransferQueue's storage actors) and :data:`verl_ext.cpu.CPU_ENV` for every process. Under ``ray job submit``
    the head was started with those (``run_scripts/tiny_cpu.sh``) and ``ray_init=False``.
    """
    args = method_overrides(method, questions, rollout_n, without) + [
        f"data.train_files={paths['train']}",
        f"data.val_files={paths['val']}",
        "data.max_prompt_length=1024",
        f"data.max_response_length={response_length}",
        f"diva.variants.max_pixels={MAX_PIXELS}",
        f"actor_rollout_ref.model.path={paths['model']}",
        *accelerator_free_overrides(packed, precision),
        *cluster_overrides(shape, questions * 2 * rollout_n),
        # Gradient checkpointing stays on, as on the GPU (the recipe's setting): its recomputed forward gives the
        # same gradients bit for bit (tests/cpu/test_gradient_checkpointing_on_cpu.py), so recorded runs repeat.
        f"actor_rollout_ref.actor.optim.lr={lr}",
        f"actor_rollout_ref.rollout.name={ROLLOUT_NAME}",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        *_reward_overrides(reward),
        f"trainer.total_training_steps={steps}",
        "trainer.total_epochs=100",
        f"trainer.save_freq={save_freq if save_freq is not None else steps}",
        f"trainer.test_freq={test_freq if test_freq is not None else steps}",
        "trainer.val_before_train=true",
        "actor_rollout_ref.rollout.val_kwargs.temperature=0",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=false",
        f"data.seed={seed}",
        f"diva.variants.seed={seed}",
        f"actor_rollout_ref.rollout.seed={seed}",
        "trainer.resume_mode=auto",
        "trainer.logger=[console,file]",
        f"trainer.experiment_name={experiment}",
        f"trainer.default_local_dir={ckpt_dir}",
    ]
    if ray_init:
        if shape.nodes != 1:
            raise ValueError("ray_init starts a one-node Ray cluster in the entry point; several nodes need a launcher")
        args += [
            f"+ray_kwargs.ray_init.num_gpus={shape.gpus_per_node}",
            "ray_kwargs.ray_init.num_cpus=16",
            "+ray_kwargs.ray_init.include_dashboard=false",
        ]
        args += [f"+ray_kwargs.ray_init.runtime_env.env_vars.{k}={v}" for k, v in CPU_ENV.items()]
    return args


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
        "the run's checks: the rollout's log-probs and each step's weights (verl_ext.cpu.logprob_check)",
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

# vLLM's CPU backend reads these in its engine process (Ray env values are strings).
VLLM_CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


def launcher_for(method: str) -> str:
    """The GPU launcher of ``method`` (``run_scripts/``): DIVA's, GRPO's or the toolkit method's."""
    return "qwen25vl7b_diva.sh" if _is_diva(_checked_method(method)) else f"qwen25vl7b_{method}.sh"


def vllm_launcher_env(
    paths: dict,
    run_dir: str,
    *,
    method: str = "diva",
    steps: int = 3,
    questions: int = 2,
    rollout_n: int = 4,
    response_length: int = 24,
    lr: float = 1e-3,
    shape: ClusterShape = ClusterShape(),
    without: tuple[str, ...] = (),
) -> dict[str, str]:
    """The GPU launcher's variables for the CPU run (see :data:`VLLM_CPU_CHANGES`): DIVA gets ``rollout_n``
    responses for each of its 2 prompts per question, the other methods ``2 * rollout_n`` for their one; the
    cluster's shape sets ``NNODES``, ``N_GPUS_PER_NODE`` and ``TP_SIZE``. ``without``: DIVA-GRPO's additions removed
    (:func:`verl_ext.cpu.ablations.launcher_ablation`: its variables here, its overrides in
    :func:`vllm_cpu_overrides`; DIVA only)."""
    from verl_ext.cpu.ablations import launcher_ablation

    diva = _is_diva(method)
    method_overrides(method, questions, rollout_n, without)  # refuses additions removed from another method
    extension = vllm_worker_extension(method)
    own = {"WORKER_EXTENSION": extension} if extension != VLLM_WORKER_EXTENSION else {}
    ablation, _ = launcher_ablation(without, rollout_n)
    return {
        **own,
        "MODEL_PATH": paths["model"],
        "TRAIN_FILES": paths["train"],
        "VAL_FILES": paths["val"],
        "NNODES": str(shape.nodes),
        "N_GPUS_PER_NODE": str(shape.gpus_per_node),
        "TP_SIZE": str(shape.tp),
        "QUESTIONS_PER_STEP": str(questions),
        "ROLLOUT_N": str(rollout_n if diva else 2 * rollout_n),
        "MAX_PROMPT_LENGTH": "1024",
        "MAX_RESPONSE_LENGTH": str(response_length),
        "MAX_PIXELS": str(MAX_PIXELS),
        "LR": str(lr),
        "TOTAL_EPOCHS": "100",
        "SAVE_FREQ": "1",
        "TEST_FREQ": str(steps),
        "CKPT_DIR": os.path.join(run_dir, "checkpoints"),
        "EXPERIMENT_NAME": f"tiny_cpu_{method}",
        # Empty: verl's file logger writes <VERL_FILE_LOGGER_ROOT>/<project>/<experiment>.jsonl, one per part.
        "METRICS_LOG": "",
        **ablation,
    }


def vllm_engine_overrides(method: str = "diva") -> list[str]:
    """What vLLM's CPU build needs of verl's vLLM rollout (see :data:`VLLM_CPU_CHANGES`); the rollout name is
    verl's default, ``vllm``. NC-GRPO's launcher names its own worker extension (its ``WORKER_EXTENSION``, which
    :func:`vllm_launcher_env` sets to the CPU variant), so none is added for it here, and sets
    ``enforce_eager=true`` itself (its noise is a hook in the model's forward), so that is not added either."""
    extension = vllm_worker_extension(method)
    own = (
        []
        if extension != VLLM_WORKER_EXTENSION
        else [f"+actor_rollout_ref.rollout.engine_kwargs.vllm.worker_extension_cls={extension}"]
    )
    eager = [] if method == "noise_contrastive_grpo" else ["actor_rollout_ref.rollout.enforce_eager=true"]
    return [
        "actor_rollout_ref.rollout.dtype=float32",
        *eager,
        "+actor_rollout_ref.rollout.enable_sleep_mode=false",
        "actor_rollout_ref.rollout.free_cache_engine=false",
        "actor_rollout_ref.rollout.max_num_seqs=16",
        *own,
    ]


def vllm_cpu_overrides(
    *,
    method: str = "diva",
    steps: int = 3,
    questions: int = 2,
    rollout_n: int = 4,
    shape: ClusterShape = ClusterShape(),
    without: tuple[str, ...] = (),
    packed: bool = False,
    precision: str = "fp32",
) -> list[str]:
    """Hydra overrides the GPU launcher has no variable for (see :data:`VLLM_CPU_CHANGES`), after its own;
    ``without``: those that remove DIVA-GRPO's additions (:func:`verl_ext.cpu.ablations.launcher_ablation`)."""
    from verl_ext.cpu.ablations import launcher_ablation

    return [
        *launcher_ablation(without, rollout_n)[1],
        *_mupo_overrides(method, rollout_n),
        *accelerator_free_overrides(packed, precision),
        *worker_overrides(shape, questions * 2 * rollout_n),  # nodes and GPUs: the launcher's NNODES, ...
        f"trainer.total_training_steps={steps}",
        "trainer.resume_mode=auto",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
        *vllm_engine_overrides(method),
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        *_reward_overrides("separating"),
    ]


def _reward_overrides(reward: str) -> list[str]:
    if reward == "separating":
        # A random model never writes \boxed{}: a reward that separates its responses (verl_ext.cpu.reward).
        return [
            "reward.custom_reward_function.path=pkg://verl_ext.cpu.reward",
            "reward.custom_reward_function.name=separating_score",
        ]
    if reward == "paper":
        return [
            "reward.custom_reward_function.path=pkg://verl_ext.reward",
            "reward.custom_reward_function.name=compute_score",
        ]
    raise ValueError(f"reward={reward!r}: expected 'separating' (random model) or 'paper' (verl_ext.reward)")


def runtime_env(run_dir: str, repo_root: str) -> dict:
    """The recipe's Ray runtime env (``recipe/diva_grpo/runtime_env.yaml``) plus the CPU job's environment:
    :data:`verl_ext.cpu.CPU_ENV`, verl's file-logger folder and the actor-input probe folder of ``run_dir``."""
    import yaml

    from verl_ext.cpu.probe import PROBE_ENV

    with open(os.path.join(repo_root, "recipe", "diva_grpo", "runtime_env.yaml")) as f:
        env = yaml.safe_load(f)
    env["working_dir"] = repo_root
    env["env_vars"] = {
        **env.get("env_vars", {}),
        **CPU_ENV,
        **VLLM_CPU_ENV,
        "VERL_FILE_LOGGER_ROOT": os.path.join(run_dir, "metrics"),
        PROBE_ENV: os.path.join(run_dir, "probe"),
        # The crash tests' armed faults (verl_ext/faults.py), for every process of the job.
        **{key: os.environ[key] for key in (FAULTS_ENV, FAULT_DIR_ENV) if os.environ.get(key)},
    }
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True, help="folder for the tiny model and the synthetic data")
    parser.add_argument("--run-dir", default=None, help="folder of this run's checkpoints (default: <workdir>/run)")
    parser.add_argument("--method", default="diva", help="diva (default), grpo, or a toolkit estimator name")
    parser.add_argument("--steps", type=int, default=3, help="trainer.total_training_steps")
    parser.add_argument("--save-freq", type=int, default=None, help="trainer.save_freq (default: --steps)")
    parser.add_argument("--questions", type=int, default=2, help="questions per step")
    parser.add_argument("--rollout-n", type=int, default=4, help="responses per DIVA prompt (GRPO: twice as many)")
    parser.add_argument(
        "--without",
        default="",
        help="DIVA-GRPO's additions to remove, space-separated (verl_ext.cpu.ablations.ADDITIONS, or 'all')",
    )
    parser.add_argument("--nodes", type=int, default=1, help="Ray nodes of the local cluster (trainer.nnodes)")
    parser.add_argument("--gpus-per-node", type=int, default=1, help="logical GPUs (training ranks) per node")
    parser.add_argument("--tp", type=int, default=1, help="rollout tensor parallel size (vLLM only)")
    parser.add_argument("--ray-init", action="store_true", help="the entry point starts Ray itself")
    parser.add_argument("--runtime-env-out", default=None, help="write the job's Ray runtime env (yaml) here")
    parser.add_argument(
        "--rollout",
        default=ROLLOUT_NAME,
        choices=(ROLLOUT_NAME, "vllm"),
        help="hf_cpu (default) or vllm: verl's vLLM rollout through the method's GPU launcher",
    )
    parser.add_argument("--launcher-env-out", default=None, help="--rollout vllm: write the launcher's variables here")
    parser.add_argument(
        "--arch", default=DEFAULT_ARCH, choices=ARCHS, help="the tiny model's architecture (the 7B job's: qwen2_5_vl)"
    )
    parser.add_argument(
        "--use-remove-padding",
        action="store_true",
        help="verl's packed sequences (the GPU launchers' use_remove_padding=true) instead of padded batches",
    )
    parser.add_argument(
        "--precision",
        default="fp32",
        choices=PRECISIONS,
        help="the actor's compute precision: fp32 (default, exact checks) or bf16 (the GPU job's mixed precision)",
    )
    args = parser.parse_args(argv)
    shape = ClusterShape(args.nodes, args.gpus_per_node, args.tp)
    without = tuple(args.without.split())
    try:
        shape.check(args.rollout)
        method_overrides(args.method, args.questions, args.rollout_n, without)
    except ValueError as err:
        # The launcher's own words (its variables), not this module's usage: nothing was built or written yet.
        print(f"error: {err}", file=sys.stderr)
        return 2
    paths = prepare(args.workdir, args.arch)
    run_dir = os.path.abspath(args.run_dir or os.path.join(args.workdir, "run"))
    if args.rollout == "vllm":
        # The run's settings, split between the GPU launcher's variables and the overrides it has no variable for.
        run = dict(
            method=args.method,
            steps=args.steps,
            questions=args.questions,
            rollout_n=args.rollout_n,
            shape=shape,
            without=without,
        )
        env = vllm_launcher_env(paths, run_dir, **run)
        env["DIVA_GPU_LAUNCHER"] = launcher_for(args.method)
        if args.launcher_env_out:
            with open(args.launcher_env_out, "w") as f:
                f.write("".join(f"{k}={v}\n" for k, v in env.items()))
        lines = vllm_cpu_overrides(**run, packed=args.use_remove_padding, precision=args.precision)
    else:
        lines = None
    lines = lines or cpu_overrides(
        paths,
        os.path.join(run_dir, "checkpoints"),
        method=args.method,
        steps=args.steps,
        save_freq=args.save_freq,
        questions=args.questions,
        rollout_n=args.rollout_n,
        experiment=f"tiny_cpu_{args.method}",
        ray_init=args.ray_init,
        shape=shape,
        without=without,
        packed=args.use_remove_padding,
        precision=args.precision,
    )
    if args.runtime_env_out:
        import yaml

        repo_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        with open(args.runtime_env_out, "w") as f:
            yaml.safe_dump(runtime_env(run_dir, repo_root), f, sort_keys=False)
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
