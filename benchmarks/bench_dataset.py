"""DivaDataset versus verl's RLHFDataset through a two-worker DataLoader, and ms per image perturbation.

Measured side by side in one process on the same parquet (1024 x 1024 PNG figures):

* prompts per second through ``StatefulDataLoader(num_workers=2, collate_fn=verl's collate_fn)`` for
  verl's ``RLHFDataset`` (one prompt per question) and ``DivaDataset`` (original + one variant per
  question, every variant an image perturbation: all difficulties set to 1, the paper planner);
  the figure of merit is the ratio of time per emitted prompt (target <= 1.5);
* milliseconds per perturbation kind on a one-megapixel image (including the ``max_pixels`` limit),
  next to the cost of decoding the PNG.

Run: ``python benchmarks/bench_dataset.py`` (``--quick`` for a seconds-long smoke run). The last line
printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from omegaconf import OmegaConf
from PIL import Image, ImageDraw
from record import add_no_record, record
from torch.utils.data import SequentialSampler
from torchdata.stateful_dataloader import StatefulDataLoader
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

from verl_ext.config import VariantConfig
from verl_ext.data.dataset import DivaDataset
from verl_ext.data.perturb import apply_perturbations
from verl_ext.data.planner import PAPER_TRANSFORMS, transform_params
from verl_ext.data.sampler import QuestionBlockSampler
from verl_ext.data.schema import SCHEMA, build_prompt

TARGET_RATIO = 1.5  # time per emitted prompt, DivaDataset over RLHFDataset


class _Processor:
    """RLHFDataset only checks that a processor exists for image rows (it runs later, in the agent loop)."""

    class image_processor:  # noqa: N801 - mirrors the attribute verl reads
        patch_size = 14


def figure(size: int, seed: int) -> Image.Image:
    """A math-figure-like picture: light background, shapes, lines and labels (compresses like real PNGs)."""
    rng = np.random.default_rng(seed)
    image = Image.new("RGB", (size, size), (250, 250, 245))
    draw = ImageDraw.Draw(image)
    for _ in range(12):
        x0, y0 = (int(v) for v in rng.integers(0, size - size // 4, 2))
        x1, y1 = x0 + int(rng.integers(size // 16, size // 4)), y0 + int(rng.integers(size // 16, size // 4))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)([x0, y0, x1, y1], outline=colour, width=3)
    for _ in range(20):
        points = [tuple(int(v) for v in rng.integers(0, size, 2)) for _ in range(2)]
        draw.line(points, fill=(20, 20, 20), width=2)
        draw.text(points[0], "ABCDEF"[int(rng.integers(6))], fill=(0, 0, 0))
    # a photo-like gradient patch so the image is not trivially compressible
    patch = np.linspace(0, 255, size // 3, dtype=np.float32)
    grad = np.stack([*np.meshgrid(patch, patch), np.full((size // 3, size // 3), 128.0)], -1).astype(np.uint8)
    image.paste(Image.fromarray(grad), (size // 2, size // 2))
    return image


def write_parquet(path: str, num_questions: int, size: int) -> None:
    rows = []
    for i in range(num_questions):
        buf = io.BytesIO()
        figure(size, i).save(buf, format="PNG")
        question = f"In the figure, find the length of segment AB for case {i}."
        rows.append(
            {
                "data_source": "bench",
                "prompt": build_prompt(question, 1),
                "images": [{"bytes": buf.getvalue(), "path": ""}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": "5"},
                "extra_info": {
                    "split": "train",
                    "index": i,
                    "question_id": f"b{i}",
                    "answer": "5",
                    "question": question,
                },
                "question": question,
                "paraphrases": [f"Determine AB in the figure (case {i})."],
                "hint_steps": ["Look at triangle ABC.", "Apply the Pythagorean theorem."],
                "text_in_image": True,
                "difficulty": 1.0,
            }
        )
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path)


def time_loader(dataset, sampler, batch_size: int) -> tuple[float, int]:
    """Seconds to iterate one epoch through two workers, and the number of prompts emitted."""
    loader = StatefulDataLoader(
        dataset, batch_size=batch_size, sampler=sampler, num_workers=2, collate_fn=collate_fn, drop_last=True
    )
    start, prompts = time.perf_counter(), 0
    for batch in loader:
        prompts += len(batch["raw_prompt"])
    return time.perf_counter() - start, prompts


def bench_perturbations(size: int, repeats: int) -> dict[str, float]:
    cfg = VariantConfig()
    rng = np.random.default_rng(0)
    image = figure(size, 123)
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    data = buf.getvalue()
    out = {}
    start = time.perf_counter()
    for _ in range(repeats):
        Image.open(io.BytesIO(data)).convert("RGB")
    out["png_decode"] = (time.perf_counter() - start) / repeats * 1e3
    kinds = {name: [(name, transform_params(name, 0.5, rng, cfg))] for name in PAPER_TRANSFORMS}
    text = "In the figure, find the length of segment AB, given that the circle has radius 3 and AC = 4."
    kinds["text_band"] = [("text_band", {"text": text, "position": "top", "font_frac": 0.025})]
    for name, steps in kinds.items():
        apply_perturbations(image, steps, cfg.max_pixels)  # warm caches (font)
        start = time.perf_counter()
        for _ in range(repeats):
            apply_perturbations(image, steps, cfg.max_pixels)
        out[name] = (time.perf_counter() - start) / repeats * 1e3
    return out


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run in seconds")
    parser.add_argument("--questions", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None, help="alternating timing rounds (best is kept)")
    add_no_record(parser)
    args = parser.parse_args()
    size = 256 if args.quick else 1024
    questions = args.questions or (16 if args.quick else 96)
    rounds = args.rounds or (1 if args.quick else 3)
    batch = 8

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "bench.parquet")
        write_parquet(path, questions, size)
        config = OmegaConf.create(
            {
                "train_files": [path],
                "val_files": [path + ".val"],
                "filter_overlong_prompts": False,
                "cache_dir": os.path.join(tmp, "cache"),
                "diva": {"variants": {"variants_per_question": 1, "planner": "paper"}},
            }
        )
        verl_ds = RLHFDataset(path, None, config, processor=_Processor())
        diva_ds = DivaDataset(path, None, config, processor=_Processor())
        diva_ds.difficulty_table.values.fill_(1.0)  # every variant is an image perturbation
        verl_times, diva_times = [], []
        for _ in range(rounds):
            seconds, verl_prompts = time_loader(verl_ds, SequentialSampler(verl_ds), batch)
            verl_times.append(seconds)
            seconds, diva_prompts = time_loader(diva_ds, QuestionBlockSampler(diva_ds, shuffle=False), batch)
            diva_times.append(seconds)
    verl_ms = min(verl_times) / verl_prompts * 1e3
    diva_ms = min(diva_times) / diva_prompts * 1e3
    perturb_ms = bench_perturbations(size, 2 if args.quick else 5)

    print(f"image {size}x{size}, {questions} questions, batch {batch}, 2 workers, best of {rounds}")
    print(f"RLHFDataset : {verl_prompts:5d} prompts  {verl_ms:8.2f} ms/prompt  {1e3 / verl_ms:8.1f} prompts/s")
    print(f"DivaDataset : {diva_prompts:5d} prompts  {diva_ms:8.2f} ms/prompt  {1e3 / diva_ms:8.1f} prompts/s")
    print(f"time per emitted prompt, DivaDataset / RLHFDataset = {diva_ms / verl_ms:.2f} (target <= {TARGET_RATIO})")
    for name, ms in perturb_ms.items():
        print(f"  {name:15s} {ms:8.2f} ms")
    result = {
        "image_size": size,
        "questions": questions,
        "verl_prompts_per_s": round(1e3 / verl_ms, 2),
        "diva_prompts_per_s": round(1e3 / diva_ms, 2),
        "time_per_prompt_ratio": round(diva_ms / verl_ms, 3),
        "target_time_per_prompt_ratio": TARGET_RATIO,
        "perturb_ms": {k: round(v, 2) for k, v in perturb_ms.items()},
    }
    if not args.no_record:
        record("dataset_quick" if args.quick else "dataset", result)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
