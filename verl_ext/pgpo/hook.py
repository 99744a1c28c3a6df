"""The trainer-side hook of PGPO's blind pass: which trajectories to run, the dispatch, the TransferQueue writes.

Contract (what the toolkit trainer calls, after verl's ``_compute_old_log_prob``)::

    batch = compute_blind_log_probs(trainer, batch, metrics, config=None)

* ``trainer``: verl's V1 trainer (``PPOTrainer``) whose actor worker group was built from
  :class:`verl_ext.pgpo.worker.PgpoActorRolloutRefWorker` (:func:`verl_ext.pgpo.worker.use_blind_pass_worker` in its
  ``_init_resource_pool_mgr``). Read: ``trainer.actor_rollout_wg``, ``trainer.processor`` (the visual token ids,
  as verl's agent loop resolves them), ``trainer.config.actor_rollout_ref`` (temperature, micro-batching).
* ``batch``: the step's ``KVBatchMeta`` (keys, tags, partition), after ``old_log_probs`` was written.
* ``metrics``: the step's metric dict; receives ``timing_s/blind_log_prob`` (seconds of this hook: verl's
  ``timing_s/<stage>`` convention; it is also inside ``timing_s/old_log_prob`` when the trainer calls the hook from
  ``_compute_old_log_prob``), ``pgpo/blind_pass_share`` (share of the batch's trajectories that ran the blind pass)
  and ``pgpo/visual_share`` (share with visual tokens).
* ``config``: the method's config block (unused; accepted so the hook fits ``AdvantageMethod.pre_advantage``).
* Writes, for **every** key of ``batch``: ``blind_log_probs``, a nested ``(B, r)`` float tensor aligned like verl's
  ``old_log_probs`` (position ``t`` = log-prob of response token ``t``), so ``to_padded_tensor()`` gives ``(B, T)``.
  Trajectories without visual tokens (text-only prompts, verl's synthetic padding rows) get a copy of their
  ``old_log_probs``: blind and sighted views are the same sequence, their dependency is 0 and their PGPO weights 1.
* Returns ``batch`` itself (keys, order and tags unchanged).

The trajectories that run are those with visual tokens plus, when their number is not a multiple of what the
actor's dispatch needs (data-parallel size, times ``log_prob_micro_batch_size_per_gpu`` without dynamic batch
size), the shortest text-only ones (exact: a text-only blind view is the sighted sequence); they are ordered so
that each data-parallel rank gets the same count and a balanced token workload, as verl's ``_balance_batch`` does.
The pixel values are not even fetched: the dispatch asks TransferQueue only for :data:`BLIND_PASS_FIELDS`.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
import transfer_queue as tq
from tensordict import TensorDict
from transfer_queue import KVBatchMeta

from verl_ext.pgpo.blind_view import VISUAL_TOKEN_IDS_KEY, visual_token_counts, visual_token_ids_from_processor
from verl_ext.pgpo.worker import BLIND_LOG_PROBS

# The TransferQueue fields the blind pass reads: the model inputs verl's engine uses, and those the blind view
# rewrites (multi_modal_inputs, the pixels, is left out on purpose).
BLIND_PASS_FIELDS = (
    "input_ids",
    "position_ids",
    "attention_mask",
    "prompts",
    "responses",
    "response_mask",
    "loss_mask",
)

TIMING_KEY = "timing_s/blind_log_prob"


def compute_blind_log_probs(trainer: Any, batch: KVBatchMeta, metrics: dict, config: Any = None) -> KVBatchMeta:
    """Write ``blind_log_probs`` for every trajectory of ``batch`` (module docstring: the full contract)."""
    started = time.perf_counter()
    size = len(batch)
    ids = visual_token_ids_from_processor(getattr(trainer, "processor", None))
    counts = torch.zeros(size, dtype=torch.int64)
    if ids and size:
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["input_ids"])
        counts = visual_token_counts(data["input_ids"], ids)
    rows: list[int] = []
    if bool((counts > 0).any()):
        worker_group = trainer.actor_rollout_wg
        if not hasattr(worker_group, "compute_blind_log_prob"):
            raise RuntimeError(
                "the actor workers have no compute_blind_log_prob: build them from "
                "verl_ext.pgpo.worker.PgpoActorRolloutRefWorker (call verl_ext.pgpo.use_blind_pass_worker("
                "self.role_worker_mapping) after super()._init_resource_pool_mgr() in the trainer)"
            )
        dp_size = _actor_dp_size(worker_group)
        multiple = dp_size * _samples_per_micro_batch(trainer.config.actor_rollout_ref)
        seq_lens = torch.tensor([int(tag["seq_len"]) for tag in batch.tags], dtype=torch.int64)
        rows = plan_blind_rows(counts, seq_lens, dp_size, multiple)
        sub = KVBatchMeta(
            keys=[batch.keys[i] for i in rows],
            tags=[batch.tags[i] for i in rows],
            partition_id=batch.partition_id,
            fields=list(BLIND_PASS_FIELDS),
            extra_info={
                "calculate_entropy": False,
                "compute_loss": False,
                "temperature": trainer.config.actor_rollout_ref.rollout.temperature,
                VISUAL_TOKEN_IDS_KEY: list(ids),
            },
        )
        output = worker_group.compute_blind_log_prob(sub)
        if len(output) != len(sub):
            raise RuntimeError(f"the blind pass returned {len(output)} trajectories for {len(sub)}")
    ran = set(rows)
    skipped = [batch.keys[i] for i in range(size) if i not in ran]
    if skipped:
        old = tq.kv_batch_get(keys=skipped, partition_id=batch.partition_id, select_fields=["old_log_probs"])
        copy = TensorDict({BLIND_LOG_PROBS: old["old_log_probs"]}, batch_size=[len(skipped)])
        tq.kv_batch_put(keys=skipped, partition_id=batch.partition_id, fields=copy)
    metrics[TIMING_KEY] = time.perf_counter() - started
    metrics["pgpo/blind_pass_share"] = len(rows) / size if size else 0.0
    metrics["pgpo/visual_share"] = float((counts > 0).sum()) / size if size else 0.0
    return batch


def plan_blind_rows(visual_counts: torch.Tensor, seq_lens: torch.Tensor, dp_size: int, multiple: int) -> list[int]:
    """Indices of the trajectories the blind pass runs, in dispatch order.

    Every trajectory with a visual token, then the shortest text-only ones until the count is a multiple of
    ``multiple`` (or the batch is exhausted); ordered into ``dp_size`` equal-size partitions of balanced workload
    over the blind lengths ``seq_len - visual_count`` (verl's ``get_seqlen_balanced_partitions``, as
    ``_balance_batch``), concatenated, because verl's dispatch hands rank ``k`` the ``k``-th contiguous chunk.
    """
    from verl.utils.seqlen_balancing import calculate_workload, get_seqlen_balanced_partitions

    visual = visual_counts > 0
    rows = visual.nonzero().squeeze(-1).tolist()
    if not rows:
        return []
    need = min(math.ceil(len(rows) / multiple) * multiple, len(visual_counts))
    text = (~visual).nonzero().squeeze(-1)
    if need > len(rows):
        shortest = text[torch.argsort(seq_lens[text], stable=True)][: need - len(rows)]
        rows += shortest.tolist()
    if len(rows) % dp_size:
        raise ValueError(
            f"{len(rows)} trajectories cannot be split over {dp_size} data-parallel ranks: the batch of "
            f"{len(visual_counts)} is not a multiple of the actor's dispatch size"
        )
    blind_lens = (seq_lens - visual_counts)[rows]
    partitions = get_seqlen_balanced_partitions(
        calculate_workload(blind_lens).tolist(), k_partitions=dp_size, equal_size=True
    )
    return [rows[j] for partition in partitions for j in partition]


def _actor_dp_size(worker_group: Any) -> int:
    """The actor mesh's data-parallel size, read as verl's own ``_balance_batch`` reads it."""
    if "actor" not in worker_group._dispatch_info:
        worker_group._dispatch_info["actor"] = worker_group._query_dispatch_info("actor")
    return max(worker_group._dispatch_info["actor"]) + 1


def _samples_per_micro_batch(actor_rollout_ref: Any) -> int:
    """Trajectories per rank that must divide a rank's share: 1 with dynamic batch size, else the log-prob
    micro-batch size (verl's ``prepare_micro_batches`` asserts that it divides)."""
    if actor_rollout_ref.actor.get("use_dynamic_bsz", False):
        return 1
    return int(actor_rollout_ref.rollout.get("log_prob_micro_batch_size_per_gpu", None) or 1)
