"""PixelLimitedDataset (verl_ext/data/pixel_limit.py): verl's RLHFDataset with DIVA's image limit, for the GRPO
baseline and every toolkit method, measured through verl's own length filter with a processor that allows large
images (as Qwen2.5-VL's does: 12,845,056 pixels)."""

from __future__ import annotations

import pytest
from diva_data_fixtures import data_config, make_row, picture, png_bytes, write_parquet
from verl.utils.dataset.rl_dataset import RLHFDataset

from verl_ext.data.dataset import DivaDataset
from verl_ext.data.pixel_limit import PixelLimitedDataset, image_items, limit_image_pixels

LIMIT = 84 * 84  # the tiny runs' MAX_PIXELS: a 280x280 image is 100 visual tokens unlimited, 9 limited


@pytest.fixture(scope="module")
def large_image_processor():
    """The tiny Qwen2-VL's processor, but with Qwen2.5-VL's own image limit (12,845,056 pixels)."""
    from transformers import Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor

    from verl_ext.cpu.tiny_model import CHAT_TEMPLATE, MERGE_SIZE, MIN_PIXELS, PATCH_SIZE, _byte_level_tokenizer

    sizes = {"min_pixels": MIN_PIXELS, "max_pixels": 12_845_056, "patch_size": PATCH_SIZE, "merge_size": MERGE_SIZE}
    return Qwen2VLProcessor(
        image_processor=Qwen2VLImageProcessor(**sizes),
        tokenizer=_byte_level_tokenizer(),
        video_processor=Qwen2VLVideoProcessor(**sizes),
        chat_template=CHAT_TEMPLATE,
    )


@pytest.fixture
def large_image_file(tmp_path):
    row = make_row("q0", question="Name the colour.", images=[png_bytes(picture(280, 280))])
    return write_parquet(tmp_path / "large.parquet", [row])


def config(path, tmp_path, max_prompt_length):
    cfg = data_config([path], [path], tmp_path / "cache", max_pixels=LIMIT)
    cfg.filter_overlong_prompts = True
    cfg.filter_overlong_prompts_workers = None  # in this process: a forked filter worker can hang in torch
    cfg.max_prompt_length = max_prompt_length
    return cfg


def prompt_tokens(dataset, processor) -> int:
    """The row's prompt length as verl's agent loop makes it (the images resized by qwen_vl_utils, then processed)."""
    import asyncio

    messages = dataset[0]["raw_prompt"]
    images, _ = asyncio.run(dataset.process_vision_info(messages, 14, dataset.config))
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return len(processor(text=[text], images=images, return_tensors="pt")["input_ids"][0])


def test_every_image_item_gets_the_limit_unless_it_names_its_own():
    messages = [
        {"role": "system", "content": "plain text"},
        {"role": "user", "content": [{"type": "image", "image": "a"}, {"type": "text", "text": "q"}]},
        {"role": "user", "content": [{"type": "image", "image": "b", "max_pixels": 100}]},
    ]
    limit_image_pixels(messages, LIMIT)
    assert [item.get("max_pixels") for item in image_items(messages)] == [LIMIT, 100]
    assert "max_pixels" not in messages[1]["content"][1]  # text items untouched


def test_rows_carry_the_limit_and_the_rollout_sees_the_limited_image(large_image_file, tmp_path, large_image_processor):
    cfg = config(large_image_file, tmp_path, 4096)
    limited = PixelLimitedDataset(large_image_file, large_image_processor.tokenizer, cfg, large_image_processor)
    plain = RLHFDataset(large_image_file, large_image_processor.tokenizer, cfg, large_image_processor)
    assert [item["max_pixels"] for item in image_items(limited[0]["raw_prompt"])] == [LIMIT]
    assert all("max_pixels" not in item for item in image_items(plain[0]["raw_prompt"]))
    # 280x280 unlimited: 100 merged visual tokens; limited to 84x84: 9. Everything else is the same row.
    assert prompt_tokens(plain, large_image_processor) - prompt_tokens(limited, large_image_processor) == 100 - 9


def test_the_length_filter_measures_the_images_the_rollout_will_see(large_image_file, tmp_path, large_image_processor):
    """A prompt that fits only with its image limited: verl's plain dataset drops it, the limited one keeps it (and so
    does DIVA's, which builds on it), so the GRPO baseline and DIVA-GRPO train on the same questions."""
    tokenizer = large_image_processor.tokenizer
    probe = PixelLimitedDataset(
        large_image_file, tokenizer, config(large_image_file, tmp_path, 4096), large_image_processor
    )
    fits = prompt_tokens(probe, large_image_processor)
    cfg = config(large_image_file, tmp_path, fits)
    assert len(RLHFDataset(large_image_file, tokenizer, cfg, large_image_processor)) == 0
    assert len(PixelLimitedDataset(large_image_file, tokenizer, cfg, large_image_processor)) == 1
    assert len(DivaDataset(large_image_file, tokenizer, cfg, large_image_processor, split="val")) == 1
    tighter = config(large_image_file, tmp_path, fits - 1)
    assert len(PixelLimitedDataset(large_image_file, tokenizer, tighter, large_image_processor)) == 0
