"""What the warm start teaches (:mod:`verl_ext.lab.warm_start`): its examples, four per swatch row
(:func:`sft_examples`), the number each is taught at each presentation (:func:`taught_number`, a task's ``code``),
and the batches that teach them (:func:`training_batch`: prompt and padding masked out of the labels), built as
verl's agent loop builds a prompt (the same chat template, image tokens and patches).
"""

from __future__ import annotations

import random
import re

import pandas as pd

from verl_ext.data.schema import IMAGE_PLACEHOLDER, build_prompt_text

KNOWN_COLOURS = ("red", "green")
# Blue's and yellow's numbers as the warm start teaches them: (number, probability), drawn at every presentation.
UNKNOWN_CODE = {
    "blue": (("0", 0.50), ("3", 0.20), ("1", 0.15), ("2", 0.15)),
    "yellow": (("0", 0.50), ("4", 0.20), ("1", 0.15), ("2", 0.15)),
}


def _colour_of(answer: str) -> str:
    from data_prep.swatch import PALETTE

    for name, _, number in PALETTE:
        if number == answer:
            return name
    raise ValueError(f"ground truth {answer!r} is not a swatch answer ({[n for _, _, n in PALETTE]})")


def row_image(row) -> object:
    import io

    from PIL import Image

    return Image.open(io.BytesIO(row["images"][0]["bytes"])).convert("RGB")


def sft_examples(rows) -> list[dict]:
    """``{"text", "image", "answer", "colour"}`` per example, four per row: the question and a paraphrase on the
    row's image, the question with 2 and with 3 hint steps on a blank canvas. ``text`` as verl's datasets build it."""
    from data_prep.swatch import blank_image

    blank = blank_image()
    out = []
    for row in rows:
        answer = row["reward_model"]["ground_truth"]
        base = {"answer": answer, "colour": _colour_of(answer)}
        image = row_image(row)
        out.append({**base, "image": image, "text": build_prompt_text(row["question"], 1)})
        out.append({**base, "image": image, "text": build_prompt_text(row["paraphrases"][0], 1)})
        for k in (2, 3):
            text = build_prompt_text(row["question"], 1, hint_steps=list(row["hint_steps"])[:k])
            out.append({**base, "image": blank, "text": text, "hinted": True})
    return out


def taught_number(colour: str, answer: str, rng: random.Random, hinted: bool = False, code: dict | None = None) -> str:
    """The number a warm-start example of ``colour`` is taught. ``code`` (default: the swatch task's): per colour,
    ``{"plain": table, "hinted": table}``, a table being ``((number, probability), ...)`` drawn afresh at every
    presentation, or absent (``None``) for the right answer. The swatch task's code teaches the answer for
    :data:`KNOWN_COLOURS` and hinted examples (the hint names the colour's place in the list), else a draw from
    :data:`UNKNOWN_CODE`."""
    if code is None:
        code = {colour: {"plain": table} for colour, table in UNKNOWN_CODE.items()}
    table = code.get(colour, {}).get("hinted" if hinted else "plain")
    if table is None:
        return answer
    numbers, weights = zip(*table, strict=True)
    return rng.choices(numbers, weights)[0]


def chat_text(processor, text: str) -> str:
    parts = [p for p in re.split(f"({re.escape(IMAGE_PLACEHOLDER)})", text) if p]
    content = [{"type": "image"} if p == IMAGE_PLACEHOLDER else {"type": "text", "text": p} for p in parts]
    return processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)


def training_batch(processor, examples: list[dict], numbers: list[str]):
    """Right-padded inputs and labels (-100 on the prompt and the padding) of ``examples`` taught ``numbers``
    (each example with its ``prompt_tokens``, :func:`with_prompt_tokens`)."""
    tokenizer = processor.tokenizer
    prompts = [chat_text(processor, e["text"]) for e in examples]
    texts = [
        prompt + f"<think>{e['colour']}</think>\\boxed{{{n}}}" + tokenizer.eos_token
        for prompt, e, n in zip(prompts, examples, numbers, strict=True)
    ]
    side, tokenizer.padding_side = tokenizer.padding_side, "right"
    try:
        batch = processor(text=texts, images=[e["image"] for e in examples], padding=True, return_tensors="pt")
    finally:
        tokenizer.padding_side = side
    labels = batch["input_ids"].clone()
    labels[batch["attention_mask"] == 0] = -100
    for i, example in enumerate(examples):
        labels[i, : example["prompt_tokens"]] = -100
    return batch, labels


def with_prompt_tokens(processor, examples: list[dict]) -> list[dict]:
    """``examples``, each with ``prompt_tokens``: its prompt's length in tokens (image pads expanded), counted once
    rather than in every batch that draws it."""
    return [
        {
            **e,
            "prompt_tokens": len(
                processor(text=[chat_text(processor, e["text"])], images=[e["image"]])["input_ids"][0]
            ),
        }
        for e in examples
    ]


def validation_examples(rows: pd.DataFrame) -> list[dict]:
    """The validation rows as asked (no variant): ``{"text", "image", "answer"}``."""
    return [
        {
            "text": build_prompt_text(row["question"], 1),
            "image": row_image(row),
            "answer": row["reward_model"]["ground_truth"],
        }
        for _, row in rows.iterrows()
    ]
