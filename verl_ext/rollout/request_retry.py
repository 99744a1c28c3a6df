"""Failed rollout requests: each is retried with its own seed up to a bound, then the step fails naming it.

**How a failure surfaces in verl 0.9.1.** A rollout request is one ``server_manager.generate`` call of an agent loop
(``SingleTurnAgentLoop.run``): verl's ``LLMServerClient.generate`` acquires a replica from the load balancer and
awaits ``server.generate.remote(...)``; an error there (the server raised, the actor is unreachable) propagates out of
the agent loop. The agent-loop worker (``verl/trainer/ppo/v1/agent_loop_tq.py``, ``_run_prompt``) gathers the prompt's
``n`` sessions with ``return_exceptions=True``, logs each error and tags the prompt ``failure``; the sessions that
succeeded have already written their trajectories. With ``trainer.v1.sampler.sync_refill_failed_groups`` off (the
toolkit trainers require it off), verl's synchronous replay buffer counts a ``failure`` prompt as finished and samples
it with the trajectories it has: the step trains on ``n - 1`` responses, and a prompt whose requests all failed
vanishes from the batch. Nothing retries the request.

**What this module adds.** :class:`RetryingClient` stands in for the agent loop's ``server_manager`` (the seeded
agent loop installs it, :mod:`verl_ext.rollout.agent_loop`): a request that raises is sent again with the very same
sampling params (its per-request ``seed`` included, so the same tokens come back) under a fresh request id (so the
load balancer may pick another replica; no request id reaches the sampler), after ``retry_delay_s``, doubled at each
further attempt, up to ``rollout_requests.max_attempts`` attempts. A dead replica (Ray's ``ActorDiedError``) is not
retried: the replay buffer's liveness check names it and the job fails (a restart resumes from the checkpoint).
When the attempts are spent the client records a :class:`RequestFailure` (prompt uid, question id, response, step,
replica, error) in TransferQueue, in the partition :data:`FAILURES_PARTITION`, and raises
:class:`RolloutRequestError`; verl then tags the prompt ``failure``, and the replay buffer
(:class:`verl_ext.rollout.replay_buffer.OrderedReplayBuffer`) fails the step at its next poll with the recorded
failures: no method's advantage, and no DIVA difficulty update, ever sees the incomplete group.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import hashlib
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import ray
from verl.base_config import BaseConfig

NAME = "rollout_requests"
# TransferQueue partition of the failure records (verl's buffer reads only "train" and "val").
FAILURES_PARTITION = "diva_failed_requests"


@dataclass
class RolloutRequestsConfig(BaseConfig):
    """The ``rollout_requests:`` block of the recipe config."""

    # Attempts of one rollout request, the first included, before the step fails naming it. 1: no retry.
    max_attempts: int = 3
    # Seconds before the first retry, doubled before each further one (3 attempts: 1 s, then 2 s).
    retry_delay_s: float = 1.0

    def __post_init__(self):
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ValueError(f"{NAME}.max_attempts must be a whole number >= 1, got {self.max_attempts!r}")
        if isinstance(self.retry_delay_s, bool) or not isinstance(self.retry_delay_s, int | float):
            raise ValueError(f"{NAME}.retry_delay_s must be a number of seconds, got {self.retry_delay_s!r}")
        if not 0 <= self.retry_delay_s <= 600:
            raise ValueError(f"{NAME}.retry_delay_s must be within [0, 600] seconds, got {self.retry_delay_s!r}")

    def delays(self) -> list[float]:
        """The waits before attempts 2, 3, ... (one fewer than the attempts)."""
        return [float(self.retry_delay_s) * 2**k for k in range(self.max_attempts - 1)]


def requests_config(config: Any) -> RolloutRequestsConfig:
    """The typed ``rollout_requests:`` block of the full config (defaults when absent; unknown keys raise)."""
    from verl_ext.config import config_block

    values = config.get(NAME) if config is not None and hasattr(config, "get") else None
    return config_block(RolloutRequestsConfig, values, NAME)


class RolloutRequestError(RuntimeError):
    """Rollout requests failed on every attempt: the step cannot have complete groups."""


@dataclass(frozen=True)
class RequestPlace:
    """Which response of which prompt a request is for (what a failure message names)."""

    uid: str
    session: int
    step: int
    question_id: str | None = None
    validate: bool = False

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any]) -> RequestPlace:
        """The place of the request verl's agent-loop worker runs with the prompt fields ``kwargs``."""
        from verl_ext.rollout.seeds import is_run_uid

        extra = kwargs.get("extra_info")
        question = extra.get("question_id") if isinstance(extra, dict) else None
        uid = str(kwargs.get("uid", "?"))
        return cls(
            uid=uid,
            session=int(kwargs.get("session_id", 0) or 0),
            step=int(kwargs.get("global_steps", 0) or 0),
            question_id=None if question is None else str(question),
            validate=not is_run_uid(uid),
        )


@dataclass(frozen=True)
class RequestFailure:
    """A request that failed on every attempt, as recorded for the replay buffer."""

    uid: str
    session: int
    step: int
    question_id: str | None
    validate: bool
    request_id: str
    attempts: int
    replica: str
    error: str

    @property
    def key(self) -> str:
        return f"{self.uid}|{self.session}|{self.request_id}"

    def describe(self) -> str:
        question = f" (question {self.question_id})" if self.question_id is not None else ""
        kind = "validation prompt" if self.validate else "prompt"
        return (
            f"{kind} {self.uid}{question}, response {self.session}, step {self.step}, request {self.request_id}: "
            f"{self.attempts} attempt(s), the last: {self.replica}: {self.error}"
        )

    def tag(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_tag(cls, tag: dict[str, Any]) -> RequestFailure:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{name: tag.get(name) for name in names})


def error_text(error: BaseException | None, limit: int = 600) -> str:
    """``Type: message`` of ``error`` on one line; a Ray task error by its cause (the server's own exception)."""
    if error is None:
        return "no error recorded"
    cause = getattr(error, "cause", None)
    shown = cause if isinstance(cause, BaseException) else error
    message = " ".join(line.strip() for line in str(shown).strip().splitlines() if line.strip())
    text = f"{type(shown).__name__}: {message}" if message else type(shown).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _actor_fields(error: BaseException) -> dict[str, str]:
    """``actor_id``, ``pid``, ``ip`` and ``name`` of the Ray actor an error came from, as far as it tells them.

    ``RayActorError`` has ``actor_id`` and lists ``name: ...``, ``pid: ...``, ``ip: ...`` in its message. The
    ``RayTaskError(<cause type>)`` a failed actor call raises in the caller keeps none of its attributes (Ray builds
    it from the cause's), only its first line: ``ray::Class.method() (pid=N, ip=A, actor_id=H, repr=...)``."""
    fields = {}
    actor_id = getattr(error, "actor_id", None) or getattr(error, "_actor_id", None)
    if actor_id:
        fields["actor_id"] = actor_id if isinstance(actor_id, str) else getattr(actor_id, "hex", lambda: actor_id)()
    for key in ("pid", "ip"):
        if getattr(error, key, None):
            fields[key] = str(getattr(error, key))
    text = str(error).split("\n  File ", 1)[0]  # the header, not the remote traceback's lines
    for key in ("actor_id", "pid", "ip", "name"):
        found = re.search(rf"(?:^|[\s(,]){key}(?:=|: )([^\s,)]+)", text)
        if found and key not in fields:
            fields[key] = found.group(1)
    return fields


# Actor id -> the name Ray's state API gave it: a replica's name never changes (one question to the state API per
# replica, not per failed attempt).
_REPLICA_NAMES: dict[str, str] = {}


def replica_of(error: BaseException, state_timeout_s: float = 5.0) -> str:
    """The rollout server an error came from: its Ray actor name (verl names them
    ``<backend>_server_<replica>_<node>``), actor id, node address and pid, from what the error carries and Ray's
    state API (which knows the actor's name when the error does not); for an error without an actor (raised before
    any server answered), says so."""
    fields = _actor_fields(error)
    actor_id = fields.get("actor_id")
    if not actor_id:
        return "no replica (the error was raised before a server answered)"
    name = fields.get("name") or _REPLICA_NAMES.get(actor_id)
    if name is None and ray.is_initialized():  # a process of the job (never a guess at another cluster)
        try:
            from ray.util.state import get_actor

            # This job's cluster by its GCS address: without one the state API looks for "the" local Ray instance
            # and refuses when the machine runs several (a second job's cluster beside this one's).
            address = ray.get_runtime_context().gcs_address
            state = get_actor(actor_id, address=address, timeout=state_timeout_s)
        except Exception:  # the state API needs the dashboard; the actor id still names the replica
            state = None
        if state is not None:
            name = getattr(state, "name", None) or getattr(state, "class_name", None)
            if name:
                _REPLICA_NAMES[actor_id] = name
    ip, pid = fields.get("ip"), fields.get("pid")
    detail = ", ".join([f"actor {actor_id}", *([f"node {ip}"] if ip else []), *([f"pid {pid}"] if pid else [])])
    return f"replica {name} ({detail})" if name else f"replica ({detail})"


def _retryable(error: BaseException) -> bool:
    """Every failure is retried but a dead actor's (it will not answer again: the liveness check names it)."""
    from ray.exceptions import ActorDiedError

    return not isinstance(error, ActorDiedError | RolloutRequestError)


async def record_in_transfer_queue(failure: RequestFailure) -> None:
    """Write ``failure`` to TransferQueue (tag only) for the replay buffer, which runs in the trainer process."""
    import transfer_queue as tq

    await tq.async_kv_put(key=failure.key, partition_id=FAILURES_PARTITION, tag=failure.tag())


def recorded_failures(uids: Iterable[str], listed: dict[str, dict[str, Any]] | None = None) -> dict[str, list]:
    """``uid -> [RequestFailure, ...]`` of the recorded failures of ``uids`` (``listed``: the failure partition's
    ``tq.kv_list`` answer; read from TransferQueue when not given)."""
    wanted = set(uids)
    if listed is None:
        import transfer_queue as tq

        try:
            listed = (tq.kv_list(partition_id=FAILURES_PARTITION) or {}).get(FAILURES_PARTITION, {})
        except Exception:  # no failure recorded yet: TransferQueue may not know the partition
            listed = {}
    found: dict[str, list] = {}
    for tag in listed.values():
        if tag.get("uid") in wanted:
            found.setdefault(tag["uid"], []).append(RequestFailure.from_tag(tag))
    for failures in found.values():
        failures.sort(key=lambda f: (f.session, f.request_id))
    return found


def _retry_request_id(request_id: str, attempt: int) -> str:
    return request_id if attempt == 1 else f"{request_id}-retry{attempt - 1}"


def _params_digest(sampling_params: dict[str, Any]) -> str:
    return hashlib.blake2b(repr(sorted(sampling_params.items())).encode(), digest_size=8).hexdigest()


class RetryingClient:
    """Stands in for an agent loop's ``server_manager``: ``generate`` retries a failed request with the same params
    (module docstring); everything else goes to the server manager. One per agent loop (verl builds one loop per
    request); :meth:`for_request` names the request's prompt before it runs.

    ``config``: the full config (its ``rollout_requests:`` block is read when the request is sent, so that a bad value
    fails the request with its message); ``record``: awaited with the :class:`RequestFailure` before the error is
    raised (default :func:`record_in_transfer_queue`); ``sleep``, ``name_replica`` and ``log``: replaceable for
    tests.
    """

    def __init__(
        self,
        server_manager,
        config: Any = None,
        *,
        record: Callable[[RequestFailure], Awaitable[None]] | None = None,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        name_replica: Callable[[BaseException], str] = replica_of,
        log: Callable[[str], None] | None = None,
    ):
        self._server_manager = server_manager
        self._config = config
        self._record = record
        self._sleep = sleep
        self._name_replica = name_replica
        self._log = log if log is not None else (lambda line: print(line, flush=True))
        self.place = RequestPlace(uid="?", session=0, step=0)

    def for_request(self, kwargs: dict[str, Any]) -> None:
        """Name the prompt and response of the request about to run (verl's prompt fields ``kwargs``)."""
        self.place = RequestPlace.from_kwargs(kwargs)

    async def generate(self, *, request_id: str, sampling_params: dict[str, Any], **kwargs):
        attempts, error, replica = 0, None, "no replica answered"
        try:
            knobs = requests_config(self._config)
        except ValueError as bad:
            error, replica = bad, "no replica (the rollout_requests block is invalid)"
            knobs = None
        if knobs is not None:
            delays = knobs.delays()
            sent = _params_digest(sampling_params)
            for attempt in range(1, knobs.max_attempts + 1):
                attempts = attempt
                try:
                    # A copy each time: a server may change the params it is given (verl's vLLM server pops keys).
                    return await self._server_manager.generate(
                        request_id=_retry_request_id(request_id, attempt),
                        sampling_params=copy.deepcopy(sampling_params),
                        **kwargs,
                    )
                except Exception as failed:
                    error, replica = failed, self._name_replica(failed)
                    if not _retryable(failed) or attempt == knobs.max_attempts:
                        break
                    delay = delays[attempt - 1]
                    self._log(
                        f"[rollout] request {request_id} ({self._where()}) failed, attempt {attempt} of "
                        f"{knobs.max_attempts}, {replica}: {error_text(failed)}; sending it again in {delay:g} s with "
                        f"the same params (seed {sampling_params.get('seed')}, params {sent})"
                    )
                    await self._sleep(delay)
        failure = RequestFailure(
            uid=self.place.uid,
            session=self.place.session,
            step=self.place.step,
            question_id=self.place.question_id,
            validate=self.place.validate,
            request_id=request_id,
            attempts=attempts,
            replica=replica,
            error=error_text(error),
        )
        self._log(f"[rollout] giving up: {failure.describe()}")
        await (self._record or record_in_transfer_queue)(failure)
        raise RolloutRequestError(f"rollout request failed: {failure.describe()}") from error

    def _where(self) -> str:
        place = self.place
        question = f" (question {place.question_id})" if place.question_id is not None else ""
        kind = "validation prompt" if place.validate else "prompt"
        return f"{kind} {place.uid}{question}, response {place.session}, step {place.step}"

    def __getattr__(self, name: str):
        return getattr(self._server_manager, name)
