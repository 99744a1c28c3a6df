"""PGPO's blind view of a batch: the same sequences with every visual token removed, positions kept.

Pure tensor code on the ``TensorDict`` an actor worker receives from TransferQueue in verl's V1 trainer (B
trajectories, jagged nested tensors ``(B, j)``, i.e. verl's "no padding" layout); testable without workers.

**Why dropping is the blind view.** The paper hides the visual tokens from attention (their attention-mask entries
set to False) and keeps every position id. A hidden key is invisible to every query, so by induction over the layers
a text token's hidden states depend only on the text tokens before it and on their positions: the same as a forward
of the sequence without the visual tokens, given the same positions. Dropping is exact for every attention
implementation verl uses, where a mask is not: verl's packed (remove-padding) inputs carry no attention mask at all
(flash-attention varlen finds the sequences from the position ids; transformers' SDPA/eager packed path does the
same), and the pixel features of dropped tokens are never computed.

**Positions.** Qwen2-VL / Qwen2.5-VL in verl carry ``(4, L)`` position ids per sequence (``verl``'s agent loop):

* rows 1..3, the multimodal rotary (mrope) temporal/height/width positions: kept as they are for the text tokens,
  so every text token is rotated exactly as in the sighted view (the text after an image keeps its offset);
* row 0, the plain text index ``0..L-1``: not a rotary position (transformers >= 4.54 use it only to find sequence
  boundaries and build the causal mask; older ones drop it). It is renumbered ``0..L'-1`` over the kept tokens:
  a jump in it would split the sequence in two for transformers' packed-sequence detection (``diff != 1``), while
  flash-attention varlen only looks for its zeros.

**What changes.** ``input_ids``, ``attention_mask`` and ``prompts`` lose the visual tokens, ``position_ids`` as above,
``multi_modal_inputs`` is removed (no pixels, no grid). Everything else (``responses``, ``response_mask``,
``loss_mask``, non-tensor settings) is untouched: the visual tokens all sit in the prompt, so the response is the
same tail of every sequence and verl's ``response_from_nested`` aligns the blind log-probs with the sighted ones.

Refused with a ``ValueError`` naming the trajectory or field: visual tokens inside a response (multi-turn tool
images), 1-D position ids (not an mrope model), and per-token fields this view cannot keep aligned (router replay's
``routed_experts``, distillation's ``teacher_ids`` / ``teacher_logprobs``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from tensordict import TensorDict

# Non-tensor key of the batch (KVBatchMeta.extra_info on the controller) that carries the visual token ids.
VISUAL_TOKEN_IDS_KEY = "pgpo_visual_token_ids"

# Per-token fields aligned with input_ids that the blind view would have to drop tokens from.
UNSUPPORTED_FIELDS = ("routed_experts", "teacher_ids", "teacher_logprobs")

# Multimodal inputs removed with the visual tokens.
MULTI_MODAL_KEY = "multi_modal_inputs"


def visual_token_ids_from_processor(processor: Any) -> list[int]:
    """The image and video placeholder ids the processor expands into visual tokens (verl's own lookup, as its
    agent loop uses); ``[]`` for a text-only model (no processor)."""
    from verl.utils.tokenizer.tokenizer import get_processor_token_id

    ids = (get_processor_token_id(processor, "image"), get_processor_token_id(processor, "video"))
    return sorted({int(i) for i in ids if i is not None})


def visual_token_ids_from_config(hf_config: Any) -> list[int]:
    """The visual token ids a model's forward scatters vision features into (``image_token_id`` / ``video_token_id``
    of its Hugging Face config, or the ``*_token_index`` spelling); ``[]`` when it names none."""
    ids = []
    for name in ("image_token_id", "video_token_id", "image_token_index", "video_token_index"):
        value = getattr(hf_config, name, None)
        if isinstance(value, int):
            ids.append(value)
    return sorted(set(ids))


def sequence_index(lengths: torch.Tensor) -> torch.Tensor:
    """``(sum(lengths),)`` index of the sequence each packed token belongs to."""
    return torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), lengths)


def position_in_sequence(offsets: torch.Tensor) -> torch.Tensor:
    """``(nnz,)`` position of each packed token inside its own sequence (``0..L_i - 1``)."""
    lengths = offsets.diff()
    return torch.arange(int(offsets[-1]), device=offsets.device) - torch.repeat_interleave(offsets[:-1], lengths)


def visual_mask(input_ids: torch.Tensor, visual_token_ids: Iterable[int]) -> torch.Tensor:
    """``(nnz,)`` bool: which packed tokens of the nested ``input_ids`` are visual."""
    values = input_ids.values()
    ids = torch.as_tensor(list(visual_token_ids), dtype=values.dtype, device=values.device)
    return torch.isin(values, ids)


def visual_token_counts(input_ids: torch.Tensor, visual_token_ids: Iterable[int]) -> torch.Tensor:
    """``(B,)`` int64 number of visual tokens of each sequence of the nested ``(B, j)`` ``input_ids``."""
    _check_nested("input_ids", input_ids)
    mask = visual_mask(input_ids, visual_token_ids).to(torch.int64)
    totals = torch.cat([mask.new_zeros(1), mask.cumsum(0)])
    offsets = input_ids.offsets()
    return totals[offsets[1:]] - totals[offsets[:-1]]


def blind_inputs(data: TensorDict, visual_token_ids: Sequence[int]) -> TensorDict:
    """The blind view of ``data`` (module docstring): a shallow copy with the visual tokens dropped.

    Args:
        data: an actor batch in verl's no-padding layout: nested ``input_ids (B, j)``, ``position_ids (B, 4, j)``,
            ``responses (B, r)`` (or ``response_mask``), and optionally ``attention_mask``, ``prompts``,
            ``multi_modal_inputs``.
        visual_token_ids: the placeholder ids of the visual tokens (image and video pads).

    Returns:
        A new ``TensorDict`` (the inputs are not modified); a batch without visual tokens comes back with the same
        tensors (only ``multi_modal_inputs`` removed).
    """
    from verl.utils.tensordict_utils import maybe_fix_3d_position_ids

    # verl's workaround for nested (B, 4, j) position ids after a pickle round trip (their ragged index is lost).
    maybe_fix_3d_position_ids(data)
    for name in UNSUPPORTED_FIELDS:
        if name in data.keys():
            raise ValueError(
                f"PGPO's blind pass cannot keep the per-token field {name!r} aligned when it drops the visual "
                "tokens; turn off router replay / distillation with PGPO"
            )
    input_ids = data["input_ids"]
    _check_nested("input_ids", input_ids)
    offsets = input_ids.offsets()
    lengths = offsets.diff()
    visual = visual_mask(input_ids, visual_token_ids)
    _check_prompt_only(data, visual, offsets)
    keep = ~visual
    kept = lengths - visual_token_counts(input_ids, visual_token_ids)
    new_offsets = torch.cat([offsets.new_zeros(1), kept.cumsum(0)])

    out = data.copy()
    if MULTI_MODAL_KEY in out.keys():
        del out[MULTI_MODAL_KEY]
    out["input_ids"] = torch.nested.nested_tensor_from_jagged(input_ids.values()[keep], new_offsets)
    out["position_ids"] = _blind_positions(data["position_ids"], keep, offsets, new_offsets)
    if "attention_mask" in data.keys():
        mask = data["attention_mask"]
        _check_same_layout("attention_mask", mask, offsets)
        out["attention_mask"] = torch.nested.nested_tensor_from_jagged(mask.values()[keep], new_offsets)
    if "prompts" in data.keys():
        out["prompts"] = _drop_from_prompts(data["prompts"], keep, offsets, lengths)
    return out


# ---------------------------------------------------------------------------------------------------- internals


def _blind_positions(
    position_ids: torch.Tensor, keep: torch.Tensor, offsets: torch.Tensor, new_offsets: torch.Tensor
) -> torch.Tensor:
    """Rows 1..3 (mrope) of the kept tokens as they are; row 0 (text index) renumbered per sequence."""
    if not (isinstance(position_ids, torch.Tensor) and position_ids.is_nested and position_ids.dim() == 3):
        shape = tuple(position_ids.shape) if isinstance(position_ids, torch.Tensor) else type(position_ids).__name__
        raise ValueError(
            f"position_ids must be nested (B, 4, j) multimodal rotary positions (Qwen2-VL / Qwen2.5-VL in verl), got "
            f"{shape}: PGPO's blind view keeps the rotary positions of the text tokens and renumbers only the text "
            "index row, which a 1-D position model does not have"
        )
    values = position_ids.values()  # (4, nnz): the jagged dimension is the last one
    if values.dim() != 2 or values.shape[0] != 4 or values.shape[1] != int(offsets[-1]):
        raise ValueError(
            f"position_ids must hold 4 rows (text index, then mrope t/h/w) over the {int(offsets[-1])} tokens of "
            f"input_ids, got values of shape {tuple(values.shape)}"
        )
    if not torch.equal(position_ids.offsets(), offsets):
        raise ValueError("position_ids and input_ids have different sequence lengths")
    blind = values[:, keep].clone()
    blind[0] = position_in_sequence(new_offsets).to(blind.dtype)
    return torch.nested.nested_tensor_from_jagged(blind, new_offsets, jagged_dim=2)


def _drop_from_prompts(
    prompts: torch.Tensor, keep: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor
) -> torch.Tensor:
    """``prompts`` are the head of each sequence: drop the same (all-prompt) visual tokens from them."""
    _check_nested("prompts", prompts)
    prompt_offsets = prompts.offsets()
    prompt_lengths = prompt_offsets.diff()
    in_prompt = position_in_sequence(offsets) < torch.repeat_interleave(prompt_lengths, lengths)
    keep_prompt = keep[in_prompt]
    kept = torch.zeros_like(prompt_lengths).index_add_(
        0, sequence_index(prompt_lengths), keep_prompt.to(prompt_lengths.dtype)
    )
    new_offsets = torch.cat([prompt_offsets.new_zeros(1), kept.cumsum(0)])
    return torch.nested.nested_tensor_from_jagged(prompts.values()[keep_prompt], new_offsets)


def _check_prompt_only(data: TensorDict, visual: torch.Tensor, offsets: torch.Tensor) -> None:
    """Every visual token lies before the response (the last ``r_i`` tokens of sequence ``i``)."""
    responses = data["responses"] if "responses" in data.keys() else data["response_mask"]
    _check_nested("responses", responses)
    response_lengths = responses.offsets().diff()
    lengths = offsets.diff()
    if response_lengths.shape != lengths.shape or bool((response_lengths > lengths).any()):
        raise ValueError("responses do not match input_ids: each response must be the tail of its sequence")
    start = torch.repeat_interleave(lengths - response_lengths, lengths)
    in_response = visual & (position_in_sequence(offsets) >= start)
    if bool(in_response.any()):
        row = int(sequence_index(lengths)[in_response.nonzero()[0, 0]])
        raise ValueError(
            f"trajectory {row} has visual tokens inside its response (a multi-turn tool image?); PGPO's blind pass "
            "supports images in the prompt only"
        )


def _check_nested(name: str, value: Any) -> None:
    if not (isinstance(value, torch.Tensor) and value.is_nested):
        raise ValueError(
            f"{name} must be a nested (jagged) tensor, verl's no-padding layout of TransferQueue batches, got "
            f"{type(value).__name__}{'' if not isinstance(value, torch.Tensor) else ' ' + str(tuple(value.shape))}"
        )


def _check_same_layout(name: str, value: torch.Tensor, offsets: torch.Tensor) -> None:
    _check_nested(name, value)
    if not torch.equal(value.offsets(), offsets):
        raise ValueError(f"{name} and input_ids have different sequence lengths")
