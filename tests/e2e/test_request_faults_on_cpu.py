"""A failed rollout request loses nothing, on the real CPU path (``run_scripts/tiny_cpu.sh`` through ``ray job
submit``, one node, the ``hf_cpu`` rollout), with the request fault points of :mod:`verl_ext.faults` (the server
raises; the process lives on):

1. ``rollout_request@1``: the first request of step 2 (weights after one update) fails once. The seeded agent loop
   sends it again with the same params, the same tokens come back, and the run logs, value by value, what the run
   without the fault logs for its steps 0-2: ``tests/e2e/conftest.py``'s ``tiny_diva_world1`` (same settings and
   seed, one node), which the cluster tests launch anyway.
2. ``rollout_request_always@1``: one request of step 2 fails on every attempt. The step fails within a bounded time,
   and the error names the prompt (its run uid and question id), the replica and the error; no advantage or
   difficulty update is computed for that step.
"""

from __future__ import annotations

import re
import time

import pytest
from tiny_launch import run_tiny_cpu

from verl_ext.cpu.same_run import metric_differences
from verl_ext.report.run import load_run

pytestmark = [pytest.mark.gpu_stack, pytest.mark.timeout(1800)]

# The fault runs train the shared run's first two steps (no resume): step 2 is where the faults are armed.
FAULT_RUN_STEPS = 2

# From the first failed attempt to the launcher's return: 3 attempts (waits of 1 s and 2 s, the state API naming the
# replica), the replay buffer's next poll (2 s), the job's teardown.
FAILED_REQUEST_BOUND_S = 90
RUN_UID = r"[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"  # verl_ext.rollout.seeds.prompt_uid


def launch(workdir, name: str, fault: str) -> dict:
    run_dir = workdir / name
    fault_dir = run_dir / "faults"
    fault_dir.mkdir(parents=True)
    started = time.time()
    returncode, output = run_tiny_cpu(
        workdir,
        run_dir,
        900,
        METHOD="diva",
        NODES="1",
        STEPS=str(FAULT_RUN_STEPS),
        RESUME_STEPS="0",
        DIVA_FAULTS=fault,
        DIVA_FAULT_DIR=str(fault_dir),
    )
    ended = time.time()
    job_log = run_dir / "job.log"  # the job's whole output, where the launcher keeps it (the console shows part)
    text = output + (job_log.read_text() if job_log.exists() else "")
    (run_dir / "launcher.log").write_text(output)  # to read when a check fails
    return {"dir": run_dir, "faults": fault_dir, "returncode": returncode, "output": text, "times": (started, ended)}


@pytest.fixture(scope="module")
def fails_once(tiny_diva_world1):
    return launch(tiny_diva_world1["dir"].parent, "request_fails_once", "rollout_request@1")


@pytest.fixture(scope="module")
def always_fails(tiny_diva_world1):
    return launch(tiny_diva_world1["dir"].parent, "request_always_fails", "rollout_request_always@1")


def test_a_request_that_fails_once_is_retried_and_the_run_equals_the_run_without_the_fault(
    tiny_diva_world1, fails_once
):
    out = fails_once["output"]
    assert fails_once["returncode"] == 0, out[-8000:]
    mark = fails_once["faults"] / "rollout_request@1.fired"
    assert mark.exists(), out[-8000:]
    # The retry said what failed, where, and that it resends the same params.
    assert re.search(
        r"\[rollout\] request \S+ \(prompt " + RUN_UID + r" \(question [^)]+\), response \d+, step 2\) failed, "
        r"attempt 1 of 3, replica hf_cpu_server_0_0 \(actor [0-9a-f]+.*InjectedRequestFault: injected fault "
        r"rollout_request@1: request seed \d+ .* fails once; sending it again in 1 s with the same params",
        out,
    ), out[-8000:]
    assert "[rollout] giving up" not in out
    # The world-size-1 run's steps 0-2 (it trains on and resumes; the fault run stops after step 2).
    expected = {s: v for s, v in load_run(tiny_diva_world1["dir"]).log.steps.items() if s <= FAULT_RUN_STEPS}
    actual = load_run(fails_once["dir"]).log.steps
    assert set(expected) >= {0, 1, 2}
    compared = sum(len(values) for values in expected.values())
    assert compared > 200  # every training metric of two steps, both validations
    assert metric_differences(expected, actual) == []


def test_a_request_that_always_fails_fails_the_step_naming_it_in_bounded_time(always_fails):
    out = always_fails["output"]
    assert always_fails["returncode"] != 0
    mark = always_fails["faults"] / "rollout_request_always@1.fired"
    assert mark.exists(), out[-8000:]
    found = re.search(
        r"RolloutRequestError: 1 train prompt\(s\) lost responses, so the step stops instead of training on "
        r"incomplete groups:\s+prompt (" + RUN_UID + r") \(question ([^)]+)\), response (\d+), step 2, request \S+: "
        r"3 attempt\(s\), the last: replica hf_cpu_server_0_0 \(actor [0-9a-f]+[^)]*\): InjectedRequestFault: "
        r"injected fault rollout_request_always@1: request seed \d+ .* fails on every attempt",
        out,
    )
    assert found, out[-8000:]
    # Step 1 was trained and logged; step 2 never reached its advantage, its difficulty update or its log line.
    steps = load_run(always_fails["dir"]).log.steps
    assert 1 in steps and 2 not in steps
    first_attempt = mark.stat().st_mtime
    seconds = always_fails["times"][1] - first_attempt
    print(f"[request faults] a request failing on every attempt: the launcher returned {seconds:.1f} s after it")
    assert 0 <= seconds < FAILED_REQUEST_BOUND_S
