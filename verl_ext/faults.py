"""Fault injection for the crash tests: a process kills itself (SIGKILL) at a named point of a named step, or a
rollout request fails.

``DIVA_FAULTS="<point>@<step>,..."`` arms the points; each fires once per run: before dying, the process leaves a
mark in ``DIVA_FAULT_DIR`` (required with ``DIVA_FAULTS``), so the restarted job that resumes past that step runs
on. The launchers pass both variables to every process of the job (``verl_ext.cpu.runtime_env.runtime_env``). Unset,
:func:`inject` is one dictionary lookup.

Points (where the kill leaves the run):

* ``after_difficulty_update`` (DIVA trainer): the difficulty service has applied step ``step``'s update, the step's
  checkpoint is not written: the resumed run must start from the previous checkpoint's difficulty state;
* ``checkpoint_save`` (toolkit trainer): step ``step``'s folder holds the method's own state (difficulty, planner)
  but not verl's model, optimizer and data-loader state, and verl's ``latest_checkpointed_iteration.txt`` still
  names the previous step: the partial folder must never be taken as the latest checkpoint;
* ``rollout_generate`` (``hf_cpu`` server): the rollout server dies while generating with weights version ``step``
  (the policy after ``step`` updates): the job must fail within a bounded time, naming what died;
* ``agent_loop_run`` (the seeded agent loop): an agent-loop worker dies while it runs a request of step ``step``:
  its prompts never finish, and the job must fail within a bounded time, naming it.

SIGKILL, not an exception: nothing of the dying process (``finally`` blocks, atexit, Ray's clean-up) runs, as
when a node is preempted or the kernel's OOM killer strikes.

``<point>@<step>:<node>`` loses a node of the launcher's local cluster instead (``run_scripts/_submit.sh``, e.g.
``node-1``): the process that reaches the point SIGKILLs that node's whole process tree (its ``ray start`` launcher,
raylet, object store and every worker on it) and goes on, as when a machine of a cluster is preempted; the
launcher then starts the node again before it resubmits the job.

Request points (:func:`fail_request`, in the ``hf_cpu`` server's ``generate``, ``step`` being its weights version
as for ``rollout_generate``) raise :class:`InjectedRequestFault` instead: the request fails, the server lives on.

* ``rollout_request``: the first request to arrive at weights version ``step`` fails, once; its retry (and every
  other request) goes through: the run must equal the run without the fault;
* ``rollout_request_always``: the first request to arrive at weights version ``step`` fails on every attempt (a
  request is known again by its sampling params and prompt, which a retry repeats): the step must fail in bounded
  time naming it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

FAULTS_ENV = "DIVA_FAULTS"
FAULT_DIR_ENV = "DIVA_FAULT_DIR"
KILL_POINTS = ("after_difficulty_update", "checkpoint_save", "rollout_generate", "agent_loop_run")
REQUEST_POINTS = ("rollout_request", "rollout_request_always")
POINTS = KILL_POINTS + REQUEST_POINTS


class InjectedRequestFault(RuntimeError):
    """A rollout request failed by :func:`fail_request` (``DIVA_FAULTS``)."""


def armed_faults(spec: str | None = None) -> dict[tuple[str, int], str | None]:
    """``{(point, step): node}`` of ``spec`` (default: ``$DIVA_FAULTS``; ``node`` ``None``: the process itself);
    ValueError naming a malformed entry."""
    spec = os.environ.get(FAULTS_ENV, "") if spec is None else spec
    faults = {}
    for entry in filter(None, (part.strip() for part in spec.split(","))):
        place, colon, node = entry.partition(":")
        point, _, step = place.partition("@")
        if point not in POINTS or not step.isdigit() or (colon and not node):
            raise ValueError(f"{FAULTS_ENV}: {entry!r} is not <point>@<step>[:<node>] with a point of {POINTS}")
        faults[(point, int(step))] = node or None
    return faults


def _mark(point: str, step: int) -> str:
    folder = os.environ.get(FAULT_DIR_ENV)
    if not folder:
        raise ValueError(f"{FAULTS_ENV} is set but {FAULT_DIR_ENV} is not: a fault must leave a mark to fire once")
    return os.path.join(folder, f"{point}@{step}.fired")


def local_node_processes(node: str, gcs_address: str | None = None) -> list[int]:
    """Pids of the local cluster's node named ``node``: its ``verl_ext.cluster.local_node`` launcher and all its
    descendants (raylet, object store, workers), from ``/proc``. ``gcs_address`` (``127.0.0.1:<port>``): only the node
    of that cluster (another local cluster on this machine may have a node of the same name)."""
    children: dict[int, list[int]] = {}
    roots = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(name))
        if (
            b"verl_ext.cluster.local_node" in cmd
            and f"--node-name={node}".encode() in cmd
            and (gcs_address is None or f"--address={gcs_address}".encode() in cmd)
        ):
            roots.append(int(name))
    tree, stack = set(roots), list(roots)
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in tree:
                tree.add(child)
                stack.append(child)
    return sorted(tree)


def _gcs_address() -> str | None:
    """The GCS address of the Ray cluster this process belongs to (``None`` outside Ray)."""
    import ray

    return ray.get_runtime_context().gcs_address if ray.is_initialized() else None


def _claim(mark: str, text: str) -> bool:
    """Create ``mark`` holding ``text``; False when it exists (atomic: one process, one request claims it)."""
    try:
        fd = os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.write(fd, text.encode())
    os.fsync(fd)
    os.close(fd)
    return True


def inject(point: str, step: int) -> None:
    """SIGKILL this process (or lose the named node) if ``point@step`` is armed and has not fired in this run (its
    mark is written first)."""
    if not os.environ.get(FAULTS_ENV):
        return
    armed = armed_faults()
    if (point, int(step)) not in armed:
        return
    node = armed[(point, int(step))]
    # The mark is claimed before the node's processes are scanned: a process reaching the point after the fault fired
    # returns at once instead of scanning /proc for nothing. The victims are added to the mark's record after.
    mark = _mark(point, int(step))
    if not _claim(mark, f"pid {os.getpid()} kills {node or 'itself'}"):
        return
    victims = local_node_processes(node, _gcs_address()) if node else [os.getpid()]
    with open(mark, "a") as record:
        record.write(f": {victims}\n")
    if node is None:
        print(f"[fault] {point}@{step}: killing pid {os.getpid()} (SIGKILL)", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    if not victims:
        raise RuntimeError(f"{FAULTS_ENV}: {point}@{step}:{node}: no process of a local node named {node!r}")
    print(f"[fault] {point}@{step}: losing {node} (SIGKILL to its {len(victims)} processes)", flush=True)
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def fail_request(step: int, request: str | Callable[[], str]) -> None:
    """Raise :class:`InjectedRequestFault` if a request point is armed at ``step`` and ``request`` (what identifies
    the request across its retries, or a function giving it) is the one it fails (the module docstring)."""
    if not os.environ.get(FAULTS_ENV):
        return
    armed = armed_faults()
    if not any((point, int(step)) in armed for point in REQUEST_POINTS):
        return
    request = request() if callable(request) else request
    step = int(step)
    if ("rollout_request", step) in armed and _claim(_mark("rollout_request", step), f"{request}\n"):
        print(f"[fault] rollout_request@{step}: failing request {request} once", flush=True)
        raise InjectedRequestFault(f"injected fault rollout_request@{step}: request {request} fails once")
    if ("rollout_request_always", step) in armed:
        mark = _mark("rollout_request_always", step)
        first = _claim(mark, f"{request}\n")
        if first or _read(mark) == request:
            print(f"[fault] rollout_request_always@{step}: failing request {request}", flush=True)
            raise InjectedRequestFault(
                f"injected fault rollout_request_always@{step}: request {request} fails on every attempt"
            )


def _read(mark: str) -> str:
    try:
        with open(mark) as f:
            return f.read().strip()
    except OSError:
        return ""
