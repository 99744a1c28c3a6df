"""A validation request's seed is keyed on its question's content, not on how its images are to be resized: DIVA's
dataset puts ``max_pixels`` on every image item and verl's puts none, and the same question must draw the same
samples under DIVA-GRPO and under GRPO (the seed sweep pairs their sampled validations)."""

from __future__ import annotations

import numpy as np
from PIL import Image

from verl_ext.rollout.agent_loop import request_place


def _prompt(colour, **hints):
    image = Image.fromarray(np.full((8, 8, 3), colour, dtype=np.uint8))
    return [{"role": "user", "content": [{"type": "image", "image": image, **hints}, {"type": "text", "text": "n?"}]}]


def _key(prompt, index=3, uid="a4f0c2e1-0000-4000-8000-000000000000"):
    return request_place({"uid": uid, "raw_prompt": prompt, "index": index, "global_steps": 0, "session_id": 1})[1]


def test_resize_hints_do_not_change_the_key():
    plain = _key(_prompt(200))
    assert _key(_prompt(200, max_pixels=7056)) == plain
    assert _key(_prompt(200, max_pixels=1024, min_pixels=16)) == plain


def test_the_image_the_text_and_the_index_do():
    plain = _key(_prompt(200))
    assert _key(_prompt(201)) != plain
    assert _key(_prompt(200), index=4) != plain
    other_text = _prompt(200)
    other_text[0]["content"][1]["text"] = "m?"
    assert _key(other_text) != plain


def test_the_raw_prompt_is_left_as_it_was():
    prompt = _prompt(200, max_pixels=7056)
    _key(prompt)
    assert prompt[0]["content"][0]["max_pixels"] == 7056
