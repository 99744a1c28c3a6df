"""A further node of the launcher's local Ray cluster, on loopback: ``python -m verl_ext.cluster.local_node ARGS``.

``ARGS`` are those of ``ray start`` for a worker node (``--address=127.0.0.1:<gcs port> --block ...``); this runs
Ray's own ``ray start`` with them, as a user starts a node of a real cluster, with one thing lifted.

Which Ray assumption is lifted, and why. The local head keeps every Ray server on 127.0.0.1 by starting with
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (``run_scripts/_submit.sh``): with multi-node clusters on, Ray replaces a
loopback ``--node-ip-address`` by the machine's external address (``ray._private.services.resolve_ip_for_localhost``).
The same flag also makes ``ray start --address`` refuse to start a second node ("Multi-node Ray clusters are not
supported on Windows and OSX"). Ray couples the two; the local cluster wants the first without the second. So, in
this process only, the CLI's flag reads "clusters on" (its refusal passes) while the node address resolves as it
does with clusters off (:func:`ray._common.network_utils.get_localhost_ip`, 127.0.0.1). Everything this node starts
(raylet, object store, workers) inherits ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` from the environment and binds
127.0.0.1, as the head's processes do. Ray's own test clusters run several nodes on one address the same way.
"""

from __future__ import annotations

import sys


def lift_multi_node_refusal() -> None:
    """Let ``ray start --address`` add a node while every address stays on loopback (module docstring)."""
    import ray._private.ray_constants as ray_constants
    import ray._private.services as services
    from ray._common.network_utils import get_localhost_ip

    if ray_constants.ENABLE_RAY_CLUSTER:
        raise SystemExit(
            "verl_ext.cluster.local_node starts a node of a loopback-only cluster: run it with "
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, as the head was started (run_scripts/_submit.sh)"
        )
    ray_constants.ENABLE_RAY_CLUSTER = True
    services.get_node_ip_address = lambda address=None: get_localhost_ip()


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not any(arg == "--address" or arg.startswith("--address=") for arg in args):
        raise SystemExit("usage: python -m verl_ext.cluster.local_node --address=127.0.0.1:<gcs port> [ray start args]")
    lift_multi_node_refusal()
    from ray.scripts.scripts import main as ray_main

    sys.argv = ["ray", "start", *args]
    ray_main()


if __name__ == "__main__":
    main()
