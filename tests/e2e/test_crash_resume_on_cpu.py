"""A crash loses nothing: the DIVA run killed four times, restarted by the launcher, logs what the run that never
stopped logs (``tests/e2e/conftest.py``'s ``tiny_diva_world1``: one node, 3 steps, then a resume for a 4th). The
two-node cluster's faults (a lost node, storage a node cannot see) are in ``test_cluster_faults_on_cpu.py``.

One launch of ``run_scripts/tiny_cpu.sh`` with ``MAX_RESTARTS=4`` and four faults (:mod:`verl_ext.faults`), each a
SIGKILL, each once, and a failed rollout request:

0. ``rollout_request@1``: the first request of step 2 fails once; the seeded agent loop sends it again with the same
   params (its seed among them) and the same tokens come back: the job goes on, and the values below show it;

1. ``checkpoint_save@2``: the trainer dies while saving step 2 (the difficulty state written, verl's model and
   marker not): the restart resumes from step 1, never from the partial ``global_step_2``;
2. ``rollout_generate@2``: the rollout server dies generating step 3 (weights after 2 updates): the job fails
   within a bounded time naming the dead server (verl's buffer alone says only that no trajectory came); the
   restart resumes from step 2;
3. ``after_difficulty_update@3``: the trainer dies after the difficulty service applied step 3's update, before
   its checkpoint: the restart resumes from step 2's difficulty state (the lost update is not kept, none twice);
4. ``agent_loop_run@4``: the agent-loop worker dies running a step-4 request: its prompts would stay pending
   forever; the job fails within a bounded time naming the dead worker; the restart resumes from step 3.

The fifth attempt finishes. Every value the reference run logged (training metrics of steps 1-4, validation
before training, at step 3 and at the end; wall times and memory aside) must be logged again, exactly: with the
run's seeds (prompt uids, rollout sampling, variants, data order) and batches in key order, a resumed run repeats
the run it continues. Same seed and settings (``SAVE_FREQ`` and the validation schedule aside, which do not change
the training); the first two steps also show that two launches of one seed are the same run.
"""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest
from tiny_launch import DIVA_ALL_STEPS, DIVA_STEPS, run_tiny_cpu

from verl_ext.checks.same_run import metric_differences
from verl_ext.difficulty.persistence import checkpoint_state_path, load_state
from verl_ext.report.run import load_run

# Five attempts of a one-node launch: marked extended, which CI leaves out for time (run it with -m extended).
pytestmark = [pytest.mark.gpu_stack, pytest.mark.extended, pytest.mark.timeout(1800)]

FAULTS = "rollout_request@1,checkpoint_save@2,rollout_generate@2,after_difficulty_update@3,agent_loop_run@4"
# A dead rollout is found by the replay buffer's liveness check (every 10 s) and the job torn down: well within.
DEAD_ROLLOUT_BOUND_S = 90
RUN_UID = r"[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"  # verl_ext.rollout.seeds.prompt_uid


@pytest.fixture(scope="module")
def crashed(tiny_diva_world1):
    run_dir = tiny_diva_world1["workdir"] / "crashed"
    fault_dir = run_dir / "faults"
    fault_dir.mkdir(parents=True)
    returncode, output = run_tiny_cpu(
        tiny_diva_world1["workdir"],
        run_dir,
        1500,
        METHOD="diva",
        NODES="1",
        STEPS=str(len(DIVA_ALL_STEPS)),
        RESUME_STEPS="0",
        SAVE_FREQ="1",
        MAX_RESTARTS="4",
        DIVA_FAULTS=FAULTS,
        DIVA_FAULT_DIR=str(fault_dir),
    )
    (run_dir / "launcher.log").write_text(output)  # to read when a check fails
    job_log = run_dir / "job.log"  # every attempt's whole output (the console shows the run's own lines and errors)
    log = job_log.read_text() if job_log.exists() else ""
    return {"dir": run_dir, "faults": fault_dir, "returncode": returncode, "output": output, "log": log}


def test_the_launcher_restarted_the_job_until_it_finished(crashed):
    out = crashed["output"]
    assert crashed["returncode"] == 0, out[-8000:]
    for attempt in (1, 2, 3, 4):
        assert f"[diva] attempt {attempt} failed at " in out
    assert "[diva] attempt 5 finished the job after 4 restart(s)" in out
    fired = sorted(path.name for path in crashed["faults"].iterdir())
    assert fired == sorted(f"{fault}.fired" for fault in FAULTS.split(","))


def test_each_restart_resumed_from_the_last_complete_checkpoint(crashed):
    # verl's logger truncates its file; each attempt's log is kept (verl_ext.metrics_log). An attempt's first line
    # is its validation before training, at the step it resumed from: 0, then 1 (not the partial step 2), 2, 2, 3.
    logs = sorted((crashed["dir"] / "metrics").glob("*/*.jsonl"), key=lambda path: path.stat().st_mtime)
    assert [path.name for path in logs][-1] == "tiny_cpu_diva.jsonl"
    first_steps = [json.loads(path.read_text().splitlines()[0])["step"] for path in logs]
    assert first_steps == [0, 1, 2, 2, 3]
    checkpoints = crashed["dir"] / "checkpoints"
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text().strip() == str(DIVA_ALL_STEPS[-1])


def test_a_request_that_failed_once_was_sent_again_with_the_same_params(crashed):
    # The retry says what failed, where, and that it resends the same params; it never gave up. That the retried
    # request brought back the same tokens is in the values compared below (step 2's rollouts, rewards, advantages).
    text = crashed["output"] + crashed["log"]
    failed = re.search(
        r"\[rollout\] request (\S+) \(prompt " + RUN_UID + r" \(question [^)]+\), response \d+, step 2\) failed, "
        r"attempt 1 of 3, replica hf_cpu_server_0_0 \(actor [0-9a-f]+.*InjectedRequestFault: injected fault "
        r"rollout_request@1: request seed \d+ .* fails once; sending it again in 1 s with the same params",
        text,
    )
    assert failed, text[-8000:]
    # The run's only requests given up are those of the rollout server the run kills (rollout_generate@2): a dead
    # replica is not retried, by design (its liveness check fails the step instead); the request that failed once
    # never gave up.
    given_up = re.findall(r"\[rollout\] giving up: [^\n]*", text)
    assert not [line for line in given_up if failed.group(1) in line or "ActorDiedError" not in line], given_up


@pytest.mark.parametrize(
    ("fault", "attempt", "named"),
    [("rollout_generate@2", 2, r"rollout server 0 of replica \d"), ("agent_loop_run@4", 4, r"agent-loop worker \d")],
)
def test_a_dead_rollout_actor_fails_the_job_in_bounded_time_naming_it(crashed, fault, attempt, named):
    out = crashed["output"]
    assert re.search(rf"RolloutDiedError: waiting for the train rollouts, found dead: {named}( on \S+)?: ", out)
    killed = dt.datetime.fromtimestamp((crashed["faults"] / f"{fault}.fired").stat().st_mtime, dt.UTC)
    failed = dt.datetime.fromisoformat(re.search(rf"\[diva\] attempt {attempt} failed at (\S+)", out).group(1))
    assert 0 <= (failed - killed).total_seconds() < DEAD_ROLLOUT_BOUND_S


def test_the_crashed_run_logs_what_the_run_that_never_stopped_logs(tiny_diva_world1, crashed):
    expected = load_run(tiny_diva_world1["dir"]).log.steps
    actual = load_run(crashed["dir"]).log.steps
    assert set(DIVA_ALL_STEPS) | {0} <= set(expected)
    compared = sum(len(values) for values in expected.values())
    assert compared > 400  # every training metric of four steps and three validations
    assert metric_differences(expected, actual) == []


def test_the_difficulty_states_saved_match_the_uninterrupted_runs(tiny_diva_world1, crashed):
    # The reference saved steps 3 and 4; the difficulty state of each is the same after three crashes.
    for step in (DIVA_STEPS, DIVA_ALL_STEPS[-1]):
        reference = load_state(checkpoint_state_path(tiny_diva_world1["dir"] / "checkpoints" / f"global_step_{step}"))
        again = load_state(checkpoint_state_path(crashed["dir"] / "checkpoints" / f"global_step_{step}"))
        assert again["questions"] == reference["questions"]
