"""``diva-prep swatch``: colour-swatch questions a tiny model can learn on a CPU, with a controllable difficulty.

Each image (84 x 84 pixels, the tiny CPU model's size) shows one coloured square on a grey background; the answer
is the number the square's colour stands for (:data:`PALETTE`: red 1, green 2, blue 3, yellow 4), written in
``\\boxed{}`` and checked by the project's reward (:func:`verl_ext.reward.compute_score`, math-verify). The answer
depends on the image only: the question text is the same for every row.

Difficulty: each row draws a ``hardness`` h in ``[0, 1]`` (uniform, or fixed by ``hardness=``). The square's side
shrinks from 48 to 14 pixels and its colour fades towards the background grey (saturation 1.0 to 0.2) as h
grows, so fewer and weaker pixels carry the answer. The paper's three variant kinds mean what they should:

* image perturbations (DIVA's ``image_perturb``: noise, speckle, salt-and-pepper, blur, low resolution,
  rotation) blur or bury a small, faint square in the grey: an easy question gets harder;
* paraphrases (two per row) change the wording only: the answer and the evidence stay;
* hint steps name the colour's family, then the colour and its place in the question's list ("the third colour"),
  then the rule (never the number as a digit): a hard question, whose square is hard to see or whose colour's number
  the policy does not know, becomes a reading question, easier.

Everything is drawn from ``random.Random(seed)``: same seed, same bytes. The ``difficulty`` column stays null: the
difficulty service starts every question at its ``d_init`` and learns it, as in the paper.
"""

from __future__ import annotations

import io
import random
from pathlib import Path

from PIL import Image, ImageDraw

from data_prep.parquet_io import DivaParquetWriter
from verl_ext.data.schema import build_prompt

DATA_SOURCE = "diva_swatch"
IMAGE_SIZE = 84
BACKGROUND = (128, 128, 128)
# (name, RGB, the number it stands for); warm and cool families are what the first hint step names.
PALETTE = (
    ("red", (230, 30, 30), "1"),
    ("green", (30, 200, 50), "2"),
    ("blue", (30, 60, 235), "3"),
    ("yellow", (240, 220, 20), "4"),
)
FAMILY = {
    "red": "warm (red or yellow)",
    "yellow": "warm (red or yellow)",
    "green": "cool (green or blue)",
    "blue": "cool (green or blue)",
}
# A hint names the colour's place in the question's list as a word, never the number itself.
ORDINAL = ("first", "second", "third", "fourth")
SIDE_RANGE = (48, 14)  # side in pixels at hardness 0 and 1
SATURATION_RANGE = (1.0, 0.2)
QUESTION = "The colour of the square stands for a number: red 1, green 2, blue 3, yellow 4. Which number is it?"
PARAPHRASES = (
    "Red means 1, green 2, blue 3 and yellow 4. What number does the square's colour mean?",
    "Each colour is a number (red 1, green 2, blue 3, yellow 4). Give the number of the square's colour.",
)


def answer_text(colour: str) -> str:
    """The completion a solver writes for ``colour``: the colour as its reasoning, the number boxed."""
    number = {name: num for name, _, num in PALETTE}[colour]
    return f"<think>{colour}</think>\\boxed{{{number}}}"


def _lerp(pair: tuple[float, float], t: float) -> float:
    return pair[0] + t * (pair[1] - pair[0])


def swatch_image(rgb: tuple[int, int, int], hardness: float, rng: random.Random) -> Image.Image:
    """The grey canvas with one square of ``rgb`` faded and shrunk by ``hardness`` at a random position."""
    if not 0.0 <= hardness <= 1.0:
        raise ValueError(f"hardness must be in [0, 1], got {hardness}")
    side = round(_lerp(SIDE_RANGE, hardness))
    saturation = _lerp(SATURATION_RANGE, hardness)
    colour = tuple(round(b + saturation * (c - b)) for c, b in zip(rgb, BACKGROUND, strict=True))
    image = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), BACKGROUND)
    left, top = rng.randint(0, IMAGE_SIZE - side), rng.randint(0, IMAGE_SIZE - side)
    ImageDraw.Draw(image).rectangle([left, top, left + side - 1, top + side - 1], fill=colour)
    return image


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=False)
    return buffer.getvalue()


def blank_image() -> Image.Image:
    """The grey canvas with no square: an image that tells nothing (the warm start's hint-only examples)."""
    return Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), BACKGROUND)


def swatch_rows(n: int, seed: int = 0, split: str = "train", hardness: float | None = None, max_hardness: float = 1.0):
    """Yield ``n`` DIVA rows (dicts in :data:`verl_ext.data.schema.SCHEMA`); colours cycle so each appears n/4 times.

    Hardness is ``hardness`` when given, else uniform in ``[0, max_hardness]``."""
    if not 0.0 <= max_hardness <= 1.0:
        raise ValueError(f"max_hardness must be in [0, 1], got {max_hardness}")
    rng = random.Random(seed)
    for index in range(n):
        name, rgb, number = PALETTE[index % len(PALETTE)]
        h = rng.random() * max_hardness if hardness is None else float(hardness)
        image = swatch_image(rgb, h, rng)
        yield {
            "data_source": DATA_SOURCE,
            "prompt": build_prompt(QUESTION, 1),
            "images": [{"bytes": _png(image), "path": ""}],
            "ability": "perception",
            "reward_model": {"style": "rule", "ground_truth": number},
            "extra_info": {
                "split": split,
                "index": index,
                "question_id": f"{DATA_SOURCE}/{split}/{seed}/{index}",
                "answer": number,
                "question": QUESTION,
            },
            "question": QUESTION,
            "paraphrases": list(PARAPHRASES),
            "hint_steps": [
                f"The square's colour is {FAMILY[name]}.",
                f"Looking closely, the square is {name}, the {ORDINAL[index % len(PALETTE)]} colour of the "
                "question's list.",
                "Match that colour to its number in the question's list.",
            ],
            "text_in_image": False,  # the question drawn into 84 pixels would be unreadable, not harder
            "difficulty": None,
        }


def swatch(output: str | Path, n: int, seed: int = 0, split: str = "train", hardness: float | None = None) -> int:
    """Write ``n`` swatch rows to ``output``; returns the row count."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    with DivaParquetWriter(output) as writer:
        for row in swatch_rows(n, seed, split, hardness):
            writer.write(row)
        writer.commit()
        return writer.rows_written
