"""A checkpoint manager for verl's FSDP2 engine whose checkpoints load at any world size.

verl 0.9.1's ``FSDPCheckpointManager`` saves each rank's shard of the model and optimizer as
``model_world_size_{W}_rank_{r}.pt`` / ``optim_world_size_{W}_rank_{r}.pt`` (DTensors cut for ``W`` ranks) and the
lr scheduler with the RNG state as ``extra_state_world_size_{W}_rank_{r}.pt``, and loads exactly those names: a run
saved on two nodes cannot resume on one (verl issues #2265, #1535), which is what a job that lost a node needs.

:class:`ReshardableCheckpointManager` keeps verl's files as they are (plain verl still loads them at the same world
size) and adds, for an FSDP2 model, a copy in ``torch.distributed.checkpoint`` (DCP) format under
``<local_path>/dcp/``: the model and optimizer state keyed by parameter name (``get_model_state_dict`` /
``get_optimizer_state_dict``), each shard stored with its offset in the full tensor, which DCP reads back into
whatever sharding the loading run has. The folder holds

* DCP's files (``.metadata`` and one ``__{rank}_0.distcp`` per saving rank), keys ``model.*`` and ``optimizer.*``;
* ``extra_state.pt`` (rank 0): the lr scheduler's state and the saving world size, nothing per rank;
* ``done.json``, written by rank 0 last, after every rank finished: ``{"world_size": W, "contents": [...]}``. A copy
  without it (a save interrupted midway) counts as absent, so that a load never takes half a checkpoint.

Loading prefers verl's own files when every rank finds its own (the same world size: verl's code, unchanged); it
reads the DCP copy otherwise, and without one fails naming the world sizes the folder holds files for. Reading and
writing go through the default process group, gloo on a CPU run, NCCL on GPUs.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import sys

import torch
import torch.distributed
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
from verl.utils.fsdp_utils import fsdp_version

from verl_ext.checkpoint import BIND_PENDING, ENGINE_MODULE

# verl's loggers print at INFO to the job's log unless VERL_LOGGING_LEVEL says otherwise; this one does the same.
logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))

RESHARDABLE_DIR = "dcp"
DONE_MARKER = "done.json"
EXTRA_STATE = "extra_state.pt"
# The names verl's FSDPCheckpointManager gives each rank's files.
_VERL_FILE = re.compile(r"^(model|optim|extra_state)_world_size_(\d+)_rank_(\d+)\.pt$")


def reshardable_checkpoint_dir(local_path: str) -> str:
    """The folder of the reshardable copy of the checkpoint in ``local_path``."""
    return os.path.join(local_path, RESHARDABLE_DIR)


def has_reshardable_checkpoint(local_path: str) -> bool:
    """True when ``local_path`` holds a complete reshardable copy (its save reached the end: ``done.json``)."""
    return os.path.isfile(os.path.join(reshardable_checkpoint_dir(local_path), DONE_MARKER))


def saved_world_sizes(local_path: str) -> list[int]:
    """The world sizes that verl's per-rank files in ``local_path`` were saved at (sorted; empty when none)."""
    if not os.path.isdir(local_path):
        return []
    found = (_VERL_FILE.match(name) for name in os.listdir(local_path))
    return sorted({int(match.group(2)) for match in found if match})


class ReshardableCheckpointManager(FSDPCheckpointManager):
    """verl's ``FSDPCheckpointManager`` plus a reshardable copy of an FSDP2 model's state (see the module).

    What is saved and loaded follows verl's ``checkpoint.save_contents`` / ``load_contents`` (``model``,
    ``optimizer``, ``extra``), for both formats.
    """

    def save_checkpoint(self, local_path: str, hdfs_path: str = None, global_step: int = 0, max_ckpt_to_keep=None):
        """verl's save (its per-rank files, config, tokenizer, optional HF model), then the reshardable copy."""
        super().save_checkpoint(
            local_path, hdfs_path=hdfs_path, global_step=global_step, max_ckpt_to_keep=max_ckpt_to_keep
        )
        # FSDP1 models are left to verl: the project runs FSDP2 everywhere, and FSDP1's sharded state dict would
        # need its own state-dict context here.
        if local_path is not None and fsdp_version(self.model) == 2:
            self.save_reshardable_copy(local_path)

    def save_reshardable_copy(self, local_path: str) -> None:
        """Write ``<local_path>/dcp/`` (collective: every rank calls it)."""
        folder = reshardable_checkpoint_dir(local_path)
        if self.rank == 0:
            # A step saved again (a job restarted before its tracker file moved on) must not let the earlier
            # copy's done.json vouch for files this save has not finished writing: the copy starts empty.
            shutil.rmtree(folder, ignore_errors=True)
            os.makedirs(folder)
        torch.distributed.barrier()

        state, contents = {}, []
        if self.should_save_model:
            state["model"] = get_model_state_dict(self.model)
            contents.append("model")
        if self.should_save_optimizer:
            had_state = bool(self.optimizer.state)
            state["optimizer"] = get_optimizer_state_dict(self.model, self.optimizer)
            if not had_state:
                # get_optimizer_state_dict gives an optimizer without state one, by a zero-gradient step (AdamW's
                # step count becomes 1): undone, so that a save never changes the training it records, and
                # nothing per parameter is saved, as verl's file holds nothing either.
                self.optimizer.state.clear()
                state["optimizer"]["state"] = {}
            contents.append("optimizer")
        if state:
            dcp.save(state, checkpoint_id=folder)
        if self.should_save_extra:
            contents.append("extra")
            if self.rank == 0:
                scheduler_state = self.lr_scheduler.state_dict() if self.lr_scheduler is not None else None
                extra = {"lr_scheduler": scheduler_state, "world_size": self.world_size}
                torch.save(extra, os.path.join(folder, EXTRA_STATE))

        torch.distributed.barrier()
        if self.rank == 0:
            done = os.path.join(folder, DONE_MARKER)
            with open(done + ".tmp", "w") as f:
                json.dump({"world_size": self.world_size, "contents": contents}, f)
            os.replace(done + ".tmp", done)  # whole or absent, even if this process dies here
        # No rank returns (and, say, copies or loads the folder) before the marker exists.
        torch.distributed.barrier()

    def load_checkpoint(self, local_path: str, hdfs_path: str = None, del_local_after_load=False):
        """verl's own load when every rank has its own file at this world size; the reshardable copy otherwise."""
        if local_path is None:
            return
        own_file = self._verl_file_to_load(local_path)
        # One decision for all ranks: a rank taking the other path would wait forever in the other's collectives.
        seen = [None] * self.world_size
        torch.distributed.all_gather_object(seen, (os.path.isfile(own_file), has_reshardable_checkpoint(local_path)))
        if all(has_own for has_own, _ in seen):
            super().load_checkpoint(local_path, hdfs_path=hdfs_path, del_local_after_load=del_local_after_load)
        elif all(has_copy for _, has_copy in seen):
            self.load_reshardable_copy(local_path)
        else:
            raise FileNotFoundError(self._nothing_to_load(local_path, own_file))

    def load_reshardable_copy(self, local_path: str) -> None:
        """Load ``<local_path>/dcp/`` into this run's sharding (collective: every rank calls it).

        ``del_local_after_load`` does not apply: verl deletes only the local copies it downloaded from remote
        storage, and the copy is read where it lies.
        """
        folder = reshardable_checkpoint_dir(local_path)
        with open(os.path.join(folder, DONE_MARKER)) as f:
            done = json.load(f)
        wanted = [
            name
            for name, load in (
                ("model", self.should_load_model),
                ("optimizer", self.should_load_optimizer),
                ("extra", self.should_load_extra),
            )
            if load
        ]
        missing = [name for name in wanted if name not in done["contents"]]
        if missing:
            raise FileNotFoundError(
                f"the reshardable checkpoint in {folder} holds {done['contents']}, not {missing}, which "
                f"checkpoint.load_contents={wanted} asks for"
            )

        # The current model and optimizer's own (sharded) state dicts are the targets: DCP fills each local shard
        # from whichever saved shards overlap it.
        state = {}
        if self.should_load_model:
            state["model"] = get_model_state_dict(self.model)
        if self.should_load_optimizer:
            state["optimizer"] = self._optimizer_state_to_load(folder)
        if state:
            dcp.load(state, checkpoint_id=folder)
        if "model" in state:
            set_model_state_dict(self.model, state["model"])
        if "optimizer" in state:
            # Not strict: the parameters left out by _optimizer_state_to_load end without state, as in the saving run.
            options = StateDictOptions(strict=False)
            set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"], options=options)
        if self.should_load_extra:
            extra = torch.load(os.path.join(folder, EXTRA_STATE), weights_only=False)
            if extra["lr_scheduler"] is not None and self.lr_scheduler is not None:
                self.lr_scheduler.load_state_dict(extra["lr_scheduler"])
        # The RNG state verl saves is per rank and is not restored on a reshard (there is no rank-to-rank mapping
        # between two world sizes). Nothing of the project reads it: every draw is seeded from the run's seed and
        # the draw's place (step, prompt, response), never from process state.
        if self.rank == 0:
            logger.info(
                f"resharded the {os.path.basename(os.path.normpath(local_path))}'s checkpoint from world size "
                f"{done['world_size']} to {self.world_size} ({folder}: {', '.join(wanted)})"
            )
        torch.distributed.barrier()

    def _optimizer_state_to_load(self, folder: str) -> dict:
        """This optimizer's sharded state dict, restricted to the parameters the saved copy has state for.

        A parameter that never had a gradient has no optimizer state in the saving run (a VLM's vision tower after
        text-only steps), while ``get_optimizer_state_dict`` first gives a fresh optimizer state for every parameter
        (a zero-gradient step): asking DCP for those entries would fail, and keeping them would resume such a
        parameter with a step count the saving run never had (another Adam bias correction at its first update).
        """
        saved = set(FileSystemReader(folder).read_metadata().state_dict_metadata)
        target = get_optimizer_state_dict(self.model, self.optimizer)
        target["state"] = {
            fqn: entry
            for fqn, entry in target["state"].items()
            if any(f"optimizer.state.{fqn}.{name}" in saved for name in entry)
        }
        return target

    def _verl_file_to_load(self, local_path: str) -> str:
        """This rank's verl file that verl's load would open first: the model's, else the optimizer's, else the
        extra state's."""
        kind = "model" if self.should_load_model else "optim" if self.should_load_optimizer else "extra_state"
        return os.path.join(local_path, f"{kind}_world_size_{self.world_size}_rank_{self.rank}.pt")

    def _nothing_to_load(self, local_path: str, own_file: str) -> str:
        folder = reshardable_checkpoint_dir(local_path)
        found = saved_world_sizes(local_path)
        if os.path.isdir(folder) and not has_reshardable_checkpoint(local_path):
            copy = f"its reshardable copy {folder} is incomplete (no {DONE_MARKER}: its save was interrupted)"
        elif os.path.isdir(folder):
            copy = f"its reshardable copy {folder} is not visible to every rank (is the folder on shared storage?)"
        else:
            copy = f"it has no reshardable copy ({folder})"
        return (
            f"no checkpoint in {local_path} loads at world size {self.world_size}: verl's per-rank files there were "
            f"saved at world size(s) {found or 'none'} ({os.path.basename(own_file)} is missing), and {copy}. A "
            "checkpoint saved without the reshardable copy (verl_ext.checkpoint, applied by the plugin) must resume "
            "at the world size that saved it."
        )


def bind_manager(engine) -> bool:
    """Make verl's FSDP engine module ``engine`` build :class:`ReshardableCheckpointManager` (the patch of
    :mod:`verl_ext.checkpoint.patch`); True when this call changed the name.

    A manager someone else already put there (another plugin's subclass) is left in place with a warning: replacing
    it would silently drop what it does.
    """
    bound = engine.FSDPCheckpointManager
    if bound is ReshardableCheckpointManager:
        return False
    if bound is not FSDPCheckpointManager:
        logger.warning(
            f"verl's FSDP engine builds {bound.__module__}.{bound.__qualname__}, not verl's FSDPCheckpointManager; "
            "left in place, so its checkpoints load only at the world size that saved them"
        )
        return False
    engine.FSDPCheckpointManager = ReshardableCheckpointManager
    return True


# The patch's finder met this module half-imported (its import of verl's checkpoint package imported the engine):
# the binding it left pending is done here, now that the class exists.
_engine = sys.modules.get(ENGINE_MODULE)
if _engine is not None and getattr(_engine, BIND_PENDING, False):
    delattr(_engine, BIND_PENDING)
    bind_manager(_engine)
