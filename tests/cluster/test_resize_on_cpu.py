"""A job planned on the nodes its cluster has left (``verl_ext.cluster.resize``): what changes, what is refused.

The lost-node run that goes on with one node is ``tests/e2e/test_reshard_resume_on_cpu.py`` (``extended``)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from verl_ext.cluster.batch_arithmetic import BatchArithmeticError
from verl_ext.cluster.resize import compose, plan_resize

ROOT = Path(__file__).resolve().parents[2]


def launcher_overrides(script: str, **env) -> list[str]:
    run_env = {**os.environ, "DIVA_PRINT_ONLY": "1", **env}
    out = subprocess.run(["bash", script], cwd=ROOT, env=run_env, capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines() if line]


def test_the_paper_run_on_one_node_less_says_what_changed():
    # The DIVA launcher on two nodes of 8 GPUs: 64 questions x 2 prompts x 5 responses = 640 responses.
    cfg = compose(launcher_overrides("run_scripts/qwen25vl7b_diva.sh", NNODES="2"))
    resize = plan_resize(cfg, 1)
    assert resize.overrides() == ["trainer.nnodes=1"]
    head = resize.lines()[0]
    assert head == (
        "resubmitting on the 1 node(s) left: nodes 2 -> 1, training ranks 16 -> 8, rollout replicas 16 -> 8, "
        "rows per rank 40 -> 80 (640 responses per step, unchanged)"
    )
    assert resize.lines()[1].startswith("batch: 128 prompts x 5 responses = 640 rows over 8 ranks (8 GPUs)")


def test_every_node_back_changes_nothing():
    cfg = compose(launcher_overrides("run_scripts/qwen25vl7b_diva.sh", NNODES="2"))
    resize = plan_resize(cfg, 2)
    assert resize.overrides() == [] and resize.lines() == []


def test_a_batch_the_survivors_cannot_split_is_refused_naming_the_setting():
    # 3 nodes of 8 GPUs: 48 questions x 2 prompts x 5 = 480 responses, 20 per rank; on the 2 nodes left, 30 per rank,
    # which the launcher's old-log-prob micro-batches of 4 do not divide.
    cfg = compose(launcher_overrides("run_scripts/qwen25vl7b_diva.sh", NNODES="3", QUESTIONS_PER_STEP="48"))
    assert plan_resize(cfg, 3).overrides() == []
    with pytest.raises(BatchArithmeticError) as err:
        plan_resize(cfg, 2)
    message = str(err.value)
    assert message.startswith("the job cannot go on with the 2 node(s) left of 3 (trainer.nnodes): ")
    assert "log_prob_micro_batch_size_per_gpu=4 does not divide the 30 rows each of the 16 training ranks" in message
    assert "trainer.nnodes to 1 or 3 (node counts that pass)" in message


def test_no_node_left_is_refused():
    cfg = compose(launcher_overrides("run_scripts/qwen25vl7b_diva.sh", NNODES="2"))
    with pytest.raises(BatchArithmeticError, match="no node with GPUs is left of the 2"):
        plan_resize(cfg, 0)


def test_node_return_s_must_be_seconds():
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "DRY_RUN")}
    out = subprocess.run(
        ["bash", "run_scripts/qwen25vl7b_diva.sh"], cwd=ROOT, env={**env, "NODE_RETURN_S": "soon"}, capture_output=True
    )
    assert out.returncode == 2
    assert b"NODE_RETURN_S=soon: expected seconds to wait for lost nodes" in out.stderr
