"""PixelLimitedDataset: verl's ``RLHFDataset`` with every image limited to ``diva.variants.max_pixels``.

verl's dataset hands each image to the processor as the parquet stores it, and Qwen2.5-VL's image processing
(``qwen_vl_utils.fetch_image``, then the HF processor) allows up to 12,845,056 pixels (16,384 visual tokens). DIVA's
dataset limits every image, original or variant, to ``diva.variants.max_pixels`` (``MAX_PIXELS`` in the launchers).
A baseline on verl's plain dataset would therefore train on other images than DIVA-GRPO at the same ``MAX_PIXELS``:
larger ones, with up to 12x the visual tokens, and without the prompts verl's length filter drops because of them.
The GRPO baseline and every toolkit method use this class (``data.custom_cls``), so that every method of the project
sees the same images; :class:`verl_ext.data.dataset.DivaDataset` builds on it.

The limit is the per-image ``max_pixels`` key that ``qwen_vl_utils.fetch_image`` reads (verl's agent loop and its
length filter both resize through it), set in :meth:`_build_messages`, the one place verl builds a row's messages:
the prompt-length filter measures the images the rollout will see. An image item that names its own ``max_pixels``
keeps it.
"""

from __future__ import annotations

from verl.utils.dataset.rl_dataset import RLHFDataset

from verl_ext.config import diva_config_from


def image_items(messages: list[dict]) -> list[dict]:
    """The ``{"type": "image", ...}`` content items of chat ``messages`` (text-only content is skipped)."""
    return [
        item
        for message in messages
        if isinstance(message.get("content"), list)
        for item in message["content"]
        if item.get("type") == "image"
    ]


def limit_image_pixels(messages: list[dict], max_pixels: int) -> list[dict]:
    """Give every image item of ``messages`` the resolution limit ``max_pixels`` unless it names one; returns them."""
    for item in image_items(messages):
        item.setdefault("max_pixels", max_pixels)
    return messages


class PixelLimitedDataset(RLHFDataset):
    """verl's ``RLHFDataset``, every image limited to ``config.diva.variants.max_pixels`` (the recipe sets
    ``data.diva: ${diva}``; absent, the paper default). Plug it in with
    ``data.custom_cls.path=pkg://verl_ext.data.pixel_limit data.custom_cls.name=PixelLimitedDataset``."""

    def __init__(self, data_files, tokenizer, config, processor=None, max_samples: int = -1):
        self.max_pixels = diva_config_from(config.get("diva", None)).variants.max_pixels
        super().__init__(data_files, tokenizer, config, processor=processor, max_samples=max_samples)

    def _build_messages(self, example: dict, key: str):
        return limit_image_pixels(super()._build_messages(example, key), self.max_pixels)
