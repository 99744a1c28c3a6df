"""Variant planners against their tables (docs/algo/diva_grpo.md), variety over slots, fallbacks."""

import json
import math

import numpy as np
import pytest

from verl_ext.config import DifficultyConfig, VariantConfig
from verl_ext.data.planner import (
    HINT,
    IMAGE_PERTURB,
    PAPER_TRANSFORMS,
    PARAPHRASE,
    RELEASED_COMBINABLE,
    RELEASED_SINGLE,
    TEXT_IN_IMAGE,
    RowFeatures,
    get_planner,
    plan_paper,
    plan_released,
)

CFG = VariantConfig()
DCFG = DifficultyConfig()
FULL = RowFeatures(num_images=1, images_decodable=True, num_paraphrases=3, num_hint_steps=4, text_in_image=True)


def plans(planner, d, m=1, features=FULL, seed=0):
    return planner(d, m, np.random.default_rng(seed), features, CFG, DCFG)


def check_params(name, params):
    if name == "gaussian_noise":
        assert CFG.noise_sigma[0] <= params["sigma"] <= CFG.noise_sigma[1]
    if name == "rotate":
        assert CFG.rotation_degrees[0] <= abs(params["degrees"]) <= CFG.rotation_degrees[1]
        assert params["degrees"] == round(params["degrees"])  # whole degrees: the prompt states them exactly


# ------------------------------------------------------------------------------------------- paper
@pytest.mark.parametrize("d", range(1, 10))
def test_paper_one_variant_follows_the_three_tiers(d):
    mid = 5
    expected_shift = 0 if 4 <= d <= 6 else mid - d  # middling: a paraphrase keeps D
    for seed in range(20):
        (plan,) = plans(plan_paper, float(d), seed=seed)
        assert plan.fallback == "" and plan.planner == "paper"
        assert math.isclose(plan.shift, expected_shift)
        if not 4 <= d <= 6:
            assert plan.difficulty(d, 1, 9) == mid  # m = 1: the variant is moved to the middle difficulty
        if d <= 3:
            assert plan.kind in (IMAGE_PERTURB, TEXT_IN_IMAGE)
            assert len(plan.perturbations) == 1 and plan.hint_steps == 0
            name, params = plan.perturbations[0]
            assert name in (*PAPER_TRANSFORMS, "text_band")
            strength = (mid - d) / (mid - 1)
            assert math.isclose(plan.extra["strength"], strength)
            if name == "gaussian_noise":
                lo, hi = CFG.noise_sigma
                assert math.isclose(params["sigma"], round(lo + strength * (hi - lo), 4))
            check_params(name, params)
        elif d <= 6:
            assert plan.kind == PARAPHRASE and plan.perturbations == () and 0 <= plan.paraphrase_index < 3
        else:
            # S = 4 stored steps, fraction (D - 5) / 4: 7 -> 2 steps, 8 -> 3, 9 -> all 4
            assert plan.kind == HINT and plan.hint_steps == {7: 2, 8: 3, 9: 4}[d]


def test_paper_easy_questions_get_a_paraphrase_about_half_the_time():
    used = [plans(plan_paper, 2.0, seed=s)[0].paraphrase_index >= 0 for s in range(400)]
    assert 0.4 < np.mean(used) < 0.6


def test_paper_rounds_non_integer_difficulty_for_the_tier_but_shifts_continuously():
    (plan,) = plans(plan_paper, 3.4)
    assert plan.kind in (IMAGE_PERTURB, TEXT_IN_IMAGE) and math.isclose(plan.shift, 1.6)
    (plan,) = plans(plan_paper, 6.4)
    assert plan.kind == PARAPHRASE and plan.shift == 0
    (plan,) = plans(plan_paper, 6.6)
    assert plan.kind == HINT and math.isclose(plan.shift, -1.6)


def test_paper_three_variants_vary_over_the_slots():
    easy = plans(plan_paper, 1.0, m=3)
    names = [p.perturbations[0][0] for p in easy]
    assert len(set(names)) == 3  # three different perturbation kinds
    assert [round(p.shift, 6) for p in easy] == [round(4 / 3, 6), round(8 / 3, 6), 4.0]  # a ladder towards mid
    hard = plans(plan_paper, 9.0, m=3)
    assert [p.hint_steps for p in hard] == [2, 3, 4]
    middling = plans(plan_paper, 5.0, m=3)
    assert sorted(p.paraphrase_index for p in middling) == [0, 1, 2]


def test_paper_text_in_image_only_when_the_row_allows_it():
    no_band = RowFeatures(1, True, 3, 4, text_in_image=False)
    kinds = {plans(plan_paper, 1.0, m=7, features=no_band, seed=s)[k].kind for s in range(5) for k in range(7)}
    assert TEXT_IN_IMAGE not in kinds
    kinds = {p.kind for p in plans(plan_paper, 1.0, m=7)}
    assert TEXT_IN_IMAGE in kinds  # the pool of 7 covers every kind once


# ---------------------------------------------------------------------------------------- released
RELEASED_TABLE = {1: 8, 2: 6, 3: 4, 4: 2, 5: 1, 6: -1, 7: -2, 8: -3, 9: -5}


@pytest.mark.parametrize("d", range(1, 10))
def test_released_one_variant_follows_the_authors_table(d):
    shift = RELEASED_TABLE[d]
    for seed in range(20):
        (plan,) = plans(plan_released, float(d), seed=seed)
        assert plan.shift == shift and plan.planner == "released" and plan.fallback == ""
        assert plan.difficulty(d, 1, 9) == min(9, max(1, d + shift))
        names = [name for name, _ in plan.perturbations]
        if shift < 0:
            # -1, -2: one step; -3: two; -5: three
            assert plan.kind == HINT and plan.hint_steps == {-1: 1, -2: 1, -3: 2, -5: 3}[shift] and not names
        elif shift >= 7:
            assert plan.kind == TEXT_IN_IMAGE and names == ["text_band"]
        elif shift >= 5:
            assert plan.kind == IMAGE_PERTURB and len(set(names)) == 3 and set(names) <= set(RELEASED_COMBINABLE)
        elif shift >= 3:
            assert plan.kind == IMAGE_PERTURB and len(set(names)) == 2 and set(names) <= set(RELEASED_COMBINABLE)
        else:
            assert plan.kind == IMAGE_PERTURB and len(names) == 1 and names[0] in RELEASED_SINGLE
        for name, params in plan.perturbations:
            check_params(name, params)


def test_released_all_steps_for_the_largest_negative_shifts():
    from verl_ext.data.planner import _released_hint_steps

    assert [_released_hint_steps(s, 6) for s in (-1, -2, -3, -4, -5, -6, -7, -8)] == [1, 1, 2, 2, 3, 3, 6, 6]
    assert _released_hint_steps(-5, 2) == 2  # never more than stored


def test_released_question_in_image_not_allowed_falls_back_to_three_transforms():
    no_band = RowFeatures(1, True, 3, 4, text_in_image=False)
    (plan,) = plans(plan_released, 1.0, features=no_band)
    assert plan.kind == IMAGE_PERTURB and plan.shift == 8 and len(plan.perturbations) == 3
    assert plan.fallback == "text_in_image->image_perturb:text_in_image_not_allowed"


def test_released_more_variants_draw_around_the_table_shift():
    shifts = []
    for seed in range(200):
        ps = plans(plan_released, 5.0, m=3, seed=seed)
        assert ps[0].shift == 1
        shifts += [p.shift for p in ps[1:]]
    assert -8 <= min(shifts) and max(shifts) <= 8
    assert abs(np.mean(shifts) - 1) < 0.2 and 0.8 < np.std(shifts) < 1.3
    kinds = {p.kind for s in range(50) for p in plans(plan_released, 5.0, m=3, seed=s)}
    assert {PARAPHRASE, HINT, IMAGE_PERTURB} <= kinds


# ---------------------------------------------------------------------------------------- fallbacks
@pytest.mark.parametrize("planner", [plan_paper, plan_released])
def test_hint_without_steps_falls_back_to_paraphrase(planner):
    (plan,) = plans(planner, 9.0, features=RowFeatures(1, True, 2, 0, True))
    assert plan.kind == PARAPHRASE and plan.shift == 0 and plan.fallback == "hint->paraphrase:no_hint_steps"


@pytest.mark.parametrize("planner", [plan_paper, plan_released])
def test_undecodable_image_falls_back_to_text(planner):
    (plan,) = plans(planner, 2.0, features=RowFeatures(1, False, 2, 3, True))
    assert plan.kind == PARAPHRASE and plan.perturbations == ()
    assert plan.fallback.endswith("->paraphrase:image_undecodable")
    (plan,) = plans(planner, 2.0, features=RowFeatures(1, False, 0, 3, True))
    assert plan.kind == HINT and plan.shift == -1 and plan.hint_steps == 1


def test_missing_paraphrases_fall_back_by_direction():
    none = RowFeatures(1, True, 0, 3, True)
    (low,) = plans(plan_paper, 4.0, features=none)
    assert low.kind == IMAGE_PERTURB and low.shift == 1 and low.fallback == "paraphrase->image_perturb:no_paraphrases"
    (high,) = plans(plan_paper, 6.0, features=none)
    assert high.kind == HINT and high.shift == -1 and high.fallback == "paraphrase->hint:no_paraphrases"


@pytest.mark.parametrize("planner", [plan_paper, plan_released])
@pytest.mark.parametrize("d", [1.0, 5.0, 9.0])
def test_nothing_feasible_raises(planner, d):
    with pytest.raises(ValueError, match="no variant kind is feasible"):
        plans(planner, d, features=RowFeatures(0, True, 0, 0, False))


# ----------------------------------------------------------------------------------- determinism
@pytest.mark.parametrize("name", ["paper", "released"])
def test_plans_are_reproducible_and_records_are_json(name):
    planner = get_planner(name)
    for d in np.linspace(1, 9, 17):
        a = plans(planner, float(d), m=3, seed=11)
        b = plans(planner, float(d), m=3, seed=11)
        assert a == b
        for plan in a:
            record = json.loads(json.dumps(plan.record()))
            assert record["kind"] == plan.kind and record["planner"] == name


def test_unknown_planner_is_a_clear_error():
    with pytest.raises(ValueError, match="diva.variants.planner='mine'"):
        get_planner("mine")
