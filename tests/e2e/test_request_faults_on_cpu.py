"""A failed rollout request loses nothing, on the real CPU path (``run_scripts/tiny_cpu.sh`` through ``ray job
submit``, one node, the ``hf_cpu`` rollout), with the request fault points of :mod:`verl_ext.faults` (the server
raises; the process lives on). A request that fails once (``rollout_request@1``) is retried with the same params and
the run equals the run without the fault: that fault is one of the crash run's (``test_crash_resume_on_cpu.py``),
whose values are compared with the uninterrupted run's.

Here ``rollout_request_always@1``: one request of step 2 fails on every attempt. The step fails within a bounded
time, and the error names the prompt (its run uid and question id), the replica and the error; no advantage or
difficulty update is computed for that step.

The run trains the tiny Qwen2-VL (``TINY_ARCH=qwen2_vl``): the older architecture, which the swatch task's warm start
and the recorded sweeps use, keeps this run in CI (the other CPU runs train the 7B job's Qwen2.5-VL).
"""

from __future__ import annotations

import re
import time

import pytest
from tiny_launch import run_tiny_cpu

from verl_ext.report.run import load_run

pytestmark = [pytest.mark.gpu_stack, pytest.mark.timeout(1800)]

# The fault run trains the shared run's first two steps (no resume): step 2 is where the fault is armed.
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
        TINY_ARCH="qwen2_vl",
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
def always_fails(tiny_diva_world1):
    return launch(tiny_diva_world1["dir"].parent, "request_always_fails", "rollout_request_always@1")


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
    assert "actor_rollout_ref.model.path=" + str(always_fails["dir"].parent / "tiny_qwen2_vl") in out
    # Step 1 was trained and logged; step 2 never reached its advantage, its difficulty update or its log line.
    steps = load_run(always_fails["dir"]).log.steps
    assert 1 in steps and 2 not in steps
    first_attempt = mark.stat().st_mtime
    seconds = always_fails["times"][1] - first_attempt
    print(f"[request faults] a request failing on every attempt: the launcher returned {seconds:.1f} s after it")
    assert 0 <= seconds < FAILED_REQUEST_BOUND_S
