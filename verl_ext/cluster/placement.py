"""Where a job's processes landed, read from Ray's state API: the trainer process, each training rank, each rollout
replica's servers, the agent-loop and reward workers, the difficulty service.

:func:`placement` takes named groups of actor handles (``{"training ranks": [...], ...}``) and returns, for each
group, the node of each actor in order, plus the cluster's nodes and the trainer process's node and GPUs;
:func:`placement_lines` prints it one line per group. A cluster user reads it to see that ranks and replicas spread
over the nodes as asked; the tests read its JSON line (``[cluster] placement {...}``).
"""

from __future__ import annotations

import json

PLACEMENT_PREFIX = "[cluster] placement "


def _actor_id(handle) -> str:
    return handle._actor_id.hex()


def placement(groups: dict[str, list]) -> dict:
    """``{"nodes": {node_id: {name, ip, head, gpus}}, "trainer": {node, gpus}, "groups": {group: [node_id, ...]},
    "actors": {actor_id: node_id}}`` for the actor handles of each group (an actor Ray does not list, e.g. one that
    died, gets ``None``)."""
    import ray
    from ray.util.state import list_actors, list_nodes

    context = ray.get_runtime_context()
    # This cluster's: on a machine with several Ray clusters, the state API would refuse to guess.
    address = context.gcs_address
    nodes = {
        node.node_id: {
            "name": node.node_name,
            "ip": node.node_ip,
            "head": bool(node.is_head_node),
            "gpus": int(node.resources_total.get("GPU", 0)),
        }
        # raise_on_missing_output off: Ray's check compares the filtered count with the total, so a cluster that
        # lost a node (its dead entry stays in the table) would raise on every query.
        for node in list_nodes(
            address=address, filters=[("state", "=", "ALIVE")], limit=10_000, raise_on_missing_output=False
        )
    }
    wanted = {_actor_id(h) for handles in groups.values() for h in handles}
    where = {
        actor.actor_id: actor.node_id
        for actor in list_actors(
            address=address, filters=[("state", "=", "ALIVE")], limit=10_000, raise_on_missing_output=False
        )
        if actor.actor_id in wanted
    }
    return {
        "nodes": nodes,
        "trainer": {"node": context.get_node_id(), "gpus": list(context.get_accelerator_ids().get("GPU", []))},
        "groups": {name: [where.get(_actor_id(h)) for h in handles] for name, handles in groups.items()},
        "actors": where,
    }


def _label(report: dict, node_id: str | None) -> str:
    node = report["nodes"].get(node_id) if node_id else None
    return node["name"] if node else "?"


def placement_lines(report: dict) -> list[str]:
    """The report as the console shows it, then its JSON line (:data:`PLACEMENT_PREFIX`)."""
    nodes = ", ".join(
        f"{n['name']} ({n['ip']}{', head' if n['head'] else ''}, {n['gpus']} GPU)" for n in report["nodes"].values()
    )
    trainer = report["trainer"]
    lines = [
        f"[cluster] {len(report['nodes'])} node(s): {nodes}",
        f"[cluster] trainer process: {_label(report, trainer['node'])} "
        f"({'GPUs ' + ','.join(map(str, trainer['gpus'])) if trainer['gpus'] else 'no GPU'})",
    ]
    for name, where in report["groups"].items():
        if where:
            lines.append(f"[cluster] {name}: " + ", ".join(f"{i} {_label(report, n)}" for i, n in enumerate(where)))
    lines.append(PLACEMENT_PREFIX + json.dumps(report, sort_keys=True))
    return lines


def parse_placement(output: str) -> dict:
    """The last placement report printed in ``output`` (a job's console); ``ValueError`` if there is none."""
    found = [line.split(PLACEMENT_PREFIX, 1)[1] for line in output.splitlines() if PLACEMENT_PREFIX in line]
    if not found:
        raise ValueError("no placement report ('[cluster] placement {...}') in the output")
    return json.loads(found[-1])
