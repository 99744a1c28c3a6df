"""DifficultyTracker: per-question state, batched updates, bad input, metrics, state round trip."""

import copy
import math
import subprocess
import sys

import numpy as np
import pytest

from verl_ext.config import DifficultyConfig
from verl_ext.difficulty import DifficultyTracker, per_response_values, question_alphas


def reference_alphas(ids, values):
    sums, counts = {}, {}
    for q, v in zip(ids, values, strict=True):
        sums[q] = sums.get(q, 0.0) + v
        counts[q] = counts.get(q, 0) + 1
    return {q: sums[q] / counts[q] for q in sums}


def test_question_alphas_average_original_and_variants():
    rng = np.random.default_rng(1)
    ids = [f"q{i}" for i in rng.integers(0, 20, 200)] + [7, 7]
    values = rng.integers(0, 2, 202).astype(float)
    got_ids, got = question_alphas(ids, values)
    want = reference_alphas(ids, values)
    assert got_ids == list(dict.fromkeys(ids))  # first-seen order
    np.testing.assert_allclose(got, [want[q] for q in got_ids], rtol=0, atol=1e-12)


def test_question_alphas_rejects_bad_values():
    with pytest.raises(ValueError, match="values_per_response"):
        question_alphas(["a", "b"], [0.5, float("nan")])
    with pytest.raises(ValueError, match="values_per_response"):
        question_alphas(["a"], [1.2])
    with pytest.raises(ValueError, match="question_ids_per_response"):
        question_alphas(["a", "b"], [0.5])


def test_update_moves_only_the_batch_and_records_state():
    t = DifficultyTracker()
    t.update(["a", "b", 3], [0.0, 1.0, 0.25], step=1)
    t.update(["a"], [0.0], step=2)
    assert t.state_of("a") == {"difficulty": 9.0, "updates": 2, "last_step": 2, "last_alpha": 0.0}
    assert t.state_of("b") == {"difficulty": 3.0, "updates": 1, "last_step": 1, "last_alpha": 1.0}
    assert t.state_of(3)["difficulty"] == 6.0
    unknown = t.state_of("zzz")
    assert unknown["difficulty"] == 5.0 and unknown["updates"] == 0 and math.isnan(unknown["last_alpha"])
    # int 3 and str "3" are different questions.
    np.testing.assert_array_equal(t.difficulties([3, "3", "b"]), [6.0, 5.0, 3.0])


def test_update_matches_a_dict_reference_over_many_steps():
    rng = np.random.default_rng(2)
    for rule in ("continuous", "binned"):
        cfg = DifficultyConfig(rule=rule)
        t = DifficultyTracker(cfg)
        ref = {}
        for step in range(30):
            ids = [int(x) for x in rng.choice(300, size=64, replace=False)]
            alphas = rng.integers(0, 6, 64) / 5.0
            t.update(ids, alphas, step)
            for q, a in zip(ids, alphas, strict=True):
                d = ref.get(q, 5.0)
                if rule == "continuous":
                    d = min(max(d + 4.0 * (0.5 - a), 1.0), 9.0)
                else:
                    change = next(c for e, c in zip(cfg.bin_edges, cfg.bin_changes, strict=True) if a <= e)
                    d = min(max(d + change, 1.0), 9.0)
                ref[q] = d
        assert t.snapshot() == pytest.approx(ref, abs=1e-12)


@pytest.mark.parametrize(
    "ids, alphas, step, name",
    [
        (["a", "b"], [0.5, float("nan")], 1, "alphas"),
        (["a", "b"], [0.5, float("inf")], 1, "alphas"),
        (["a", "b"], [0.5, -0.1], 1, "alphas"),
        (["a", "b"], [0.5, 1.5], 1, "alphas"),
        (["a", "b"], [0.5], 1, "question_ids has 2 entries but alphas has 1"),
        (["a", "a"], [0.5, 0.5], 1, "question_ids"),
        ([1.5, "b"], [0.5, 0.5], 1, "question_ids"),
        (["a", "b"], [0.5, 0.5], -1, "step"),
    ],
)
def test_bad_input_raises_naming_argument_and_changes_nothing(ids, alphas, step, name):
    t = DifficultyTracker()
    t.update(["a", "c"], [0.0, 1.0], step=0)
    before = copy.deepcopy(t.state_dict())
    with pytest.raises(ValueError, match=name):
        t.update(ids, alphas, step)
    assert t.state_dict() == before


def test_metrics_counts_levels_bounds_and_seen():
    t = DifficultyTracker()
    # D after one update from 5: alpha 0 -> 7, 1 -> 3, 0.375 -> 5.5 (rounds half up to level 6), 0.5 -> 5.
    m = t.update(["a", "b", "c", "d"], [0.0, 1.0, 0.375, 0.5], step=1)
    p = "diva/difficulty/"
    assert m[p + "mean"] == pytest.approx((7 + 3 + 5.5 + 5) / 4)
    assert m[p + "questions_seen"] == 4 and m[p + "updates_in_step"] == 4
    assert m[p + "count_level_7"] == 1 and m[p + "count_level_3"] == 1
    assert m[p + "count_level_6"] == 1 and m[p + "count_level_5"] == 1
    assert sum(m[p + f"count_level_{k}"] for k in range(1, 10)) == 4
    m = t.update(["a", "b"], [0.0, 1.0], step=2)  # a: 9 (max), b: 1 (min)
    assert m[p + "frac_at_max"] == 0.25 and m[p + "frac_at_min"] == 0.25
    assert m[p + "updates_in_step"] == 2


def test_state_dict_round_trip_is_exact_and_json_safe():
    import json

    rng = np.random.default_rng(3)
    t = DifficultyTracker()
    for step in range(5):
        t.update([f"q{i}" for i in range(step, step + 10)] + [step], rng.uniform(0, 1, 11), step)
    state = json.loads(json.dumps(t.state_dict(), allow_nan=False))
    u = DifficultyTracker()
    u.load_state_dict(state)
    assert u.snapshot() == t.snapshot()
    for q in t.snapshot():
        assert u.state_of(q) == t.state_of(q)
    # Continuing from either gives the same result (determinism).
    assert u.update(["q3", 2], [0.2, 0.9], 9) == t.update(["q3", 2], [0.2, 0.9], 9)


def test_load_state_dict_rejects_malformed_and_keeps_state():
    t = DifficultyTracker()
    t.update(["a"], [1.0], 0)
    good = t.state_dict()
    before = copy.deepcopy(good)
    for broken in (
        {**good, "format": "other"},
        {**good, "questions": {**good["questions"], "difficulty": [99.0]}},
        {**good, "questions": {**good["questions"], "updates": [1, 2]}},
        {k: v for k, v in good.items() if k != "version"},
    ):
        with pytest.raises(ValueError):
            t.load_state_dict(broken)
        assert t.state_dict() == before


def test_changes_since_gives_only_new_entries_and_full_after_load():
    t = DifficultyTracker()
    t.update(["a", "b"], [0.0, 0.0], 1)
    v1 = t.version
    t.update(["b", "c"], [1.0, 1.0], 2)
    version, full, ids, values = t.changes_since(v1)
    assert not full and version == t.version and ids == ["b", "c"]
    np.testing.assert_array_equal(values, [5.0, 3.0])
    assert t.changes_since(t.version)[2] == []
    _, full, ids, _ = t.changes_since(-1)
    assert full and ids == ["a", "b", "c"]
    t.load_state_dict(t.state_dict())
    _, full, ids, _ = t.changes_since(version)
    assert full and ids == ["a", "b", "c"]


def test_request_id_makes_a_retry_a_no_op():
    t = DifficultyTracker()
    t.update(["a"], [0.0], 1, request_id="r1")
    t.update(["a"], [0.0], 1, request_id="r1")
    assert t.state_of("a")["updates"] == 1 and t.state_of("a")["difficulty"] == 7.0


def test_tracker_module_imports_no_ray():
    code = "import sys, verl_ext.difficulty.tracker; assert 'ray' not in sys.modules, 'ray imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_alpha_source_picks_accuracy_or_total_reward():
    acc, reward = [1.0, 0.0, 1.0], [1.0, 0.1, 0.9]
    ids = ["q", "q", "q"]
    assert question_alphas(ids, per_response_values(acc, reward, "accuracy"))[1][0] == pytest.approx(2 / 3)
    assert question_alphas(ids, per_response_values(acc, reward, "reward"))[1][0] == pytest.approx(2.0 / 3)
    assert question_alphas(ids, per_response_values(acc, [0.9, 0.1, 0.9], "reward"))[1][0] == pytest.approx(1.9 / 3)
    with pytest.raises(ValueError, match="alpha_source"):
        per_response_values(acc, reward, "tokens")
    with pytest.raises(ValueError, match="reward"):
        per_response_values(acc, [1.0, 0.0, 1.3], "reward")


def test_priors_start_unseen_questions_and_are_ignored_for_known_ones():
    t = DifficultyTracker()
    t.update(["seen"], [0.5], step=0)  # stays at d_init = 5
    record = t.compute_update(["seen", "new"], [1.0, 1.0], 1, priors=[8.0, 8.0])
    # seen: 5 + 4 * (0.5 - 1) = 3 (its prior is ignored); new starts from its prior 8: 8 - 2 = 6
    assert record.difficulty.tolist() == [3.0, 6.0]
    t.apply(record)
    assert t.difficulties(["seen", "new"]).tolist() == [3.0, 6.0]


@pytest.mark.parametrize("priors", [[5.0], [float("nan"), 5.0], [0.5, 5.0], [5.0, 9.5]])
def test_bad_priors_raise_naming_the_argument_and_change_nothing(priors):
    t = DifficultyTracker()
    before = t.state_dict()
    with pytest.raises(ValueError, match="priors"):
        t.compute_update(["a", "b"], [0.5, 0.5], 0, priors=priors)
    assert t.state_dict() == before
