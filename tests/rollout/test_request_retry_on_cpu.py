"""A failed rollout request is retried with the same params, then fails the step naming it; no group with missing
responses reaches an advantage (verl_ext/rollout/request_retry.py, replay_buffer.py, complete_groups.py).

Stand-in servers answer from the request's seed alone, as a seeded sampler does, so "the same tokens come back" is
checked against a request that never failed. verl's own agent loop (``SingleTurnAgentLoop.run``, the tiny
tokenizer) and verl's own replay buffer run around them; TransferQueue is an in-memory stand-in.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import transfer_queue
from omegaconf import OmegaConf
from ray.exceptions import ActorDiedError
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
from verl.workers.rollout.replica import TokenOutput

from verl_ext.rollout import request_retry
from verl_ext.rollout.complete_groups import IncompleteGroupError, check_complete_groups
from verl_ext.rollout.replay_buffer import OrderedReplayBuffer, RolloutDiedError
from verl_ext.rollout.request_retry import (
    FAILURES_PARTITION,
    RequestFailure,
    RetryingClient,
    RolloutRequestError,
    RolloutRequestsConfig,
    recorded_failures,
    replica_of,
    requests_config,
)
from verl_ext.rollout.seeds import prompt_uid

UID = prompt_uid(0, 3, 0, 1)
KWARGS = {"uid": UID, "session_id": 2, "global_steps": 3, "extra_info": {"question_id": "q17"}}


def tokens_of(params: dict) -> list[int]:
    """A seeded sampler: the response depends on the request's seed and nothing else."""
    rng = random.Random(params["seed"])
    return [rng.randrange(100) for _ in range(int(params.get("max_tokens", 6)))]


class Server:
    """Answers from the seed; the first ``failures`` calls raise ``error`` (calls, params and ids recorded). Like
    verl's vLLM server, it pops keys from the params it is given."""

    def __init__(self, failures: int = 0, error: BaseException | None = None):
        self.failures, self.error, self.calls = failures, error or RuntimeError("replica overloaded"), []

    async def generate(self, *, request_id, sampling_params, **kwargs):
        self.calls.append((request_id, dict(sampling_params), kwargs))
        tokens = tokens_of(sampling_params)
        sampling_params.pop("max_tokens", None)
        if len(self.calls) <= self.failures:
            raise self.error
        return TokenOutput(token_ids=tokens, log_probs=[-1.0] * len(tokens), stop_reason="completed", extra_fields={})


class Recorder:
    def __init__(self):
        self.failures, self.slept, self.lines = [], [], []

    async def record(self, failure):
        self.failures.append(failure)

    async def sleep(self, seconds):
        self.slept.append(seconds)

    def client(self, server, config=None, replica=lambda error: "replica test_server_0_0 (actor 00ff)"):
        client = RetryingClient(
            server, config, record=self.record, sleep=self.sleep, name_replica=replica, log=self.lines.append
        )
        client.for_request(KWARGS)
        return client


def send(client, params=None):
    params = params or {"seed": 1234, "temperature": 1.0, "max_tokens": 6, "extra_args": {"k": [1]}}
    return asyncio.run(client.generate(request_id="r1", sampling_params=params, prompt_ids=[7, 8], image_data=None))


def config(**block):
    return OmegaConf.create({"rollout_requests": block} if block else {})


# ---------------------------------------------------------------------------------------------------------------
# The retrying client
# ---------------------------------------------------------------------------------------------------------------


def test_a_request_that_fails_then_succeeds_gives_the_tokens_of_one_that_never_failed():
    reference = send(Recorder().client(Server()))
    rec = Recorder()
    server = Server(failures=2)
    got = send(rec.client(server))
    assert got.token_ids == reference.token_ids
    # Three sends of the very same params (the server's pop of max_tokens did not leak into the next attempt) under
    # fresh request ids; waits of 1 s then 2 s; nothing recorded.
    assert [params for _, params, _ in server.calls] == [server.calls[0][1]] * 3
    assert server.calls[0][1]["max_tokens"] == 6 and server.calls[0][1]["seed"] == 1234
    assert [rid for rid, _, _ in server.calls] == ["r1", "r1-retry1", "r1-retry2"]
    assert all(kwargs == {"prompt_ids": [7, 8], "image_data": None} for _, _, kwargs in server.calls)
    assert rec.slept == [1.0, 2.0] and rec.failures == []
    assert len(rec.lines) == 2 and "attempt 1 of 3" in rec.lines[0] and "seed 1234" in rec.lines[0]
    assert f"prompt {UID} (question q17), response 2, step 3" in rec.lines[0]


def test_a_request_that_always_fails_is_recorded_and_raised_naming_prompt_replica_and_error():
    rec = Recorder()
    server = Server(failures=99, error=ValueError("CUDA error: an illegal memory access"))
    with pytest.raises(RolloutRequestError) as raised:
        send(rec.client(server, config(max_attempts=4, retry_delay_s=0.5)))
    assert len(server.calls) == 4 and rec.slept == [0.5, 1.0, 2.0]
    (failure,) = rec.failures
    assert failure == RequestFailure(
        uid=UID,
        session=2,
        step=3,
        question_id="q17",
        validate=False,
        request_id="r1",
        attempts=4,
        replica="replica test_server_0_0 (actor 00ff)",
        error="ValueError: CUDA error: an illegal memory access",
    )
    message = str(raised.value)
    for part in (UID, "question q17", "response 2", "step 3", "4 attempt(s)", "test_server_0_0", "illegal memory"):
        assert part in message
    assert isinstance(raised.value.__cause__, ValueError)
    assert RequestFailure.from_tag(failure.tag()) == failure  # what TransferQueue carries to the replay buffer


def test_a_dead_replica_is_not_retried():
    rec = Recorder()
    server = Server(failures=99, error=ActorDiedError())
    with pytest.raises(RolloutRequestError, match="1 attempt"):
        send(rec.client(server))
    assert len(server.calls) == 1 and rec.slept == [] and rec.failures[0].attempts == 1


def test_one_attempt_means_no_retry_and_a_bad_block_fails_the_request_with_its_message():
    rec = Recorder()
    with pytest.raises(RolloutRequestError):
        send(rec.client(Server(failures=1), config(max_attempts=1)))
    assert rec.slept == []
    rec = Recorder()
    server = Server()
    with pytest.raises(RolloutRequestError, match=r"rollout_requests.*max_atempts") as raised:
        send(rec.client(server, config(max_atempts=2)))
    assert server.calls == [] and "invalid" in rec.failures[0].replica
    assert isinstance(raised.value.__cause__, ValueError)


def test_the_config_block_defaults_and_refusals():
    assert requests_config(None) == requests_config(OmegaConf.create({})) == RolloutRequestsConfig()
    assert RolloutRequestsConfig().max_attempts == 3 and RolloutRequestsConfig().delays() == [1.0, 2.0]
    assert requests_config(config(max_attempts=5, retry_delay_s=0)).delays() == [0.0] * 4
    for block, message in [
        ({"max_attempts": 0}, "max_attempts must be a whole number >= 1"),
        ({"max_attempts": 2.5}, "max_attempts must be a whole number"),
        ({"retry_delay_s": -1}, r"retry_delay_s must be within \[0, 600\]"),
        ({"retry_delay_s": "soon"}, "retry_delay_s must be a number"),
        ({"retries": 2}, "retries"),
    ]:
        with pytest.raises(ValueError, match=message):
            requests_config(config(**block))


def test_the_recipe_config_holds_the_block_with_its_defaults():
    from pathlib import Path

    recipe = OmegaConf.load(Path(__file__).parents[2] / "recipe" / "diva_grpo" / "config" / "diva_grpo.yaml")
    assert requests_config(recipe) == RolloutRequestsConfig()
    assert set(recipe.rollout_requests) == {"max_attempts", "retry_delay_s"}


def test_replica_of_names_the_ray_actor_or_says_none_answered():
    from ray.exceptions import RayTaskError

    # What a failed actor call raises in the caller: RayTaskError(<cause type>), which keeps only Ray's header line.
    raised = RayTaskError(
        "generate",
        'Traceback (most recent call last):\n  File "rollout.py", line 9, in generate\nRuntimeError: boom, name: x',
        RuntimeError("boom"),
        proctitle="ray::HFCpuServer.generate",
        pid=41,
        ip="10.0.0.7",
        actor_repr="<HFCpuServer object>",
        actor_id="a1b2",
    ).as_instanceof_cause()
    # No Ray in this process: the state API is not asked; the actor id, node and pid still name it.
    assert replica_of(raised) == "replica (actor a1b2, node 10.0.0.7, pid 41)"
    assert request_retry.error_text(raised) == "RuntimeError: boom"
    died = ActorDiedError()
    died.actor_id = "c9dc"
    died.error_msg = "The actor died.\n\tclass_name: HFCpuServer\n\tactor_id: c9dc\n\tpid: 7\n\tname: hf_cpu_server_1_0"
    assert replica_of(died) == "replica hf_cpu_server_1_0 (actor c9dc, pid 7)"
    assert replica_of(RuntimeError("x")).startswith("no replica")


def test_the_request_fault_points_fail_their_request_once_or_always(tmp_path, monkeypatch):
    from verl_ext import faults

    monkeypatch.setenv(faults.FAULTS_ENV, "rollout_request@1,rollout_request_always@2")
    monkeypatch.setenv(faults.FAULT_DIR_ENV, str(tmp_path))
    faults.fail_request(0, lambda: 1 / 0)  # not armed at 0: the request's key is never even computed
    with pytest.raises(faults.InjectedRequestFault, match="rollout_request@1: request a fails once"):
        faults.fail_request(1, "a")
    faults.fail_request(1, "a")  # its retry goes through, and so does every other request
    faults.fail_request(1, "b")
    for _ in range(3):  # the first request at 2 fails on every attempt, the others go through
        with pytest.raises(faults.InjectedRequestFault, match="rollout_request_always@2: request b fails on every"):
            faults.fail_request(2, lambda: "b")
        faults.fail_request(2, "c")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rollout_request@1.fired", "rollout_request_always@2.fired"]
    monkeypatch.delenv(faults.FAULTS_ENV)
    faults.fail_request(2, "b")  # unarmed: nothing


# ---------------------------------------------------------------------------------------------------------------
# Inside verl's agent loop (the seeded loop and NC-GRPO's)
# ---------------------------------------------------------------------------------------------------------------


def _loop(cls, server, block=None, **extra):
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap

    from verl_ext.cpu.tiny_model import _byte_level_tokenizer

    cfg = OmegaConf.create(
        {
            "actor_rollout_ref": {"rollout": {"seed": 0, "n": 2, "prompt_length": 64, "response_length": 6}},
            "data": {},
            "rollout_requests": block or {"max_attempts": 3, "retry_delay_s": 0.0},
            **extra,
        }
    )
    return cls(
        trainer_config=DictConfigWrap(cfg),
        server_manager=server,
        tokenizer=_byte_level_tokenizer(),
        processor=None,
        dataset_cls=None,
        data_config=DictConfigWrap(cfg.data),
    )


def _run(cls, server, monkeypatch, session=0, **extra):
    recorded = []

    async def record(failure):
        recorded.append(failure)

    monkeypatch.setattr(request_retry, "record_in_transfer_queue", record)

    async def main():  # verl's loop binds the running event loop when it is built
        loop = _loop(cls, server, **extra)
        prompt = {"raw_prompt": [{"role": "user", "content": "what is 2+2?"}], "extra_info": {"question_id": "q4"}}
        return await loop.run({"temperature": 1.0, "top_p": 1.0}, uid=UID, global_steps=3, session_id=session, **prompt)

    try:
        return asyncio.run(main()), recorded
    except RolloutRequestError as error:
        return error, recorded


def test_verls_single_turn_loop_retries_through_the_seeded_loop(monkeypatch, capsys):
    from verl_ext.rollout.agent_loop import SeededSingleTurnAgentLoop

    clean, _ = _run(SeededSingleTurnAgentLoop, Server(), monkeypatch)
    server = Server(failures=1)
    retried, recorded = _run(SeededSingleTurnAgentLoop, server, monkeypatch)
    assert retried.response_ids == clean.response_ids and recorded == []
    assert server.calls[0][1] == server.calls[1][1] and "seed" in server.calls[0][1]
    assert "[rollout] request" in capsys.readouterr().out

    failed, recorded = _run(SeededSingleTurnAgentLoop, Server(failures=99), monkeypatch)
    assert isinstance(failed, RolloutRequestError) and len(recorded) == 1
    assert (recorded[0].uid, recorded[0].session, recorded[0].question_id, recorded[0].attempts) == (UID, 0, "q4", 3)


def test_nc_grpos_probe_and_its_clean_twin_are_each_retried(monkeypatch):
    """A flagged NC-GRPO request goes out with its clean twin; a failure of either is retried on its own, with the same
    params, and the probe's comparison is the one of a run without the failure."""
    from verl_ext.nc_grpo.agent_loop import NoiseContrastiveAgentLoop
    from verl_ext.nc_grpo.branching import FIRST_DIFFERENCE_FIELD
    from verl_ext.nc_grpo.noise import NOISE_KEY, noisy_responses

    class NoisyServer(Server):
        async def generate(self, *, request_id, sampling_params, **kwargs):
            noisy = NOISE_KEY in (sampling_params.get("extra_args") or {})
            output = await super().generate(request_id=request_id, sampling_params=sampling_params, **kwargs)
            output.token_ids = ([999] if noisy else []) + output.token_ids  # the noise changes the first token
            output.log_probs = [-1.0] * len(output.token_ids)
            return output

    block = {"noisy_fraction": 0.5, "branch_probe_tokens": 4}
    session = sorted(noisy_responses(0, 3, UID, 2, 0.5))[0]
    clean, _ = _run(NoiseContrastiveAgentLoop, NoisyServer(), monkeypatch, session, noise_contrastive_grpo=block)
    for failing in (1, 2):  # the first call to fail: the noisy request or its twin (sent together)
        server = NoisyServer(failures=failing)
        server.failures = 0
        calls = []

        async def generate(*, request_id, sampling_params, _server=server, _calls=calls, _failing=failing, **kwargs):
            _calls.append(request_id)
            if len(_calls) == _failing:
                raise RuntimeError("transient")
            return await NoisyServer.generate(_server, request_id=request_id, sampling_params=sampling_params, **kwargs)

        server.generate = generate
        out, recorded = _run(NoiseContrastiveAgentLoop, server, monkeypatch, session, noise_contrastive_grpo=block)
        assert recorded == [] and len(calls) == 3
        assert out.response_ids == clean.response_ids
        assert out.extra_fields[FIRST_DIFFERENCE_FIELD] == clean.extra_fields[FIRST_DIFFERENCE_FIELD] == 0
        assert calls[2] == calls[failing - 1] + "-retry1"  # the failed one alone was sent again


# ---------------------------------------------------------------------------------------------------------------
# The replay buffer fails the step; the advantage's own check
# ---------------------------------------------------------------------------------------------------------------


class FakeTransferQueue:
    """TransferQueue's key-value calls the replay buffer makes, in memory: partition -> key -> tag."""

    def __init__(self, partitions: dict):
        self.partitions = {name: dict(keys) for name, keys in partitions.items()}

    def kv_list(self, partition_id=None):
        if partition_id is not None:
            return {partition_id: dict(self.partitions.get(partition_id, {}))}
        return {name: dict(keys) for name, keys in self.partitions.items()}

    def kv_clear(self, keys, partition_id):
        for key in [keys] if isinstance(keys, str) else keys:
            self.partitions.get(partition_id, {}).pop(key, None)


def prompts(step=3, count=3):
    uids = sorted(prompt_uid(0, step, 0, row) for row in range(count))
    return uids, {uid: {"is_prompt": True, "status": "finished", "global_steps": step} for uid in uids}


def trajectories(uid, sessions):
    return {f"{uid}_{s}_0": {"status": "success", "global_steps": 3} for s in sessions}


def buffer(monkeypatch, partitions, cls=OrderedReplayBuffer):
    fake = FakeTransferQueue(partitions)
    monkeypatch.setattr(transfer_queue, "kv_list", fake.kv_list)
    monkeypatch.setattr(transfer_queue, "kv_clear", fake.kv_clear)
    buf = cls(
        trainer_mode="sync",
        trainer_config={},
        max_off_policy_threshold=None,
        max_off_policy_strategy="drop",
        sampler_kwargs={},
        poll_interval=0.01,
        refill_fn=lambda count: None,
    )
    return buf, fake


def failure(uid, session, error="RuntimeError: replica overloaded"):
    replica = "replica hf_cpu_server_0_0 (actor 0a)"
    return RequestFailure(uid, session, 3, "q9", False, f"req{session}", 3, replica, error)


def test_verls_buffer_alone_samples_a_group_with_a_missing_response(monkeypatch):
    """The failure this guards against: with sync_refill_failed_groups off, verl's buffer returns the failed group's
    surviving responses as if it were complete (and nothing of a prompt whose requests all failed)."""
    (a, b, c), tags = prompts()
    tags[b]["status"] = tags[c]["status"] = "failure"
    train = {**tags, **trajectories(a, [0, 1]), **trajectories(b, [0])}
    buf, _ = buffer(monkeypatch, {"train": train}, cls=ReplayBuffer)
    batch, _ = buf.sample(global_steps=3, partition_id="train", batch_size=3)
    assert sorted(batch.keys) == sorted([f"{a}_0_0", f"{a}_1_0", f"{b}_0_0"])  # b short by one, c gone


def test_the_buffer_fails_the_step_naming_each_failed_request(monkeypatch):
    (a, b, c), tags = prompts()
    tags[b]["status"] = tags[c]["status"] = "failure"
    records = {f.key: f.tag() for f in (failure(b, 1), failure(c, 0, "ValueError: bad image"), failure(c, 1))}
    train = {**tags, **trajectories(a, [0, 1]), **trajectories(b, [0])}
    buf, _ = buffer(monkeypatch, {"train": train, FAILURES_PARTITION: records})
    with pytest.raises(RolloutRequestError) as raised:
        buf.sample(global_steps=3, partition_id="train", batch_size=3)
    message = str(raised.value)
    assert message.startswith("2 train prompt(s) lost responses")
    assert f"prompt {b} (question q9), response 1, step 3, request req1: 3 attempt(s)" in message
    assert f"prompt {c} (question q9), response 0" in message and "ValueError: bad image" in message
    assert f"prompt {c} (question q9), response 1" in message and "hf_cpu_server_0_0" in message
    assert a not in message


def test_a_failed_group_ends_the_wait_without_waiting_for_the_others(monkeypatch):
    (a, b, c), tags = prompts()
    tags[a]["status"], tags[b]["status"], tags[c]["status"] = "running", "failure", "running"
    buf, _ = buffer(monkeypatch, {"train": {**tags, **trajectories(b, [0])}})
    with pytest.raises(RolloutRequestError, match=f"prompt {b}: a session failed outside its rollout request"):
        buf.sample(global_steps=3, partition_id="train", batch_size=3)


def test_a_dead_actor_is_named_first(monkeypatch):
    from verl_ext.rollout import replay_buffer

    (a, b, c), tags = prompts()
    tags[b]["status"] = "failure"
    buf, _ = buffer(monkeypatch, {"train": {**tags, **trajectories(a, [0]), **trajectories(c, [0])}})
    monkeypatch.setattr(replay_buffer, "dead_actors", lambda actors: ["rollout server 0 of replica 1: died"])
    buf.watch(lambda: [])
    with pytest.raises(RolloutDiedError, match="rollout server 0 of replica 1"):
        buf.sample(global_steps=3, partition_id="train", batch_size=3)


def test_a_validation_prompt_that_failed_fails_too_and_a_complete_batch_passes(monkeypatch):
    uid = "0b6f1f0e-8d1c-4a57-9a53-2d6f1c1f5d2e"  # verl's uuid4
    val = {uid: {"is_prompt": True, "status": "failure", "global_steps": 0}}
    record = RequestFailure(uid, 0, 0, None, True, "v0", 3, "replica x", "RuntimeError: no")
    buf, _ = buffer(monkeypatch, {"val": val, FAILURES_PARTITION: {record.key: record.tag()}})
    with pytest.raises(RolloutRequestError, match=f"validation prompt {uid}, response 0"):
        buf.sample(global_steps=0, partition_id="val", batch_size=1)

    (a, b, c), tags = prompts()
    train = {**tags, **trajectories(a, [0, 1]), **trajectories(b, [0, 1]), **trajectories(c, [0, 1])}
    buf, _ = buffer(monkeypatch, {"train": train})
    batch, _ = buf.sample(global_steps=3, partition_id="train", batch_size=3)
    assert len(batch.keys) == 6


def test_recorded_failures_reads_the_partition_by_uid():
    f1, f2, other = failure("u1", 1), failure("u1", 0), failure("u2", 0)
    listed = {f.key: f.tag() for f in (f1, f2, other)}
    assert recorded_failures(["u1"], listed) == {"u1": [f2, f1]}
    assert recorded_failures(["u3"], listed) == {}


def test_complete_groups_are_checked_before_any_advantage():
    """The trainers' own check (``_check_groups``, before every method's advantage and DIVA's difficulty update):
    a prompt short of a response, and a DIVA question short of a prompt, are refused by name."""
    from recipe.diva_grpo.toolkit_trainer import ToolkitTrainer
    from recipe.diva_grpo.trainer import DivaTrainer
    from verl_ext.config import diva_config_from

    n = 2
    cfg = OmegaConf.create({"actor_rollout_ref": {"rollout": {"n": n}}})
    toolkit = SimpleNamespace(config=cfg)
    ToolkitTrainer._check_groups(toolkit, np.array(["p1", "p1", "p2", "p2"], dtype=object), None)
    with pytest.raises(IncompleteGroupError, match=r"1 prompts .* than 2: p2 \(1\)"):
        ToolkitTrainer._check_groups(toolkit, np.array(["p1", "p1", "p2"], dtype=object), None)

    diva = object.__new__(DivaTrainer)
    diva.config, diva.diva = cfg, diva_config_from({"variants": {"variants_per_question": 1}})
    info = [{"question_id": q} for q in ("q1", "q1", "q1", "q1", "q2", "q2")]  # q2 lost its variant's group
    with pytest.raises(IncompleteGroupError, match=r"1 questions .* than 4: q2 \(2\)"):
        DivaTrainer._check_groups(diva, np.array(["p1", "p1", "v1", "v1", "p2", "p2"], dtype=object), info)
    with pytest.raises(IncompleteGroupError, match=r"2 prompts .*: a \(1\), c \(3\)"):
        check_complete_groups(["a", "b", "b", "c", "c", "c"], 2, "prompts", "hint")


def make_buffer(sampler_kwargs):
    return OrderedReplayBuffer(
        trainer_mode="sync",
        trainer_config={},
        max_off_policy_threshold=None,
        max_off_policy_strategy="drop",
        sampler_kwargs=sampler_kwargs,
        refill_fn=lambda count: None,
    )


def test_the_poll_interval_is_a_setting_with_verls_default():
    assert make_buffer({}).poll_interval == 2.0  # verl's own default when the key is absent
    assert make_buffer(OmegaConf.create({"poll_interval_s": 0.1})).poll_interval == 0.1
    recipe = OmegaConf.load(Path(__file__).resolve().parents[2] / "recipe/diva_grpo/config/diva_grpo.yaml")
    assert recipe.trainer.v1.sampler.sampler_kwargs.poll_interval_s == 2.0  # the GPU job keeps verl's interval
    for bad in (0, -1.0, "fast", True):
        with pytest.raises(ValueError, match="poll_interval_s"):
            make_buffer({"poll_interval_s": bad})
    with pytest.raises(ValueError, match="takes poll_interval_s only"):
        make_buffer({"poll_intervl_s": 0.1})


def test_cpu_runs_poll_often():
    from verl_ext.cpu.overrides import POLL_INTERVAL_S, accelerator_free_overrides

    assert POLL_INTERVAL_S < 2.0
    assert f"trainer.v1.sampler.sampler_kwargs.poll_interval_s={POLL_INTERVAL_S}" in accelerator_free_overrides()
