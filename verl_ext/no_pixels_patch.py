"""A named patch of verl for Qwen2-VL / Qwen2.5-VL micro-batches without any pixels (every process, every device).

**Assumption lifted:** "the vision tower returns a tensor". verl 0.9.1's monkey-patched Qwen2-VL forward
(``verl.models.transformers.qwen2_vl._get_input_embeds``, used for ``qwen2_vl`` and ``qwen2_5_vl`` whenever verl
patches the model: the actor's log-prob and training forwards and the reference's) runs a dummy vision forward when a
micro-batch has no ``pixel_values`` (so that every FSDP rank all-gathers the vision weights the same number of times)
and adds ``0.0 * image_embeds.mean()``. Since transformers 5 the tower returns a ``BaseModelOutputWithPooling``, so
that line raises ``AttributeError: ... has no attribute 'mean'``; verl's own pixel branch already unpacks it with
``unpack_visual_output``. A micro-batch without pixels comes from text-only rows: a text-only prompt, the rows verl
pads a short batch with, PGPO's blind pass (every one of its micro-batches). At world size > 1 the rank that fails
leaves the others waiting in a collective until it times out.

:func:`apply` wraps the function: a micro-batch with pixels or video goes to verl's code unchanged; one without runs
the same dummy forward, through ``unpack_visual_output``. Applied from :mod:`verl_ext.plugin` in every process (verl
loads the plugin on ``import verl``, so in every worker before its first forward; verl's forwards look the function
up in its module at each call, so the order of imports does not matter); idempotent.
"""

from __future__ import annotations

import functools

import torch

NAME = "qwen2_vl_dummy_vision_output"
# verl's own function, kept for the test that shows the assumption this patch lifts.
VERLS_FUNCTION = None


def apply() -> bool:
    """Install the wrapper (once per process); returns whether it is installed."""
    from verl.models.transformers import qwen2_vl
    from verl.utils.transformers_compat import unpack_visual_output

    global VERLS_FUNCTION
    original = qwen2_vl._get_input_embeds
    if getattr(original, "_verl_ext_patch", None) == NAME:
        return True
    VERLS_FUNCTION = original

    @functools.wraps(original)
    def _get_input_embeds(
        model,
        input_ids,
        attention_mask=None,
        pixel_values=None,
        pixel_values_videos=None,
        image_grid_thw=None,
        video_grid_thw=None,
    ):
        if pixel_values is not None or pixel_values_videos is not None:
            return original(
                model, input_ids, attention_mask, pixel_values, pixel_values_videos, image_grid_thw, video_grid_thw
            )
        # verl's text-only branch (same dummy 16-patch image), with the tower's output unpacked.
        inputs_embeds = model.get_input_embeddings()(input_ids)
        config = model.config.vision_config
        patch_dim = config.in_channels * config.temporal_patch_size * config.patch_size**2
        dummy = torch.zeros((16, patch_dim), dtype=inputs_embeds.dtype, device=inputs_embeds.device)
        grid = torch.tensor([[1, 4, 4]], dtype=torch.long, device=inputs_embeds.device)
        image_embeds, _ = unpack_visual_output(model.visual(dummy, grid_thw=grid))
        inputs_embeds = inputs_embeds + 0.0 * image_embeds.mean()
        if attention_mask is not None:
            attention_mask = attention_mask.to(inputs_embeds.device)
        return inputs_embeds, attention_mask

    _get_input_embeds._verl_ext_patch = NAME
    qwen2_vl._get_input_embeds = _get_input_embeds
    return True
