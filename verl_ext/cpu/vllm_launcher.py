"""The CPU run on the main job's stack: verl's vLLM rollout on vLLM's CPU build, configured by the method's GPU
launcher itself (``run_scripts/qwen25vl7b_<method>.sh``, ``run_scripts/setup_vllm_cpu.sh`` builds the stack).

:func:`vllm_launcher_env` sets the launcher's variables and :func:`vllm_cpu_overrides` adds the Hydra overrides it
has no variable for; :data:`verl_ext.checks.cpu_changes.VLLM_CPU_CHANGES` says why each one is there (the ledger,
:mod:`verl_ext.checks.ledger`, checks that it lists every difference from the GPU job).
"""

from __future__ import annotations

import os

from verl_ext.cpu import VLLM_WORKER_EXTENSION
from verl_ext.cpu.overrides import (
    ClusterShape,
    accelerator_free_overrides,
    checked_method,
    is_diva,
    method_overrides,
    mupo_overrides,
    reward_overrides,
    vllm_worker_extension,
    worker_overrides,
)
from verl_ext.cpu.tiny_model import MAX_PIXELS

# vLLM's CPU backend reads these in its engine process (Ray env values are strings). TORCHINDUCTOR_VEC_ISA_OK: vLLM's
# CPU sampler is a torch.compile'd function (its unseeded path, which the profile run at start takes); loading it,
# inductor checks each vector instruction set the CPU reports by compiling a probe and importing torch in a fresh
# Python per set (7 s of every engine start here). "1" takes the CPU's own report for it; the set chosen is the same.
VLLM_CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "TORCHINDUCTOR_VEC_ISA_OK": "1"}


def launcher_for(method: str) -> str:
    """The GPU launcher of ``method`` (``run_scripts/``): DIVA's, GRPO's or the toolkit method's."""
    return "qwen25vl7b_diva.sh" if is_diva(checked_method(method)) else f"qwen25vl7b_{method}.sh"


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

    diva = is_diva(method)
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
        *mupo_overrides(method, rollout_n),
        *accelerator_free_overrides(packed, precision),
        *worker_overrides(shape, questions * 2 * rollout_n),  # nodes and GPUs: the launcher's NNODES, ...
        f"trainer.total_training_steps={steps}",
        "trainer.resume_mode=auto",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
        *vllm_engine_overrides(method),
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        *reward_overrides("separating"),
    ]
