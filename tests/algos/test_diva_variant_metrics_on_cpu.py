"""DIVA's per-variant accuracy metrics: per-kind means with their response counts, the paired gap (variant minus
the same question's original), and the planned difficulty of solved and failed questions."""

from __future__ import annotations

import numpy as np
import pytest

from verl_ext.methods.diva import variant_accuracy_metrics


def test_per_kind_accuracy_paired_gap_and_difficulty_of_solved_and_failed():
    # q1 (easy, D=3): original 4/4 right, its perturbed variant 1/4. q2 (hard, D=7): original 0/4, hint 3/4.
    kinds = ["original"] * 4 + ["image_perturb"] * 4 + ["original"] * 4 + ["hint"] * 4
    qids = np.array(["q1"] * 8 + ["q2"] * 8, dtype=object)
    acc = np.array([1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0], dtype=np.float64)
    infos = [
        {"variant_kind": k, "question_difficulty": 3.0 if q == "q1" else 7.0}
        for k, q in zip(kinds, qids.tolist(), strict=True)
    ]
    out = variant_accuracy_metrics(acc, infos, qids)
    assert out["diva/accuracy/original"] == pytest.approx(0.5)
    assert out["diva/accuracy/original/responses"] == 8
    assert out["diva/accuracy/image_perturb"] == pytest.approx(0.25)
    assert out["diva/accuracy/hint"] == pytest.approx(0.75)
    assert out["diva/accuracy_gap/image_perturb"] == pytest.approx(0.25 - 1.0)
    assert out["diva/accuracy_gap/hint"] == pytest.approx(0.75 - 0.0)
    # q1: 5/8 right (solved, planned at D=3); q2: 3/8 (failed, D=7).
    assert out["diva/difficulty/solved_mean"] == 3.0 and out["diva/difficulty/failed_mean"] == 7.0
    assert "diva/accuracy_gap/original" not in out


def test_half_right_questions_count_as_neither_solved_nor_failed():
    infos = [{"variant_kind": "original", "question_difficulty": 5.0}] * 2
    out = variant_accuracy_metrics(np.array([1.0, 0.0]), infos, np.array(["q", "q"], dtype=object))
    assert "diva/difficulty/solved_mean" not in out and "diva/difficulty/failed_mean" not in out
    assert out["diva/accuracy/original"] == 0.5
