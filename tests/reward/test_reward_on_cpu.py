"""DIVA reward (verl_ext.reward): extraction, format, accuracy, weights, adversarial inputs, verl wiring.

The integration tests load ``compute_score`` through verl's own loader (``load_reward_manager`` ->
``get_custom_reward_fn``) from verl's composed ``ppo_trainer`` config and score a DataProto with verl's
``naive`` reward manager, the object the reward-loop workers run.
"""

import asyncio
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

import verl_ext.reward as reward_module
from verl_ext.reward import (
    DEFAULT_MAX_ANSWER_CHARS,
    BoundedVerifier,
    accuracy_reward,
    compute_score,
    extract_last_boxed,
    format_reward,
)

# A generous wall-clock bound for one adversarial call: only proves "does not hang", not speed.
HANG_BOUND_S = 30.0


# ---------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so \\boxed{42}.", "42"),
        ("\\boxed{1} then \\boxed{2}", "2"),  # the last one wins
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # nested braces
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # escaped braces are literal
        ("\\boxed { 7 }", "7"),  # whitespace before the brace and inside
        ("\\boxed{a{b{c}d}e}", "a{b{c}d}e"),
        ("\\boxed{3} and \\boxedsymbol", "3"),  # \boxed not followed by { is skipped
        ("\\boxed{5} then \\boxed{6", None),  # the last one is unclosed: no final answer
        ("no answer here", None),
        ("", None),
    ],
)
def test_extract_last_boxed(text, expected):
    assert extract_last_boxed(text) == expected


def test_extract_last_boxed_length_cap():
    assert extract_last_boxed("\\boxed{" + "1" * 10 + "}", max_chars=10) == "1" * 10
    assert extract_last_boxed("\\boxed{" + "1" * 11 + "}", max_chars=10) is None


# ---------------------------------------------------------------- format


@pytest.mark.parametrize(
    "response, expected",
    [
        ("<think>reasoning</think>The answer is \\boxed{3}.", 1.0),
        ("  \n<think>\nreasoning\n</think>\n\n\\boxed{3}\n", 1.0),  # whitespace tolerant
        ("<think></think>\\boxed{3}", 1.0),  # empty thought is allowed
        ("The answer is \\boxed{3}.", 0.0),  # no think block
        ("<think>reasoning</think>The answer is 3.", 0.0),  # no boxed answer
        ("<think>\\boxed{3}</think>so 3", 0.0),  # boxed only inside the thought
        ("preamble <think>r</think>\\boxed{3}", 0.0),  # text before <think>
        ("<think>a</think><think>b</think>\\boxed{3}", 0.0),  # two think blocks
        ("<think>a</think>\\boxed{3}</think>", 0.0),  # stray closing tag
        ("<think>reasoning \\boxed{3}", 0.0),  # never closed
        ("<think>r</think>\\boxed{3", 0.0),  # unclosed box
    ],
)
def test_format_reward(response, expected):
    assert format_reward(response) == expected


# ---------------------------------------------------------------- accuracy


@pytest.mark.parametrize(
    "ground_truth, answer, expected",
    [
        ("42", "42", 1.0),
        ("42", "43", 0.0),
        ("\\frac{1}{2}", "0.5", 1.0),
        ("0.5", "\\frac{1}{2}", 1.0),
        ("1/2", "\\dfrac{1}{2}", 1.0),
        ("0.5", "\\frac{1}{3}", 0.0),
        ("\\frac{\\sqrt{2}}{2}", "\\sqrt{2}/2", 1.0),
        ("30^\\circ", "30", 1.0),
        ("x=2", "2", 1.0),
        ("\\{1,2\\}", "\\{2,1\\}", 1.0),  # math-verify only (mathruler says no)
        ("50\\%", "50", 1.0),  # mathruler only (math-verify says no)
        ("\\pi", "3.14159", 0.0),
        ("A", "A", 1.0),
        ("B", "(B)", 1.0),
        ("(C)", "C", 1.0),
        ("D", "D.", 1.0),
        ("B", "\\text{B}", 1.0),
        ("B", "(B) 30^\\circ", 1.0),
        ("B", "C", 0.0),
        ("B", "(A)", 0.0),
        ("B", "30", 0.0),
        ("A", "a + 1", 0.0),
    ],
)
def test_accuracy_equivalent_forms(ground_truth, answer, expected):
    assert accuracy_reward(answer, ground_truth) == expected


def test_missing_or_overlong_answer_is_wrong():
    assert compute_score("d", "<think>t</think>the answer is 42", "42")["acc"] == 0.0
    long_right = "<think>t</think>\\boxed{" + "0" * (DEFAULT_MAX_ANSWER_CHARS + 5) + "1}"
    assert compute_score("d", long_right, "1") == {"score": 0.0, "acc": 0.0, "format": 0.0}


def test_last_boxed_wins():
    assert compute_score("d", "\\boxed{41} no wait \\boxed{42}", "42")["acc"] == 1.0
    assert compute_score("d", "\\boxed{42} no wait \\boxed{41}", "42")["acc"] == 0.0


# ---------------------------------------------------------------- score, weights, keys


@pytest.mark.parametrize("acc_weight, format_weight", [(0.9, 0.1), (1.0, 0.0), (0.5, 0.5), (2.0, -0.25)])
def test_score_is_weighted_sum(acc_weight, format_weight):
    responses = {
        "<think>t</think>\\boxed{7}": (1.0, 1.0),
        "<think>t</think>\\boxed{8}": (0.0, 1.0),
        "\\boxed{7}": (1.0, 0.0),
        "seven": (0.0, 0.0),
    }
    for response, (acc, fmt) in responses.items():
        result = compute_score("d", response, "7", acc_weight=acc_weight, format_weight=format_weight)
        assert set(result) == {"score", "acc", "format"}
        assert all(isinstance(value, float) for value in result.values())
        assert (result["acc"], result["format"]) == (acc, fmt)
        assert result["score"] == pytest.approx(acc_weight * acc + format_weight * fmt)


def test_default_weights_are_the_papers():
    assert compute_score("d", "<think>t</think>\\boxed{7}", "7")["score"] == pytest.approx(1.0)
    assert compute_score("d", "\\boxed{7}", "7")["score"] == pytest.approx(0.9)
    assert compute_score("d", "<think>t</think>\\boxed{6}", "7")["score"] == pytest.approx(0.1)


def test_numeric_ground_truth_is_compared_as_text():
    assert compute_score("d", "\\boxed{0.5}", 0.5)["acc"] == 1.0


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(TypeError, match="acc_wieght"):
        compute_score("d", "\\boxed{1}", "1", acc_wieght=0.9)
    with pytest.raises(ValueError, match="format_weight"):
        compute_score("d", "\\boxed{1}", "1", format_weight=float("nan"))
    with pytest.raises(ValueError, match="question_id='q7'"):
        compute_score("d", "\\boxed{1}", None, extra_info={"question_id": "q7"})
    with pytest.raises(ValueError, match="verify_timeout_s"):
        compute_score("d", "\\boxed{1}", "1", verify_timeout_s=0)
    # keys verl's reward managers add themselves are accepted
    result = compute_score("d", "\\boxed{1}", "1", reward_router_address=None, reward_model_tokenizer=None)
    assert result["acc"] == 1.0


# ---------------------------------------------------------------- adversarial inputs


def _adversarial_cases():
    megabyte = 1 << 20
    return {
        "100k open braces": "<think>t</think>\\boxed{" + "{" * 100_000,
        "100k nested pairs": "\\boxed{" + "{" * 100_000 + "}" * 100_001,
        "megabyte boxed answer": "<think>t</think>\\boxed{" + "9" * megabyte + "}",
        "megabyte response, no box": "<think>" + "x" * megabyte + "</think> done",
        "100k unclosed boxes": "\\boxed{" * 100_000,
        "100k bare \\boxed": "\\boxed " * 100_000,
        "100k closing think tags": "<think>" + "</think>\\boxed{" * 50_000,
        "100k backslashes": "\\boxed{" + "\\" * 100_000 + "}",
    }


@pytest.mark.parametrize("name", list(_adversarial_cases()))
def test_adversarial_strings_finish_in_bounded_time(name):
    response = _adversarial_cases()[name]
    start = time.monotonic()
    result = compute_score("d", response, "9")
    assert time.monotonic() - start < HANG_BOUND_S
    assert result["acc"] == 0.0


@pytest.mark.parametrize("answer", ["10^{10^{10}}", "2^{2^{40}}", "(10^{10})!"])
def test_pathological_latex_is_cut_off_and_the_verifier_recovers(answer):
    """Short answers on which sympy never returns: the child is killed after the timeout, acc = 0."""
    verifier = BoundedVerifier()
    try:
        for run_in_thread in (False, True):  # verl calls from executor threads: signals cannot help there
            start = time.monotonic()
            if run_in_thread:
                with ThreadPoolExecutor(1) as pool:
                    equal = pool.submit(verifier.equivalent, "5", answer, 1.0).result()
            else:
                equal = verifier.equivalent("5", answer, 1.0)
            assert time.monotonic() - start < HANG_BOUND_S
            assert equal is False
        starts_after_kills = verifier.starts
        assert verifier.equivalent("\\frac{1}{2}", "0.5", 10.0) is True
        assert verifier.starts == starts_after_kills + 1  # a fresh child answers after the kill
    finally:
        verifier.close()


def test_compute_score_timeout_scores_wrong_but_keeps_format():
    start = time.monotonic()
    result = compute_score("d", "<think>t</think>\\boxed{9^{9^{9}}}", "5", verify_timeout_s=1.0)
    assert time.monotonic() - start < HANG_BOUND_S
    assert result == {"score": pytest.approx(0.1), "acc": 0.0, "format": 1.0}


def test_concurrent_calls_from_threads_are_correct():
    cases = [("\\boxed{0.5}", "\\frac{1}{2}", 1.0), ("\\boxed{0.4}", "\\frac{1}{2}", 0.0)] * 6
    cases += [("\\boxed{\\sqrt{4}}", "2", 1.0), ("\\boxed{(B)}", "B", 1.0)]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda case: compute_score("d", case[0], case[1])["acc"], cases))
    assert results == [expected for _, _, expected in cases]


# ---------------------------------------------------------------- verl integration


def _byte_level_tokenizer():
    """A tiny HF tokenizer that round-trips any text exactly (byte-level BPE without merges), hub-free."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {char: index for index, char in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend)
    tokenizer.add_special_tokens({"pad_token": "<pad>"})
    return tokenizer


def _verl_config(path, reward_kwargs):
    """verl's own ppo_trainer config, composed by Hydra, with the overrides a user would write."""
    import verl
    from hydra import compose, initialize_config_dir

    overrides = [f"reward.custom_reward_function.path={path}", "reward.custom_reward_function.name=compute_score"]
    overrides += [f"+reward.custom_reward_function.reward_kwargs.{key}={value}" for key, value in reward_kwargs.items()]
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose("ppo_trainer", overrides=overrides)


def _batch(tokenizer, responses, ground_truths, prompt_length=4, response_length=96):
    """A DataProto laid out like the agent loop's output: left-padded prompts, right-padded responses."""
    from verl import DataProto

    size = len(responses)
    prompts = torch.full((size, prompt_length), tokenizer.pad_token_id, dtype=torch.long)
    response_ids = torch.full((size, response_length), tokenizer.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((size, prompt_length + response_length), dtype=torch.long)
    for row, text in enumerate(responses):
        ids = tokenizer.encode(text)
        assert len(ids) <= response_length
        prompt_ids = tokenizer.encode("Q?")
        prompts[row, prompt_length - len(prompt_ids) :] = torch.tensor(prompt_ids)
        attention_mask[row, prompt_length - len(prompt_ids) : prompt_length] = 1
        response_ids[row, : len(ids)] = torch.tensor(ids)
        attention_mask[row, prompt_length : prompt_length + len(ids)] = 1
    return DataProto.from_dict(
        tensors={"prompts": prompts, "responses": response_ids, "attention_mask": attention_mask},
        non_tensors={
            "data_source": np.array(["mmk12"] * size, dtype=object),
            "reward_model": np.array([{"style": "rule", "ground_truth": gt} for gt in ground_truths], dtype=object),
            "extra_info": np.array([{"question_id": f"q{row}"} for row in range(size)], dtype=object),
        },
    )


@pytest.fixture(scope="module")
def tokenizer():
    return _byte_level_tokenizer()


@pytest.mark.parametrize("path_kind", ["pkg", "file"])
def test_verl_reward_manager_loads_and_calls_compute_score(tokenizer, path_kind):
    from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager
    from verl.trainer.ppo.reward import load_reward_manager

    path = "pkg://verl_ext.reward" if path_kind == "pkg" else reward_module.__file__
    config = _verl_config(path, {"acc_weight": 0.8, "format_weight": 0.2})
    manager = load_reward_manager(config, tokenizer)
    assert isinstance(manager, NaiveRewardManager)
    assert not manager.is_async_reward_score  # verl runs it in an executor thread

    responses = [
        "<think>half</think>So \\boxed{\\frac{1}{2}}.",  # right, formatted
        "<think>guess</think>\\boxed{3}",  # wrong, formatted
        "It is \\boxed{(B)}",  # right, unformatted
        "<think>hmm</think> no idea",  # no answer
    ]
    ground_truths = ["0.5", "4", "B", "1"]
    expected = [(1.0, 1.0), (0.0, 1.0), (1.0, 0.0), (0.0, 0.0)]
    data = _batch(tokenizer, responses, ground_truths)

    async def score_all():  # as RewardLoopWorker.compute_score_batch does: one task per response
        return await asyncio.gather(*(manager.run_single(data[i : i + 1]) for i in range(len(data))))

    outputs = manager.loop.run_until_complete(score_all())  # the loop the manager's executor calls are bound to
    for output, (acc, fmt) in zip(outputs, expected, strict=True):
        assert output["reward_extra_info"]["acc"] == acc
        assert output["reward_extra_info"]["format"] == fmt
        assert output["reward_score"] == pytest.approx(0.8 * acc + 0.2 * fmt)

    rm_scores = NaiveRewardManager.assemble_rm_scores(data, [output["reward_score"] for output in outputs])
    assert rm_scores.sum(dim=1).tolist() == pytest.approx([1.0, 0.2, 0.8, 0.0])


def test_verl_loader_rejects_a_misspelt_reward_kwarg():
    from verl.trainer.ppo.reward import get_custom_reward_fn

    reward_fn = get_custom_reward_fn(_verl_config("pkg://verl_ext.reward", {"acc_weigth": 0.5}))
    with pytest.raises(TypeError, match="acc_weigth"):
        reward_fn(data_source="d", solution_str="\\boxed{1}", ground_truth="1", extra_info={})


def test_benchmark_quick_runs_and_ends_with_json():
    import json
    import subprocess
    import sys

    script = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "bench_reward.py")
    completed = subprocess.run(
        [sys.executable, script, "--quick", "--no-record"], capture_output=True, text=True, timeout=300
    )
    assert completed.returncode == 0, completed.stderr
    figures = json.loads(completed.stdout.strip().splitlines()[-1])
    assert figures["isolated_ms"] > 0 and figures["in_process_ms"] > 0 and figures["exact_ms"] > 0
