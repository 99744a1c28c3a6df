"""Records what verl's actor consumed in each step, for the end-to-end tests and the CPU summary.

:func:`install_probe` swaps the trainer registered under a ``trainer.v1.trainer_mode`` for a subclass that, right
before verl's ``_update_actor`` sends the batch to the actor workers, reads from TransferQueue the very fields the
actor will read (advantages, response mask, old and rollout log-probs) with the rewards, ids and extra infos, and
saves them as ``actor_inputs_step<N>.pt`` in a folder. At train begin it writes ``train_begin_step<N>.json`` (N: the
first step this trainer runs, the checkpoint's step + 1 on a resume): the dataloader state and the DIVA difficulty
state when the trainer has one. Any trainer works
(DIVA, verl's sync GRPO, the toolkit's other methods): nothing is method-specific.

It is installed by the recipe's task runner only when ``DIVA_CPU_PROBE_DIR`` names a folder (a test asks for it).
"""

from __future__ import annotations

import json
import os

import torch

# The probe folder's variable, named in the backend that sets it (verl_ext.cpu.runtime_env); the task runner and the
# checks read it from here.
from verl_ext.cpu.names import PROBE_ENV  # noqa: F401

# Fields the actor reads, and what the checks need besides; missing ones (e.g. extra_info with verl's plain
# dataset, rollout_log_probs without calculate_log_probs) are left out.
# blind_log_probs: PGPO's blind pass (verl_ext.pgpo).
TENSOR_FIELDS = ("advantages", "response_mask", "rm_scores", "old_log_probs", "rollout_log_probs", "blind_log_probs")
# One unpadded tensor per sample: the whole sequence and the response, for the exact log-prob check of the vLLM
# rollout (verl_ext.checks.logprob_check), which runs the sequences through the step's weights again.
SEQUENCE_FIELDS = ("input_ids", "responses")
OBJECT_FIELDS = ("uid", "extra_info", "extra_fields", "multi_modal_inputs")


def _as_list(value) -> list:
    from verl_ext.transfer_queue_fields import non_tensor_list

    return non_tensor_list(value)


def jsonable(value):
    """``value`` with tensors and numpy scalars turned into lists and numbers (for JSON)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if hasattr(value, "item") and not isinstance(value, str):
        return value.item()
    return value


class ActorInputProbe:
    """Mixin placed before a verl V1 trainer class (see :func:`install_probe`)."""

    probe_dir: str = ""

    def _read_fields(self, batch) -> dict:
        import transfer_queue as tq

        out: dict = {}
        for name in TENSOR_FIELDS + SEQUENCE_FIELDS + OBJECT_FIELDS:
            try:
                data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=[name])
            except Exception:  # noqa: BLE001  (a field this run does not produce)
                continue
            if name not in data.keys():
                continue
            value = data[name]
            if name in TENSOR_FIELDS:
                out[name] = value.to_padded_tensor(0.0) if getattr(value, "is_nested", False) else value
            elif name in SEQUENCE_FIELDS:
                out[name] = list(value.unbind(0)) if getattr(value, "is_nested", False) else list(value)
            else:
                out[name] = _as_list(value)
        return out

    def _update_actor(self, batch, metrics: dict):
        record = self._read_fields(batch)
        record["keys"] = list(batch.keys)
        record["is_padding"] = [bool(tag.get("is_padding", False)) for tag in batch.tags]
        record["step"] = int(self.global_steps)
        batch = super()._update_actor(batch, metrics)
        record["actor_metrics"] = {k: float(v) for k, v in metrics.items() if k.startswith("actor/")}
        torch.save(record, os.path.join(self.probe_dir, f"actor_inputs_step{self.global_steps}.pt"))
        return batch

    def on_train_begin(self):
        super().on_train_begin()
        state = {"global_steps": int(self.global_steps), "dataloader": None, "difficulty": None}
        loader = getattr(self, "train_dataloader", None)
        if loader is not None and hasattr(loader, "state_dict"):
            state["dataloader"] = jsonable(loader.state_dict())
        service = getattr(self, "difficulty", None)
        if service is not None and hasattr(service, "snapshot"):
            state["difficulty"] = service.snapshot()
        with open(os.path.join(self.probe_dir, f"train_begin_step{self.global_steps}.json"), "w") as f:
            json.dump(state, f, sort_keys=True, default=str)


def read_actor_inputs(run_dir: str) -> dict[int, dict]:
    """The records a run's probe saved (``<run_dir>/probe/actor_inputs_step<N>.pt``), by step."""
    import glob

    records = {}
    for path in glob.glob(os.path.join(run_dir, "probe", "actor_inputs_step*.pt")):
        record = torch.load(path, weights_only=False)
        records[int(record["step"])] = record
    return records


def install_probe(trainer_mode: str, probe_dir: str):
    """Replace the trainer registered as ``trainer_mode`` (in this process) by its probed subclass; returns it."""
    from verl.trainer.ppo.v1 import trainer_base

    os.makedirs(probe_dir, exist_ok=True)
    base = trainer_base.get_trainer_cls(trainer_mode)
    if issubclass(base, ActorInputProbe):
        return base
    probed = type(f"Probed{base.__name__}", (ActorInputProbe, base), {"probe_dir": probe_dir})
    # Not register_trainer(): it refuses a second class under one name, and this swap is meant for this process.
    trainer_base.TRAINER_REGISTRY[trainer_mode] = probed
    return probed
