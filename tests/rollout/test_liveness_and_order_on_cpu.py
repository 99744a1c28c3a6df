"""The replay buffer's two duties, on their own: key order, and telling a dead rollout actor from a busy one."""

from __future__ import annotations

import asyncio
import time

import pytest
import ray

from verl_ext.rollout.liveness import dead_actors
from verl_ext.rollout.replay_buffer import key_order
from verl_ext.rollout.seeds import prompt_uid


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="liveness")
    yield
    ray.shutdown()


@ray.remote(num_cpus=0)
class Server:
    async def generate(self, seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "done"


@ray.remote(num_cpus=0)
class BlockingServer:
    def generate(self, seconds: float) -> str:
        time.sleep(seconds)
        return "done"


def wait_until_dead(actor, timeout_s: float = 60.0) -> None:
    """ray.kill goes through the GCS while calls go straight to the actor, so a call made just after the kill can
    still be answered (CI once saw ``dead_actors`` find no one). The check is for actors that died before a stall:
    ask until Ray itself says the actor is gone."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=timeout_s)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.1)
    raise AssertionError(f"the killed actor still answered after {timeout_s} s")


def test_dead_actors_names_the_dead_only_and_says_why(local_ray):
    alive, busy, dead = Server.remote(), BlockingServer.remote(), Server.remote()
    ray.get([alive.__ray_ready__.remote(), busy.__ray_ready__.remote(), dead.__ray_ready__.remote()])
    busy.generate.remote(30)  # a synchronous actor mid-request cannot answer: slow, not dead
    ray.kill(dead, no_restart=True)
    wait_until_dead(dead)
    started = time.monotonic()
    found = dead_actors([("server a", alive), ("server b", busy), ("server c", dead)], timeout_s=2.0)
    assert len(found) == 1 and found[0].startswith("server c: ")
    assert "actor" in found[0].lower()  # Ray's own reason follows the name
    assert time.monotonic() - started < 20  # its 2 s timeout, not the busy server's 30 s request
    assert dead_actors([("server a", alive)]) == []


def test_key_order_sorts_by_uid_then_session_then_output():
    uid_a, uid_b = sorted(prompt_uid(0, 1, 0, row) for row in range(2))
    keys = [f"{uid_b}_0_0", f"{uid_a}_10_0", f"{uid_a}_2_0", f"{uid_a}_2_1"]
    assert sorted(keys, key=key_order) == [f"{uid_a}_2_0", f"{uid_a}_2_1", f"{uid_a}_10_0", f"{uid_b}_0_0"]
    assert key_order(f"{uid_a}_3_1") == (uid_a, 3, 1)
