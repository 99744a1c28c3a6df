"""A tiny Qwen2.5-VL, verl-layout batches for it and verl's own engine steps around it (tests and benchmarks).

Nothing is downloaded: the model is ``transformers.Qwen2_5_VLForConditionalGeneration`` from a small config with
random weights; images are random pixel patches with their ``image_grid_thw``, as the Qwen2.5-VL processor would
produce them. :func:`verl_batch` builds the ``TensorDict`` an actor worker receives from TransferQueue in verl's V1
trainer (jagged nested tensors, ``(B, 4, j)`` position ids made as verl's agent loop makes them: the text index
row, then the model's ``get_rope_index``). :func:`engine_infer` runs verl's FSDP engine code on it
(``prepare_micro_batches``, ``FSDPEngineWithLMHead.prepare_model_inputs`` / ``prepare_model_outputs``,
``postprocess_batch_func``) without FSDP or a process group, so the blind pass is tested through the input
preparation, packing (remove padding) and output slicing a real actor uses.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from tensordict import NonTensorStack, TensorDict

VOCAB = 64
IMAGE_TOKEN_ID, VIDEO_TOKEN_ID, VISION_START_ID, VISION_END_ID = 60, 61, 62, 63
# Vision tower: 2-pixel patches, 3 channels, one temporal patch, merged 2 x 2 into one language-model token.
PATCH_DIM = 3 * 1 * 2 * 2
MERGE = 2


def tiny_qwen25_vl(attn_implementation: str = "sdpa", seed: int = 0, init_std: float = 0.3):
    """A 2-layer Qwen2.5-VL (hidden 32, 4 heads of 8, mrope sections [2, 1, 1]) with a 1-block vision tower.

    ``init_std``: the weights' standard deviation; larger than transformers' 0.02 so that the image visibly
    changes the log-probs of a random model. Float32, eval mode.
    """
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            rope_parameters={"rope_type": "default", "mrope_section": [2, 1, 1], "rope_theta": 10000.0},
            bos_token_id=0,
            eos_token_id=1,
            pad_token_id=0,
        ),
        vision_config=dict(
            depth=1,
            hidden_size=16,
            intermediate_size=32,
            num_heads=2,
            out_hidden_size=32,
            patch_size=2,
            spatial_merge_size=MERGE,
            temporal_patch_size=1,
            window_size=8,
            fullatt_block_indexes=[0],
        ),
        image_token_id=IMAGE_TOKEN_ID,
        video_token_id=VIDEO_TOKEN_ID,
        vision_start_token_id=VISION_START_ID,
        vision_end_token_id=VISION_END_ID,
    )
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, init_std)
    return model.eval()


@dataclass
class Trajectory:
    """One prompt + response. ``prompt`` holds ``None`` where an image goes (expanded to its visual tokens)."""

    prompt: list[int | None]
    response: list[int]
    grids: list[tuple[int, int, int]] = field(default_factory=list)  # (t, h, w) patches of each image


def image_tokens(grid: tuple[int, int, int]) -> int:
    t, h, w = grid
    return t * h * w // (MERGE * MERGE)


def expand(trajectory: Trajectory) -> list[int]:
    """The token ids of prompt + response, each image as ``<vision_start> <image_pad> * n <vision_end>``."""
    ids, grids = [], iter(trajectory.grids)
    for token in trajectory.prompt:
        if token is None:
            ids += [VISION_START_ID] + [IMAGE_TOKEN_ID] * image_tokens(next(grids)) + [VISION_END_ID]
        else:
            ids.append(token)
    return ids + list(trajectory.response)


def positions(model, ids: torch.Tensor, grids: Sequence[tuple[int, int, int]]) -> torch.Tensor:
    """``(4, L)`` position ids as verl's agent loop builds them: text index row, then the mrope rows."""
    length = ids.shape[0]
    if grids:
        mm_types = (ids == IMAGE_TOKEN_ID).to(torch.int32).unsqueeze(0)
        rope, _ = model.model.get_rope_index(
            ids.unsqueeze(0), mm_token_type_ids=mm_types, image_grid_thw=torch.tensor(grids)
        )
        rope = rope[:, 0]
    else:
        rope = torch.arange(length).expand(3, -1)
    return torch.cat([torch.arange(length).unsqueeze(0), rope], dim=0)


def verl_batch(model, trajectories: Sequence[Trajectory], seed: int = 0) -> tuple[TensorDict, list[dict]]:
    """The actor batch of ``trajectories`` in verl's no-padding layout, and the per-trajectory pieces.

    Returns ``(data, pieces)``; ``pieces[i]`` holds ``input_ids (L,)``, ``position_ids (4, L)``, ``pixel_values``
    and ``image_grid_thw`` (absent for a text-only prompt) and ``response_length``.
    """
    generator = torch.Generator().manual_seed(seed)
    pieces = []
    for trajectory in trajectories:
        ids = torch.tensor(expand(trajectory))
        piece = {"input_ids": ids, "position_ids": positions(model, ids, trajectory.grids)}
        piece["response_length"] = len(trajectory.response)
        if trajectory.grids:
            patches = sum(t * h * w for t, h, w in trajectory.grids)
            piece["pixel_values"] = torch.randn(patches, PATCH_DIM, generator=generator)
            piece["image_grid_thw"] = torch.tensor(trajectory.grids)
        pieces.append(piece)

    responses = [p["input_ids"][-p["response_length"] :] for p in pieces]
    prompts = [p["input_ids"][: -p["response_length"]] for p in pieces]
    data = TensorDict(
        {
            "input_ids": nested(p["input_ids"] for p in pieces),
            "position_ids": nested_positions([p["position_ids"] for p in pieces]),
            "attention_mask": nested(torch.ones_like(p["input_ids"]) for p in pieces),
            "prompts": nested(prompts),
            "responses": nested(responses),
            "response_mask": nested(torch.ones_like(r) for r in responses),
            "loss_mask": nested(torch.ones_like(r) for r in responses),
            "multi_modal_inputs": NonTensorStack(
                *[{k: p[k] for k in ("pixel_values", "image_grid_thw") if k in p} for p in pieces]
            ),
        },
        batch_size=[len(pieces)],
    )
    return data, pieces


def nested(tensors) -> torch.Tensor:
    """Jagged ``(B, j)`` nested tensor of 1-D tensors, as TransferQueue returns a per-sample field."""
    return torch.nested.as_nested_tensor(list(tensors), layout=torch.jagged)


def nested_positions(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Jagged ``(B, 4, j)`` nested tensor of ``(4, L)`` position ids (ragged last dimension, as verl's)."""
    offsets = torch.tensor([0] + [t.shape[-1] for t in tensors]).cumsum(0)
    return torch.nested.nested_tensor_from_jagged(torch.cat(list(tensors), dim=-1), offsets, jagged_dim=2)


def engine_infer(
    model, *, use_remove_padding: bool = True, micro_batch_size: int | None = 2, max_token_len: int | None = None
) -> Callable[[TensorDict], TensorDict]:
    """An ``infer_batch`` for :func:`verl_ext.pgpo.worker.blind_log_prob_pass` made of verl's engine steps.

    ``micro_batch_size``: fixed micro-batches; or ``max_token_len`` with ``micro_batch_size=None``: verl's dynamic
    batch size. Temperature 1. Returns a ``TensorDict`` with nested ``log_probs (B, j)`` over each sequence, as
    ``TrainingWorker.infer_batch`` does.
    """
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
    from verl.workers.engine.utils import postprocess_batch_func, prepare_micro_batches

    # The engine's model-facing steps need only these attributes (no FSDP wrapping, no process group).
    engine = FSDPEngineWithLMHead.__new__(FSDPEngineWithLMHead)
    engine.pad_to_length = False
    engine.use_ulysses_sp = False

    def infer(data: TensorDict) -> TensorDict:
        dynamic = micro_batch_size is None
        tu.assign_non_tensor(
            data,
            use_remove_padding=use_remove_padding,
            use_dynamic_bsz=dynamic,
            use_fused_kernels=False,
            temperature=1.0,
            **({"max_token_len_per_gpu": max_token_len} if dynamic else {"micro_batch_size_per_gpu": micro_batch_size}),
        )
        micro_batches, indices = prepare_micro_batches(data, dp_group=None, same_micro_num_in_dp=False)
        outputs = []
        for micro_batch in micro_batches:
            inputs, output_args = engine.prepare_model_inputs(micro_batch)
            with torch.no_grad():
                raw = model(**inputs, use_cache=False)
            model_output = engine.prepare_model_outputs(raw, output_args, micro_batch, None)
            outputs.append({"model_output": model_output, "loss": 0.0, "metrics": {}})
        model_output = postprocess_batch_func(outputs, indices, data)["model_output"]
        return TensorDict({"log_probs": model_output["log_probs"]}, batch_size=[len(data)])

    return infer


def sequence_log_probs(model, input_ids: torch.Tensor, position_ids: torch.Tensor, **model_inputs) -> torch.Tensor:
    """``(L,)`` log-prob of token ``t + 1`` at position ``t`` (the last one: of token 0, verl's roll) for one padded
    sequence; ``model_inputs``: pixels, grid, ``attention_mask``."""
    with torch.no_grad():
        logits = model(
            input_ids=input_ids.unsqueeze(0), position_ids=position_ids.unsqueeze(1), use_cache=False, **model_inputs
        ).logits[0]
    labels = torch.roll(input_ids, shifts=-1)
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
