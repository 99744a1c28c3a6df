"""One launch of ``run_scripts/tiny_cpu.sh`` for the end-to-end tests: a clean environment, the output, the summary."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import struct
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The shared DIVA run (tests/e2e/conftest.py, tiny_diva_run): trains STEPS steps, then resumes for RESUME_STEPS more,
# on a cluster of NODES Ray nodes (one training rank and one rollout replica each).
DIVA_STEPS, DIVA_RESUME_STEPS, DIVA_NODES = 3, 1, 2
DIVA_ALL_STEPS = list(range(1, DIVA_STEPS + DIVA_RESUME_STEPS + 1))
# The shared vLLM DIVA run (tests/e2e/conftest.py, tiny_vllm_run): the same on verl's vLLM rollout.
VLLM_STEPS, VLLM_RESUME_STEPS, VLLM_NODES = 2, 1, 2
# Settings of the calling process that would point the launch at another cluster, platform or folder, or change
# what its console shows.
CLEARED = (
    "RAY_ADDRESS",
    "VERL_PLATFORM",
    "DIVA_CPU_PROBE_DIR",
    "VERL_FILE_LOGGER_ROOT",
    "DIVA_FAULTS",
    "MAX_RESTARTS",
    "NODES",
    "GPUS_PER_NODE",
    "TP",
    "WITHOUT",
    "VERBOSE",
    "DIVA_JOB_LOG",
    "PRECISION",
    "USE_REMOVE_PADDING",
    "TINY_ARCH",
    "NODE_RETURN_S",
    "LOCAL_NODE_RESTART",
)


def run_tiny_cpu(
    workdir: Path, run_dir: Path, timeout: int, sockets: set | None = None, **settings: str
) -> tuple[int, str]:
    """Run the launcher with ``WORKDIR``, ``RUN_DIR`` and ``settings`` (``METHOD``, ``ROLLOUT``, ``STEPS``, ...);
    returns its exit status and console output (stdout, then stderr; the job's whole output: :func:`job_log`).
    ``sockets``: filled with every listening socket (:func:`listening_sockets`) that a process of the launch (the Ray
    head and all it starts) held, sampled each second."""
    env = {name: value for name, value in os.environ.items() if name not in CLEARED}
    env.update(WORKDIR=str(workdir), RUN_DIR=str(run_dir), **settings)
    with one_cluster_of_two_nodes(settings), tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            ["bash", "run_scripts/tiny_cpu.sh"], cwd=ROOT, env=env, stdout=out, stderr=err, text=True
        )
        deadline = time.monotonic() + timeout
        while proc.poll() is None:
            if time.monotonic() > deadline:
                proc.kill()
                raise subprocess.TimeoutExpired(proc.args, timeout)
            if sockets is not None:
                seen = listening_sockets(proc.pid)
                sockets.update(seen)
                for _, _, _, pid, _ in seen:
                    if pid not in _MASTER_PORTS and (port := _master_port(pid)) is not None:
                        _MASTER_PORTS[pid] = port
            time.sleep(1.0)
        out.seek(0)
        err.seek(0)
        return proc.returncode, out.read() + err.read()


# CI runs two pytest processes at once (.ci/run); a launch on two Ray nodes takes up to 15 GB of this machine's 24: two
# of them at once (one per process) would not fit, so each waits for the other's end (any pytest process, one file).
TWO_NODE_LOCK = Path(tempfile.gettempdir()) / "diva_tests_two_node_launch.lock"


@contextlib.contextmanager
def one_cluster_of_two_nodes(settings: dict):
    """Held for a launch of more than one Ray node (``NODES``): one such launch on this machine at a time."""
    if int(settings.get("NODES", "1")) < 2:
        yield
        return
    with open(TWO_NODE_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def run_compare_tiny(out: Path, timeout: int, **settings: str) -> subprocess.CompletedProcess:
    """Run ``run_scripts/compare_tiny.sh`` into ``out`` with ``settings`` (``METHODS``, ``TASK``, ``STEPS``, ...) on
    this test's Python (the stack it runs on, whatever PATH says), clear of the caller's cluster, platform and
    folders; returns the finished process (output captured)."""
    import sys

    cleared = ("RAY_ADDRESS", "VERL_PLATFORM", "DIVA_CPU_PROBE_DIR", "VERL_FILE_LOGGER_ROOT", "WORKDIR")
    env = {name: value for name, value in os.environ.items() if name not in cleared}
    env.update(OUT=str(out), PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", **settings)
    return subprocess.run(
        ["bash", "run_scripts/compare_tiny.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def training_metrics(run_dir: Path) -> dict[int, dict]:
    """verl's logged values of each training step of a launch (every part of it: the trained and the resumed), by
    step; validation-only entries are left out."""
    out = {}
    for path in sorted((run_dir / "metrics").glob("*/*.jsonl")):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            if "actor/pg_loss" in entry["data"]:
                out[entry["step"]] = entry["data"]
    return out


def job_log(run_dir: Path) -> str:
    """The job's whole output, which the launcher's console shows only part of (``run_scripts/tiny_cpu.sh`` writes
    it to ``RUN_DIR/job.log``: verl's and Ray's own lines, every actor's output)."""
    return (run_dir / "job.log").read_text()


def launch_tiny_cpu(
    workdir: Path, run_dir: Path, timeout: int, sockets: set | None = None, **settings: str
) -> tuple[str, dict]:
    """:func:`run_tiny_cpu`; asserts it passed and returns its output and its summary (``RUN_DIR/summary.json``, which
    the console's ``[cpu] summary`` lines show in part)."""
    returncode, output = run_tiny_cpu(workdir, run_dir, timeout, sockets, **settings)
    assert returncode == 0, output[-8000:]
    assert "[cpu] PASSED" in output, output[-8000:]
    assert f"[cpu]   every figure: {run_dir / 'summary.json'}" in output, output[-8000:]
    return output, json.loads((run_dir / "summary.json").read_text())


LOOPBACK = ("127.0.0.1", "::1", "::ffff:127.0.0.1")


def _process_tree(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(name))
    tree, stack = {root}, [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in tree:
                tree.add(child)
                stack.append(child)
    return tree


def _address(hex_ip: str, v6: bool) -> str:
    raw = bytes.fromhex(hex_ip)
    if not v6:
        return socket.inet_ntop(socket.AF_INET, struct.pack("<I", int(hex_ip, 16)))
    return socket.inet_ntop(socket.AF_INET6, b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))


def listening_sockets(root: int) -> set[tuple[str, str, str, int, int]]:
    """``(protocol, address, process name, pid, port)`` of every listening TCP and bound UDP socket of ``root`` and
    its descendants, from ``/proc``."""
    owner: dict[int, int] = {}
    for pid in _process_tree(root):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if link.startswith("socket:["):
                    owner.setdefault(int(link[8:-1]), pid)
        except OSError:
            continue
    found = set()
    for proto, v6, listening in (
        ("tcp", False, "0A"),
        ("tcp6", True, "0A"),
        ("udp", False, "07"),
        ("udp6", True, "07"),
    ):
        try:
            with open(f"/proc/net/{proto}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            inode = int(fields[9])
            if fields[3] != listening or inode not in owner:
                continue
            pid = owner[inode]
            try:
                with open(f"/proc/{pid}/comm") as f:
                    name = f.read().strip()
            except OSError:
                name = "?"
            hex_ip, hex_port = fields[1].split(":")
            found.add((proto, _address(hex_ip, v6), name, pid, int(hex_port, 16)))
    return found


def _master_port(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
    except OSError:
        return None
    port = env.get(b"MASTER_PORT")
    return int(port) if port and port.isdigit() else None


def sockets_off_loopback(sockets: set) -> list[tuple]:
    """The sockets of :func:`listening_sockets` on another address than loopback, but for the listed exception
    (docs/reliability.md, "The local head"): torch.distributed's TCPStore, which binds every interface and
    has no setting for it, one per process that opens a process group: verl's FSDP workers (on ``MASTER_PORT``)
    and vLLM's engine worker (``init_method=tcp://127.0.0.1:<port>``). Each process's ports are read while it runs."""
    outside = [s for s in sockets if s[1] not in LOOPBACK]
    per_pid: dict[int, int] = {}
    for s in outside:
        per_pid[s[3]] = per_pid.get(s[3], 0) + 1
    unlisted = []
    for proto, address, name, pid, port in outside:
        fsdp_store = name == "ray::WorkerDict" and port == _MASTER_PORTS.get(pid)
        vllm_store = name == "VLLM::Worker" and per_pid[pid] == 1
        if not (fsdp_store or vllm_store):
            unlisted.append((proto, address, name, pid, port))
    return sorted(unlisted)


# pid -> MASTER_PORT of the worker processes seen by run_tiny_cpu (a process's environment is gone once it exits).
_MASTER_PORTS: dict[int, int] = {}


def launch_diva_world1(workdir: Path, run_dir: Path, timeout: int = 900, **settings: str) -> tuple[str, dict]:
    """The shared DIVA run's settings and seed on one node, one rank, one replica (``settings``: more, e.g.
    ``USE_REMOVE_PADDING="1"``): the world-size-1 reference and the runs compared with it."""
    return launch_tiny_cpu(
        workdir,
        run_dir,
        timeout,
        METHOD="diva",
        NODES="1",
        STEPS=str(DIVA_STEPS),
        RESUME_STEPS=str(DIVA_RESUME_STEPS),
        **settings,
    )
