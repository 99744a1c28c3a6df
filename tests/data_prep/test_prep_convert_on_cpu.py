"""``diva-prep convert`` on tiny fixtures of each layout: rows, ids, quarantine, failures, determinism."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from prep_fixtures import corrupt_data_pages, png, write_jsonl, write_parquet

from data_prep.cli import main
from data_prep.validate import validate_file
from verl_ext.data.schema import SCHEMA, build_prompt


def quarantined(path) -> list[dict]:
    return [json.loads(line) for line in open(path, encoding="utf-8")]


def geometry3k_file(tmp_path, bad: bool = False):
    images = [[{"bytes": png(i), "path": f"img{i}.png"}] for i in range(4)]
    problems = [f"<image>Find x in triangle {i}." for i in range(4)]
    answers = ["3", "4\\sqrt{2}", "12", "7"]
    if bad:
        images[1] = [{"bytes": b"\x89PNG not really", "path": "broken.png"}]
        answers[2] = "  "
    return write_parquet(tmp_path / "g3k" / "train.parquet", {"images": images, "problem": problems, "answer": answers})


def test_geometry3k_rows_follow_the_schema(tmp_path):
    source = geometry3k_file(tmp_path)
    out = tmp_path / "out.parquet"
    argv = ["convert", "--input", str(source), "--layout", "geometry3k", "--output", str(out), "--no-progress"]
    assert main(argv) == 0
    table = pq.read_table(out)
    assert table.schema.equals(SCHEMA)
    rows = table.to_pylist()
    assert [row["extra_info"]["question_id"] for row in rows] == [f"geometry3k/train/{i}" for i in range(4)]
    assert rows[1]["question"] == "Find x in triangle 1."
    assert rows[1]["prompt"] == build_prompt("Find x in triangle 1.", 1)
    assert rows[1]["reward_model"] == {"style": "rule", "ground_truth": "4\\sqrt{2}"}
    assert rows[1]["images"] == [{"bytes": png(1), "path": "img1.png"}]
    assert rows[0]["text_in_image"] is True and rows[0]["difficulty"] is None
    assert validate_file(out).ok


def test_bad_rows_are_quarantined_and_fail_the_default_threshold(tmp_path, capsys):
    source = geometry3k_file(tmp_path, bad=True)
    out, quarantine = tmp_path / "out.parquet", tmp_path / "q.jsonl"
    argv = ["convert", "--input", str(source), "--layout", "geometry3k", "--output", str(out)]
    argv += ["--quarantine", str(quarantine), "--no-progress"]
    assert main(argv) == 1
    assert not out.exists() and not out.with_name("out.parquet.tmp").exists()
    records = quarantined(quarantine)
    assert [(r["row"], r["reason"].split(":")[0]) for r in records] == [(1, "undecodable image"), (2, "empty answer")]
    assert "exceeds --max-bad-fraction" in capsys.readouterr().out

    assert main([*argv, "--max-bad-fraction", "0.5"]) == 0
    rows = pq.read_table(out).to_pylist()
    # Quarantined rows keep their place in the numbering: ids stay stable when a row is fixed later.
    assert [row["extra_info"]["question_id"] for row in rows] == ["geometry3k/train/0", "geometry3k/train/3"]
    assert len(quarantined(quarantine)) == 2


def test_mmk12_folder_with_struct_and_binary_image_columns(tmp_path):
    folder = tmp_path / "mmk12"
    write_parquet(
        folder / "a.parquet",
        {
            "image": [{"bytes": png(1), "path": "x.png"}, {"bytes": None, "path": "files/y.png"}],
            "question": ["<image>\nWhat is the value of y?", "How many cells?"],
            "answer": ["5", "9"],
            "subject": ["Math", "Physics"],
            "id": ["m1", "m2"],
        },
    )
    (folder / "files").mkdir()
    (folder / "files" / "y.png").write_bytes(png(2))  # bytes null: read from the path inside the input folder
    write_parquet(
        folder / "b.parquet",
        {"image": [png(3)], "question": ["Speed?"], "answer": [12], "subject": ["physics"]},
    )
    out = tmp_path / "out.parquet"
    args = ["convert", "--input", str(folder), "--layout", "mmk12", "--output", str(out), "--split", "test"]
    assert main([*args, "--no-progress"]) == 0
    rows = pq.read_table(out).to_pylist()
    assert [row["ability"] for row in rows] == ["math", "physics", "physics"]
    assert [row["extra_info"]["question_id"] for row in rows] == ["mmk12/test/0", "mmk12/test/1", "mmk12/test/2"]
    assert rows[0]["question"] == "What is the value of y?"
    assert rows[1]["images"][0]["bytes"] == png(2)
    assert rows[2]["reward_model"]["ground_truth"] == "12"
    assert validate_file(out).ok


def test_jsonl_paths_escapes_and_malformed_lines(tmp_path):
    data = tmp_path / "data"
    (data / "imgs").mkdir(parents=True)
    (data / "imgs" / "a.png").write_bytes(png(1))
    (data / "imgs" / "b.png").write_bytes(png(2))
    (tmp_path / "outside.png").write_bytes(png(3))  # exists, but outside the input folder
    source = write_jsonl(
        data / "set.jsonl",
        [
            {"image": "imgs/a.png", "question": "Area?", "answer": "6", "hint_steps": ["Multiply the sides."]},
            {"images": ["imgs/a.png", "imgs/b.png"], "question": "Compare <image> and <image>.", "answer": "B"},
            {"image": "../outside.png", "question": "Escape?", "answer": "1"},
            {"image": "imgs/missing.png", "question": "Missing?", "answer": "1"},
            '{"image": "imgs/a.png", "question": "cut',
            "",
            {"image": "imgs/b.png", "question": "Difficulty?", "answer": "2", "difficulty": 7},
        ],
    )
    out, quarantine = tmp_path / "out.parquet", tmp_path / "q.jsonl"
    argv = ["convert", "--input", str(source), "--layout", "jsonl", "--output", str(out), "--no-progress"]
    assert main([*argv, "--quarantine", str(quarantine), "--max-bad-fraction", "0.5"]) == 0
    reasons = {r["row"]: r["reason"] for r in quarantined(quarantine)}
    assert set(reasons) == {2, 3, 4}
    assert reasons[2].startswith("image path escapes the input folder")
    assert reasons[3].startswith("broken image path")
    assert reasons[4].startswith("malformed JSON line")
    rows = pq.read_table(out).to_pylist()
    assert [row["extra_info"]["question_id"] for row in rows] == ["set/train/0", "set/train/1", "set/train/5"]
    assert rows[0]["hint_steps"] == ["Multiply the sides."]
    assert rows[1]["prompt"][0]["content"].startswith("<image><image>Compare and .")
    assert len(rows[1]["images"]) == 2
    assert rows[2]["difficulty"] == 7.0
    assert validate_file(out).ok


def test_non_utf8_lines_and_nul_image_paths_are_quarantined(tmp_path, capsys):
    data = tmp_path / "data"
    (data / "imgs").mkdir(parents=True)
    (data / "imgs" / "a.png").write_bytes(png(1))
    good = {"image": "imgs/a.png", "question": "Area?", "answer": "6"}
    source = data / "set.jsonl"
    with open(source, "wb") as handle:
        handle.write(json.dumps(good).encode() + b"\n")
        handle.write(b'{"image": "imgs/a.png", "question": "Caf\xe9 area?", "answer": "6"}\n')  # latin-1 byte
        handle.write(json.dumps({**good, "image": "imgs/a\u0000.png"}).encode() + b"\n")  # NUL in the path
        handle.write(json.dumps({**good, "image": "x" * 5000 + ".png"}).encode() + b"\n")  # name too long
        handle.write(json.dumps(good).encode() + b"\n")
    out, quarantine = tmp_path / "out.parquet", tmp_path / "q.jsonl"
    argv = ["convert", "--input", str(source), "--layout", "jsonl", "--output", str(out), "--no-progress"]
    argv += ["--quarantine", str(quarantine)]
    assert main(argv) == 1  # three bad rows of five: above the default --max-bad-fraction 0, no output
    assert "FAILED: bad fraction 0.6000" in capsys.readouterr().out and not out.exists()
    reasons = {r["row"]: (r["reason"], r["source"]) for r in quarantined(quarantine)}
    assert set(reasons) == {1, 2, 3}
    assert reasons[1][0].startswith(f"not UTF-8 text: line 2 of {source}") and reasons[1][1] == f"{source}:2"
    assert reasons[2][0].startswith("broken image path: 'imgs/a\\x00.png' is not a usable path")
    assert reasons[3][0].startswith("broken image path: 'xxx")

    assert main([*argv, "--max-bad-fraction", "0.6"]) == 0
    assert [row["extra_info"]["index"] for row in pq.read_table(out).to_pylist()] == [0, 4]

    nul = tmp_path / "g3k" / "train.parquet"  # the same path problem in an image cell of a parquet layout
    write_parquet(nul, {"images": [[{"bytes": None, "path": "a\x00.png"}]], "problem": ["Area?"], "answer": ["6"]})
    argv = ["convert", "--input", str(nul), "--layout", "geometry3k", "--output", str(tmp_path / "g.parquet")]
    assert main([*argv, "--quarantine", str(quarantine), "--no-progress"]) == 1
    assert quarantined(quarantine)[0]["reason"].startswith("broken image path: 'a\\x00.png' is not a usable path")


def damage(path, how: str):
    """Make ``path`` unreadable: not parquet at all, cut short, or with a corrupt page behind a valid footer."""
    if how == "junk":
        path.write_bytes(b"this is not a parquet file")
    elif how == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:
        corrupt_data_pages(path)
    return "corrupt parquet file" if how == "pages" else "not a parquet file"


@pytest.mark.parametrize("how", ["junk", "truncated", "pages"])
def test_unreadable_parquet_input_names_the_file(tmp_path, capsys, how):
    folder = tmp_path / "g3k"
    geometry3k = {"images": [[{"bytes": png(1), "path": "a.png"}]] * 3, "problem": ["Area?"] * 3, "answer": ["6"] * 3}
    write_parquet(folder / "a.parquet", geometry3k)
    bad = write_parquet(folder / "b.parquet", geometry3k)
    expected = damage(bad, how)
    out = tmp_path / "out.parquet"
    argv = ["convert", "--input", str(folder), "--layout", "geometry3k", "--output", str(out), "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"error: {expected}: {bad}" in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize(
    ("layout", "columns", "named"),
    [
        (
            "geometry3k",
            {"image": [png(1)], "question": ["q"], "answer": ["1"], "subject": ["math"]},
            "s 'problem', 'images'",
        ),
        (
            "mmk12",
            {"images": [[{"bytes": png(1), "path": ""}]], "problem": ["q"], "answer": ["1"]},
            "s 'question', 'image'",
        ),
    ],
)
def test_missing_column_names_column_and_layout(tmp_path, capsys, layout, columns, named):
    source = write_parquet(tmp_path / "in.parquet", columns)
    argv = ["convert", "--input", str(source), "--layout", layout, "--output", str(tmp_path / "o.parquet")]
    assert main([*argv, "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert f"missing column{named}" in error and f"layout {layout!r}" in error


def test_jsonl_missing_key_is_a_column_error(tmp_path, capsys):
    source = write_jsonl(tmp_path / "x.jsonl", [{"image": "a.png", "question": "q"}])
    argv = ["convert", "--input", str(source), "--layout", "jsonl", "--output", str(tmp_path / "o.parquet")]
    assert main(argv) == 2
    assert "missing column 'answer'" in capsys.readouterr().err


def test_convert_is_deterministic(tmp_path):
    source = geometry3k_file(tmp_path)
    outputs = []
    for name, workers in (("a.parquet", "1"), ("b.parquet", "3")):
        out = tmp_path / name
        argv = ["convert", "--input", str(source), "--layout", "geometry3k", "--output", str(out), "--no-progress"]
        assert main([*argv, "--workers", workers]) == 0
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]


def test_the_clis_say_their_version_and_verls():
    import subprocess
    import sys

    for module, prog in (("data_prep.cli", "diva-prep"), ("verl_ext.report.cli", "diva-report")):
        code = f"import sys; from {module} import main; sys.exit(main(['--version']))"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith(f"{prog} ") and "(diva-grpo-verl; verl 0.9.1)" in out.stdout
