"""``diva-prep swatch``: valid DIVA rows whose answer is read from the image, deterministic, graded by the project's
reward, with hints that never state the number and a hardness that shrinks and fades the evidence."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from data_prep.cli import main
from data_prep.swatch import BACKGROUND, PALETTE, answer_text, swatch, swatch_image
from data_prep.validate import validate_file
from verl_ext.reward import compute_score


def _pixels(row) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(row["images"][0]["bytes"])).convert("RGB"), dtype=np.int64)


def test_rows_valid_deterministic_and_answered_by_the_image(tmp_path):
    path = tmp_path / "s.parquet"
    assert main(["swatch", "--output", str(path), "--n", "8", "--seed", "3"]) == 0
    assert validate_file(path).ok
    again = tmp_path / "t.parquet"
    swatch(again, 8, seed=3)
    assert path.read_bytes() == again.read_bytes()
    rows = pd.read_parquet(path)
    for _, row in rows.iterrows():
        pixels = _pixels(row)
        square = pixels[(pixels != np.array(BACKGROUND)).any(-1)]
        # The one non-grey colour lies between the background and exactly one palette colour: the answer's.
        direction = square.mean(0) - np.array(BACKGROUND)
        cosines = {
            number: float(direction @ (np.array(rgb) - BACKGROUND))
            / (np.linalg.norm(direction) * np.linalg.norm(np.array(rgb) - BACKGROUND))
            for _, rgb, number in PALETTE
        }
        assert max(cosines, key=cosines.get) == row["reward_model"]["ground_truth"]
        assert not any(ch.isdigit() for step in row["hint_steps"] for ch in step)  # hints never state the number
        assert len(row["paraphrases"]) == 2
    # The question is the same for every row: only the image tells the answers apart.
    assert rows["question"].nunique() == 1 and rows["reward_model"].map(lambda r: r["ground_truth"]).nunique() == 4


@pytest.mark.parametrize("name,rgb,number", PALETTE)
def test_the_solver_answer_is_graded_correct_by_the_reward(name, rgb, number):
    score = compute_score("diva_swatch", answer_text(name), number)
    assert score["acc"] == 1.0 and score["format"] == 1.0
    wrong = next(n for _, _, n in PALETTE if n != number)
    assert compute_score("diva_swatch", answer_text(name), wrong)["acc"] == 0.0


def test_hardness_shrinks_and_fades_the_square():
    import random

    def evidence(hardness: float) -> float:
        pixels = np.asarray(swatch_image(PALETTE[0][1], hardness, random.Random(0)), dtype=np.float64)
        return float(np.abs(pixels - np.array(BACKGROUND)).sum())

    values = [evidence(h) for h in (0.0, 0.5, 1.0)]
    assert values[0] > values[1] > values[2] > 0
    with pytest.raises(ValueError, match="hardness"):
        swatch_image(PALETTE[0][1], 1.5, random.Random(0))
    assert main(["swatch", "--output", "x.parquet", "--n", "0"]) == 2


def test_max_hardness_bounds_the_drawn_hardness_and_hints_name_the_place_not_the_number():
    from data_prep.swatch import ORDINAL, SIDE_RANGE, blank_image, swatch_rows

    rows = list(swatch_rows(16, seed=4, max_hardness=0.5))
    for index, row in enumerate(rows):
        pixels = _pixels(row)
        side = int((pixels != np.array(BACKGROUND)).any(-1).any(0).sum())
        # hardness <= 0.5: the square is at least halfway between the largest and the smallest side
        assert side >= (SIDE_RANGE[0] + SIDE_RANGE[1]) / 2 - 1, (index, side)
        name = PALETTE[index % len(PALETTE)][0]
        assert f"the square is {name}, the {ORDINAL[index % len(PALETTE)]} colour" in row["hint_steps"][1]
    assert not np.any(np.asarray(blank_image()) != np.array(BACKGROUND))
    with pytest.raises(ValueError, match="max_hardness"):
        next(swatch_rows(1, max_hardness=1.5))
