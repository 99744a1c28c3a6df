"""A tiny, randomly initialised Qwen2-VL with its tokenizer and processor, built locally (no hub).

``build_tiny_qwen2_vl(folder)`` writes a folder that ``transformers.AutoModelForImageTextToText``,
``AutoTokenizer`` and ``AutoProcessor`` (so verl's ``hf_tokenizer`` / ``hf_processor``) load like a hub
checkpoint. Sizes are chosen for a 2-core CPU:

* tokenizer: byte-level BPE with no merges (one token per byte, 256 tokens) plus Qwen2-VL's special tokens
  (``<|im_start|>``, ``<|im_end|>``, ``<|vision_start|>``, ``<|image_pad|>`` ...) and a Qwen-style chat template;
* text model: 2 layers, hidden 128, 2 attention heads of dimension 64, one KV head;
* vision tower: 2 layers, width 32, 14-pixel patches merged 2x2, so an image of at most 84 x 84 pixels
  (``max_pixels``) costs at most 9 tokens.
"""

from __future__ import annotations

import json
import os

SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)

# Qwen's chat template, reduced to what verl's agent loop renders: system/user/assistant turns whose content is
# a string or a list of {"type": "text"} / {"type": "image"} parts.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' or 'image' in part %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# The vision tower's patch grid: 14-pixel patches, merged 2 x 2 into one language-model token.
PATCH_SIZE = 14
MERGE_SIZE = 2
MAX_PIXELS = 84 * 84
MIN_PIXELS = 28 * 28


def _byte_level_tokenizer():
    """Byte-level BPE with an empty merge list: every UTF-8 byte is one token, any string round-trips."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {char: i for i, char in enumerate(sorted(ByteLevel.alphabet(), key=lambda c: ord(c)))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=list(SPECIAL_TOKENS[1:]),
    )
    tok.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS[1:])})
    tok.chat_template = CHAT_TEMPLATE
    return tok


def tiny_qwen2_vl_config(tokenizer):
    """``Qwen2VLConfig`` of the tiny model, its special-token ids taken from ``tokenizer``."""
    from transformers import Qwen2VLConfig

    ids = {tok: tokenizer.convert_tokens_to_ids(tok) for tok in SPECIAL_TOKENS}
    head_dim = 64
    return Qwen2VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": 2 * head_dim,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "max_position_embeddings": 4096,
            # Multimodal rope splits head_dim / 2 = 32 frequencies over (time, height, width).
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [8, 12, 12]},
            "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"],
            "tie_word_embeddings": False,
        },
        vision_config={
            "depth": 2,
            "embed_dim": 32,
            "hidden_size": 2 * head_dim,
            "num_heads": 2,
            "mlp_ratio": 2,
            "patch_size": PATCH_SIZE,
            "spatial_merge_size": MERGE_SIZE,
            "temporal_patch_size": 2,
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )


def vision_token_ids(config) -> list[int]:
    """Token ids a random model must never generate: in a response they break Qwen2-VL's rope index
    (``get_rope_index`` pairs every ``<|vision_start|>`` with an image that does not exist)."""
    return sorted(
        {
            int(config.image_token_id),
            int(config.video_token_id),
            int(config.vision_start_token_id),
            int(config.vision_end_token_id),
        }
    )


def build_tiny_qwen2_vl(folder: str, seed: int = 0) -> str:
    """Write the tiny model, tokenizer and processor into ``folder`` (created); returns ``folder``.

    Idempotent: a folder that already holds a complete build (``tiny_model.json`` with the same seed) is reused.
    """
    import torch
    from transformers import (
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    marker = os.path.join(folder, "tiny_model.json")
    if os.path.exists(marker):
        with open(marker) as f:
            if json.load(f).get("seed") == seed:
                return folder
    os.makedirs(folder, exist_ok=True)
    tokenizer = _byte_level_tokenizer()
    config = tiny_qwen2_vl_config(tokenizer)
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(config).to(torch.float32)
    model.generation_config.suppress_tokens = vision_token_ids(config)
    model.generation_config.eos_token_id = config.text_config.eos_token_id
    model.generation_config.pad_token_id = config.text_config.pad_token_id
    model.save_pretrained(folder)
    image_processor = Qwen2VLImageProcessor(
        min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS, patch_size=PATCH_SIZE, merge_size=MERGE_SIZE
    )
    video_processor = Qwen2VLVideoProcessor(
        min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS, patch_size=PATCH_SIZE, merge_size=MERGE_SIZE
    )
    processor = Qwen2VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    with open(marker, "w") as f:
        json.dump({"seed": seed, "kind": "qwen2_vl", "max_pixels": MAX_PIXELS}, f)
    return folder
