"""A lost node fails the job within a bounded time, naming the node and what ran there.

When a node dies (preempted, its raylet killed, the machine gone), its training rank, rollout replica and agent-loop
worker die with it, and what is left of the job can wait a long time: the other ranks inside a collective (gloo's
and NCCL's timeouts are tens of minutes), the trainer inside ``ray.get`` on the rank still blocked there.
:class:`NodeWatch` runs in the trainer process: every ``interval_s`` it reads the cluster's node table (Ray's GCS,
which marks a node dead a few seconds after its raylet stops answering) and, when a node of the run's placement
report (:mod:`verl_ext.cluster.placement`) is gone, prints what was lost and ends the trainer process, so that the
job fails and a resubmission (``MAX_RESTARTS``) resumes from the last complete checkpoint.

A loss can also fail the trainer before the GCS notices it: a surviving rank's collective fails at once when its
peer's connection resets (a node lost while a checkpoint is saved: gloo's "Connection reset by peer"), and that error
names no node. :meth:`NodeWatch.name_lost` is called with such an error: it waits for the GCS's verdict and raises
:class:`NodeLostError` naming the lost node and what ran there.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

LOST_PREFIX = "[cluster] lost node "
# How a rank sees its peer's node vanish before Ray's GCS declares the node dead (with Ray's default health checks,
# up to about 30 s after its raylet stops answering): its collective's connection reset or closed (gloo, NCCL). Only
# such errors are worth waiting for the verdict. A dead actor is not among them: the replay buffer's liveness check
# names it with its node, and waiting would only delay the failure of an actor that died on a live node.
PEER_GONE_SIGNS = ("Connection reset by peer", "Connection closed by peer", "Connection refused", "NCCL", "gloo")
GCS_VERDICT_WAIT_S = 60.0


class NodeLostError(RuntimeError):
    """The job failed because a node of its placement was lost."""


def could_be_a_lost_peer(err: BaseException) -> bool:
    """Whether ``err`` (or an error it was raised from) looks like a peer whose node vanished."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        text = f"{type(err).__name__}: {err}"
        if any(sign in text for sign in PEER_GONE_SIGNS):
            return True
        err = err.__cause__ or err.__context__
    return False


def alive_node_ids() -> set[str]:
    import ray

    return {node["NodeID"] for node in ray.nodes() if node.get("Alive")}


def used_nodes(report: dict) -> set[str]:
    """Node ids that run something of the placement ``report`` (the trainer, a rank, a replica, a worker)."""
    return {report["trainer"]["node"], *(node for where in report["groups"].values() for node in where)}


def lost_nodes(report: dict, alive: set[str]) -> list[str]:
    """Node ids of :func:`used_nodes` not in ``alive``; a node of the cluster that runs none of this job may come
    and go (an autoscaler's)."""
    used = used_nodes(report)
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

    def name_lost(self, err: BaseException, wait_s: float = GCS_VERDICT_WAIT_S) -> None:
        """Called with the error that failed the trainer: when a node of the run is gone, print
        :func:`describe_lost` for each lost node and raise :class:`NodeLostError` from ``err``; otherwise return
        (the caller re-raises ``err``). The GCS is asked once, and for up to ``wait_s`` only when the run spans
        several nodes and ``err`` could come from a lost peer (:func:`could_be_a_lost_peer`): any other error goes
        on at once (on one node, a lost node takes the trainer with it)."""
        self.stop()  # from here on this method speaks for the watch: one report, no process exit under it
        wait = len(used_nodes(self.report)) > 1 and could_be_a_lost_peer(err)
        deadline = time.monotonic() + (wait_s if wait else 0.0)
        while True:
            try:
                lost = lost_nodes(self.report, self.alive())
            except Exception:  # the GCS busy or restarting: ask again
                lost = []
            if lost or time.monotonic() >= deadline:
                break
            time.sleep(self.interval_s)
        if not lost:
            return
        lines = [describe_lost(self.report, node) for node in lost]
        print("\n".join(lines), flush=True)
        raise NodeLostError(
            f"{'; '.join(line.removeprefix('[cluster] ') for line in lines)}. It failed the trainer with "
            f"{type(err).__name__}: {err}. Resubmit the job (MAX_RESTARTS=N does) to resume from the last complete "
            "checkpoint"
        ) from err
