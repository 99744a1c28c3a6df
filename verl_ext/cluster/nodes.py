"""The nodes of a Ray cluster, read from its dashboard: ``python -m verl_ext.cluster.nodes wait --address URL
--count N``.

The launcher of the local cluster waits, after starting its nodes, until the cluster sees all of them alive before
it submits: a job started earlier would find fewer GPUs than ``trainer.nnodes x n_gpus_per_node`` and wait for
them, or place everything on the head.
"""

from __future__ import annotations

import argparse
import sys
import time


def alive_nodes(address: str) -> list[dict]:
    """``{node_id, name, ip, head, gpus}`` of each alive node of the cluster whose dashboard is ``address``."""
    from ray.util.state import list_nodes

    return [
        {
            "node_id": node.node_id,
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
    ]


def wait_for_nodes(
    address: str, count: int, timeout_s: float, exact: bool = False, with_gpus: bool = False
) -> list[dict]:
    """Poll until ``count`` nodes are alive (``exact``: exactly ``count``, e.g. a node started again while Ray still
    counts its dead predecessor as alive for a few seconds; ``with_gpus``: count only nodes with GPUs, those a job's
    ``trainer.nnodes`` counts); ``TimeoutError`` naming the ones seen otherwise."""
    deadline = time.monotonic() + timeout_s
    seen: list[dict] = []
    error: Exception | None = None

    def done() -> bool:
        return len(seen) == count if exact else len(seen) >= count

    while True:
        try:
            seen, error = [n for n in alive_nodes(address) if n["gpus"] > 0 or not with_gpus], None
        except Exception as err:  # the dashboard answers a few seconds after the head starts
            seen, error = [], err
        if done() or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    if not done():
        names = ", ".join(n["name"] for n in seen) or "none"
        raise TimeoutError(
            f"{len(seen)} Ray nodes alive after {timeout_s:.0f} s, {'exactly ' if exact else ''}{count} wanted "
            f"(alive: {names})" + (f"; the last query failed: {type(error).__name__}: {error}" if error else "")
        )
    return seen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    wait = sub.add_parser("wait", help="wait until COUNT nodes are alive")
    wait.add_argument("--address", required=True, help="the dashboard address, http://host:port")
    wait.add_argument("--count", type=int, required=True)
    wait.add_argument("--exact", action="store_true", help="wait for exactly COUNT alive nodes")
    wait.add_argument("--timeout", type=float, default=120.0, help="seconds (default 120)")
    args = parser.parse_args(argv)
    try:
        nodes = wait_for_nodes(args.address, args.count, args.timeout, exact=args.exact)
    except TimeoutError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    described = ", ".join(f"{n['name']} ({n['gpus']} GPU{', head' if n['head'] else ''})" for n in nodes)
    print(f"[diva] {len(nodes)} Ray node(s) alive: {described}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
