"""PGPO's blind forward pass inside verl's actor workers.

verl 0.9.1's V1 trainer builds its actor from ``verl.workers.engine_workers.ActorRolloutRefWorker`` (the class is
chosen in the trainer's ``_init_resource_pool_mgr``, ``role_worker_mapping``). :class:`PgpoActorRolloutRefWorker`
is that class plus one registered method, :meth:`~PgpoActorRolloutRefWorker.compute_blind_log_prob`, which runs
the actor's own ``infer_batch`` (the same engine, micro-batching, dynamic batch size, temperature and
remove-padding settings as ``compute_log_prob``) on the blind view of the batch (:mod:`verl_ext.pgpo.blind_view`).
Nothing of verl is copied: the subclass adds a method and inherits everything else. Every blind micro-batch has no
pixels: verl's Qwen2-VL forward takes them through the named patch :mod:`verl_ext.no_pixels_patch`, which the plugin
applies in every process (the worker checks that it is in place).

:func:`use_blind_pass_worker` swaps the class in a trainer's ``role_worker_mapping``; call it right after
``super()._init_resource_pool_mgr()`` (the same place verl's own separate-async trainer changes its worker
mapping), before the worker groups are created.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import ray
from tensordict import TensorDict
from verl.single_controller.base.decorator import make_nd_compute_dataproto_dispatch_fn, register
from verl.utils import tensordict_utils as tu
from verl.utils.profiler import DistProfiler
from verl.workers.engine_workers import ActorRolloutRefWorker
from verl.workers.utils.padding import response_from_nested

from verl_ext.pgpo.blind_view import VISUAL_TOKEN_IDS_KEY, blind_inputs

# The field the worker writes to TransferQueue: response-aligned nested (B, r) log-probs, like old_log_probs.
BLIND_LOG_PROBS = "blind_log_probs"


def blind_log_prob_pass(
    data: TensorDict,
    infer_batch: Callable[[TensorDict], TensorDict | None],
    model_visual_token_ids: Sequence[int] = (),
) -> TensorDict | None:
    """Blind log-probs of ``data``'s sampled response tokens, through the actor's ``infer_batch``.

    Args:
        data: the actor batch verl's dispatch hands a worker (nested no-padding layout), with the visual token ids
            under the non-tensor key ``pgpo_visual_token_ids`` (set by the trainer-side hook).
        infer_batch: the actor's ``TrainingWorker.infer_batch`` (returns ``None`` on ranks without outputs).
        model_visual_token_ids: the ids the model itself treats as visual (its config); each must be among the
            given ones, or the blind view would leave visual tokens in place.

    Returns:
        ``TensorDict`` with ``blind_log_probs``: nested ``(B, r)``, response-aligned (position ``t`` is the
        log-prob of response token ``t``), or ``None`` where ``infer_batch`` returns ``None``.
    """
    ids = tu.pop(data, key=VISUAL_TOKEN_IDS_KEY, default=None)
    if ids is None:
        raise ValueError(
            f"the blind pass needs the visual token ids under the batch key {VISUAL_TOKEN_IDS_KEY!r}; call it through "
            "verl_ext.pgpo.compute_blind_log_probs"
        )
    ids = [int(i) for i in ids]
    missing = sorted(set(int(i) for i in model_visual_token_ids) - set(ids))
    if missing:
        raise ValueError(
            f"the model's visual token ids {missing} are not among the processor's {ids}: the blind view would keep "
            "those tokens; check that the processor belongs to the actor model"
        )
    blind = blind_inputs(data, ids)
    output = infer_batch(blind)
    if output is None:
        return None
    log_probs = response_from_nested(output["log_probs"], data["response_mask"])
    return TensorDict({BLIND_LOG_PROBS: log_probs}, batch_size=[len(data)])


class PgpoActorRolloutRefWorker(ActorRolloutRefWorker):
    """verl's hybrid actor/rollout/ref worker plus PGPO's blind pass."""

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    @DistProfiler.annotate(color="cyan", role="actor_compute_blind_log_prob")
    def compute_blind_log_prob(self, data: TensorDict) -> TensorDict | None:
        """The old policy's log-probs of the sampled tokens with the visual tokens hidden (``blind_log_probs``).

        Dispatched like ``compute_log_prob`` (the actor mesh; the trainer passes a ``KVBatchMeta`` and verl's
        TransferQueue bridge fetches the fields and writes ``blind_log_probs`` back under the same keys).
        """
        from verl_ext import no_pixels_patch
        from verl_ext.pgpo.blind_view import visual_token_ids_from_config

        no_pixels_patch.apply()  # applied by the plugin in every process already: a no-op that makes sure of it
        model_ids = visual_token_ids_from_config(self.actor.model_config.hf_config)
        output = blind_log_prob_pass(data, self.actor.infer_batch, model_ids)
        return output.cpu() if output is not None else None


def use_blind_pass_worker(role_worker_mapping: dict) -> None:
    """Make the actor role(s) of a trainer's ``role_worker_mapping`` :class:`PgpoActorRolloutRefWorker`.

    Replaces verl's ``ray.remote(ActorRolloutRefWorker)`` for the roles ``Actor``, ``ActorRollout`` and
    ``ActorRolloutRef`` (not a standalone ``RefPolicy`` worker: the blind pass runs on the actor). Idempotent; a
    mapping that already holds another subclass is refused, since two extensions of the worker cannot both win.
    """
    from verl.trainer.ppo.utils import Role

    actor_roles = {Role.Actor, Role.ActorRollout, Role.ActorRolloutRef}
    replaced = False
    for role in list(role_worker_mapping):
        if role not in actor_roles:
            continue
        cls = getattr(role_worker_mapping[role], "__ray_actor_class__", role_worker_mapping[role])
        if isinstance(cls, type) and issubclass(cls, PgpoActorRolloutRefWorker):
            replaced = True
            continue
        if cls is not ActorRolloutRefWorker:
            raise ValueError(
                f"role {role} runs {getattr(cls, '__qualname__', cls)}, not verl's ActorRolloutRefWorker: PGPO's blind "
                "pass subclasses verl's worker and cannot extend another one"
            )
        role_worker_mapping[role] = ray.remote(PgpoActorRolloutRefWorker)
        replaced = True
    if not replaced:
        raise ValueError(f"role_worker_mapping has no actor role ({sorted(str(r) for r in role_worker_mapping)})")
