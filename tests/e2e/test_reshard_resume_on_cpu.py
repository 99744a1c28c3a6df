"""Resume on another number of nodes: a run checkpointed at world size 2 continues at 1, and one at 1 continues at 2.

Each resumed launch starts from a copy of a shared run's checkpoint folder (up to the step it resumes from) on the
other cluster shape and trains the shared run's next step; the actor loads the reshardable copy of its state
(:mod:`verl_ext.checkpoint`), everything else of the run's state never depended on the world size. It must log the
uninterrupted run's values (:func:`verl_ext.cluster.world_size.compare_runs`): tokens, rewards, advantages and the
difficulty exactly; loss, gradient norm and log-probs to float tolerance (the two world sizes reduce in another
order).

* ``hf_cpu``, 1 -> 2: the world-size-1 DIVA run's step-3 checkpoint, resumed on two Ray nodes for step 4; and
  2 -> 1: the two-node run's step-3 checkpoint, resumed on one node for step 4 (2 -> 1 in CI; 1 -> 2 ``extended``
  for CI time, its load at world size 2 in CI in ``tests/checkpoint/test_reshardable_checkpoint_on_cpu.py``).
* vLLM, 2 -> 1: the two-node vLLM DIVA run's step-2 checkpoint, resumed on one node for step 3 (through the GPU
  launcher, which is what a user resubmits; ``extended`` for CI time).
* A lost node that does not come back (``extended``): ``NODES=2 MAX_RESTARTS=1 LOCAL_NODE_RESTART=0``, node-1 killed
  while step 2 is rolled out; the launcher waits ``NODE_RETURN_S``, plans the job on the one node left (batch checked,
  the change said on the console) and the job finishes there, logging the two-node run's values for steps 2 and 3.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from tiny_launch import DIVA_NODES, DIVA_STEPS, VLLM_NODES, VLLM_STEPS, run_tiny_cpu

from verl_ext.checkpoint.reshardable import has_reshardable_checkpoint, saved_world_sizes
from verl_ext.checks.probe import read_actor_inputs
from verl_ext.cluster.storage import RunRecord
from verl_ext.cluster.world_size import compare_runs, metric_differences, record_differences
from verl_ext.report.run import load_run

pytestmark = [pytest.mark.gpu_stack, pytest.mark.timeout(1800)]


def copy_checkpoints_up_to(source: Path, run_dir: Path, step: int) -> Path:
    """``source``'s checkpoint folder with the steps after ``step`` left out, as a run interrupted after ``step``:
    verl's latest-step file and the run's record of its saved steps (:class:`verl_ext.cluster.storage.RunRecord`)
    say ``step``."""
    folder = run_dir / "checkpoints"
    shutil.copytree(source / "checkpoints", folder, ignore=lambda _, names: [n for n in names if _later(n, step)])
    (folder / "latest_checkpointed_iteration.txt").write_text(str(step))
    record = RunRecord(str(folder))
    saved = record.read()
    saved["saved_steps"] = [s for s in saved["saved_steps"] if s <= step]
    record.write(saved)
    return folder


def _later(name: str, step: int) -> bool:
    found = re.fullmatch(r"global_step_(\d+)", name)
    return bool(found) and int(found.group(1)) > step


def _resumed(source: Path, run_dir: Path, step: int, nodes: int, **settings: str) -> dict:
    folder = copy_checkpoints_up_to(source, run_dir, step)
    actor = folder / f"global_step_{step}" / "actor"
    assert has_reshardable_checkpoint(str(actor)), sorted(p.name for p in actor.iterdir())
    returncode, output = run_tiny_cpu(
        run_dir.parent, run_dir, 900, METHOD="diva", NODES=str(nodes), STEPS=str(step + 1), RESUME_STEPS="0", **settings
    )
    assert returncode == 0, output[-8000:]
    assert f"[diva] resuming from {folder / f'global_step_{step}'}" in output
    return {"dir": run_dir, "output": output, "saved_at": saved_world_sizes(str(actor))}


def _same_values(resumed: Path, reference: Path, ranks: int, reference_ranks: int, steps: list[int]) -> None:
    differences, counts = compare_runs(str(resumed), str(reference), ranks, reference_ranks)
    assert differences == [], differences[:20]
    assert set(steps) <= set(counts["steps"]) and counts["response_fields"] > 0, counts


# CI time (a launch; tests/checkpoint/test_reshardable_checkpoint_on_cpu.py loads a world-size-1 save at 2 in CI):
# run with -m extended
@pytest.mark.extended
def test_hf_cpu_saved_at_world_size_1_resumes_at_2(tiny_diva_world1):
    run = _resumed(tiny_diva_world1["dir"], tiny_diva_world1["workdir"] / "reshard_1_to_2", DIVA_STEPS, DIVA_NODES)
    assert run["saved_at"] == [1]
    assert "resharded the actor's checkpoint from world size 1 to 2" in (run["dir"] / "job.log").read_text()
    _same_values(run["dir"], tiny_diva_world1["dir"], DIVA_NODES, 1, [DIVA_STEPS + 1])


def test_hf_cpu_saved_at_world_size_2_resumes_at_1(tiny_diva_run):
    run = _resumed(tiny_diva_run["dir"], tiny_diva_run["workdir"] / "reshard_2_to_1", DIVA_STEPS, 1)
    assert run["saved_at"] == [DIVA_NODES]
    assert f"resharded the actor's checkpoint from world size {DIVA_NODES} to 1" in (run["dir"] / "job.log").read_text()
    _same_values(run["dir"], tiny_diva_run["dir"], 1, DIVA_NODES, [DIVA_STEPS + 1])


@pytest.mark.extended  # CI time (a vLLM launch): run with -m extended
def test_vllm_saved_at_world_size_2_resumes_at_1(tiny_vllm_run):
    run = _resumed(tiny_vllm_run["dir"], tiny_vllm_run["workdir"] / "reshard_2_to_1", VLLM_STEPS, 1, ROLLOUT="vllm")
    assert run["saved_at"] == [VLLM_NODES]
    assert f"resharded the actor's checkpoint from world size {VLLM_NODES} to 1" in (run["dir"] / "job.log").read_text()
    _same_values(run["dir"], tiny_vllm_run["dir"], 1, VLLM_NODES, [VLLM_STEPS + 1])


@pytest.fixture(scope="module")
def lost_for_good(tiny_diva_run):
    run_dir = tiny_diva_run["workdir"] / "lost_for_good"
    fault_dir = run_dir / "faults"
    fault_dir.mkdir(parents=True)
    returncode, output = run_tiny_cpu(
        tiny_diva_run["workdir"],
        run_dir,
        1500,
        METHOD="diva",
        NODES=str(DIVA_NODES),
        STEPS=str(DIVA_STEPS),
        RESUME_STEPS="0",
        SAVE_FREQ="1",
        MAX_RESTARTS="1",
        LOCAL_NODE_RESTART="0",
        NODE_RETURN_S="10",
        DIVA_FAULTS="rollout_generate@1:node-1",
        DIVA_FAULT_DIR=str(fault_dir),
    )
    (run_dir / "launcher.log").write_text(output)
    return {"dir": run_dir, "returncode": returncode, "output": output}


@pytest.mark.extended  # CI time (three launches' worth on two cores): run with -m extended (docs/reliability.md)
def test_a_node_gone_for_good_the_job_finishes_on_the_one_left(lost_for_good):
    out = lost_for_good["output"]
    assert lost_for_good["returncode"] == 0, out[-8000:]
    assert "node-1 of the local cluster died" in out and "not starting it again (LOCAL_NODE_RESTART=0)" in out
    assert "[diva] 1 of the job's 2 node(s) did not come back within 10 s (NODE_RETURN_S)" in out
    assert (
        "[diva] resubmitting on the 1 node(s) left: nodes 2 -> 1, training ranks 2 -> 1, rollout replicas 2 -> 1, "
        "rows per rank 8 -> 16 (16 responses per step, unchanged)"
    ) in out
    assert "[diva] attempt 2 finished the job after 1 restart(s)" in out


@pytest.mark.extended
def test_the_job_on_the_node_left_logs_the_two_node_runs_values(tiny_diva_run, lost_for_good):
    resumed_steps = list(range(2, DIVA_STEPS + 1))
    expected = {s: v for s, v in load_run(tiny_diva_run["dir"]).log.steps.items() if s in resumed_steps}
    actual = {s: v for s, v in load_run(lost_for_good["dir"]).log.steps.items() if s in resumed_steps}
    differences, compared = metric_differences(actual, expected, 1, DIVA_NODES)
    assert differences == [] and compared > 100, differences[:20]
    records, reference = read_actor_inputs(str(lost_for_good["dir"])), read_actor_inputs(str(tiny_diva_run["dir"]))
    for step in resumed_steps:
        found, count = record_differences(records[step], reference[step])
        assert found == [] and count > 0, found[:20]
