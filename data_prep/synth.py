"""``diva-prep synth``: a small synthetic multimodal math set drawn with PIL, with verifiable integer answers.

Four figure kinds, chosen round-robin so every kind appears in any set of four or more rows:

* bar chart with the value printed above each bar -> sum or maximum of the bars
* number line with labelled ticks and two marked points -> distance between the points
* rectangle with labelled sides -> area or perimeter
* right triangle with labelled legs -> area (legs chosen so it is an integer)

Every row carries two templated paraphrases and three hint steps that describe the method without any number from
the figure, so they never state the answer. Everything is drawn from ``random.Random(seed)``: same seed, same bytes.
"""

from __future__ import annotations

import io
import random
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from data_prep.parquet_io import DivaParquetWriter
from verl_ext.data.schema import build_prompt

IMAGE_SIZE = (384, 288)
DATA_SOURCE = "diva_synth"


@lru_cache(maxsize=1)
def _font() -> ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=18)
    except (TypeError, OSError):  # Pillow built without FreeType: the fixed bitmap font still draws digits
        return ImageFont.load_default()


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=False)
    return buffer.getvalue()


def _canvas() -> tuple[Image.Image, ImageDraw.ImageDraw]:
    image = Image.new("RGB", IMAGE_SIZE, "white")
    return image, ImageDraw.Draw(image)


def bar_chart(rng: random.Random) -> dict:
    values = [rng.randint(1, 9) for _ in range(rng.randint(3, 6))]
    image, draw = _canvas()
    width, height = IMAGE_SIZE
    base, unit, slot = height - 40, (height - 90) / 9, (width - 40) / len(values)
    draw.line([(20, base), (width - 20, base)], fill="black", width=2)
    for i, value in enumerate(values):
        left = 20 + i * slot + slot * 0.2
        right = 20 + (i + 1) * slot - slot * 0.2
        top = base - value * unit
        draw.rectangle([left, top, right, base], fill=(70, 120, 200), outline="black")
        draw.text(((left + right) / 2, top - 4), str(value), fill="black", font=_font(), anchor="mb")
        draw.text(((left + right) / 2, base + 6), chr(ord("A") + i), fill="black", font=_font(), anchor="mt")
    if rng.random() < 0.5:
        return {
            "image": image,
            "question": "The bar chart shows a value above each bar. What is the sum of all the bar values?",
            "answer": str(sum(values)),
            "paraphrases": [
                "Add up the values of every bar in the chart. What total do you get?",
                "What do the values written above the bars add up to?",
            ],
            "hint_steps": [
                "Read the value written above each bar, from left to right.",
                "List every bar's value so that none is skipped.",
                "Add the values one bar at a time, keeping a running total.",
            ],
        }
    return {
        "image": image,
        "question": "The bar chart shows a value above each bar. What is the largest bar value?",
        "answer": str(max(values)),
        "paraphrases": [
            "Which value is the greatest among the bars in the chart?",
            "What is the value of the tallest bar in the chart?",
        ],
        "hint_steps": [
            "Read the value written above each bar.",
            "Compare the bars' values two at a time, keeping the larger one.",
            "The value kept after comparing every bar is the largest.",
        ],
    }


def number_line(rng: random.Random) -> dict:
    start = rng.randint(-10, 5)
    ticks = list(range(start, start + 11))
    first, second = sorted(rng.sample(ticks, 2))
    image, draw = _canvas()
    width, height = IMAGE_SIZE
    y, left, step = height // 2, 30, (width - 60) / 10
    draw.line([(left - 10, y), (width - 20, y)], fill="black", width=2)
    for i, tick in enumerate(ticks):
        x = left + i * step
        draw.line([(x, y - 8), (x, y + 8)], fill="black", width=2)
        draw.text((x, y + 14), str(tick), fill="black", font=_font(), anchor="mt")
    for label, value in (("P", first), ("Q", second)):
        x = left + ticks.index(value) * step
        draw.ellipse([x - 6, y - 6, x + 6, y + 6], fill=(200, 40, 40))
        draw.text((x, y - 14), label, fill=(200, 40, 40), font=_font(), anchor="mb")
    return {
        "image": image,
        "question": "Points P and Q are marked on the number line. What is the distance between P and Q?",
        "answer": str(second - first),
        "paraphrases": [
            "How far apart are the points P and Q on the number line?",
            "On the number line, what is the length of the segment from P to Q?",
        ],
        "hint_steps": [
            "Read the tick label directly below point P.",
            "Read the tick label directly below point Q.",
            "The distance is the larger label minus the smaller label.",
        ],
    }


def rectangle(rng: random.Random) -> dict:
    side_w, side_h = rng.randint(2, 15), rng.randint(2, 12)
    image, draw = _canvas()
    width, height = IMAGE_SIZE
    scale = min((width - 120) / side_w, (height - 100) / side_h)
    left, top = (width - side_w * scale) / 2, (height - side_h * scale) / 2
    right, bottom = left + side_w * scale, top + side_h * scale
    draw.rectangle([left, top, right, bottom], outline="black", width=3)
    draw.text(((left + right) / 2, bottom + 8), f"{side_w} cm", fill="black", font=_font(), anchor="mt")
    draw.text((right + 8, (top + bottom) / 2), f"{side_h} cm", fill="black", font=_font(), anchor="lm")
    if rng.random() < 0.5:
        return {
            "image": image,
            "question": "The rectangle's sides are labelled in centimetres. What is its area in square centimetres?",
            "answer": str(side_w * side_h),
            "paraphrases": [
                "How many square centimetres does the labelled rectangle cover?",
                "Find the area, in square centimetres, of the rectangle shown.",
            ],
            "hint_steps": [
                "Read the length of the bottom side from its label.",
                "Read the length of the right side from its label.",
                "The area of a rectangle is one side length times the other.",
            ],
        }
    return {
        "image": image,
        "question": "The rectangle's sides are labelled in centimetres. What is its perimeter in centimetres?",
        "answer": str(2 * (side_w + side_h)),
        "paraphrases": [
            "How long, in centimetres, is the boundary of the labelled rectangle?",
            "Find the perimeter of the rectangle shown, in centimetres.",
        ],
        "hint_steps": [
            "Read the two labelled side lengths.",
            "Opposite sides of a rectangle are equal, so each length occurs twice.",
            "Add all four sides, or double the sum of the two labelled sides.",
        ],
    }


def right_triangle(rng: random.Random) -> dict:
    leg_a, leg_b = 2 * rng.randint(1, 7), rng.randint(2, 12)  # an even leg keeps the area an integer
    image, draw = _canvas()
    width, height = IMAGE_SIZE
    scale = min((width - 120) / leg_b, (height - 100) / leg_a)
    corner = (60, height - 50)
    top, right = (corner[0], corner[1] - leg_a * scale), (corner[0] + leg_b * scale, corner[1])
    draw.polygon([corner, top, right], outline="black", width=3)
    draw.rectangle([corner[0], corner[1] - 14, corner[0] + 14, corner[1]], outline="black", width=2)
    draw.text((corner[0] - 8, (corner[1] + top[1]) / 2), f"{leg_a}", fill="black", font=_font(), anchor="rm")
    draw.text(((corner[0] + right[0]) / 2, corner[1] + 8), f"{leg_b}", fill="black", font=_font(), anchor="mt")
    return {
        "image": image,
        "question": "The right triangle's two legs are labelled. What is the area of the triangle?",
        "answer": str(leg_a * leg_b // 2),
        "paraphrases": [
            "Find the area of the right triangle whose legs are labelled in the figure.",
            "How large is the area enclosed by the right triangle shown?",
        ],
        "hint_steps": [
            "The two labelled sides meet at the right angle, so they are the base and the height.",
            "Multiply the two leg lengths.",
            "A triangle's area is half of base times height, so halve that product.",
        ],
    }


FIGURES: tuple[Callable[[random.Random], dict], ...] = (bar_chart, number_line, rectangle, right_triangle)


def synth_rows(n: int, seed: int = 0, split: str = "train"):
    """Yield ``n`` DIVA rows (dicts in :data:`verl_ext.data.schema.SCHEMA`), deterministic in ``seed``."""
    rng = random.Random(seed)
    for index in range(n):
        item = FIGURES[index % len(FIGURES)](rng)
        yield {
            "data_source": DATA_SOURCE,
            "prompt": build_prompt(item["question"], 1),
            "images": [{"bytes": _png(item["image"]), "path": ""}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": item["answer"]},
            "extra_info": {
                "split": split,
                "index": index,
                "question_id": f"{DATA_SOURCE}/{split}/{seed}/{index}",
                "answer": item["answer"],
                "question": item["question"],
            },
            "question": item["question"],
            "paraphrases": item["paraphrases"],
            "hint_steps": item["hint_steps"],
            "text_in_image": True,
            "difficulty": None,
        }


def synth(output: str | Path, n: int, seed: int = 0, split: str = "train") -> int:
    """Write ``n`` synthetic rows to ``output``; returns the row count."""
    with DivaParquetWriter(output) as writer:
        for row in synth_rows(n, seed, split):
            writer.write(row)
        writer.commit()
        return writer.rows_written
