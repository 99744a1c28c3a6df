"""The sparse task (verl_ext/lab/sparse_task.py): what its warm start teaches, the log-probabilities its transfer
measure steps on against a one-sequence-at-a-time reference, the property check and its printed lines, and the
per-question measures run for real on the tiny Qwen2-VL (untrained: every answer wrong, so the task's check refuses
it, naming the properties that fail). The task's runs themselves are ``tests/e2e/test_compare_sparse_on_cpu.py``
(``-m extended``)."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest
import torch

from data_prep.swatch import PALETTE, answer_text, swatch
from verl_ext.lab import sampling, solved_questions, sparse_task
from verl_ext.lab.sft_examples import taught_number
from verl_ext.lab.sparse_task import (
    HARD_COLOURS,
    SPARSE_CODE,
    SparseTaskError,
    check_properties,
    property_lines,
)

NUMBER = {name: num for name, _, num in PALETTE}


def test_sparse_code_teaches_hard_colours_wrong_plainly_and_often_right_with_a_hint():
    rng = random.Random(0)
    for colour in ("red", "green"):
        for hinted in (False, True):
            assert {taught_number(colour, NUMBER[colour], rng, hinted, SPARSE_CODE) for _ in range(200)} == {
                NUMBER[colour]
            }
    for colour in HARD_COLOURS:
        plain = Counter(taught_number(colour, NUMBER[colour], rng, False, SPARSE_CODE) for _ in range(20_000))
        hinted = Counter(taught_number(colour, NUMBER[colour], rng, True, SPARSE_CODE) for _ in range(20_000))
        assert set(plain) == set(hinted) == {"0", NUMBER[colour]}  # 0 is no colour's number
        # 20 000 draws: a binomial standard deviation below 0.0035; 0.015 is over four of them.
        assert abs(plain[NUMBER[colour]] / 20_000 - sparse_task.PLAIN_RIGHT) < 0.015
        assert abs(hinted[NUMBER[colour]] / 20_000 - sparse_task.HINTED_RIGHT) < 0.015


def test_the_swatch_code_is_unchanged_by_the_code_argument():
    # The swatch task's warm start draws exactly as before (its recorded runs pair by the warm start's weights).
    a, b = random.Random(3), random.Random(3)
    colours = [c for c, _, _ in PALETTE] * 50
    assert [taught_number(c, NUMBER[c], a) for c in colours] == [
        taught_number(c, NUMBER[c], b, False, None) for c in colours
    ]


def _properties(unsolved=True, hints=True, transfer=True):
    return {
        "unsolved": {
            "held": unsolved,
            "count": 3,
            "questions": 8,
            "share": 0.375,
            "samples": 32,
            "temperature": 0.7,
            "right": 0,
            "accuracy": 1 / 98,
            "all_wrong_at_group": (97 / 98) ** 8,
        },
        "validation_unsolved_share": 0.5,
        "hints_solvable": {"held": hints, "hint_steps": 2, "accuracy": 0.44},
        "hints_transfer": {
            "held": transfer,
            "steps": 6,
            "log_prob_before": -7.07,
            "log_prob_after": -6.12,
            "accuracy_before": 0.0,
            "accuracy_after": 0.0,
            "hint_accuracy_after": 0.73,
        },
    }


def test_check_names_every_property_that_fails():
    check_properties(_properties())
    with pytest.raises(SparseTaskError, match=r"\['unsolved', 'hints_transfer'\]"):
        check_properties(_properties(unsolved=False, transfer=False))


def test_property_lines_say_each_property_and_whether_it_holds():
    lines = property_lines(_properties(hints=False))
    assert [line.split(" (")[0] for line in lines] == [
        "[sparse] 1. unsolved",
        "[sparse] 2. hints solvable",
        "[sparse] 3. hints transfer",
    ]
    assert "(holds)" in lines[0] and "(FAILS)" in lines[1] and "(holds)" in lines[2]
    assert "3 of 8 training questions (38%)" in lines[0] and "0.92" in lines[0]
    assert "the originals 0 of 96" in lines[1]
    assert "-7.07 to -6.12" in lines[2]


# --- on the tiny model ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from verl_ext.cpu.tiny_model import build_tiny_qwen2_vl

    folder = tmp_path_factory.mktemp("sparse")
    model_dir = build_tiny_qwen2_vl(str(folder / "model"), seed=0)
    train, val = folder / "train.parquet", folder / "val.parquet"
    swatch(train, 4, seed=0, split="train")
    swatch(val, 4, seed=1, split="test")
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    return {
        "dir": model_dir,
        "train": str(train),
        "val": str(val),
        "model": model,
        "processor": AutoProcessor.from_pretrained(model_dir),
    }


@pytest.mark.gpu_stack
def test_batched_response_log_probs_equal_one_sequence_at_a_time(tiny):
    import pandas as pd

    model, processor = tiny["model"], tiny["processor"]
    tokenizer = processor.tokenizer
    prompts = sampling.prompts(pd.read_parquet(tiny["train"]), 0)[:3]
    prompts[1] = sampling.prompts(pd.read_parquet(tiny["train"]), 2)[1]  # a hinted prompt: another length
    texts = [answer_text("red"), "<think>blue</think>", answer_text("yellow") + " and more words"]
    encoded = tokenizer(
        [t + tokenizer.eos_token for t in texts], add_special_tokens=False, padding=True, return_tensors="pt"
    )
    responses = encoded["input_ids"].masked_fill(encoded["attention_mask"] == 0, tokenizer.pad_token_id)
    with torch.no_grad():
        batched, mask, tokens = sampling.response_log_probs(
            model, sampling.inputs(processor, prompts), responses, tokenizer.pad_token_id, tokenizer.eos_token_id
        )
        for i, prompt in enumerate(prompts):  # the reference: one prompt, its response alone, no padding anywhere
            alone = sampling.inputs(processor, [prompt])
            target = tokenizer(texts[i] + tokenizer.eos_token, add_special_tokens=False, return_tensors="pt")
            ids = torch.cat([alone["input_ids"], target["input_ids"]], dim=1)
            types = torch.cat([alone["mm_token_type_ids"], torch.zeros_like(target["input_ids"])], dim=1)
            logits = model(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                pixel_values=alone["pixel_values"],
                image_grid_thw=alone["image_grid_thw"],
                mm_token_type_ids=types,
            ).logits[0]
            start = alone["input_ids"].shape[1]
            expected = sum(
                torch.log_softmax(logits[start + j - 1], dim=-1)[token].item()
                for j, token in enumerate(target["input_ids"][0].tolist())
            )
            assert mask[i].sum().item() == target["input_ids"].shape[1]
            assert batched[i].item() == pytest.approx(expected, abs=1e-4)


@pytest.mark.gpu_stack
def test_right_log_prob_parts_split_the_completion_at_the_colour_word_and_the_number(tiny):
    import pandas as pd

    model, processor = tiny["model"], tiny["processor"]
    tokenizer = processor.tokenizer
    prompts = sampling.prompts(pd.read_parquet(tiny["train"]), 0)[:3]
    colour = {number: name for name, _, number in PALETTE}
    parts = sampling.right_log_prob_parts(model, processor, prompts)
    reference = {"total": [], "colour": [], "number": []}
    for prompt in prompts:  # one sequence alone; the tiny tokenizer writes these strings a character a token
        name = colour[prompt["answer"]]
        text = answer_text(name)
        ids = tokenizer(text + tokenizer.eos_token, add_special_tokens=False, return_tensors="pt")["input_ids"]
        assert ids.shape[1] == len(text) + 1
        alone = sampling.inputs(processor, [prompt])
        with torch.no_grad():
            _, _, tokens = sampling.response_log_probs(
                model, alone, ids, tokenizer.pad_token_id, tokenizer.eos_token_id
            )
        word = text.index(name)
        reference["total"].append(tokens[0].sum().item())
        reference["colour"].append(tokens[0, word : word + len(name)].sum().item())
        reference["number"].append(tokens[0, text.index("{") + 1].item())
    for part, values in reference.items():
        assert parts[part] == pytest.approx(sum(values) / len(values), abs=1e-4), part
    assert sampling.right_log_prob(model, processor, prompts) == parts["total"]


@pytest.mark.gpu_stack
def test_properties_of_an_untrained_model_refuse_the_task(tiny, tmp_path):
    # The random model never writes \boxed{}: every question unsolved, no hint solvable; the transfer measure runs
    # its GRPO steps (all-wrong groups: zero advantage, no move) and the check names the two failed properties.
    properties = sparse_task.task_properties(tiny["dir"], tiny["train"], tiny["val"], samples=4, steps=1, horizon=2)
    assert properties["unsolved"]["count"] == 4 and properties["unsolved"]["right"] == 0
    assert properties["validation_unsolved"] == [0, 1, 2, 3]
    assert properties["hints_solvable"]["accuracy"] == 0.0
    transfer = properties["hints_transfer"]
    assert transfer["log_prob_after"] == pytest.approx(transfer["log_prob_before"], abs=1e-5)
    with pytest.raises(SparseTaskError, match=r"\['hints_solvable', 'hints_transfer'\]"):
        check_properties(properties)
    json.dumps(properties)  # kept in the warm start's folder


@pytest.mark.gpu_stack
def test_solved_record_reads_the_last_checkpoints_weights(tiny, tmp_path):
    run = tmp_path / "run"
    with pytest.raises(FileNotFoundError, match="hf_model"):
        solved_questions.final_weights(run)
    for step in (2, 10):  # numeric order: step 10 is the last, not step 2
        tiny["model"].save_pretrained(run / "checkpoints" / f"global_step_{step}" / "actor" / "huggingface")
    properties = {"validation_unsolved": [0, 2]}
    record = solved_questions.solved_record(run, tiny["dir"], tiny["val"], properties, seed=0)
    assert record["step"] == 10 and record["initially_unsolved"] == [0, 2]
    assert len(record["accuracy"]) == 4 and record["solved"] == [] and record["solved_share"] == 0.0
    # the same weights at the start and the end: the right answer's log-probability has not moved
    moved, parts = record["unsolved_right_log_prob"], record["unsolved_right_log_prob_parts"]
    assert moved["start"] == pytest.approx(moved["end"], abs=1e-5) and moved["start"] < 0
    assert parts["start"]["total"] == moved["start"]
    assert parts["start"]["colour"] < 0 and parts["start"]["number"] < 0
    assert parts["start"]["colour"] + parts["start"]["number"] > moved["start"]  # the format and end tokens: the rest
    assert json.loads((run / solved_questions.QUESTIONS_FILE).read_text()) == record
