"""A lost node fails the job within a bounded time, naming the node and what ran there.

When a node dies (preempted, its raylet killed, the machine gone), its training rank, rollout replica and agent-loop
worker die with it, and what is left of the job can wait a long time: the other ranks inside a collective (gloo's
and NCCL's timeouts are tens of minutes), the trainer inside ``ray.get`` on the rank still blocked there.
:class:`NodeWatch` runs in the trainer process: every ``interval_s`` it reads the cluster's node table (Ray's GCS,
which marks a node dead a few seconds after its raylet stops answering) and, when a node of the run's placement
report (:mod:`verl_ext.cluster.placement`) is gone, prints what was lost and ends the trainer process, so that the
job fails and a resubmission (``MAX_RESTARTS``) resumes from the last complete checkpoint.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

LOST_PREFIX = "[cluster] lost node "


def alive_node_ids() -> set[str]:
    import ray

    return {node["NodeID"] for node in ray.nodes() if node.get("Alive")}


def lost_nodes(report: dict, alive: set[str]) -> list[str]:
    """Node ids that run something of the placement ``report`` (the trainer, a rank, a replica, a worker) and are
    not in ``alive``; a node of the cluster that runs none of this job may come and go (an autoscaler's)."""
    used = {report["trainer"]["node"], *(node for where in report["groups"].values() for node in where)}
    return [node for node in report["nodes"] if node in used and node not in alive]


def describe_lost(report: dict, node_id: str) -> str:
    """``[cluster] lost node node-1 (127.0.0.1): it ran training rank 1, rollout replica 1, ...``."""
    node = report["nodes"][node_id]
    ran = [
        f"{group[:-1] if group.endswith('s') else group} {i}"
        for group, where in report["groups"].items()
        for i, n in enumerate(where)
        if n == node_id
    ]
    if report["trainer"]["node"] == node_id:
        ran.insert(0, "the trainer process")
    return f"{LOST_PREFIX}{node['name']} ({node['ip']}): it ran {', '.join(ran) or 'none of this job'}"


def _end_trainer_process() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(1.0)  # Ray's log monitor forwards the lines above to the job's log before the process goes
    os._exit(1)


class NodeWatch(threading.Thread):
    """Watch the nodes of ``report``; on a loss, print :func:`describe_lost` for each lost node and call ``on_loss``
    (default: end this process with status 1). ``alive`` reads the cluster's live node ids (tests pass their own)."""

    def __init__(
        self,
        report: dict,
        interval_s: float = 2.0,
        on_loss: Callable[[list[str]], None] | None = None,
        alive: Callable[[], set[str]] = alive_node_ids,
    ):
        super().__init__(name="diva-node-watch", daemon=True)
        self.report = report
        self.interval_s = interval_s
        self.on_loss = on_loss or (lambda lost: _end_trainer_process())
        self.alive = alive
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.interval_s):
            try:
                lost = lost_nodes(self.report, self.alive())
            except Exception:  # the GCS busy or restarting: ask again next time
                continue
            if lost:
                for node in lost:
                    print(describe_lost(self.report, node), flush=True)
                self.on_loss(lost)
                return

    def stop(self) -> None:
        self._halt.set()
