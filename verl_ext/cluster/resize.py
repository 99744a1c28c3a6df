"""Go on with the nodes a cluster has left: the resubmission of a job whose node is gone for good.

``python -m verl_ext.cluster.resize --address URL --wait S -- OVERRIDES...`` (``run_scripts/_submit.sh``, after a
failed attempt with ``MAX_RESTARTS``): composes the job's config (the recipe and the job's Hydra overrides), waits up
to ``S`` seconds (``NODE_RETURN_S``) for the cluster to have the ``trainer.nnodes`` nodes with GPUs the job was sized
for, and when fewer come back, plans the job on the survivors: ``trainer.nnodes`` set to their number, the batch
arithmetic of every pass checked for the new world size before anything loads
(:func:`verl_ext.cluster.batch_arithmetic.check_batch_arithmetic`), and what changed said on the console (nodes,
training ranks, rollout replicas, rows per rank). It prints the overrides to add (none when every node is back) on
stdout; a batch that cannot be split over the survivors is refused, naming the setting and what passes, before any
Ray process starts.

The job then resumes from its last complete checkpoint at the new world size: the actor's reshardable copy
(:mod:`verl_ext.checkpoint`) loads at any world size, and the rest of a run's state (dataloader position, difficulty
service, the methods' states, the seeds of every draw) never depended on it.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from verl_ext.cluster.batch_arithmetic import BatchArithmeticError, BatchPlan, batch_plan, check_batch_arithmetic

CONFIG_DIR = Path(__file__).resolve().parents[2] / "recipe" / "diva_grpo" / "config"


@dataclass(frozen=True)
class Resize:
    """The job planned on ``nodes`` nodes instead of ``before.world / gpus_per_node``."""

    nodes_before: int
    nodes: int
    before: BatchPlan
    after: BatchPlan

    def overrides(self) -> list[str]:
        return [] if self.nodes == self.nodes_before else [f"trainer.nnodes={self.nodes}"]

    def lines(self) -> list[str]:
        if not self.overrides():
            return []
        b, a = self.before, self.after
        return [
            f"resubmitting on the {self.nodes} node(s) left: nodes {self.nodes_before} -> {self.nodes}, training ranks "
            f"{b.dp} -> {a.dp}, rollout replicas {b.replicas} -> {a.replicas}, rows per rank {b.rows_per_rank} -> "
            f"{a.rows_per_rank} ({a.responses} responses per step, unchanged)",
            *(f"batch: {line}" for line in a.lines()),
        ]


def compose(overrides: list[str]):
    """The job's config: the recipe's yaml with the job's Hydra overrides (no verl import)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return hydra_compose("diva_grpo", overrides=list(overrides))


def plan_resize(cfg, nodes: int) -> Resize:
    """``cfg`` planned on ``nodes`` nodes of its ``trainer.n_gpus_per_node`` GPUs; :class:`BatchArithmeticError`
    naming the setting when its batch does not split over them (``nodes < 1``: none left to train on)."""
    before = batch_plan(cfg)
    nodes_before = int(cfg.trainer.nnodes)
    if nodes < 1:
        raise BatchArithmeticError(f"no node with GPUs is left of the {nodes_before} the job (trainer.nnodes) ran on")
    resized = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    resized.trainer.nnodes = nodes
    try:
        after = check_batch_arithmetic(resized)
    except BatchArithmeticError as err:
        raise BatchArithmeticError(
            f"the job cannot go on with the {nodes} node(s) left of {nodes_before} (trainer.nnodes): {err}"
        ) from err
    return Resize(nodes_before, nodes, before, after)


def nodes_with_gpus(address: str, wanted: int, wait_s: float) -> int:
    """The alive nodes with GPUs, once ``wanted`` are alive or ``wait_s`` seconds have passed."""
    from verl_ext.cluster.nodes import alive_nodes, wait_for_nodes

    try:
        nodes = wait_for_nodes(address, wanted, wait_s, with_gpus=True)
    except TimeoutError:
        nodes = [n for n in alive_nodes(address) if n["gpus"] > 0]
    return len(nodes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True, help="the Ray dashboard address, http://host:port")
    parser.add_argument("--wait", type=float, required=True, help="seconds to wait for lost nodes (NODE_RETURN_S)")
    parser.add_argument("overrides", nargs="*", help="the job's Hydra overrides (after --)")
    args = parser.parse_args(argv)
    cfg = compose(args.overrides)
    wanted = int(cfg.trainer.nnodes)
    alive = nodes_with_gpus(args.address, wanted, args.wait)
    try:
        resize = plan_resize(cfg, min(alive, wanted))
    except BatchArithmeticError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return 2
    if alive < wanted:
        lost = wanted - alive
        print(
            f"[diva] {lost} of the job's {wanted} node(s) did not come back within {args.wait:.0f} s (NODE_RETURN_S)",
            file=sys.stderr,
            flush=True,
        )
    for line in resize.lines():
        print(f"[diva] {line}", file=sys.stderr, flush=True)
    for override in resize.overrides():
        print(override, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
