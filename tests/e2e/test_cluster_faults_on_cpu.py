"""A cluster's faults lose nothing: a lost node, storage a node cannot see (on the two-node CPU cluster, through
``ray job submit``).

* **A lost node.** One launch (``NODES=2``, ``MAX_RESTARTS=2``) in which the second node (its ``ray start``, raylet,
  object store and every worker on it) is SIGKILLed twice (:mod:`verl_ext.faults`, ``<point>@<step>:node-1``):
  mid-step (while step 2 is rolled out) and during step 3's checkpoint save. Each time the job fails within a bounded
  time naming the node and what ran there; the launcher, as a cluster manager would, starts the node again before it
  resubmits; the job resumes from the last complete checkpoint (1, then 2) and logs every value the uninterrupted
  run (the shared DIVA run of ``tests/e2e/conftest.py``) logged for steps 0-3, exactly.
* **Storage a node cannot see.** The second node gets a disk of its own at the checkpoint folder
  (``LOCAL_NODE_PRIVATE_DIR``: an empty tmpfs in a mount namespace of its own): the job fails at its start, before
  any model loads, naming the node that cannot see the folder and what to set.

The lost-node launch (three attempts) takes about 18 minutes on two busy cores: its tests are marked ``extended`` and
CI leaves them out; run them on the main job's stack with ``-m extended``.
"""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest
from tiny_launch import DIVA_NODES, DIVA_STEPS, run_tiny_cpu

from verl_ext.checks.same_run import metric_differences
from verl_ext.report.run import load_run

# The lost-node tests set up the shared two-node run and then the lost-node launch (three attempts): on two busy
# cores that took over 30 minutes.
pytestmark = [pytest.mark.gpu_stack, pytest.mark.timeout(3600)]

NODE_FAULTS = "rollout_generate@1:node-1,checkpoint_save@3:node-1"
# Ray's GCS marks a node dead some seconds after its raylet stops answering; the trainer's watch reads the node table
# every 2 s, the replay buffer checks the rollout actors every 10 s: the job fails well within.
LOST_NODE_BOUND_S = 120


@pytest.fixture(scope="module")
def lost_node(tiny_diva_run):
    run_dir = tiny_diva_run["workdir"] / "lost_node"
    fault_dir = run_dir / "faults"
    fault_dir.mkdir(parents=True)
    returncode, output = run_tiny_cpu(
        tiny_diva_run["workdir"],
        run_dir,
        2400,
        METHOD="diva",
        NODES=str(DIVA_NODES),
        STEPS=str(DIVA_STEPS),
        RESUME_STEPS="0",
        SAVE_FREQ="1",
        MAX_RESTARTS="2",
        DIVA_FAULTS=NODE_FAULTS,
        DIVA_FAULT_DIR=str(fault_dir),
    )
    (run_dir / "launcher.log").write_text(output)  # to read when a check fails
    return {"dir": run_dir, "faults": fault_dir, "returncode": returncode, "output": output}


@pytest.mark.extended  # CI time: run with -m extended (docs/reliability.md, "A lost node")
def test_the_launcher_restarted_the_lost_node_then_the_job(lost_node):
    out = lost_node["output"]
    assert lost_node["returncode"] == 0, out[-8000:]
    assert out.count("[diva] node-1 of the local cluster died") == 2
    assert "[diva] attempt 3 finished the job after 2 restart(s)" in out
    assert sorted(p.name for p in lost_node["faults"].iterdir()) == sorted(
        f"{fault.split(':')[0]}.fired" for fault in NODE_FAULTS.split(",")
    )


@pytest.mark.extended
@pytest.mark.parametrize(("fault", "attempt"), [("rollout_generate@1", 1), ("checkpoint_save@3", 2)])
def test_each_loss_failed_the_job_in_bounded_time_naming_the_node(lost_node, fault, attempt):
    out = lost_node["output"]
    # Each attempt's own output (a loss in the save fails a collective first, before Ray marks the node dead: the
    # attempt must still name the node, not leave it to an earlier attempt's line).
    own = out[out.index(f"submitting (attempt {attempt} of") : out.index(f"[diva] attempt {attempt} failed")]
    # From the trainer's node watch ("[cluster] lost node node-1 ...: it ran training rank 1, ...") or, when the
    # rollout's liveness check sees the dead server first, the dead actors on node-1 named with their node.
    named = re.findall(r"\[cluster\] lost node node-1 \(127\.0\.0\.1\): it ran [^\n]*|found dead: [^\n]*node-1", own)
    assert named, own[-8000:]
    killed = dt.datetime.fromtimestamp((lost_node["faults"] / f"{fault}.fired").stat().st_mtime, dt.UTC)
    failed = dt.datetime.fromisoformat(re.search(rf"\[diva\] attempt {attempt} failed at (\S+)", out).group(1))
    assert 0 <= (failed - killed).total_seconds() < LOST_NODE_BOUND_S


@pytest.mark.extended  # CI time: run with -m extended (docs/reliability.md, "A lost node")
def test_it_resumed_from_the_last_complete_checkpoint_and_logged_the_same_values(tiny_diva_run, lost_node):
    logs = sorted((lost_node["dir"] / "metrics").glob("*/*.jsonl"), key=lambda path: path.stat().st_mtime)
    assert [json.loads(path.read_text().splitlines()[0])["step"] for path in logs] == [0, 1, 2]
    out = lost_node["output"]
    assert "[diva] resuming from " in out and re.search(r"global_step_1\b", out) and re.search(r"global_step_2\b", out)
    expected = {step: values for step, values in load_run(tiny_diva_run["dir"]).log.steps.items() if step <= 3}
    actual = load_run(lost_node["dir"]).log.steps
    assert sum(len(values) for values in expected.values()) > 300
    assert metric_differences(expected, actual) == []


def test_a_node_that_cannot_see_the_checkpoint_folder_fails_the_job_at_its_start(tiny_diva_run):
    run_dir = tiny_diva_run["workdir"] / "private_disk"
    checkpoints = run_dir / "checkpoints"
    checkpoints.mkdir(parents=True)
    returncode, output = run_tiny_cpu(
        tiny_diva_run["workdir"],
        run_dir,
        600,
        METHOD="diva",
        NODES=str(DIVA_NODES),
        STEPS="1",
        RESUME_STEPS="0",
        LOCAL_NODE_PRIVATE_DIR=str(checkpoints),
    )
    assert returncode != 0
    assert re.search(
        rf"StorageError: the checkpoint folder {re.escape(str(checkpoints))} is not the same folder on every node: "
        r"the marker written from \S+ \(127\.0\.0\.1\) is not seen by node-1 \(127\.0\.0\.1\): no such file",
        output,
    ), output[-6000:]
    assert "Set CKPT_DIR (trainer.default_local_dir) to storage every node mounts at the same path" in output
    assert "actor/pg_loss" not in output and "Training Progress" not in output  # nothing trained, nothing loaded
