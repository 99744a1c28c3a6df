"""A tiny, randomly initialised Qwen2.5-VL or Qwen2-VL with its tokenizer and processor, built locally (no hub).

``build_tiny_vlm(folder, arch)`` (``arch``: :data:`ARCHS`; ``build_tiny_qwen2_vl(folder)`` for Qwen2-VL) writes a
folder that ``transformers.AutoModelForImageTextToText``,
``AutoTokenizer`` and ``AutoProcessor`` (so verl's ``hf_tokenizer`` / ``hf_processor``) load like a hub
checkpoint. Sizes are chosen for a 2-core CPU:

* tokenizer: byte-level BPE with no merges (one token per byte, 256 tokens) plus Qwen2-VL's special tokens
  (``<|im_start|>``, ``<|im_end|>``, ``<|vision_start|>``, ``<|image_pad|>`` ...) and a Qwen-style chat template;
* text model: 2 layers, hidden 128, 2 attention heads of dimension 64, one KV head;
* vision tower: 2 layers, width 32, 14-pixel patches merged 2x2, so an image of at most 84 x 84 pixels
  (``max_pixels``) costs at most 9 tokens. Qwen2.5-VL's, as the 7B's shrunk: 4 blocks, windowed attention in
  windows of 56 pixels (2 x 2 merged tokens; the 7B: 112) but for full-attention blocks 1 and 3 (the 7B: every
  eighth, [7, 15, 23, 31]), RMSNorm and a gated MLP, so that an 84-pixel image spans several windows.

The main job's model class is Qwen2.5-VL (``Qwen2_5_VLForConditionalGeneration``): the CPU runs build it by default
(``TINY_ARCH``: :data:`DEFAULT_ARCH`); the swatch task's warm start and the seed sweeps' recorded runs stay on
Qwen2-VL, which they were recorded with (:mod:`verl_ext.lab.compare`).
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


def tiny_qwen2_5_vl_config(tokenizer):
    """``Qwen2_5_VLConfig`` of the tiny model: the text model of :func:`tiny_qwen2_vl_config`, Qwen2.5-VL's vision
    tower (window attention with full-attention blocks, RMSNorm, gated MLP) shrunk."""
    from transformers import Qwen2_5_VLConfig

    base = tiny_qwen2_vl_config(tokenizer)
    text = base.text_config.to_dict()
    text = {
        k: text[k]
        for k in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "max_position_embeddings",
            "rope_parameters",
            "bos_token_id",
            "eos_token_id",
            "pad_token_id",
            "tie_word_embeddings",
        )
    }
    return Qwen2_5_VLConfig(
        text_config=text,
        vision_config={
            "depth": 4,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": text["hidden_size"],
            "patch_size": PATCH_SIZE,
            "spatial_merge_size": MERGE_SIZE,
            "temporal_patch_size": 2,
            "window_size": 2 * PATCH_SIZE * MERGE_SIZE,
            "fullatt_block_indexes": [1, 3],
        },
        image_token_id=base.image_token_id,
        video_token_id=base.video_token_id,
        vision_start_token_id=base.vision_start_token_id,
        vision_end_token_id=base.vision_end_token_id,
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


# The tiny model's architectures (``TINY_ARCH``); the 7B job's is Qwen2.5-VL.
ARCHS = ("qwen2_5_vl", "qwen2_vl")
DEFAULT_ARCH = "qwen2_5_vl"


def tiny_model_dir_name(arch: str) -> str:
    """The folder name of the tiny model of ``arch`` in a CPU run's workdir."""
    return f"tiny_{check_arch(arch)}"


def check_arch(arch: str) -> str:
    if arch not in ARCHS:
        raise ValueError(f"TINY_ARCH={arch!r}: expected one of {ARCHS} (the main job's model class: {DEFAULT_ARCH})")
    return arch


def build_tiny_qwen2_vl(folder: str, seed: int = 0) -> str:
    """:func:`build_tiny_vlm` of Qwen2-VL (the swatch task's warm start and the recorded sweeps)."""
    return build_tiny_vlm(folder, seed, arch="qwen2_vl")


def build_tiny_vlm(folder: str, seed: int = 0, arch: str = DEFAULT_ARCH) -> str:
    """Write the tiny model of ``arch`` (:data:`ARCHS`), its tokenizer and processor into ``folder`` (created);
    returns ``folder``.

    Idempotent: a folder that already holds a complete build (``tiny_model.json`` with the same seed and
    architecture) is reused.
    """
    import torch
    from transformers import (
        Qwen2_5_VLForConditionalGeneration,
        Qwen2_5_VLProcessor,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )
    from transformers.utils import logging as hf_logging

    check_arch(arch)
    marker = os.path.join(folder, "tiny_model.json")
    if os.path.exists(marker):
        with open(marker) as f:
            built = json.load(f)
        if built.get("seed") == seed and built.get("kind") == arch:
            return folder
    os.makedirs(folder, exist_ok=True)
    tokenizer = _byte_level_tokenizer()
    torch.manual_seed(seed)
    if arch == "qwen2_5_vl":
        config = tiny_qwen2_5_vl_config(tokenizer)
        model = Qwen2_5_VLForConditionalGeneration(config).to(torch.float32)
        processor_cls = Qwen2_5_VLProcessor
    else:
        config = tiny_qwen2_vl_config(tokenizer)
        model = Qwen2VLForConditionalGeneration(config).to(torch.float32)
        processor_cls = Qwen2VLProcessor
    model.generation_config.suppress_tokens = vision_token_ids(config)
    model.generation_config.eos_token_id = config.text_config.eos_token_id
    model.generation_config.pad_token_id = config.text_config.pad_token_id
    # transformers draws a "Writing model shards" progress bar for a model of a few MB, before the launcher's header.
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(folder)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    image_processor = Qwen2VLImageProcessor(
        min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS, patch_size=PATCH_SIZE, merge_size=MERGE_SIZE
    )
    video_processor = Qwen2VLVideoProcessor(
        min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS, patch_size=PATCH_SIZE, merge_size=MERGE_SIZE
    )
    processor = processor_cls(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    with open(marker, "w") as f:
        json.dump({"seed": seed, "kind": arch, "max_pixels": MAX_PIXELS}, f)
    return folder
