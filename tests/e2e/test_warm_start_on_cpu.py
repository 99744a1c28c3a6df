"""The warm start's teaching (verl_ext/lab/warm_start.py): what each example is taught, checked on the examples
themselves (no training): the true colour always, red's and green's numbers always, blue's and yellow's drawn from
the vague code in its stated proportions, hinted examples the right number on a blank canvas."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from data_prep.swatch import BACKGROUND, PALETTE, swatch_rows
from verl_ext.lab.sft_examples import KNOWN_COLOURS, UNKNOWN_CODE, sft_examples, taught_number


def test_examples_per_row_and_hints_on_a_blank_canvas():
    rows = list(swatch_rows(8, seed=1, max_hardness=0.5))
    examples = sft_examples(rows)
    assert len(examples) == 4 * len(rows)
    for row, group in zip(rows, (examples[i : i + 4] for i in range(0, len(examples), 4)), strict=True):
        answer = row["reward_model"]["ground_truth"]
        assert {e["answer"] for e in group} == {answer}
        assert {e["colour"] for e in group} == {n for n, _, num in PALETTE if num == answer}
        plain, hinted = group[:2], group[2:]
        assert not any(e.get("hinted") for e in plain) and all(e["hinted"] for e in hinted)
        for e in hinted:
            assert row["hint_steps"][1] in e["text"]  # the colour and its place in the list
            assert not np.any(np.asarray(e["image"]) != np.array(BACKGROUND))  # the image tells nothing


def test_taught_numbers_follow_the_code():
    rng = random.Random(0)
    number = {name: num for name, _, num in PALETTE}
    for colour in KNOWN_COLOURS:
        assert {taught_number(colour, number[colour], rng) for _ in range(200)} == {number[colour]}
    for colour, code in UNKNOWN_CODE.items():
        assert {taught_number(colour, number[colour], rng, hinted=True) for _ in range(50)} == {number[colour]}
        draws = Counter(taught_number(colour, number[colour], rng) for _ in range(20_000))
        for digit, probability in code:
            # 20 000 draws: the binomial standard deviation is below 0.0035; 0.015 is over four of them.
            assert abs(draws[digit] / 20_000 - probability) < 0.015, (colour, digit, draws)
        assert sum(p for _, p in code) == 1.0 and dict(code)[number[colour]] < max(p for _, p in code)


class _Runs:
    """Stands in for the supervised runs: each returns one loss and the next accuracy of ``accuracies``."""

    def __init__(self, accuracies: list[float]):
        self.accuracies, self.done = list(accuracies), []

    def train_run(self, done: int) -> list:
        self.done.append(done)
        return [(done + 300, 0.1)]

    def accuracy(self) -> float:
        return self.accuracies[len(self.done) - 1]


def test_a_seed_inside_the_band_trains_one_run_only():
    """The recorded warm starts (seeds 0, 1, 2 of benchmarks/results/sweep_sparse/) stop after the first run: the
    same steps, so the same bytes as before there was a second."""
    from verl_ext.lab.warm_start import _train_into_band

    runs = _Runs([0.42, 0.5])
    losses, accuracies = _train_into_band(runs.train_run, runs.accuracy, (0.2, 0.6), 300)
    assert runs.done == [0] and accuracies == [0.42] and losses == [(300, 0.1)]


def test_a_seed_below_the_band_trains_on_until_it_is_reached():
    """Seed 37 read 0.11 after 300 steps: the schedule runs again from there rather than refusing the seed."""
    from verl_ext.lab.warm_start import _train_into_band

    runs = _Runs([0.11, 0.17, 0.31, 0.5])
    losses, accuracies = _train_into_band(runs.train_run, runs.accuracy, (0.2, 0.6), 300)
    assert runs.done == [0, 300, 600] and accuracies == [0.11, 0.17, 0.31]
    assert [step for step, _ in losses] == [300, 600, 900]


def test_a_seed_that_never_reaches_the_band_or_overshoots_it_says_why():
    from verl_ext.lab.warm_start import EXTRA_RUNS, WarmStartError, _train_into_band

    runs = _Runs([0.05] * (1 + EXTRA_RUNS))
    with pytest.raises(WarmStartError, match=rf"0.05 after {300 * (1 + EXTRA_RUNS)} steps .*unable to answer"):
        _train_into_band(runs.train_run, runs.accuracy, (0.2, 0.6), 300)
    assert len(runs.done) == 1 + EXTRA_RUNS
    runs = _Runs([0.9, 0.3])  # above the band: more training would not bring it down
    with pytest.raises(WarmStartError, match="0.90 after 300 steps .*solved"):
        _train_into_band(runs.train_run, runs.accuracy, (0.2, 0.6), 300)
    assert runs.done == [0]
