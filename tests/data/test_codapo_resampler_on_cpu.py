"""CoDaPO's resampling logic: selection at the weight quantile, the resampled pass, alternation and resume."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from verl_ext.data.codapo_resampler import CoDaPOResampler, resampled_pass, rows_for, select_questions

# ---------------------------------------------------------------------------------------------------------------
# Slow, obvious references, written from the authors' trainer loop (codapo/ray_trainer.py) in plain Python.
# ---------------------------------------------------------------------------------------------------------------


def linear_quantile(values, q):
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (position - low) * (ordered[high] - ordered[low])


def reference_select(question_keys, weights, percentile, group_index):
    """Per prompt group (uid) one weight; threshold over the groups; questions of passing groups, deduplicated."""
    groups = group_index if group_index is not None else question_keys
    group_weight, group_question = {}, {}
    for key, weight, group in zip(question_keys, weights, groups, strict=True):
        group_weight.setdefault(group, weight)
        group_question.setdefault(group, key)
    threshold = linear_quantile(list(group_weight.values()), percentile)
    kept = []
    for group, weight in group_weight.items():
        if weight >= threshold and group_question[group] not in kept:
            kept.append(group_question[group])
    return kept, threshold


def reference_pass(kept, batch_size, repeat_count):
    """The authors' while loop: each question repeat_count times while the batch has room, cycling, then cut."""
    out, position = [], 0
    while len(out) < batch_size:
        if position < len(kept):
            for _ in range(repeat_count):
                if len(out) < batch_size:
                    out.append(kept[position])
            position += 1
        else:
            position = 0
    return out[:batch_size]


def random_fresh_batch(rng, prompts=None):
    """Per-response keys, weights and uids of a fresh batch: weights from a few levels so ties are common."""
    prompts = prompts or int(rng.integers(1, 40))
    questions = rng.choice(1000, size=prompts, replace=False)
    levels = rng.choice([0.1, 0.35, 0.6, 0.85, 1.1], size=int(rng.integers(1, 6)), replace=False)
    weights = rng.choice(levels, size=prompts)
    rollouts = int(rng.choice([1, 5, 8]))
    keys = np.repeat(np.array([f"q{q}" for q in questions], dtype=object), rollouts)
    uids = np.repeat(np.array([f"uid-{rng.integers(2**62)}" for _ in range(prompts)], dtype=object), rollouts)
    return keys, np.repeat(weights, rollouts), uids


# ---------------------------------------------------------------------------------------------------------------
# Selection.
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("percentile", [0.75, 0.5, 0.9, 0.1])
def test_selection_matches_the_reference_on_random_batches(percentile):
    rng = np.random.default_rng(int(percentile * 100))
    for _ in range(200):
        keys, weights, uids = random_fresh_batch(rng)
        for group_index in (uids, None):
            kept, threshold, units, kept_units = select_questions(keys, weights, percentile, group_index)
            expected, expected_threshold = reference_select(list(keys), list(weights), percentile, group_index)
            assert threshold == pytest.approx(expected_threshold, abs=1e-12)
            assert kept == expected
            assert units == len(set(keys)) and kept_units == len(kept)  # one prompt per question here
            # The authors compute the threshold with torch.quantile.
            per_prompt = torch.tensor(weights[:: len(keys) // units])
            assert threshold == pytest.approx(torch.quantile(per_prompt, percentile).item(), abs=1e-12)


def test_ties_at_the_threshold_are_all_kept():
    kept, threshold, units, kept_units = select_questions(["a", "b", "c", "d"], [0.1, 0.1, 0.9, 0.9])
    assert (kept, threshold, kept_units) == (["c", "d"], 0.9, 2)  # half kept, not a quarter
    kept, _, _, _ = select_questions(list("abcdefgh"), [0.5] * 8)
    assert kept == list("abcdefgh")  # all equal: everyone passes
    kept, threshold, _, _ = select_questions(list("abcde"), [0.2, 0.3, 0.9, 0.4, 0.1])
    assert threshold == pytest.approx(0.4) and kept == ["c", "d"]  # order of first appearance, not of weight


def test_at_least_one_question_is_always_kept():
    rng = np.random.default_rng(0)
    for _ in range(300):
        weights = rng.random(int(rng.integers(1, 30))) * 10 ** rng.uniform(-8, 3)
        percentile = float(rng.uniform(0.01, 0.99))
        kept, _, _, _ = select_questions([f"q{i}" for i in range(len(weights))], weights, percentile)
        assert kept and f"q{int(np.argmax(weights))}" in kept


def test_a_question_in_two_prompts_is_kept_when_either_passes():
    """With group_index the quantile is over prompt groups, as the authors' per-uid dictionary."""
    keys = ["a", "a", "b", "b", "a", "a", "c", "c"]
    uids = ["u1", "u1", "u2", "u2", "u3", "u3", "u4", "u4"]
    weights = [0.2, 0.2, 0.3, 0.3, 0.9, 0.9, 0.1, 0.1]
    kept, threshold, units, kept_units = select_questions(keys, weights, 0.75, group_index=uids)
    assert units == 4 and kept == ["a"] and kept_units == 1
    assert threshold == pytest.approx(linear_quantile([0.2, 0.3, 0.9, 0.1], 0.75))
    with pytest.raises(ValueError, match="group_index=uid"):
        select_questions(keys, weights, 0.75)  # without uids, question a has two weights


# ---------------------------------------------------------------------------------------------------------------
# The resampled pass: repeat, cycle, truncate.
# ---------------------------------------------------------------------------------------------------------------


def test_resampled_pass_matches_the_authors_loop():
    rng = np.random.default_rng(1)
    for _ in range(300):
        kept = [f"q{i}" for i in range(int(rng.integers(1, 20)))]
        batch_size, repeat_count = int(rng.integers(1, 70)), int(rng.integers(1, 7))
        assert resampled_pass(kept, batch_size, repeat_count) == reference_pass(kept, batch_size, repeat_count)


def test_resampled_pass_worked_examples():
    assert resampled_pass(["a", "b", "c"], 10) == list("aaaabbbbcc")  # truncated inside the last question
    assert resampled_pass(["a", "b", "c"], 14) == list("aaaabbbbccccaa")  # cycles back to the first
    assert resampled_pass(["a"], 6) == list("aaaaaa")
    assert resampled_pass(list("abcde"), 8) == list("aaaabbbb")  # more kept than room: the last ones wait
    assert resampled_pass([3, 7], 5, repeat_count=2) == [3, 3, 7, 7, 3]  # integer keys


def test_rows_for_maps_planned_keys_to_first_rows():
    served = ["q1", "q2", "q3", "q2"]
    assert rows_for(["q3", "q3", "q2", "q1"], served).tolist() == [2, 2, 1, 0]
    assert rows_for([5, 5, 9], np.array([9, 5])).tolist() == [1, 1, 0]
    with pytest.raises(ValueError, match="'q9' is not among served_keys"):
        rows_for(["q1", "q9"], served)


# ---------------------------------------------------------------------------------------------------------------
# Alternation, metrics, state.
# ---------------------------------------------------------------------------------------------------------------


def test_alternation_fresh_then_resampled():
    sampler = CoDaPOResampler()
    assert not sampler.resampled_next
    with pytest.raises(RuntimeError, match="no fresh batch observed"):
        sampler.plan(8)
    kept = sampler.observe(["a", "b", "c", "d"], [0.1, 0.2, 0.3, 0.4])
    assert kept == ["d"] and sampler.resampled_next
    with pytest.raises(RuntimeError, match="never planned"):
        sampler.observe(["a"], [0.1])
    assert sampler.plan(4) == ["d"] * 4 and not sampler.resampled_next
    with pytest.raises(RuntimeError, match="no fresh batch observed"):
        sampler.plan(4)


def test_metrics_report_the_selection_and_the_budget():
    sampler = CoDaPOResampler(percentile=0.75, repeat_count=4)
    assert set(sampler.metrics()) == {
        f"codapo/resample/{name}"
        for name in ("threshold", "kept_questions", "kept_fraction", "copies_per_kept", "kept_budget_share",
                     "budget_share")
    }  # fmt: skip
    keys = [f"q{i}" for i in range(8)]
    sampler.observe(keys, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8])  # threshold 0.625: q6, q7
    sampler.plan(8)
    metrics = sampler.metrics()
    assert metrics["codapo/resample/threshold"] == pytest.approx(0.625)
    assert metrics["codapo/resample/kept_questions"] == 2 and metrics["codapo/resample/kept_fraction"] == 0.25
    assert metrics["codapo/resample/copies_per_kept"] == 4.0
    assert metrics["codapo/resample/kept_budget_share"] == pytest.approx((2 + 8) / 16)
    assert metrics["codapo/resample/budget_share"] == 0.5
    sampler.observe(keys, [0.5] * 8)  # a fresh batch whose pass has not run yet
    assert sampler.metrics()["codapo/resample/budget_share"] == pytest.approx(8 / 24)


class _Loader:
    """A stand-in for verl's StatefulDataLoader: fresh batches of question keys, with a resumable position."""

    def __init__(self, batches):
        self.batches, self.position = batches, 0

    def next(self):
        batch = self.batches[self.position % len(self.batches)]
        self.position += 1
        return batch

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


def _weights_of(keys, step):
    """A deterministic weight per question (the model's state depends on the step) with ties."""
    return [round(((hash_of(k) * 7 + step * 3) % 11) / 10 + 0.1, 3) for k in keys]


def hash_of(key):
    return sum(ord(c) * (i + 1) for i, c in enumerate(key))


def _run(sampler, loader, steps, start_step=0, batch_size=12):
    """The trainer's step loop: fetch (fresh or resampled), 'roll out', observe fresh batches only."""
    served = []
    for step in range(start_step, start_step + steps):
        if sampler.resampled_next:
            keys, fresh = sampler.plan(batch_size), False
        else:
            keys, fresh = loader.next(), True
        served.append((fresh, list(keys), sampler.metrics()))
        if fresh:
            responses = np.repeat(np.array(keys, dtype=object), 5)  # rollout.n = 5
            uids = np.repeat(np.array([f"{step}-{i}" for i in range(len(keys))], dtype=object), 5)
            sampler.observe(responses, np.repeat(_weights_of(keys, step), 5), group_index=uids)
    return served


def test_resume_mid_epoch_continues_exactly():
    rng = np.random.default_rng(4)
    batches = [[f"q{q}" for q in rng.choice(500, size=12, replace=False)] for _ in range(5)]
    steps = 14
    uninterrupted = _run(CoDaPOResampler(), _Loader(batches), steps)
    assert [fresh for fresh, _, _ in uninterrupted] == [True, False] * (steps // 2)
    for cut in range(1, steps):  # after a fresh step (a resampled pass pending) and after a resampled one
        sampler, loader = CoDaPOResampler(), _Loader(batches)
        first = _run(sampler, loader, cut)
        saved = json.loads(json.dumps({"sampler": sampler.state_dict(), "loader": loader.state_dict()}))
        resumed_sampler, resumed_loader = CoDaPOResampler(), _Loader(batches)
        resumed_sampler.load_state_dict(saved["sampler"])
        resumed_loader.load_state_dict(saved["loader"])
        assert resumed_sampler.resampled_next == (cut % 2 == 1)
        second = _run(resumed_sampler, resumed_loader, steps - cut, start_step=cut)
        assert first + second == uninterrupted, cut


def test_every_kept_question_of_the_fresh_batch_gets_its_copies():
    rng = np.random.default_rng(6)
    batches = [[f"q{q}" for q in rng.choice(500, size=16, replace=False)] for _ in range(3)]
    served = _run(CoDaPOResampler(), _Loader(batches), 6, batch_size=16)
    for (_, fresh_keys, _), (_, resampled_keys, _) in zip(served[::2], served[1::2], strict=True):
        assert set(resampled_keys) <= set(fresh_keys)
        counts = {key: resampled_keys.count(key) for key in set(resampled_keys)}
        assert all(count >= 1 for count in counts.values()) and len(resampled_keys) == 16


# ---------------------------------------------------------------------------------------------------------------
# Bad input.
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        ((["a", "b"], [0.1]), {}, "weights"),
        ((["a", "b"], [0.1, float("nan")]), {}, "weights must be finite"),
        ((["a", "b"], ["x", "y"]), {}, "weights must be numbers"),
        ((["a", None], [0.1, 0.2]), {}, "question_keys: entry 1"),
        ((["a", 1.5], [0.1, 0.2]), {}, "question_keys: entry 1"),
        (([], []), {}, "question_keys is empty"),
        (("ab", [0.1, 0.2]), {}, "question_keys must be"),
        ((["a", "a"], [0.1, 0.2]), {}, "group_index=uid"),
        ((["a", "b"], [0.1, 0.2]), {"group_index": ["u"]}, "group_index"),
        ((["a", "b"], [0.1, 0.2]), {"group_index": ["u", None]}, "group_index is missing"),
        ((["a", "b"], [0.1, 0.1]), {"group_index": ["u", "u"]}, "question_keys: entry 1"),
        ((["a", "b"], [0.1, 0.2]), {"percentile": 1.0}, "percentile"),
        ((["a", "b"], [0.1, 0.2]), {"percentile": 0.0}, "percentile"),
    ],
)
def test_bad_selection_input_raises_value_error(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        select_questions(*args, **kwargs)


def test_bad_knobs_and_states_raise():
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="repeat_count"):
            CoDaPOResampler(repeat_count=bad)
    with pytest.raises(ValueError, match="percentile"):
        CoDaPOResampler(percentile=float("nan"))
    with pytest.raises(ValueError, match="batch_size"):
        resampled_pass(["a"], 0)
    with pytest.raises(ValueError, match="kept is empty"):
        resampled_pass([], 4)
    sampler = CoDaPOResampler()
    with pytest.raises(ValueError, match="version"):
        sampler.load_state_dict({"pending": None})
    with pytest.raises(ValueError, match="lacks"):
        sampler.load_state_dict({"version": 1, "pending": None})
    good = CoDaPOResampler().state_dict()
    with pytest.raises(ValueError, match="pending'\\] is empty"):
        sampler.load_state_dict(good | {"pending": []})
    with pytest.raises(ValueError, match="pending"):
        sampler.load_state_dict(good | {"pending": [None]})


def test_numpy_and_tensor_inputs():
    keys = np.array([3, 1, 2, 4])
    assert select_questions(keys, torch.tensor([0.1, 0.9, 0.2, 0.3])).kept == [1]
    assert select_questions(torch.tensor([3, 1, 2, 4]), np.array([0.1, 0.9, 0.2, 0.3])).kept == [1]
    kept = CoDaPOResampler().observe(np.array(["a", "b"]), np.array([0.4, 0.4], dtype=np.float32))
    assert kept == ["a", "b"] and all(type(key) is str for key in kept)  # JSON-ready Python strings
