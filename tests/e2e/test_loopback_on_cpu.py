"""A single-machine run keeps to this machine: every socket the local cluster's nodes and the job's processes listen on
is bound to loopback, and the job's driver connects to the head through 127.0.0.1 (``run_scripts/_submit.sh``).

The shared DIVA launch (``tests/e2e/conftest.py``, two Ray nodes) was sampled each second for the listening sockets of
its whole process tree (both nodes' ``ray start`` and the GCS, raylets, object managers, dashboard, agents, client
server, the job's workers, TransferQueue, the rollout servers): none may be on another address.
"""

from __future__ import annotations

import re

import pytest
from tiny_launch import DIVA_NODES, sockets_off_loopback

pytestmark = [pytest.mark.gpu_stack, pytest.mark.timeout(900)]


def test_the_head_and_the_job_listen_on_loopback_only(tiny_diva_run):
    sockets = tiny_diva_run["sockets"]
    names = {s[2] for s in sockets}
    # The sampling saw the head's servers and the job's workers, not just the launcher.
    assert {"gcs_server", "raylet"} <= names and any(name.startswith("ray::") for name in names)
    assert len({s[3] for s in sockets if s[2] == "raylet"}) == DIVA_NODES  # both nodes' raylets were sampled
    # The one exception, listed in docs/reliability.md ("The local head"): torch.distributed's store, which binds
    # every interface.
    assert sockets_off_loopback(sockets) == []


def test_the_jobs_driver_connects_through_loopback(tiny_diva_run):
    # Ray's own line: in the job's whole output (the console keeps the run's own lines)
    used = re.findall(r"Using address (\S+?):\d+ set in the environment variable RAY_ADDRESS", tiny_diva_run["log"])
    assert used and set(used) == {"127.0.0.1"}
