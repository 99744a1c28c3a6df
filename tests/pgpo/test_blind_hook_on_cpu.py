"""The trainer-side hook of the blind pass against a real TransferQueue, with verl's TransferQueue bridge.

The actor worker group is replaced by one local object whose ``compute_blind_log_prob`` is the worker method's
body (:func:`verl_ext.pgpo.blind_log_prob_pass` over verl's engine steps on a tiny Qwen2.5-VL) wrapped in verl's own
``tqbridge``, the decorator verl's ``register`` puts around every worker method: it fetches the dispatched fields
from TransferQueue and writes the output back under the same keys. Only Ray's process split is missing.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import ray
import torch
import transfer_queue as tq
from omegaconf import OmegaConf
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.utils.tensordict_utils import list_of_dict_to_tensordict
from verl.utils.transferqueue_utils import tqbridge
from verl.workers.utils.padding import response_from_nested

from verl_ext.algos import compute_pgpo_advantage, pgpo_token_weights
from verl_ext.pgpo import BLIND_PASS_FIELDS, TIMING_KEY, blind_log_prob_pass, compute_blind_log_probs
from verl_ext.pgpo.blind_view import visual_token_ids_from_config
from verl_ext.pgpo.tiny import (
    IMAGE_TOKEN_ID,
    VIDEO_TOKEN_ID,
    Trajectory,
    engine_infer,
    sequence_log_probs,
    tiny_qwen25_vl,
    verl_batch,
)

# Starts Ray, a process group or a fresh interpreter that imports verl: the launch tier (pytest -m launch; CI runs it).
pytestmark = pytest.mark.launch

TRAJECTORIES = [
    Trajectory([5, 6, None, 7, 8], [10, 11, 12, 13], [(1, 4, 4)]),
    Trajectory([5, 9, 8], [20, 21, 22]),
    Trajectory([3, None, 4, None, 9], [30, 31, 32, 33, 34], [(1, 4, 4), (1, 2, 4)]),
    Trajectory([7, 7, 7, 7, 7, 7, 7, 7], [1, 2]),  # a long text-only prompt: not the shortest filler
    Trajectory([None, 5], [40, 41], [(1, 2, 2)]),
    Trajectory([4, 4], [3, 3, 3]),  # the shortest text-only trajectory
]
IMAGE_ROWS = [0, 2, 4]


@pytest.fixture(scope="module")
def ray_and_tq():
    ray.init(num_cpus=16, include_dashboard=False, namespace="test_pgpo_hook", log_to_driver=False)
    tq.init()
    yield
    tq.close()
    ray.shutdown()


class LocalActorGroup:
    """Stands for ``trainer.actor_rollout_wg`` with a data-parallel size of ``dp_size`` (read by the hook as
    verl's ``_balance_batch`` reads it). Records what each call received."""

    def __init__(self, model, dp_size: int):
        self._dispatch_info = {"actor": list(range(dp_size))}
        self.infer = engine_infer(model, micro_batch_size=1)
        self.model_ids = visual_token_ids_from_config(model.config)
        self.received: list[TensorDict] = []
        self.compute_blind_log_prob = tqbridge()(self._compute_blind_log_prob)

    def _compute_blind_log_prob(self, data: TensorDict) -> TensorDict:
        self.received.append(data)
        return blind_log_prob_pass(data, self.infer, self.model_ids)


def put_batch(model, partition: str):
    """The trajectories in TransferQueue as verl's agent loop and ``_compute_old_log_prob`` leave them."""
    data, pieces = verl_batch(model, TRAJECTORIES)
    sighted = engine_infer(model, micro_batch_size=1)(data.copy())
    old = response_from_nested(sighted["log_probs"], data["response_mask"])
    fields, keys, tags = [], [], []
    for i in range(len(TRAJECTORIES)):
        fields.append({key: data[key][i] for key in BLIND_PASS_FIELDS} | {"old_log_probs": old[i]})
        fields[-1]["multi_modal_inputs"] = data["multi_modal_inputs"][i]
        keys.append(f"uid{i}_0_0")
        length = int(pieces[i]["input_ids"].numel())
        tags.append({"status": "success", "seq_len": length, "response_len": pieces[i]["response_length"]})
    tq.kv_batch_put(keys=keys, partition_id=partition, fields=list_of_dict_to_tensordict(fields), tags=tags)
    return KVBatchMeta(keys=keys, tags=tags, partition_id=partition), pieces, old


def trainer(model, dp_size: int, micro_batch_size: int, dynamic: bool = False):
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "actor": {"use_dynamic_bsz": dynamic},
                "rollout": {"temperature": 1.0, "log_prob_micro_batch_size_per_gpu": micro_batch_size},
            }
        }
    )
    processor = SimpleNamespace(image_token_id=IMAGE_TOKEN_ID, video_token_id=VIDEO_TOKEN_ID)
    return SimpleNamespace(processor=processor, actor_rollout_wg=LocalActorGroup(model, dp_size), config=config)


@pytest.mark.parametrize("dp_size, micro_batch_size, dynamic", [(1, 1, False), (2, 2, False), (2, 1, True)])
def test_hook_writes_blind_log_probs_for_every_trajectory(ray_and_tq, dp_size, micro_batch_size, dynamic):
    model = tiny_qwen25_vl()
    partition = f"train_{dp_size}_{micro_batch_size}_{dynamic}"
    batch, pieces, old = put_batch(model, partition)
    step = trainer(model, dp_size, micro_batch_size, dynamic)
    metrics = {}
    assert compute_blind_log_probs(step, batch, metrics) is batch

    # One dispatch, of the image rows plus the shortest text rows up to the dispatch multiple, without the pixels.
    (received,) = step.actor_rollout_wg.received
    multiple = dp_size * (1 if dynamic else micro_batch_size)
    expected_rows = -(-len(IMAGE_ROWS) // multiple) * multiple
    assert len(received) == expected_rows
    assert "multi_modal_inputs" not in received.keys()
    text_received = [ids for ids in received["input_ids"].unbind() if not bool((ids == IMAGE_TOKEN_ID).any())]
    shortest_text = [pieces[5]["input_ids"], pieces[1]["input_ids"], pieces[3]["input_ids"]]
    assert len(text_received) == expected_rows - len(IMAGE_ROWS)
    assert all(torch.equal(a, b) for a, b in zip(sorted(text_received, key=len), shortest_text, strict=False))
    ran = metrics["pgpo/blind_pass_share"] * len(TRAJECTORIES)
    assert round(ran) == expected_rows and metrics["pgpo/visual_share"] == pytest.approx(0.5)
    assert metrics[TIMING_KEY] > 0

    stored = tq.kv_batch_get(keys=batch.keys, partition_id=partition, select_fields=["blind_log_probs"])
    blind = stored["blind_log_probs"]
    for i, piece in enumerate(pieces):
        if i in IMAGE_ROWS:
            ids, pos, r = piece["input_ids"], piece["position_ids"], piece["response_length"]
            keep = ids != IMAGE_TOKEN_ID
            kept_pos = pos[:, keep].clone()
            kept_pos[0] = torch.arange(kept_pos.shape[1])
            by_hand = sequence_log_probs(model, ids[keep], kept_pos)[-r - 1 : -1]
            torch.testing.assert_close(blind[i], by_hand, rtol=1e-5, atol=1e-5)
            assert float((blind[i] - old[i]).abs().max()) > 1e-2
        else:  # text only: the same sequence in both views (copied, or run as a filler row)
            torch.testing.assert_close(blind[i], old[i], rtol=1e-6, atol=1e-6)

    # What the advantage step then reads: (B, T) like old_log_probs; text-only responses get weights 1.
    padded = tq.kv_batch_get(
        keys=batch.keys, partition_id=partition, select_fields=["old_log_probs", "blind_log_probs", "response_mask"]
    ).to_padded_tensor()
    weights = pgpo_token_weights(padded["old_log_probs"], padded["blind_log_probs"], padded["response_mask"])
    for i in range(len(TRAJECTORIES)):
        if i not in IMAGE_ROWS:
            assert torch.equal(weights[i], padded["response_mask"][i].to(weights.dtype))
        else:
            assert float(weights[i].max()) > 1.0
    rewards = torch.zeros_like(padded["old_log_probs"])
    rewards[:, 0] = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    advantages, _ = compute_pgpo_advantage(
        rewards, padded["response_mask"], ["a"] * 6, padded["old_log_probs"], padded["blind_log_probs"]
    )
    assert torch.isfinite(advantages).all()


def test_batch_without_images_copies_the_old_log_probs_and_dispatches_nothing(ray_and_tq):
    model = tiny_qwen25_vl()
    batch, pieces, old = put_batch(model, "text_only")
    step = trainer(model, 1, 1)
    step.processor = None  # a text-only model: no visual token ids at all
    metrics = {}
    compute_blind_log_probs(step, batch, metrics)
    assert step.actor_rollout_wg.received == [] and metrics["pgpo/blind_pass_share"] == 0.0
    stored = tq.kv_batch_get(keys=batch.keys, partition_id="text_only", select_fields=["blind_log_probs"])
    for i in range(len(pieces)):
        assert torch.equal(stored["blind_log_probs"][i], old[i])


def test_workers_without_the_blind_pass_are_named(ray_and_tq):
    model = tiny_qwen25_vl()
    batch, _, _ = put_batch(model, "no_worker")
    step = trainer(model, 1, 1)
    step.actor_rollout_wg = SimpleNamespace(_dispatch_info={"actor": [0]})
    with pytest.raises(RuntimeError, match="use_blind_pass_worker"):
        compute_blind_log_probs(step, batch, {})
