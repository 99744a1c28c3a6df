"""Validation batches come out of the replay buffer in one order in every run: verl draws their uids with uuid4, so
they are sorted by the prompt's tokens and the question's fields (verl_ext/rollout/replay_buffer.py). Questions that
differ only by their image (the swatch task: one prompt text for every colour) tie on the tokens; their fields break
the tie, whatever order the requests finished in. A real TransferQueue on a local Ray."""

from __future__ import annotations

import uuid

import pytest
import ray
import torch
import transfer_queue as tq
from tensordict import NonTensorStack, TensorDict

from verl_ext.rollout.replay_buffer import OrderedReplayBuffer

# Starts Ray and TransferQueue: the launch tier (pytest -m launch; CI runs it).
pytestmark = pytest.mark.launch


@pytest.fixture(scope="module")
def local_tq():
    ray.init(num_cpus=16, include_dashboard=False, namespace="test_validation_order", log_to_driver=False)
    tq.init()
    yield
    tq.close()
    ray.shutdown()


def put_questions(order: list[int], with_extra_info: bool) -> dict[str, int]:
    """Four validation questions with one prompt's tokens, put in ``order``; ``{uid: question}``."""
    uids = {}
    for question in order:
        uid = str(uuid.uuid4())
        uids[uid] = question
        fields = {
            "prompts": torch.tensor([[7, 8, 9]]),
            "responses": torch.tensor([[question]]),
            "data_source": NonTensorStack("swatch"),
            "reward_model": NonTensorStack({"ground_truth": ["red", "red", "blue", "green"][question]}),
        }
        if with_extra_info:
            fields["extra_info"] = NonTensorStack({"question_id": f"q{question}"})
        tq.kv_batch_put(
            keys=[f"{uid}_0_0"],
            partition_id="val",
            fields=TensorDict(fields, batch_size=1),
            tags=[{"status": "success", "global_steps": 0}],
        )
        tq.kv_put(key=uid, partition_id="val", tag={"is_prompt": True, "status": "finished", "global_steps": 0})
    return uids


@pytest.mark.parametrize("with_extra_info", [True, False])
def test_tied_validation_questions_come_out_in_one_order(local_tq, with_extra_info):
    buffer = OrderedReplayBuffer(
        trainer_mode="sync",
        trainer_config={},
        max_off_policy_threshold=None,
        max_off_policy_strategy="drop",
        sampler_kwargs={"poll_interval_s": 0.01},
        refill_fn=lambda count: None,
    )
    orders = []
    for finished in ([0, 1, 2, 3], [3, 2, 1, 0], [2, 0, 3, 1]):
        uids = put_questions(finished, with_extra_info)
        batch, _ = buffer.sample(global_steps=0, partition_id="val", batch_size=4)
        orders.append([uids[key.split("_")[0]] for key in batch.keys])
        tq.kv_clear(keys=list(batch.keys) + list(uids), partition_id="val")
    assert orders[0] == orders[1] == orders[2], orders
