"""verl's synchronous replay buffer, with the sampled batch in key order and a deadline on dead rollout actors.

Plugged in through verl's own extension point, ``trainer.v1.sampler.custom_sampler`` (the recipe's config sets it):

* **Key order.** verl's buffer returns a step's trajectories in the order they finished, which changes from run to
  run (thread timing). Every later sum (the actor's gradient accumulation over micro-batches, the step's metric
  means) then adds the same numbers in another order, and two runs of one seed drift apart in the last bits from
  the first step. :meth:`OrderedReplayBuffer.sample` sorts them by ``(uid, session, output index)``: with the run's
  uids (:mod:`verl_ext.rollout.seeds`) the order, and so every sum, is the same in every run of a seed. Validation
  uids are verl's ``uuid4``: those batches are sorted by the prompt's tokens and the question's fields instead.
* **A dead rollout fails the job, naming it.** While it waits for rollouts, the buffer checks every
  ``liveness_check_s`` that the actors the rollout needs are alive (:func:`verl_ext.rollout.liveness.dead_actors`,
  fed by the trainer through :meth:`watch`), and raises :class:`RolloutDiedError` naming the dead ones: a dead
  agent-loop worker's prompts would otherwise stay pending forever. A dead server fails all its requests; verl's
  buffer then stops with "no materializable trajectories", which names no cause: the same check names it.
* **A failed group fails the step, naming its requests.** verl tags a prompt ``failure`` when one of its sessions
  raised, and its synchronous buffer (``sync_refill_failed_groups`` off, as the toolkit trainers require) samples
  the group with the responses it has. A rollout request is retried first, with its own seed
  (:mod:`verl_ext.rollout.request_retry`); a prompt still tagged ``failure`` fails the step at the next poll with
  :class:`verl_ext.rollout.request_retry.RolloutRequestError`, naming each failed request (prompt uid, question id,
  response, replica, error) from the records the agent loop left in TransferQueue: no advantage or difficulty update
  is ever computed over an incomplete group, and a prompt whose requests all failed cannot vanish from the batch.

* **A poll interval that is a setting.** verl's buffer sleeps its ``poll_interval`` (2.0 s, not a config key) between
  looks at TransferQueue while a step's rollouts finish. ``trainer.v1.sampler.sampler_kwargs.poll_interval_s`` sets
  it (the recipe's config: verl's 2.0 for the GPU job, where a step takes minutes); the CPU runs set 0.1 s, or a tiny
  step (~1 s of work) would be mostly sleep. The interval changes when a step's batch is taken, never which
  trajectories it holds (the synchronous buffer waits for all of them), so a run logs the same values at any interval.

verl builds a custom sampler with its base arguments only (no DAPO group filter, no failed-group refill): the
toolkit trainers refuse those settings.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Iterable

import transfer_queue as tq
from transfer_queue import KVBatchMeta  # noqa: TC002 (verl's return type)
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

from verl_ext.rollout.liveness import dead_actors
from verl_ext.rollout.request_retry import RolloutRequestError, recorded_failures
from verl_ext.rollout.seeds import content_key, is_run_uid
from verl_ext.transfer_queue_fields import non_tensor_list

LIVENESS_CHECK_S = 10.0
# The fields that tell validation questions with the same prompt tokens apart (verl carries a dataset row's columns
# into each trajectory).
QUESTION_FIELDS = ("data_source", "extra_info", "reward_model")


class RolloutDiedError(RuntimeError):
    """An actor the rollout needs (server, agent-loop worker, reward worker) died while a step waited for it."""


def key_order(key: str) -> tuple[str, int, int]:
    """``{uid}_{session}_{index}`` (verl's TransferQueue trajectory key) -> ``(uid, session, index)``."""
    uid, session, index = key.rsplit("_", 2)
    return uid, int(session), int(index)


class OrderedReplayBuffer(ReplayBuffer):
    """verl's ``ReplayBuffer`` (synchronous schedule) whose batches are in key order and whose waits fail fast when
    a rollout actor died."""

    liveness_check_s = LIVENESS_CHECK_S

    def __init__(self, *args, trainer_mode: str = "sync", sampler_kwargs=None, **kwargs):
        if trainer_mode != "sync":
            raise ValueError(
                f"trainer.v1.sampler.custom_sampler=OrderedReplayBuffer serves the synchronous schedule, not "
                f"trainer_mode={trainer_mode!r}; unset the custom sampler for verl's asynchronous buffer"
            )
        options = dict(sampler_kwargs or {})
        poll_interval_s = options.pop("poll_interval_s", None)
        if options:
            raise ValueError(
                "trainer.v1.sampler.sampler_kwargs: OrderedReplayBuffer takes poll_interval_s only, not "
                f"{sorted(options)}"
            )
        if poll_interval_s is not None:
            number = isinstance(poll_interval_s, int | float) and not isinstance(poll_interval_s, bool)
            if not number or poll_interval_s <= 0:
                raise ValueError(
                    f"trainer.v1.sampler.sampler_kwargs.poll_interval_s={poll_interval_s!r}: expected seconds > 0 "
                    "(verl's default is 2.0)"
                )
            kwargs["poll_interval"] = float(poll_interval_s)
        super().__init__(*args, trainer_mode=trainer_mode, sampler_kwargs=sampler_kwargs, **kwargs)
        self._watched: Callable[[], Iterable[tuple[str, object]]] | None = None
        self._last_check = time.monotonic()

    def watch(self, actors: Callable[[], Iterable[tuple[str, object]]]) -> None:
        """Check ``actors()`` (``(name, handle)`` pairs, asked anew at each check) while waiting for rollouts."""
        self._watched = actors

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[KVBatchMeta, dict]:
        try:
            batch, metrics = super().sample(global_steps=global_steps, partition_id=partition_id, batch_size=batch_size)
        except RuntimeError as error:
            # verl's synchronous buffer stops when a step's groups all failed ("... no materializable trajectories"):
            # say why, when an actor of the rollout is dead (a dead server fails every request it had), else name
            # the failed requests.
            self._raise_if_dead(partition_id, cause=error)
            self._raise_if_failed(partition_id, cause=error)
            raise
        # The groups verl sampled as finished include those tagged "failure" (missing responses): fail instead.
        self._raise_if_failed(partition_id)
        sizes = Counter(key_order(key)[0] for key in batch.keys)
        if len(sizes) < batch_size or len(set(sizes.values())) > 1:
            # Fewer groups than asked for (verl drops failed validation groups, and _validate then fails on an empty
            # batch, naming no cause), or groups that lost responses (a dead server of one replica fails its share of
            # each step's requests while the other replicas serve theirs): say whether a rollout actor died.
            self._raise_if_dead(partition_id)
        places = [key_order(key) for key in batch.keys]
        if batch.keys and not all(is_run_uid(uid) for uid, _, _ in places):
            # verl draws validation uids with uuid4: order those trajectories by their prompt's content instead. The
            # tokens alone tie whenever questions differ only in their images (a swatch's colour) or share a prompt
            # across validation views: the question's own fields break those ties, or the per-question sums of
            # verl's validation metrics would add in the order the requests finished.
            questions = self._question_keys(batch)
            places = [(questions[i], session, index) for i, (_, session, index) in enumerate(places)]
        order = sorted(range(len(batch.keys)), key=lambda i: places[i])
        keys, tags = [batch.keys[i] for i in order], [batch.tags[i] for i in order]
        return dataclasses.replace(batch, keys=keys, tags=tags), metrics

    @staticmethod
    def _question_keys(batch: KVBatchMeta) -> list[tuple]:
        """Per trajectory: its prompt's tokens, a digest of its question's fields (``data_source``, ``extra_info``,
        ``reward_model``: those the trajectory carries), its response's tokens."""
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["prompts", "responses"])
        tokens = [tuple(row.tolist()) for row in data["prompts"].unbind(0)]
        responses = [tuple(row.tolist()) for row in data["responses"].unbind(0)]
        fields = {}
        for name in QUESTION_FIELDS:
            got = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=[name])
            if name in got.keys():  # TransferQueue answers an empty batch for a field no row has (no such column)
                fields[name] = non_tensor_list(got[name])
        # Last, the response: trajectories alike in all of these score alike, in whichever order they add.
        return [
            (tokens[i], content_key(*(fields[name][i] for name in sorted(fields))), responses[i])
            for i in range(len(batch.keys))
        ]

    def _wait_for_next_poll(self, partition_id: str, last_debug_time: float) -> float:
        # verl calls this after each metadata sync that did not yet find the whole batch: a failed group ends the
        # wait at once (the step cannot be complete), dead actors first (the likely cause).
        self._raise_if_failed(partition_id)
        now = time.monotonic()
        if now - self._last_check >= self.liveness_check_s:
            self._last_check = now
            self._raise_if_dead(partition_id)
        return super()._wait_for_next_poll(partition_id, last_debug_time)

    def _raise_if_failed(self, partition_id: str, cause: BaseException | None = None) -> None:
        """Raise :class:`RolloutRequestError` when a prompt of ``partition_id`` is tagged ``failure`` (in the last
        metadata sync): the recorded failed requests of up to five prompts, by uid (a dead rollout actor is named
        instead, by :meth:`_raise_if_dead`)."""
        failed = sorted(self.failure_keys.get(partition_id, ()))
        if not failed:
            return
        self._raise_if_dead(partition_id, cause=cause)
        records = recorded_failures(failed)
        lines = []
        for uid in failed[:5]:
            if uid in records:
                lines += [failure.describe() for failure in records[uid]]
            else:
                lines.append(
                    f"prompt {uid}: a session failed outside its rollout request (the agent loop, the reward or the "
                    "trajectory's post-processing); verl logged its error in the agent-loop worker's log after "
                    f"'Error in _run_prompt for uid={uid}'"
                )
        more = f"\n  ... and {len(failed) - 5} more prompt(s)" if len(failed) > 5 else ""
        raise RolloutRequestError(
            f"{len(failed)} {partition_id} prompt(s) lost responses, so the step stops instead of training on "
            "incomplete groups:\n  " + "\n  ".join(lines) + more + "\nEach request was retried with its own seed "
            "(rollout_requests.max_attempts); resume from the last checkpoint once the cause is fixed (MAX_RESTARTS=N "
            "in the launchers resubmits the job)."
        ) from cause

    def _raise_if_dead(self, partition_id: str, cause: BaseException | None = None) -> None:
        dead = dead_actors(self._watched()) if self._watched is not None else []
        if dead:
            raise RolloutDiedError(
                f"waiting for the {partition_id} rollouts, found dead: {'; '.join(dead)}. The job stops instead of "
                "waiting for rollouts that cannot come; resume it from its last checkpoint (MAX_RESTARTS=N in the "
                "launchers resubmits it)."
            ) from cause
