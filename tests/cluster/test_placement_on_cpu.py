"""The placement report's lines and JSON, and the local node's refusal outside a loopback-only cluster."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from verl_ext.cluster.placement import parse_placement, placement_lines

REPORT = {
    "nodes": {
        "n1": {"name": "head", "ip": "127.0.0.1", "head": True, "gpus": 1},
        "n2": {"name": "node-1", "ip": "127.0.0.1", "head": False, "gpus": 1},
    },
    "trainer": {"node": "n1", "gpus": []},
    "groups": {"training ranks": ["n2", "n1"], "rollout replicas": ["n2", "n1"], "reward workers": []},
}


def test_lines_name_each_node_and_round_trip_as_json():
    lines = placement_lines(REPORT)
    assert lines[0] == "[cluster] 2 node(s): head (127.0.0.1, head, 1 GPU), node-1 (127.0.0.1, 1 GPU)"
    assert lines[1] == "[cluster] trainer process: head (no GPU)"
    assert "[cluster] training ranks: 0 node-1, 1 head" in lines
    assert not any(line.startswith("[cluster] reward workers") for line in lines)  # an empty group: no line
    assert parse_placement("noise\n" + "\n".join(lines) + "\nmore") == REPORT
    with pytest.raises(ValueError, match="no placement report"):
        parse_placement("nothing here")


def test_an_actor_ray_does_not_list_is_named_unknown():
    report = {**REPORT, "groups": {"difficulty service": [None]}}
    assert "[cluster] difficulty service: 0 ?" in placement_lines(report)


def test_the_local_node_refuses_a_cluster_that_is_not_loopback_only():
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "verl_ext.cluster.local_node", "--address=127.0.0.1:1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    assert "run it with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, as the head was started" in out.stderr
    usage = subprocess.run(
        [sys.executable, "-m", "verl_ext.cluster.local_node"], capture_output=True, text=True, timeout=120
    )
    assert usage.returncode != 0 and "usage: python -m verl_ext.cluster.local_node --address=" in usage.stderr
