"""The Ray runtime env of a CPU job: the recipe's, plus the environment every process of the job needs."""

from __future__ import annotations

import os

from verl_ext.cpu import CPU_ENV
from verl_ext.cpu.names import PROBE_ENV
from verl_ext.cpu.vllm_launcher import VLLM_CPU_ENV
from verl_ext.faults import FAULT_DIR_ENV, FAULTS_ENV


def runtime_env(run_dir: str, repo_root: str) -> dict:
    """The recipe's Ray runtime env (``recipe/diva_grpo/runtime_env.yaml``) plus the CPU job's environment:
    :data:`verl_ext.cpu.CPU_ENV`, verl's file-logger folder and the actor-input probe folder of ``run_dir``."""
    import yaml

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
