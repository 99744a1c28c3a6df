"""Which of a set of Ray actors have died, and why, without waiting on the live ones.

verl's synchronous replay buffer waits for the step's rollouts without a deadline: when a rollout server or an
agent-loop worker dies, its prompts stay pending (a dead worker) or fail and are refilled (a dead server) forever,
and the job hangs. :func:`dead_actors` asks each actor for Ray's built-in ``__ray_ready__``: a dead actor answers
at once with ``RayActorError`` (carrying Ray's death cause), a live but busy one within the timeout or not at all
(then it counts as alive: slow is not dead).
"""

from __future__ import annotations

from collections.abc import Iterable

import ray


def dead_actors(actors: Iterable[tuple[str, object]], timeout_s: float = 5.0) -> list[str]:
    """``"<name>: <Ray's reason>"`` of each dead actor of ``(name, handle)`` pairs; empty when all are alive."""
    named = list(actors)
    refs = {name: handle.__ray_ready__.remote() for name, handle in named}
    dead = []
    ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    for name, ref in refs.items():
        ready, _ = ray.wait([ref], timeout=0)
        if not ready:
            continue
        try:
            ray.get(ref)
        except ray.exceptions.RayActorError as error:
            reason = str(error).strip().splitlines()
            dead.append(f"{name}: {' '.join(line.strip() for line in reason[:3])}")
    return dead
