"""The difficulty service: a named Ray actor holding the :class:`DifficultyTracker`, and its client.

Who talks to it:

- the trainer: ``service.attach_table(table)`` once (the dataset's :class:`SharedDifficultyTable`, made before
  the DataLoader workers start), then once per step ``pending = service.update_async(ids, alphas, step)`` right
  after the advantage is computed and ``metrics = service.finish(pending)`` when the metrics are needed (the
  reply also carries the changed difficulties, which ``finish`` copies into the table);
- the trainer's checkpoint hooks: ``service.save(step_folder)`` / ``service.load(step_folder)``;
- never the DataLoader workers: they read the shared table.

Naming and isolation: the actor is named ``"<service_name>/<experiment_name>"`` and created, or found, in a Ray
namespace: by default the calling job's own namespace (``ray.get_runtime_context().namespace``; every
``ray job submit`` gets a fresh anonymous one unless the user names one). Two experiments on one cluster therefore
never share state: different namespaces, and different names even inside one shared namespace.

Fault tolerance: the actor restarts up to ``max_restarts`` times and Ray retries the interrupted call as often.
Its state lives in ``live_dir`` (a :class:`LiveStateStore`: base file + journal, appended before each update is
acknowledged), which the restarted actor reads in ``__init__``; every update carries a request id, so a retried
update that had already been applied is not applied twice. The actor is pinned to the node that created it,
so ``live_dir`` (on that node's disk) is there after a restart; use shared storage to lift the pin.
"""

from __future__ import annotations

import dataclasses
import os
import time
import uuid
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from verl_ext.difficulty.live_store import LiveStateStore
from verl_ext.difficulty.persistence import (
    DifficultyStateFileError,
    checkpoint_state_path,
    load_state,
    save_state,
)
from verl_ext.difficulty.tracker import DifficultyTracker

if TYPE_CHECKING:  # kept out of the actor process: verl and torch take seconds to import there
    from verl_ext.config import DifficultyConfig
    from verl_ext.difficulty.shared_table import SharedDifficultyTable


class DifficultyServiceActor:
    """Actor body: one tracker, its live store, and the checkpoint file hooks. Methods run one at a time."""

    def __init__(self, config: dict, live_dir: str | None):
        self._config = dict(config)
        self.tracker = DifficultyTracker(self._config)
        self.store = LiveStateStore(live_dir) if live_dir else None
        self.replayed = self.store.restore_into(self.tracker) if self.store else 0

    def update(
        self,
        question_ids: list,
        alphas: np.ndarray,
        step: int,
        request_id: str | None = None,
        changes_since: int | None = None,
        priors: np.ndarray | None = None,
    ) -> dict:
        """Apply one step's update; returns ``{"version": int, "metrics": {...}}``, plus ``"changes"``
        (:meth:`DifficultyTracker.changes_since`) when ``changes_since`` is given: the table refresh rides on the
        same round trip."""
        if not self.tracker.is_applied(request_id):
            record = self.tracker.compute_update(question_ids, alphas, step, request_id, priors)
            if self.store is not None:
                self.store.append(record)  # before applying: nothing acknowledged is ever lost
            self.tracker.apply(record)
            if self.store is not None and self.store.needs_compaction(self.tracker):
                self.store.compact(self.tracker)
        result = {"version": self.tracker.version, "metrics": self.tracker.metrics()}
        if changes_since is not None:
            result["changes"] = self.tracker.changes_since(changes_since)
        return result

    def changes_since(self, version: int) -> tuple[int, bool, list, np.ndarray]:
        return self.tracker.changes_since(version)

    def snapshot(self) -> dict:
        return self.tracker.snapshot()

    def difficulties(self, question_ids: list) -> np.ndarray:
        return self.tracker.difficulties(question_ids)

    def state_of(self, question_id: Hashable) -> dict:
        return self.tracker.state_of(question_id)

    def metrics(self) -> dict:
        return self.tracker.metrics()

    def config(self) -> dict:
        return dict(self._config)

    def info(self) -> dict:
        return {"pid": os.getpid(), "version": self.tracker.version, "questions": len(self.tracker)}

    def save(self, step_folder: str) -> str:
        return save_state(self.tracker.state_dict(), checkpoint_state_path(step_folder))

    def load(self, step_folder: str) -> int:
        """Replace the state with the checkpoint's; returns the new version (readers will rebuild fully)."""
        path = checkpoint_state_path(step_folder)
        state = load_state(path)
        try:
            self.tracker.load_state_dict(state)
        except ValueError as err:
            raise DifficultyStateFileError(f"{path}: {err}") from None
        if self.store is not None:
            self.store.compact(self.tracker)  # a restart from here must come back with the loaded state
        return self.tracker.version


def actor_name(experiment_name: str, service_name: str = "diva_difficulty") -> str:
    """``"<service_name>/<experiment_name>"``: the Ray actor name of one experiment's service."""
    if not experiment_name or not isinstance(experiment_name, str):
        raise ValueError(
            f"experiment_name must be a non-empty string (use trainer.experiment_name), got {experiment_name!r}"
        )
    return f"{service_name}/{experiment_name}"


def config_fields(config: DifficultyConfig | Mapping | None) -> dict:
    """The ``diva.difficulty`` knobs as a plain dict (what the actor receives; no verl needed to read it)."""
    if config is None:
        from verl_ext.config import DifficultyConfig

        config = DifficultyConfig()
    if dataclasses.is_dataclass(config):
        return {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if not f.name.startswith("_")}
    return dict(config)


@dataclass
class PendingUpdate:
    """An update sent to the actor and not yet collected (see :meth:`DifficultyService.finish`)."""

    ref: ray.ObjectRef
    request_id: str
    num_questions: int


class DifficultyService:
    """Trainer-side handle on one experiment's difficulty actor (create with :meth:`get_or_create`).

    With a table attached (:meth:`attach_table`), every update also brings back the entries changed since the
    table was last written, and :meth:`finish` copies them in: one round trip per step, ~512 entries, not the
    whole ``{qid: D}`` map.
    """

    def __init__(self, handle, config: dict, name: str, namespace: str | None):
        self.handle = handle
        self.config = config
        self.name = name
        self.namespace = namespace
        self.table: SharedDifficultyTable | None = None
        # Service version last copied into the table; -1: never (the next copy is a full one).
        self.table_version = -1

    @classmethod
    def get_or_create(
        cls,
        experiment_name: str,
        config: DifficultyConfig | Mapping | None = None,
        live_dir: str | None = None,
        namespace: str | None = None,
    ) -> DifficultyService:
        """Find the experiment's actor, or start it.

        Args:
            experiment_name: names the actor (``trainer.experiment_name``).
            config: the ``diva.difficulty`` block (``None``: defaults); only the creating call's config is used.
            live_dir: folder for the actor's running record (restart recovery); ``None`` keeps state in memory
                only, so a restarted actor starts empty. Put it under the run's ``default_local_dir``.
            namespace: Ray namespace; ``None`` = the calling job's namespace.
        """
        config = config_fields(config)
        name = actor_name(experiment_name, config["service_name"])
        if namespace is None:
            namespace = ray.get_runtime_context().namespace
        node_id = ray.get_runtime_context().get_node_id()
        actor_cls = ray.remote(DifficultyServiceActor)
        handle = actor_cls.options(
            name=name,
            namespace=namespace,
            get_if_exists=True,
            max_restarts=config["max_restarts"],
            max_task_retries=config["max_restarts"],
            # Bookkeeping only: takes no CPU slot from the rollout/training workers.
            num_cpus=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
        ).remote(config, os.path.abspath(live_dir) if live_dir else None)
        # If the actor already existed, its own config (from its creation) is the one in force.
        return cls(handle, ray.get(handle.config.remote()), name, namespace)

    @classmethod
    def connect(
        cls, experiment_name: str, namespace: str | None = None, service_name: str = "diva_difficulty"
    ) -> DifficultyService:
        """Attach to a running service (another process of the same job); ``ValueError`` if there is none."""
        name = actor_name(experiment_name, service_name)
        if namespace is None:
            namespace = ray.get_runtime_context().namespace
        handle = ray.get_actor(name, namespace=namespace)
        return cls(handle, ray.get(handle.config.remote()), name, namespace)

    # ------------------------------------------------------------------ per step
    def attach_table(self, table: SharedDifficultyTable) -> int:
        """Keep ``table`` (the dataset's shared table, made before the DataLoader workers start) in sync from now
        on; fills it with the service's current state. Returns the rows written."""
        self.table = table
        self.table_version = -1
        return self.refresh()

    def update_async(
        self,
        question_ids: Sequence[Hashable],
        alphas: Sequence[float],
        step: int,
        priors: Sequence[float] | None = None,
    ) -> PendingUpdate:
        """Send one step's update and return at once. Lengths are checked here too, so the simplest mistake fails
        in the trainer; the actor validates everything else (``ValueError`` naming the argument, raised by
        :meth:`finish`). ``priors``: starting difficulties of ids the service has not seen yet (see
        :meth:`DifficultyTracker.compute_update`)."""
        ids = list(question_ids)
        alpha = np.asarray(alphas, dtype=np.float64)
        if len(ids) != alpha.size:
            raise ValueError(
                f"question_ids has {len(ids)} entries but alphas has {alpha.size}; give one alpha per question"
            )
        request_id = uuid.uuid4().hex
        since = self.table_version if self.table is not None else None
        prior = None if priors is None else np.asarray(priors, dtype=np.float64)
        ref = self.handle.update.remote(ids, alpha, int(step), request_id, since, prior)
        return PendingUpdate(ref, request_id, len(ids))

    def finish(self, pending: PendingUpdate) -> dict[str, float]:
        """Wait for an update, copy its changes into the attached table, return the service metrics."""
        result = ray.get(pending.ref)
        if self.table is not None and "changes" in result:
            self._write_changes(*result["changes"])
        return result["metrics"]

    def update(self, question_ids: Sequence[Hashable], alphas: Sequence[float], step: int) -> dict[str, float]:
        """Blocking :meth:`update_async` + :meth:`finish`."""
        return self.finish(self.update_async(question_ids, alphas, step))

    def refresh(self) -> int:
        """Copy what changed since the last copy into the attached table (everything the first time or after a
        load). Returns the number of table rows written."""
        if self.table is None:
            raise RuntimeError("no table attached: call attach_table(table) first")
        return self._write_changes(*ray.get(self.handle.changes_since.remote(self.table_version)))

    def _write_changes(self, version: int, full: bool, ids: list, values: np.ndarray) -> int:
        if version <= self.table_version and not full:
            return 0  # an older reply (of overlapping async updates): the table is already newer
        # Ids of another dataset (not rows of this table) are skipped. On a full refresh, questions the service has
        # not seen return to the dataset's initial difficulty (parquet or d_init), in one copy.
        snapshot = dict(zip(ids, np.asarray(values).tolist(), strict=True))
        written = self.table.replace_all(snapshot) if full else self.table.write_snapshot(snapshot)
        self.table_version = version
        return written

    # ------------------------------------------------------------------ reads, checkpoints
    def snapshot(self) -> dict:
        return ray.get(self.handle.snapshot.remote())

    def difficulties(self, question_ids: Sequence[Hashable]) -> np.ndarray:
        return ray.get(self.handle.difficulties.remote(list(question_ids)))

    def state_of(self, question_id: Hashable) -> dict:
        return ray.get(self.handle.state_of.remote(question_id))

    def metrics(self) -> dict[str, float]:
        return ray.get(self.handle.metrics.remote())

    def save(self, step_folder: str) -> str:
        """Write the state into a verl checkpoint step folder (``global_step_N``); returns the file path."""
        return ray.get(self.handle.save.remote(step_folder))

    def load(self, step_folder: str) -> None:
        """Restore the state saved in ``step_folder`` (and the attached table); a missing, partial or corrupt file
        raises naming it, and the state is left as it was."""
        ray.get(self.handle.load.remote(step_folder))
        if self.table is not None:
            self.refresh()

    def stop(self, timeout_s: float = 60.0) -> None:
        """Kill the actor for good and return once its name is free. ``ray.kill`` only sends the request through
        the GCS, so a :meth:`get_or_create` made right after it could still find the dying actor by name (and a
        call made right after it can still be answered)."""
        ray.kill(self.handle, no_restart=True)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                ray.get_actor(self.name, namespace=self.namespace)
            except ValueError:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the difficulty actor {self.name!r} still has its name {timeout_s} s after ray.kill"
                )
            time.sleep(0.05)


__all__ = ["DifficultyService", "DifficultyServiceActor", "PendingUpdate", "actor_name"]
