"""The paper's evaluation sets (data_prep/benchmarks.py): tiny files in each release's layout, converted with the
named layout and with ``--layout auto``; rows, prompts, gold answers, and the reward on gold and wrong answers."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from prep_fixtures import png, write_parquet

from data_prep.benchmarks import CHOICE_INSTRUCTION
from data_prep.cli import main
from data_prep.validate import validate_file
from verl_ext.data.schema import PROMPT_SUFFIX, SCHEMA, build_prompt
from verl_ext.reward import compute_score

IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def image(seed: int) -> dict:
    return {"bytes": png(seed), "path": f"{seed}.png"}


def write(path, columns: dict, types: dict | None = None):
    types = types or {}
    arrays = {name: pa.array(values, type=types.get(name)) for name, values in columns.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(arrays), path)
    return path


def mathvista(tmp_path):
    return write(
        tmp_path / "mathvista" / "testmini-00000-of-00001.parquet",
        {
            "pid": ["1", "2", "3", "4"],
            "question": ["Which angle is largest?", "How many bars are there?", "What is the slope?", "Pick one."],
            "image": ["images/1.jpg", "images/2.jpg", "images/3.jpg", "images/4.jpg"],
            "decoded_image": [image(1), image(2), image(3), image(4)],
            "choices": [["30°", "145°", "60°"], None, None, ["7", "8"]],
            "unit": [None, None, "", None],
            "precision": [None, None, 2.0, None],
            "answer": ["145°", "7", "1.25", "9"],  # row 3: an answer that is not among its choices
            "question_type": ["multi_choice", "free_form", "free_form", "multi_choice"],
            "answer_type": ["text", "integer", "float", "text"],
            "query": ["q1", "q2", "q3", "q4"],
        },
        {"decoded_image": IMAGE},
    )


def mathverse(tmp_path):
    return write(
        tmp_path / "mathverse" / "testmini.parquet",
        {
            "sample_index": ["1", "2"],
            "problem_index": ["1", "1"],
            "problem_version": ["Text Dominant", "Vision Only"],
            "question": ["As shown, AB = 3. Find BC.\nChoices:\nA:3\nB:4\nC:5", "Find the area shown in the image."],
            "image": [image(5), image(6)],
            "answer": ["B", "\\frac{3}{2}"],
            "question_type": ["multi-choice", "free-form"],
            "query_wo": ["w1", "w2"],
            "query_cot": ["c1", "c2"],
        },
        {"image": IMAGE},
    )


def mathvision(tmp_path):
    return write(
        tmp_path / "mathvision" / "test.parquet",
        {
            "id": ["1", "2"],
            "question": ["<image1>Which figure comes next?", "How many cubes are hidden?<image1>"],
            "options": [["A", "B", "C", "D", "E"], []],
            "image": ["images/1.jpg", "images/2.jpg"],
            "decoded_image": [image(7), image(8)],
            "answer": ["C", "12"],
            "solution": [None, None],
            "level": [1, 3],
            "subject": ["logic", "counting"],
        },
        {"decoded_image": IMAGE, "options": pa.list_(pa.string())},
    )


def olympiadbench(tmp_path):
    columns = {
        "id": [1, 2],
        "question": ["In the figure <image_1>, find the radius.", "Given <image_1> and <image_2>, find all x."],
        "solution": [["r = 5"], ["x = 1 or 2"]],
        "final_answer": [["$5$"], ["$1$", "$2$"]],
        "context": [None, "Let ABCD be a square."],
        "image_1": [image(9), image(10)],
        "image_2": [None, image(11)],
        "image_3": [None, None],
        "is_multiple_answer": [False, True],
        "unit": [None, None],
        "answer_type": ["Numerical", "Numerical"],
        "subfield": ["Geometry", "Algebra"],
        "language": ["English", "English"],
    }
    types = {"image_1": IMAGE, "image_2": IMAGE, "image_3": IMAGE, "unit": pa.string(), "context": pa.string()}
    return write(tmp_path / "olympiadbench" / "OE_MM_maths_en_COMP" / "train" / "0000.parquet", columns, types)


def wemath(tmp_path):
    return write(
        tmp_path / "wemath" / "testmini.parquet",
        {
            "ID": ["1@1", "2@1"],
            "split": ["testmini", "testmini"],
            "knowledge concept": ["Area of Squares", "Sectors"],
            "question": ["What is the area of the square?", "What is the angle A?"],
            "option": ["A. 4; B. 9; C. 16; D. No correct answer", "A. 30°; B. 45°; C. 60°"],
            "answer": ["C", "A"],
            "image_path": [image(12), image(13)],
            "key": ["1", "2"],
            "question number": [1, 2],
        },
        {"image_path": IMAGE},
    )


def convert(source, out, layout, split="test"):
    argv = ["convert", "--input", str(source), "--layout", layout, "--output", str(out), "--split", split]
    return main([*argv, "--no-progress", "--max-bad-fraction", "0.5"])


def rows_of(path) -> list[dict]:
    table = pq.read_table(path)
    assert table.schema.equals(SCHEMA)
    return table.to_pylist()


def reward(row, answer: str) -> dict:
    response = f"<think>working</think> The answer is \\boxed{{{answer}}}."
    return compute_score(row["data_source"], response, row["reward_model"]["ground_truth"], row["extra_info"])


# name, builder, expected (question text, gold) per written row, one wrong answer per row
CASES = {
    "mathvista": (
        mathvista,
        [
            (
                "Which angle is largest?\nChoices:\n(A) 30°\n(B) 145°\n(C) 60°\n" + CHOICE_INSTRUCTION,
                "B",
                "A",
            ),
            ("How many bars are there?\nAnswer with an integer.", "7", "8"),
            ("What is the slope?\nAnswer with a number with 2 decimal places.", "1.25", "1.5"),
        ],
    ),
    "mathverse": (
        mathverse,
        [
            ("As shown, AB = 3. Find BC. Choices: A:3 B:4 C:5 " + CHOICE_INSTRUCTION, "B", "C"),
            ("Find the area shown in the image.", "\\frac{3}{2}", "2"),
        ],
    ),
    "mathvision": (
        mathvision,
        [
            ("Which figure comes next? Choices: (A) A (B) B (C) C (D) D (E) E " + CHOICE_INSTRUCTION, "C", "D"),
            ("How many cubes are hidden?", "12", "11"),
        ],
    ),
    "olympiadbench": (
        olympiadbench,
        [
            ("In the figure (image 1), find the radius.", "5", "4"),
            (
                "Let ABCD be a square. Given (image 1) and (image 2), find all x. "
                "The problem has several answers: give them all, separated by commas, in one \\boxed{}.",
                "1, 2",
                "1",
            ),
        ],
    ),
    "wemath": (
        wemath,
        [
            (
                "What is the area of the square? Choices: A. 4 B. 9 C. 16 D. No correct answer " + CHOICE_INSTRUCTION,
                "C",
                "B",
            ),
            ("What is the angle A? Choices: A. 30° B. 45° C. 60° " + CHOICE_INSTRUCTION, "A", "C"),
        ],
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("layout", ["named", "auto"])
def test_benchmark_rows_prompts_and_reward_on_gold(tmp_path, name, layout):
    build, expected = CASES[name]
    source = build(tmp_path)
    out = tmp_path / f"{name}.parquet"
    assert convert(source, out, name if layout == "named" else "auto") == 0
    rows = rows_of(out)
    assert [row["data_source"] for row in rows] == [name] * len(expected)
    assert [row["extra_info"]["question_id"] for row in rows][0] == f"{name}/test/0"
    for row, (question, gold, wrong) in zip(rows, expected, strict=True):
        assert " ".join(row["question"].split()) == " ".join(question.split())
        assert "<image" not in row["question"]
        assert row["prompt"] == build_prompt(row["question"], len(row["images"]))
        assert row["prompt"][0]["content"].endswith(PROMPT_SUFFIX)
        assert row["reward_model"]["ground_truth"] == gold
        assert reward(row, gold) == {"score": pytest.approx(1.0), "acc": 1.0, "format": 1.0}
        assert reward(row, wrong)["acc"] == 0.0
        if len(gold) == 1:  # a choice letter in the forms models write it
            assert reward(row, f"({gold})")["acc"] == 1.0 and reward(row, f"\\text{{{gold}}}")["acc"] == 1.0
    assert validate_file(out).ok


def test_images_in_order_and_bad_rows_quarantined(tmp_path):
    out = tmp_path / "ob.parquet"
    assert convert(olympiadbench(tmp_path), out, "olympiadbench") == 0
    rows = rows_of(out)
    assert [image["bytes"] for image in rows[1]["images"]] == [png(10), png(11)]
    assert rows[1]["prompt"][0]["content"].startswith("<image><image>Let ABCD")

    out = tmp_path / "mv.parquet"
    assert convert(mathvista(tmp_path), out, "mathvista") == 0
    quarantine = [json.loads(line) for line in open(tmp_path / "mv.quarantine.jsonl")]
    assert [(q["row"], q["reason"].split(":")[0]) for q in quarantine] == [(3, "bad answer")]
    assert "'9' is neither an option letter nor one of the options ['7', '8']" in quarantine[0]["reason"]


def test_auto_recognises_the_training_layouts(tmp_path, capsys):
    g3k = write_parquet(
        tmp_path / "g3k.parquet", {"images": [[image(1)]], "problem": ["<image>Find x."], "answer": ["3"]}
    )
    mmk12 = write_parquet(
        tmp_path / "mmk12.parquet",
        {"id": ["0"], "image": [image(2)], "question": ["What is 1+1?"], "answer": ["2"], "subject": ["Math"]},
    )
    for source, layout in ((g3k, "geometry3k"), (mmk12, "mmk12")):
        out = tmp_path / f"{layout}_out.parquet"
        assert convert(source, out, "auto", split="train") == 0
        assert f"layout: {layout} (found by --layout auto)" in capsys.readouterr().out
        assert rows_of(out)[0]["data_source"] == layout
    jsonl = tmp_path / "items.jsonl"
    (tmp_path / "a.png").write_bytes(png(3))
    jsonl.write_text(json.dumps({"question": "q?", "answer": "1", "image": "a.png"}) + "\n")
    assert convert(jsonl, tmp_path / "j.parquet", "auto", split="train") == 0
    assert rows_of(tmp_path / "j.parquet")[0]["data_source"] == "items"


def test_auto_names_the_columns_found_and_the_layouts_known(tmp_path, capsys):
    source = write_parquet(tmp_path / "odd.parquet", {"img": [image(1)], "prompt_text": ["q"], "label": ["1"]})
    assert convert(source, tmp_path / "o.parquet", "auto") == 2
    error = capsys.readouterr().err
    assert "has columns ['img', 'label', 'prompt_text']" in error
    for layout in ("geometry3k", "mmk12", "mathvista", "mathverse", "mathvision", "olympiadbench", "wemath", "jsonl"):
        assert f"{layout}:" in error
