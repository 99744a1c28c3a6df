"""Small DIVA parquet files and configs for the dataset tests (no hub, no downloads)."""

from __future__ import annotations

import io
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from omegaconf import OmegaConf
from PIL import Image, ImageDraw

from verl_ext.data.schema import SCHEMA, build_prompt


def picture(width: int = 64, height: int = 48, seed: int = 0) -> Image.Image:
    """A structured RGB picture: colour gradient, a few shapes, mild noise (compresses like real figures)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // max(1, width - 1), y * 255 // max(1, height - 1), np.full_like(x, 128)], axis=-1)
    image = Image.fromarray(base.astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(image)
    for _ in range(4):
        x0, y0 = int(rng.integers(0, width - 4)), int(rng.integers(0, height - 4))
        x1, y1 = x0 + int(rng.integers(2, max(3, width // 3))), y0 + int(rng.integers(2, max(3, height // 3)))
        draw.rectangle([x0, y0, x1, y1], fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
    pixels = np.asarray(image).astype(np.int16) + rng.integers(-3, 4, (height, width, 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")


def png_bytes(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def make_row(
    qid: str,
    *,
    question: str | None = None,
    images: list[bytes] | None = None,
    paraphrases: list[str] | None = None,
    hint_steps: list[str] | None = None,
    text_in_image: bool = True,
    difficulty: float | None = None,
    index: int = 0,
) -> dict:
    question = question or f"What is the area of the shaded region in figure {qid}?"
    images = [png_bytes(picture(seed=index))] if images is None else images
    return {
        "data_source": "unit",
        "prompt": build_prompt(question, len(images)),
        "images": [{"bytes": b, "path": ""} for b in images],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "42"},
        "extra_info": {"split": "train", "index": index, "question_id": qid, "answer": "42", "question": question},
        "question": question,
        "paraphrases": [f"Paraphrase {k} of question {qid}." for k in range(2)] if paraphrases is None else paraphrases,
        "hint_steps": [f"Step text {k} for {qid}." for k in range(4)] if hint_steps is None else hint_steps,
        "text_in_image": text_in_image,
        "difficulty": difficulty,
    }


def write_parquet(path, rows: list[dict]) -> str:
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), str(path))
    return str(path)


def data_config(train_files, val_files, cache_dir, **diva_variants):
    """A verl ``data`` config as the trainer passes it (recipe: ``data.diva: ${diva}``)."""
    return OmegaConf.create(
        {
            "train_files": [str(f) for f in train_files],
            "val_files": [str(f) for f in val_files],
            "prompt_key": "prompt",
            "image_key": "images",
            "filter_overlong_prompts": False,  # no tokenizer needed: the dataset never tokenizes in verl 0.9.1
            "cache_dir": str(cache_dir),
            "shuffle": False,
            "diva": {"variants": dict(diva_variants)},
        }
    )


# RLHFDataset only asserts a processor exists for multimodal rows (the processor runs later, in the
# agent loop); this carries the one attribute it reads (the patch size).
PROCESSOR = SimpleNamespace(image_processor=SimpleNamespace(patch_size=14))


def images_of(row: dict) -> list[Image.Image]:
    """The PIL images of an emitted row's raw_prompt, in placeholder order."""
    out = []
    for message in row["raw_prompt"]:
        if isinstance(message["content"], list):
            out += [item["image"] for item in message["content"] if item["type"] == "image"]
    return out


def user_text(row: dict) -> str:
    message = [m for m in row["raw_prompt"] if m["role"] == "user"][-1]
    content = message["content"]
    if isinstance(content, str):
        return content
    return "".join(item["text"] if item["type"] == "text" else f"<{item['type']}>" for item in content)
