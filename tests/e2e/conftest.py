"""The DIVA run the end-to-end tests share: one launch of ``run_scripts/tiny_cpu.sh`` on the ``hf_cpu`` rollout, on a
cluster of two Ray nodes (``NODES=2``: two training ranks, two rollout replicas, a further node started as users start
one), the shape every path of a multi-GPU run takes.

It serves the training checks (``test_tiny_cpu_training_on_cpu.py``), the cluster checks (``test_cluster_on_cpu.py``),
is the uninterrupted reference of the lost-node run (``test_cluster_faults_on_cpu.py``) and shows what both nodes
listen on (``test_loopback_on_cpu.py``): one launch for all, started by whichever needs it first.
:func:`tiny_diva_world1` is the same run at world size 1: the reference it is compared with, and the uninterrupted
run of the one-node crash test (``test_crash_resume_on_cpu.py``).
"""

from __future__ import annotations

import glob
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from tiny_launch import (
    DIVA_NODES,
    DIVA_RESUME_STEPS,
    DIVA_STEPS,
    ROOT,
    VLLM_NODES,
    VLLM_RESUME_STEPS,
    VLLM_STEPS,
    job_log,
    launch_diva_world1,
    launch_tiny_cpu,
)

from verl_ext.cpu import shared_memory


def require_torchvision() -> None:
    """Qwen2-VL's processor (transformers 5) and verl's qwen_vl_utils import torchvision: say how to get it."""
    try:
        import torchvision  # noqa: F401
    except ImportError as err:
        pytest.fail(f"the CPU end-to-end tests need torchvision ({err}): pip install torch==2.14.1 torchvision==0.29.1")


@pytest.fixture(scope="session")
def tiny_diva_run(tmp_path_factory):
    from verl_ext.config import diva_config_from

    require_torchvision()
    workdir = tmp_path_factory.mktemp("tiny_cpu")
    run_dir = workdir / "run"
    sockets: set = set()
    output, summary = launch_tiny_cpu(
        workdir,
        run_dir,
        1200,
        sockets,
        METHOD="diva",
        NODES=str(DIVA_NODES),
        STEPS=str(DIVA_STEPS),
        RESUME_STEPS=str(DIVA_RESUME_STEPS),
    )
    config = OmegaConf.load(ROOT / "recipe" / "diva_grpo" / "config" / "diva_grpo.yaml")
    records = {}
    for path in glob.glob(str(run_dir / "probe" / "actor_inputs_step*.pt")):
        record = torch.load(path, weights_only=False)
        records[record["step"]] = record
    return {
        "dir": run_dir,
        "workdir": Path(workdir),
        "summary": summary,
        "records": records,
        "diva": diva_config_from(config.diva),
        "output": output,
        "log": job_log(run_dir),
        "sockets": sockets,
    }


@pytest.fixture(scope="session")
def tiny_diva_world1(tiny_diva_run):
    """The shared run's settings and seed on one node, one rank, one replica: the world-size-1 reference of the
    two-node run (``test_cluster_on_cpu.py``) and the uninterrupted run the one-node crash run is compared with."""
    run_dir = tiny_diva_run["workdir"] / "world1"
    output, summary = launch_diva_world1(tiny_diva_run["workdir"], run_dir)
    return {"dir": run_dir, "workdir": tiny_diva_run["workdir"], "output": output, "summary": summary}


@pytest.fixture(scope="session")
def tiny_vllm_run(tmp_path_factory, vllm_required):
    """DIVA through the GPU launcher and verl's vLLM rollout on two nodes (``ROLLOUT=vllm NODES=2``): two steps, a
    checkpoint each step, a resumed third. Its checks are ``test_tiny_cpu_vllm_on_cpu.py``'s; the reshard test resumes
    its step-2 checkpoint at world size 1 (``test_reshard_resume_on_cpu.py``)."""
    workdir = tmp_path_factory.mktemp("tiny_vllm")
    run_dir = workdir / "run"
    shm_before = shared_memory.segments()
    sockets: set = set()
    output, summary = launch_tiny_cpu(
        workdir,
        run_dir,
        1100,
        sockets,
        METHOD="diva",
        ROLLOUT="vllm",
        NODES=str(VLLM_NODES),
        STEPS=str(VLLM_STEPS),
        RESUME_STEPS=str(VLLM_RESUME_STEPS),
    )
    return {
        "dir": run_dir,
        "workdir": workdir,
        "output": output,
        "log": job_log(run_dir),
        "summary": summary,
        # What this run left: new segments no process uses (a run beside it, in CI's other pytest process, may hold
        # its own live ones).
        "shm_left": shared_memory.unused(shared_memory.segments() - shm_before),
        "sockets": sockets,
    }
