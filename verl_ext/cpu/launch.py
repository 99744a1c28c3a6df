"""A tiny CPU run's launch: ``python -m verl_ext.cpu.launch`` builds its model and data and prints its settings for
the launcher (``run_scripts/tiny_cpu.sh``).

:func:`prepare` builds the tiny model (:mod:`verl_ext.cpu.tiny_model`) and a ``diva-prep synth`` data set in a
work folder; :func:`main` checks the run's method and cluster shape before anything is built, then prints the Hydra
overrides of ``recipe/diva_grpo/config/diva_grpo.yaml`` that run it on the CPU, and writes the job's Ray runtime
env. The settings live by concern:

* :mod:`verl_ext.cpu.overrides`: the ``hf_cpu`` rollout's run (:func:`~verl_ext.cpu.overrides.cpu_overrides`) and
  what both routes share (the method's settings, accelerator-free defaults, the cluster's shape);
* :mod:`verl_ext.cpu.vllm_launcher`: ``--rollout vllm``, the main job's own stack (``run_scripts/setup_vllm_cpu.sh``):
  verl's vLLM rollout on vLLM's CPU build, configured by the GPU launcher itself
  (``run_scripts/qwen25vl7b_<method>.sh``), its variables and the Hydra overrides it has no variable for;
* :mod:`verl_ext.cpu.runtime_env`: the job's Ray runtime env;
* :mod:`verl_ext.checks.cpu_changes`: why each setting of the vLLM route differs from the GPU job (the ledger's
  data, docs/stack.md's "The CPU changes").
"""

from __future__ import annotations

import argparse
import os
import sys

from verl_ext.cpu import ROLLOUT_NAME
from verl_ext.cpu.overrides import PRECISIONS, ClusterShape, cpu_overrides, method_overrides
from verl_ext.cpu.runtime_env import runtime_env
from verl_ext.cpu.tiny_model import ARCHS, DEFAULT_ARCH, build_tiny_vlm, tiny_model_dir_name
from verl_ext.cpu.vllm_launcher import launcher_for, vllm_cpu_overrides, vllm_launcher_env

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


def _parser() -> argparse.ArgumentParser:
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
    return parser


def _vllm_run_overrides(args, paths: dict, run_dir: str, shape: ClusterShape, without: tuple[str, ...]) -> list[str]:
    """The run's settings split between the GPU launcher's variables (written to ``--launcher-env-out``) and the
    overrides it has no variable for (returned)."""
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
    return vllm_cpu_overrides(**run, packed=args.use_remove_padding, precision=args.precision)


def _hf_cpu_run_overrides(args, paths: dict, run_dir: str, shape: ClusterShape, without: tuple[str, ...]) -> list[str]:
    return cpu_overrides(
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


def _write_runtime_env(path: str, run_dir: str) -> None:
    import yaml

    repo_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(path, "w") as f:
        yaml.safe_dump(runtime_env(run_dir, repo_root), f, sort_keys=False)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
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
    run_overrides = _vllm_run_overrides if args.rollout == "vllm" else _hf_cpu_run_overrides
    lines = run_overrides(args, paths, run_dir, shape, without)
    if args.runtime_env_out:
        _write_runtime_env(args.runtime_env_out, run_dir)
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
