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
"""

from __future__ import annotations

import argparse
import os
import sys

from verl_ext.cpu import CPU_ENV, ROLLOUT_NAME
from verl_ext.cpu.tiny_model import MAX_PIXELS, build_tiny_qwen2_vl

TRAIN_QUESTIONS = 16
VAL_QUESTIONS = 4


def prepare(workdir: str) -> dict:
    """Tiny model and synthetic data under ``workdir`` (reused when present); returns their paths."""
    from data_prep.synth import synth

    os.makedirs(workdir, exist_ok=True)
    paths = {
        "model": os.path.join(workdir, "tiny_qwen2_vl"),
        "train": os.path.join(workdir, "synth_train.parquet"),
        "val": os.path.join(workdir, "synth_val.parquet"),
    }
    build_tiny_qwen2_vl(paths["model"])
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


def method_overrides(method: str, questions: int, rollout_n: int) -> list[str]:
    """What differs between methods: estimator, trainer, dataset, prompts per step and responses per prompt.

    Every method gets ``2 * rollout_n`` responses per question: DIVA as 2 prompts (original + variant) x n, the
    others as 1 prompt x 2n (verl's dataset, no variants), as the GPU launchers do.
    """
    if method in ("diva", "diva_grpo"):
        estimator, trainer_mode = "diva_grpo", "diva_grpo"
    else:
        from verl_ext.methods import METHODS, get_method

        if method not in METHODS:
            raise ValueError(f"--method {method!r}: expected diva, grpo or a toolkit method {sorted(METHODS)}")
        estimator, trainer_mode = method, get_method(method).trainer_mode
    if trainer_mode == "diva_grpo":
        prompts = 2 * questions
        return [
            f"algorithm.adv_estimator={estimator}",
            "trainer.v1.trainer_mode=diva_grpo",
            "diva.variants.variants_per_question=1",
            f"data.train_batch_size={prompts}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts}",
            f"actor_rollout_ref.rollout.n={rollout_n}",
        ]
    # MUPO on a CPU: no embedding model is served (hashed trigrams), and k groups of min_size in 2n responses.
    extra = (
        ["mupo.embedding.backend=hashing", f"mupo.min_size={max(1, (2 * rollout_n) // 3)}"] if method == "mupo" else []
    )
    return [
        *extra,
        f"algorithm.adv_estimator={estimator}",
        f"trainer.v1.trainer_mode={trainer_mode}",
        "data.custom_cls.path=null",
        "data.custom_cls.name=null",
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
) -> list[str]:
    """Hydra overrides of a tiny CPU run (see the module docstring).

    ``ray_init``: the entry point starts Ray itself (a test); then it gets one logical GPU, 16 logical CPUs
    (TransferQueue's storage actors) and :data:`verl_ext.cpu.CPU_ENV` for every process. Under ``ray job submit``
    the head was started with those (``run_scripts/tiny_cpu.sh``) and ``ray_init=False``.
    """
    args = method_overrides(method, questions, rollout_n) + [
        f"data.train_files={paths['train']}",
        f"data.val_files={paths['val']}",
        "data.max_prompt_length=1024",
        f"data.max_response_length={response_length}",
        "data.dataloader_num_workers=0",
        f"diva.variants.max_pixels={MAX_PIXELS}",
        f"actor_rollout_ref.model.path={paths['model']}",
        # verl's defaults that need an accelerator: flash-attention, FSDP1, bf16 autocast, padding-free packing.
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.model.use_remove_padding=false",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
        "actor_rollout_ref.ref.fsdp_config.use_torch_compile=false",
        "+actor_rollout_ref.ref.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
        "actor_rollout_ref.actor.use_torch_compile=false",
        f"actor_rollout_ref.actor.optim.lr={lr}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16",
        f"actor_rollout_ref.rollout.name={ROLLOUT_NAME}",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "reward.num_workers=1",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        # A random model never writes \boxed{}: a reward that separates its responses (verl_ext.cpu.reward).
        "reward.custom_reward_function.path=pkg://verl_ext.cpu.reward",
        "reward.custom_reward_function.name=separating_score",
        "trainer.device=cpu",
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=1",
        f"trainer.total_training_steps={steps}",
        "trainer.total_epochs=100",
        f"trainer.save_freq={save_freq if save_freq is not None else steps}",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.resume_mode=auto",
        "trainer.logger=[console,file]",
        f"trainer.experiment_name={experiment}",
        f"trainer.default_local_dir={ckpt_dir}",
    ]
    if ray_init:
        args += [
            "+ray_kwargs.ray_init.num_gpus=1",
            "ray_kwargs.ray_init.num_cpus=16",
            "+ray_kwargs.ray_init.include_dashboard=false",
        ]
        args += [f"+ray_kwargs.ray_init.runtime_env.env_vars.{k}={v}" for k, v in CPU_ENV.items()]
    return args


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
        "VERL_FILE_LOGGER_ROOT": os.path.join(run_dir, "metrics"),
        PROBE_ENV: os.path.join(run_dir, "probe"),
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
    parser.add_argument("--ray-init", action="store_true", help="the entry point starts Ray itself")
    parser.add_argument("--runtime-env-out", default=None, help="write the job's Ray runtime env (yaml) here")
    args = parser.parse_args(argv)
    paths = prepare(args.workdir)
    run_dir = os.path.abspath(args.run_dir or os.path.join(args.workdir, "run"))
    lines = cpu_overrides(
        paths,
        os.path.join(run_dir, "checkpoints"),
        method=args.method,
        steps=args.steps,
        save_freq=args.save_freq,
        questions=args.questions,
        rollout_n=args.rollout_n,
        experiment=f"tiny_cpu_{args.method}",
        ray_init=args.ray_init,
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
