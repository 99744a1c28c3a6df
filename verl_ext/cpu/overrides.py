"""The Hydra overrides of a tiny CPU run with the ``hf_cpu`` rollout: :func:`cpu_overrides` for
``recipe/diva_grpo/config/diva_grpo.yaml``, run with verl's real trainer and FSDP2 workers.

Two methods share every setting but the method's own (:func:`method_overrides`), at the same response budget per
question:

* ``diva``: DIVA-GRPO, ``questions x (original + 1 variant)`` prompts, ``n`` responses each;
* ``grpo``: verl's GRPO baseline (verl's estimator on the toolkit trainer, which logs its collapse rate; verl's
  ``RLHFDataset``), ``questions`` prompts, ``2 n`` responses each;
* any other toolkit method (``verl_ext.methods``): its own trainer mode (``toolkit``), verl's dataset, like GRPO.

Sizes that keep a step to seconds on 2 cores: 2 questions per step, 24 response tokens, 84 x 84 pixels; one
agent-loop worker, one reward worker, one storage unit (verl's defaults start 8 of each: ~10 GB). The settings both
CPU routes share (:func:`accelerator_free_overrides`, :func:`cluster_overrides`) are here too; the vLLM route's own
are :mod:`verl_ext.cpu.vllm_launcher`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from verl_ext.cpu import CPU_ENV, ROLLOUT_NAME, VLLM_WORKER_EXTENSION
from verl_ext.cpu.tiny_model import MAX_PIXELS


def is_diva(method: str) -> bool:
    return method in ("diva", "diva_grpo")


def checked_method(method: str) -> str:
    """``method`` if it is diva or a toolkit method (verl's GRPO included); a ValueError naming them otherwise."""
    from verl_ext.methods import METHODS

    if not is_diva(method) and method not in METHODS:
        raise ValueError(
            f"METHOD={method} (--method): expected diva, grpo or a toolkit method: {', '.join(sorted(METHODS))}"
        )
    return method


def mupo_overrides(method: str, rollout_n: int) -> list[str]:
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
    if is_diva(checked_method(method)):
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
        *mupo_overrides(method, rollout_n),
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
        *reward_overrides(reward),
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
    return args + (ray_init_overrides(shape) if ray_init else [])


def ray_init_overrides(shape: ClusterShape) -> list[str]:
    """The entry point's own one-node Ray cluster: a logical GPU per rank, 16 logical CPUs (TransferQueue's storage
    actors) and :data:`verl_ext.cpu.CPU_ENV` for every process."""
    if shape.nodes != 1:
        raise ValueError("ray_init starts a one-node Ray cluster in the entry point; several nodes need a launcher")
    return [
        f"+ray_kwargs.ray_init.num_gpus={shape.gpus_per_node}",
        "ray_kwargs.ray_init.num_cpus=16",
        "+ray_kwargs.ray_init.include_dashboard=false",
        *(f"+ray_kwargs.ray_init.runtime_env.env_vars.{k}={v}" for k, v in CPU_ENV.items()),
    ]


def reward_overrides(reward: str) -> list[str]:
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
