"""Storage every node sees, checked at the job's start, and a resume that finds no checkpoint failing loudly.

verl writes each rank's FSDP shards from that rank's process, on its node, and ``data.pt`` and the
``latest_checkpointed_iteration.txt`` marker from the trainer process; the project writes the difficulty state, the
planner state and the metrics log from the trainer process too. With a checkpoint folder that is not one folder on
every node, a resubmitted job whose trainer lands on another node finds no marker, verl logs "Training from scratch"
at INFO level and the run starts at step 0 with the difficulty table back at ``d_init``.

* :func:`check_shared_folder`: the trainer writes a marker with a fresh random token into the folder, and a task on
  every alive node reads it back; a node that cannot see it (missing, or another folder's token) fails the job,
  named, with what to set.
* :class:`RunRecord`: ``<folder>/diva_run.json`` says which steps this run saved there (written by the trainer after
  each complete checkpoint). At the job's start, :func:`check_resume` compares it with the checkpoint verl will
  resume from: a record of saved steps with no checkpoint to match fails loudly (the folder or its files are not the
  run's), a restart of the launcher (``MAX_RESTARTS``) that finds no record at all fails too, and a run with nothing
  to resume says that it starts at step 0.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time

MARKER_NAME = ".diva_shared_check"
RECORD_NAME = "diva_run.json"
LATEST_NAME = "latest_checkpointed_iteration.txt"  # verl's marker of the last complete checkpoint


class StorageError(RuntimeError):
    """The checkpoint folder is not one folder on every node, or a resume that was asked for found no checkpoint."""


def _read_token(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def check_shared_folder(folder: str, timeout_s: float = 120.0) -> dict[str, str]:
    """Write a fresh token into ``folder`` from this node and read it on every alive Ray node; returns
    ``{node name: what it saw}`` and raises :class:`StorageError` naming the nodes that do not see the token."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    os.makedirs(folder, exist_ok=True)
    path = os.path.join(os.path.abspath(folder), MARKER_NAME)
    token = f"{secrets.token_hex(16)} written by {socket.gethostname()} pid {os.getpid()} at {time.time():.0f}"
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(token)
    os.replace(tmp, path)
    here = ray.get_runtime_context().get_node_id()
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    read = ray.remote(num_cpus=0)(_read_token)
    refs = {
        node["NodeID"]: read.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node["NodeID"], soft=False)
        ).remote(path)
        for node in nodes
    }
    seen = dict(zip(refs, ray.get(list(refs.values()), timeout=timeout_s), strict=True))
    names = {n["NodeID"]: f"{n.get('NodeName') or n['NodeManagerAddress']} ({n['NodeManagerAddress']})" for n in nodes}
    blind = {names[node]: got for node, got in seen.items() if got != token}
    if blind:
        described = "; ".join(
            f"{name}: {'no such file' if got is None else 'another file there'}" for name, got in blind.items()
        )
        raise StorageError(
            f"the checkpoint folder {folder} is not the same folder on every node: the marker written from "
            f"{names.get(here, here)} is not seen by {described}. Each rank saves its shards on its own node and the "
            "trainer saves the latest-checkpoint marker and the difficulty state on its node, so a restart on another "
            "node would start from scratch. Set CKPT_DIR (trainer.default_local_dir) to storage every node mounts at "
            "the same path (a shared file system), or run on one node."
        )
    return {names[node]: "sees it" for node in seen}


def _latest_step(folder: str) -> int | None:
    text = _read_token(os.path.join(folder, LATEST_NAME))
    return int(text) if text and text.isdigit() else None


class RunRecord:
    """``<folder>/diva_run.json``: the steps this run saved in ``folder`` (see the module docstring)."""

    def __init__(self, folder: str):
        self.path = os.path.join(os.path.abspath(folder), RECORD_NAME)

    def read(self) -> dict | None:
        try:
            with open(self.path) as f:
                return json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            raise StorageError(f"{self.path} is unreadable ({err}); it records which steps this run saved") from err

    def write(self, record: dict) -> None:
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(record, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def start(self, experiment: str) -> dict:
        """The record, created (no step saved yet) when the folder has none."""
        record = self.read()
        if record is None:
            record = {"experiment": experiment, "saved_steps": [], "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
            self.write(record)
        return record

    def saved(self, step: int) -> None:
        """Note a complete checkpoint of ``step`` (after verl marked it the latest)."""
        record = self.read() or {"saved_steps": []}
        record["saved_steps"] = sorted({*record.get("saved_steps", []), int(step)})
        self.write(record)


def check_resume(folder: str, resume_mode: str, experiment: str, restart: bool, resume_path: str | None = None) -> str:
    """What the run starts from, as one console line; :class:`StorageError` when a resume that was asked for would
    silently start from scratch (module docstring). ``restart``: the launcher resubmitted a failed attempt;
    ``resume_path``: ``trainer.resume_from_path`` (``resume_mode=resume_path``)."""
    record_file = RunRecord(folder)
    record = record_file.read()
    if resume_mode == "disable":
        record_file.start(experiment)
        return f"new run: starting at step 0 (trainer.resume_mode=disable; checkpoints go to {folder})"
    if resume_mode == "resume_path":
        if not resume_path or not os.path.isdir(resume_path):
            raise StorageError(f"trainer.resume_mode=resume_path: trainer.resume_from_path={resume_path!r}: no folder")
        record_file.start(experiment)
        return f"resuming from {resume_path} (trainer.resume_from_path)"
    latest = _latest_step(folder)
    if record is None and restart:
        raise StorageError(
            f"this job is a restart (MAX_RESTARTS) of a run that kept no record in {folder} ({RECORD_NAME} is "
            "missing): the folder is not the one the failed attempt wrote, or not visible here. Resuming would start "
            "from scratch; check CKPT_DIR (trainer.default_local_dir) and that every node mounts it."
        )
    saved = sorted((record or {}).get("saved_steps", []))
    if saved and (latest is None or latest < saved[-1]):
        raise StorageError(
            f"trainer.resume_mode={resume_mode}: this run saved step {saved[-1]} in {folder} ({RECORD_NAME}) but "
            f"verl finds {'no checkpoint' if latest is None else f'step {latest} as the latest'} there "
            f"({LATEST_NAME}). Resuming would lose the steps after it; the checkpoint was deleted or the folder is "
            "not the same on this node. Restore the checkpoint or point CKPT_DIR at it; to start over, use a new "
            "CKPT_DIR or trainer.resume_mode=disable."
        )
    record_file.start(experiment)
    if latest is None:
        return f"new run: starting at step 0 (no checkpoint in {folder} yet)"
    return f"resuming from {os.path.join(folder, f'global_step_{latest}')}"
