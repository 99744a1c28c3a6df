"""The cluster path, run for real on one machine: the shared DIVA launch (``tests/e2e/conftest.py``) on two Ray nodes,
a head and a second node started by Ray's own ``ray start --address``, each with its raylet, object store and one
logical GPU, all on 127.0.0.1; the job submitted from outside to the head's dashboard address.

* The placement report (Ray's state API): one training rank and one rollout replica per node, each replica beside its
  rank, agent-loop workers on both nodes, the trainer process holding no GPU.
* Both ranks wrote their FSDP shards; the difficulty state is written once per checkpoint, by the trainer.
* World size is invisible to the math: every step equals the same seed and settings at world size 1
  (``tiny_diva_world1``), value by value, the first exactly (:mod:`verl_ext.cluster.world_size` says what is exact
  and what float tolerance applies, and why).
"""

from __future__ import annotations

import pytest
from tiny_launch import DIVA_ALL_STEPS, DIVA_NODES

from verl_ext.cluster.placement import parse_placement
from verl_ext.cluster.world_size import compare_runs

pytestmark = [pytest.mark.gpu_stack, pytest.mark.timeout(1800)]


def test_ranks_replicas_and_workers_spread_over_both_nodes(tiny_diva_run):
    report = parse_placement(tiny_diva_run["log"])  # its JSON line is in the job's log
    nodes = report["nodes"]
    assert len(nodes) == DIVA_NODES and sorted(n["name"] for n in nodes.values()) == ["head", "node-1"]
    assert all(n["ip"] == "127.0.0.1" and n["gpus"] == 1 for n in nodes.values())
    groups = report["groups"]
    ranks, replicas = groups["training ranks"], groups["rollout replicas"]
    assert len(ranks) == len(set(ranks)) == DIVA_NODES  # one rank per node
    assert replicas == ranks  # replica i on the node of rank i: beside its worker, as verl places vLLM's
    assert set(groups["agent-loop workers"]) == set(nodes)
    assert groups["difficulty service"][0] in nodes
    assert report["trainer"]["gpus"] == []  # the trainer process takes no GPU a worker needs
    # The resumed trainer printed its own report (a second job run): the same shape.
    assert tiny_diva_run["log"].count("[cluster] placement ") == 2  # the log holds both launches (appended)


def test_both_ranks_saved_their_shards_and_the_difficulty_state_once(tiny_diva_run):
    checkpoints = tiny_diva_run["dir"] / "checkpoints"
    for step in (DIVA_ALL_STEPS[2], DIVA_ALL_STEPS[-1]):
        actor = checkpoints / f"global_step_{step}" / "actor"
        for kind in ("model", "optim", "extra_state"):
            shards = sorted(p.name for p in actor.glob(f"{kind}_world_size_*_rank_*.pt"))
            assert shards == [f"{kind}_world_size_{DIVA_NODES}_rank_{r}.pt" for r in range(DIVA_NODES)], (step, shards)
    states = sorted(p.relative_to(tiny_diva_run["dir"]) for p in tiny_diva_run["dir"].rglob("diva_difficulty*.json"))
    assert [str(p) for p in states] == [
        f"checkpoints/global_step_{s}/diva_difficulty.json" for s in (DIVA_ALL_STEPS[2], DIVA_ALL_STEPS[-1])
    ]


def test_world_size_is_invisible_to_the_math(tiny_diva_run, tiny_diva_world1):
    # Every value the two-node run logged (training and validations of steps 0-4, the resumed fourth step included).
    differences, counts = compare_runs(str(tiny_diva_run["dir"]), str(tiny_diva_world1["dir"]), DIVA_NODES, 1)
    assert differences == []
    assert counts["steps"] == [0, *DIVA_ALL_STEPS]
    assert counts["values"] > 400 and counts["response_fields"] == len(DIVA_ALL_STEPS) * 16 * 9
