"""PGPO's blind view on a tiny, randomly initialised Qwen2.5-VL built locally (no hub).

The blind pass runs through verl's own engine steps (micro-batching, remove-padding packing, output slicing) and
must give, for every trajectory, the log-probs of a forward in which the visual tokens were removed by hand with
their positions kept, and those of the paper's definition (the visual tokens' attention mask set to False, image
present); it must differ from the sighted log-probs where there is an image and equal them where there is none.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import ray
import torch
from verl.utils import tensordict_utils as tu
from verl.workers.engine_workers import ActorRolloutRefWorker
from verl.workers.utils.padding import response_from_nested

from verl_ext.pgpo import blind_inputs, blind_log_prob_pass, plan_blind_rows, use_blind_pass_worker
from verl_ext.pgpo.blind_view import (
    VISUAL_TOKEN_IDS_KEY,
    visual_token_counts,
    visual_token_ids_from_config,
    visual_token_ids_from_processor,
)
from verl_ext.pgpo.tiny import (
    IMAGE_TOKEN_ID,
    VIDEO_TOKEN_ID,
    Trajectory,
    engine_infer,
    nested,
    sequence_log_probs,
    tiny_qwen25_vl,
    verl_batch,
)
from verl_ext.pgpo.worker import PgpoActorRolloutRefWorker

# The main job's stack: CI runs these in the GPU stack's environment (pytest -m gpu_stack).
pytestmark = pytest.mark.gpu_stack

VISUAL = [IMAGE_TOKEN_ID, VIDEO_TOKEN_ID]

TRAJECTORIES = [
    Trajectory([5, 6, None, 7, 8], [10, 11, 12, 13], [(1, 4, 4)]),  # one image mid-prompt
    Trajectory([5, 9, 8], [20, 21, 22]),  # text only
    Trajectory([3, None, 4, None, 9], [30, 31, 32, 33, 34], [(1, 4, 4), (1, 2, 4)]),  # two images
    Trajectory([None, 5], [40, 41], [(1, 2, 2)]),  # image first, one visual token
]


@pytest.fixture(scope="module", params=["eager", "sdpa"])
def model(request):
    return tiny_qwen25_vl(attn_implementation=request.param)


def with_ids(data, ids=VISUAL):
    data = data.copy()
    tu.assign_non_tensor_data(data, VISUAL_TOKEN_IDS_KEY, list(ids))
    return data


# ---------------------------------------------------------------------------------------------------------------
# The blind inputs themselves
# ---------------------------------------------------------------------------------------------------------------


def test_blind_inputs_drop_the_visual_tokens_and_keep_the_rotary_positions(model):
    data, pieces = verl_batch(model, TRAJECTORIES)
    blind = blind_inputs(data, VISUAL)
    assert "multi_modal_inputs" not in blind.keys() and "multi_modal_inputs" in data.keys()
    for i, piece in enumerate(pieces):
        keep = ~torch.isin(piece["input_ids"], torch.tensor(VISUAL))
        assert torch.equal(blind["input_ids"][i], piece["input_ids"][keep])
        positions = blind["position_ids"][i]
        assert torch.equal(positions[1:], piece["position_ids"][1:, keep])  # mrope rows kept as they were
        assert torch.equal(positions[0], torch.arange(int(keep.sum())))  # text index row renumbered
        assert torch.equal(blind["attention_mask"][i], torch.ones(int(keep.sum()), dtype=torch.int64))
        # prompts + responses is still the sequence; responses and masks are untouched.
        assert torch.equal(torch.cat([blind["prompts"][i], blind["responses"][i]]), blind["input_ids"][i])
        assert torch.equal(blind["responses"][i], data["responses"][i])
        assert torch.equal(blind["response_mask"][i], data["response_mask"][i])
    # The text-only trajectory is unchanged, and so is the input.
    assert torch.equal(blind["input_ids"][1], data["input_ids"][1])
    assert torch.equal(blind["position_ids"][1], data["position_ids"][1])
    assert int(data["input_ids"].offsets()[-1]) == sum(p["input_ids"].numel() for p in pieces)
    assert visual_token_counts(data["input_ids"], VISUAL).tolist() == [4, 0, 6, 1]


# ---------------------------------------------------------------------------------------------------------------
# Blind log-probs through verl's engine steps
# ---------------------------------------------------------------------------------------------------------------


def by_hand_references(model, pieces):
    """Per trajectory: (sighted, masked, dropped) response log-probs from one plain forward each."""
    references = []
    for piece in pieces:
        ids, pos, r = piece["input_ids"], piece["position_ids"], piece["response_length"]
        images = {k: piece[k] for k in ("pixel_values", "image_grid_thw") if k in piece}
        sighted = sequence_log_probs(model, ids, pos, **images)
        visual = torch.isin(ids, torch.tensor(VISUAL))
        # The paper: every visual token's attention-mask entry False, image and positions kept.
        masked = sequence_log_probs(model, ids, pos, attention_mask=(~visual).long().unsqueeze(0), **images)
        # Removed by hand: the text tokens only, each keeping its rotary position (mrope rows); the text index row
        # of the shorter sequence counts 0.. again.
        kept_pos = pos[:, ~visual].clone()
        kept_pos[0] = torch.arange(kept_pos.shape[1])
        dropped = sequence_log_probs(model, ids[~visual], kept_pos)
        references.append(tuple(x[-r - 1 : -1] for x in (sighted, masked, dropped)))
    return references


@pytest.mark.parametrize(
    "engine",
    [
        dict(use_remove_padding=True, micro_batch_size=2),
        dict(use_remove_padding=True, micro_batch_size=None, max_token_len=40),  # dynamic batch size
        dict(use_remove_padding=False, micro_batch_size=4),
    ],
    ids=["packed", "packed-dynamic-bsz", "padded"],
)
def test_blind_log_probs_equal_a_forward_without_the_visual_tokens(model, engine):
    data, pieces = verl_batch(model, TRAJECTORIES)
    infer = engine_infer(model, **engine)
    blind = blind_log_prob_pass(with_ids(data), infer, visual_token_ids_from_config(model.config))
    sighted = response_from_nested(infer(data.copy())["log_probs"], data["response_mask"])
    for i, (by_hand_sighted, masked, dropped) in enumerate(by_hand_references(model, pieces)):
        ours = blind["blind_log_probs"][i]
        # Hiding by the attention mask and removing the tokens are the same view.
        torch.testing.assert_close(masked, dropped, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ours, dropped, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(sighted[i], by_hand_sighted, rtol=1e-5, atol=1e-5)
        if TRAJECTORIES[i].grids:
            assert float((ours - sighted[i]).abs().max()) > 1e-2, f"trajectory {i}: the image changed nothing"
        else:
            torch.testing.assert_close(ours, sighted[i], rtol=1e-6, atol=1e-6)


def test_text_only_batch_blind_equals_sighted(model):
    text = [Trajectory([5, 9, 8], [20, 21, 22]), Trajectory([7, 7, 3, 2], [1, 4])]
    data, _ = verl_batch(model, text)
    infer = engine_infer(model, micro_batch_size=1)
    blind = blind_log_prob_pass(with_ids(data), infer)
    sighted = response_from_nested(infer(data.copy())["log_probs"], data["response_mask"])
    for i in range(len(text)):
        assert torch.equal(blind["blind_log_probs"][i], sighted[i])


def test_verls_patched_forward_needs_the_named_patch_for_micro_batches_without_pixels(model, monkeypatch):
    """verl's monkey-patched Qwen2.5-VL forward fails on every blind micro-batch under transformers 5 (the vision
    tower's output has no ``.mean()``) without :mod:`verl_ext.no_pixels_patch` (which the plugin applies in every
    process); with it, it gives the log-probs of the unpatched model."""
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as hf
    from verl.models.transformers import qwen2_vl
    from verl.models.transformers.monkey_patch import apply_monkey_patch

    from verl_ext import no_pixels_patch

    data, _ = verl_batch(model, TRAJECTORIES)
    infer = engine_infer(model, use_remove_padding=False, micro_batch_size=4)
    expected = blind_log_prob_pass(with_ids(data), infer, VISUAL)["blind_log_probs"]
    # verl patches the classes for the whole process: monkeypatch puts every patched name back afterwards.
    for cls in (hf.Qwen2_5_VLModel, hf.Qwen2_5_VLForConditionalGeneration, hf.Qwen2_5_VLAttention):
        monkeypatch.setattr(cls, "forward", cls.forward)
    assert qwen2_vl._get_input_embeds._verl_ext_patch == no_pixels_patch.NAME  # the plugin applied it at import
    monkeypatch.setattr(qwen2_vl, "_get_input_embeds", no_pixels_patch.VERLS_FUNCTION)  # verl's own function
    apply_monkey_patch(model, use_remove_padding=False)
    with pytest.raises(AttributeError, match="mean"):
        blind_log_prob_pass(with_ids(data), infer, VISUAL)
    assert no_pixels_patch.apply() and no_pixels_patch.apply()  # idempotent
    patched = blind_log_prob_pass(with_ids(data), infer, VISUAL)["blind_log_probs"]
    for i in range(len(TRAJECTORIES)):
        torch.testing.assert_close(patched[i], expected[i], rtol=1e-5, atol=1e-5)
    # Micro-batches with pixels still go through verl's own code.
    sighted = response_from_nested(infer(data.copy())["log_probs"], data["response_mask"])
    assert all(torch.isfinite(sighted[i]).all() for i in range(len(TRAJECTORIES)))


# ---------------------------------------------------------------------------------------------------------------
# Refusals
# ---------------------------------------------------------------------------------------------------------------


def test_visual_tokens_in_a_response_are_refused(model):
    data, pieces = verl_batch(model, [TRAJECTORIES[1], TRAJECTORIES[0]])
    ids = [p["input_ids"].clone() for p in pieces]
    ids[1][-2] = IMAGE_TOKEN_ID  # a visual token in trajectory 1's response (a tool image in a later turn)
    data["input_ids"] = nested(ids)
    with pytest.raises(ValueError, match="trajectory 1 has visual tokens inside its response"):
        blind_inputs(data, VISUAL)


def test_one_dimensional_positions_are_refused(model):
    data, pieces = verl_batch(model, TRAJECTORIES[:2])
    data["position_ids"] = nested(p["position_ids"][0] for p in pieces)
    with pytest.raises(ValueError, match=r"position_ids must be nested \(B, 4, j\)"):
        blind_inputs(data, VISUAL)


def test_router_replay_fields_are_refused(model):
    data, pieces = verl_batch(model, TRAJECTORIES[:2])
    data["routed_experts"] = nested(torch.zeros_like(p["input_ids"]) for p in pieces)
    with pytest.raises(ValueError, match="routed_experts"):
        blind_inputs(data, VISUAL)


def test_missing_or_mismatched_visual_ids_are_refused(model):
    data, _ = verl_batch(model, TRAJECTORIES[:2])
    infer = engine_infer(model)
    with pytest.raises(ValueError, match="pgpo_visual_token_ids"):
        blind_log_prob_pass(data.copy(), infer)
    with pytest.raises(ValueError, match=r"model's visual token ids \[61\] are not among the processor's \[60\]"):
        blind_log_prob_pass(with_ids(data, [IMAGE_TOKEN_ID]), infer, VISUAL)


def test_non_nested_inputs_are_refused(model):
    data, _ = verl_batch(model, TRAJECTORIES[:2])
    data = data.copy()
    data["input_ids"] = torch.zeros(2, 3, dtype=torch.int64)
    with pytest.raises(ValueError, match="input_ids must be a nested"):
        blind_inputs(data, VISUAL)


# ---------------------------------------------------------------------------------------------------------------
# Visual ids, planning of the rows, the worker class swap
# ---------------------------------------------------------------------------------------------------------------


def test_visual_token_ids_from_processor_and_config(model):
    assert visual_token_ids_from_config(model.config) == VISUAL
    processor = SimpleNamespace(image_token_id=IMAGE_TOKEN_ID, video_token_id=VIDEO_TOKEN_ID)
    assert visual_token_ids_from_processor(processor) == VISUAL
    assert visual_token_ids_from_processor(None) == []


@pytest.mark.parametrize("dp_size, multiple", [(1, 1), (2, 2), (2, 4), (4, 4)])
def test_plan_runs_every_visual_row_then_the_shortest_text_rows(dp_size, multiple):
    counts = torch.tensor([3, 0, 0, 5, 0, 1, 0, 0])
    seq_lens = torch.tensor([20, 9, 4, 30, 7, 12, 5, 40])
    rows = plan_blind_rows(counts, seq_lens, dp_size, multiple)
    assert len(rows) == len(set(rows)) and len(rows) % multiple == 0
    assert {0, 3, 5} <= set(rows)
    extra = sorted(set(rows) - {0, 3, 5}, key=lambda i: seq_lens[i])
    text_by_length = sorted([1, 2, 4, 6, 7], key=lambda i: int(seq_lens[i]))
    assert extra == text_by_length[: len(extra)]
    assert len(rows) == max(3, -(-3 // multiple) * multiple)
    assert plan_blind_rows(torch.zeros(8, dtype=torch.int64), seq_lens, dp_size, multiple) == []


def test_plan_refuses_a_batch_the_dispatch_cannot_split():
    with pytest.raises(ValueError, match="cannot be split over 4 data-parallel ranks"):
        plan_blind_rows(torch.tensor([1, 1, 1]), torch.tensor([5, 5, 5]), dp_size=4, multiple=4)


def test_use_blind_pass_worker_swaps_verls_actor_class():
    from verl.trainer.ppo.utils import Role

    mapping = {Role.ActorRollout: ray.remote(ActorRolloutRefWorker), Role.Critic: "critic"}
    use_blind_pass_worker(mapping)
    assert mapping[Role.ActorRollout].__ray_actor_class__ is PgpoActorRolloutRefWorker
    assert mapping[Role.Critic] == "critic"
    use_blind_pass_worker(mapping)  # idempotent
    assert mapping[Role.ActorRollout].__ray_actor_class__ is PgpoActorRolloutRefWorker

    class Other(ActorRolloutRefWorker):
        pass

    with pytest.raises(ValueError, match="Other, not verl's ActorRolloutRefWorker"):
        use_blind_pass_worker({Role.ActorRolloutRef: ray.remote(Other)})
    with pytest.raises(ValueError, match="no actor role"):
        use_blind_pass_worker({Role.Critic: "critic"})
    # The method is registered for verl's dispatch on the actor mesh, like compute_log_prob.
    from verl.single_controller.base.decorator import MAGIC_ATTR

    assert hasattr(PgpoActorRolloutRefWorker.compute_blind_log_prob, MAGIC_ATTR)
