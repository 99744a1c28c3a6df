"""Fault injection fires once, where armed, with SIGKILL; a restarted job keeps the earlier metrics log."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from verl_ext.faults import FAULT_DIR_ENV, FAULTS_ENV, armed_faults, inject, local_node_processes
from verl_ext.metrics_log import keep_previous_log, metrics_log_path


def test_armed_faults_parses_and_names_a_bad_entry():
    assert armed_faults("checkpoint_save@2, rollout_generate@3:node-1") == {
        ("checkpoint_save", 2): None,
        ("rollout_generate", 3): "node-1",
    }
    assert armed_faults("") == {}
    with pytest.raises(ValueError, match="'checkpoint@2' is not <point>@<step>"):
        armed_faults("checkpoint@2")
    with pytest.raises(ValueError, match="DIVA_FAULTS"):
        armed_faults("checkpoint_save@two")
    with pytest.raises(ValueError, match="<point>@<step>\\[:<node>\\]"):
        armed_faults("checkpoint_save@2:")


def _inject_in_a_child(tmp_path, point: str, step: int) -> subprocess.CompletedProcess:
    code = f"from verl_ext.faults import inject; inject({point!r}, {step}); print('survived')"
    env = {**os.environ, FAULTS_ENV: "after_difficulty_update@3", FAULT_DIR_ENV: str(tmp_path)}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_a_fault_kills_its_process_with_sigkill_once(tmp_path):
    first = _inject_in_a_child(tmp_path, "after_difficulty_update", 3)
    assert first.returncode == -signal.SIGKILL and "survived" not in first.stdout
    assert (tmp_path / "after_difficulty_update@3.fired").exists()
    again = _inject_in_a_child(tmp_path, "after_difficulty_update", 3)  # the restarted job runs on
    assert again.returncode == 0 and "survived" in again.stdout
    elsewhere = _inject_in_a_child(tmp_path, "after_difficulty_update", 2)
    assert elsewhere.returncode == 0


def test_a_node_fault_kills_that_nodes_process_tree_once_and_runs_on(tmp_path):
    """A stand-in local node: a process whose command line is a node launcher's, with a child (its 'raylet')."""
    node = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
            "time.sleep(120)",
            "verl_ext.cluster.local_node",
            "--address=127.0.0.1:6001",
            "--node-name=node-7",
        ]
    )
    try:
        deadline = time.monotonic() + 30
        while len(local_node_processes("node-7")) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        tree = local_node_processes("node-7")
        assert len(tree) == 2 and tree[0] == node.pid and local_node_processes("node-8") == []
        # Another local cluster's node of the same name is not this cluster's.
        assert local_node_processes("node-7", "127.0.0.1:6001") == tree
        assert local_node_processes("node-7", "127.0.0.1:6002") == []
        code = "from verl_ext.faults import inject; inject('rollout_generate', 2); print('survived')"
        env = {**os.environ, FAULTS_ENV: "rollout_generate@2:node-7", FAULT_DIR_ENV: str(tmp_path)}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "survived" in out.stdout and "losing node-7" in out.stdout
        assert node.wait(timeout=30) == -signal.SIGKILL
        assert f"kills node-7: {tree}" in (tmp_path / "rollout_generate@2.fired").read_text()
        deadline = time.monotonic() + 30
        while local_node_processes("node-7") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert local_node_processes("node-7") == []  # the child went too
    finally:
        node.kill()


def test_inject_is_inert_unless_armed_and_needs_a_mark_folder(monkeypatch):
    monkeypatch.delenv(FAULTS_ENV, raising=False)
    inject("checkpoint_save", 1)  # unset: nothing happens
    monkeypatch.setenv(FAULTS_ENV, "checkpoint_save@1")
    monkeypatch.delenv(FAULT_DIR_ENV, raising=False)
    with pytest.raises(ValueError, match=FAULT_DIR_ENV):
        inject("checkpoint_save", 1)


def test_keep_previous_log_keeps_every_attempt(tmp_path, monkeypatch):
    monkeypatch.delenv("VERL_FILE_LOGGER_PATH", raising=False)
    monkeypatch.setenv("VERL_FILE_LOGGER_ROOT", str(tmp_path))
    path = metrics_log_path("proj", "exp")
    assert path == str(tmp_path / "proj" / "exp.jsonl")
    assert keep_previous_log(path) is None  # nothing yet
    os.makedirs(os.path.dirname(path))
    for attempt in (1, 2):
        with open(path, "w") as f:
            f.write(f'{{"step": {attempt}, "data": {{}}}}\n')
        assert keep_previous_log(path) == str(tmp_path / "proj" / f"exp.attempt{attempt}.jsonl")
    open(path, "w").close()
    assert keep_previous_log(path) is None  # an empty file holds nothing to keep
    assert (tmp_path / "proj" / "exp.attempt2.jsonl").read_text().startswith('{"step": 2')
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "given.jsonl"))
    assert metrics_log_path("proj", "exp") == str(tmp_path / "given.jsonl")
