"""``diva-prep synth`` and ``diva-prep validate``: synthetic rows are valid and deterministic; each defect is caught."""

from __future__ import annotations

import io
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image
from prep_fixtures import corrupt_data_pages, write_diva

from data_prep.cli import main
from data_prep.synth import FIGURES, IMAGE_SIZE, synth_rows
from data_prep.validate import validate_file
from verl_ext.data.schema import SCHEMA, build_prompt


def test_synth_round_trip_through_validate(tmp_path, capsys):
    out = tmp_path / "synth.parquet"
    assert main(["synth", "--output", str(out), "--n", "12", "--seed", "3"]) == 0
    assert main(["validate", str(out)]) == 0
    assert "OK: 0 error(s)" in capsys.readouterr().out
    rows = pq.read_table(out).to_pylist()
    assert pq.read_schema(out).equals(SCHEMA)
    assert len({row["extra_info"]["question_id"] for row in rows}) == 12
    for row in rows:
        assert row["text_in_image"] is True
        assert len(row["paraphrases"]) == 2 and 3 <= len(row["hint_steps"]) <= 5
        assert int(row["reward_model"]["ground_truth"]) >= 0
        assert Image.open(io.BytesIO(row["images"][0]["bytes"])).size == (384, 288)


def test_synth_is_deterministic_in_the_seed(tmp_path):
    a, b, c = (tmp_path / name for name in ("a.parquet", "b.parquet", "c.parquet"))
    for path, seed in ((a, "1"), (b, "1"), (c, "2")):
        assert main(["synth", "--output", str(path), "--n", "8", "--seed", seed]) == 0
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()


def _pixels(row) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(row["images"][0]["bytes"])).convert("RGB")).astype(int)


def test_synth_answers_match_the_drawn_figure():
    """Measure bars and number-line points in the pixels, independently of the drawing code's variables."""
    checked = Counter()
    for row in synth_rows(24, seed=5):
        pixels, answer = _pixels(row), int(row["reward_model"]["ground_truth"])
        if row["question"].startswith("The bar chart"):
            bar = np.all(pixels == (70, 120, 200), axis=-1)
            columns = np.flatnonzero(bar.any(axis=0))
            runs = np.split(columns, np.flatnonzero(np.diff(columns) > 1) + 1)
            unit = (IMAGE_SIZE[1] - 90) / 9  # pixels per bar unit, as the axis is laid out
            values = [round((bar[:, run[len(run) // 2]].sum() + 1) / unit) for run in runs]
            assert answer == (sum(values) if "sum" in row["question"] else max(values))
            checked["bar"] += 1
        elif row["question"].startswith("Points P and Q"):
            below_labels = np.arange(IMAGE_SIZE[1])[:, None] > IMAGE_SIZE[1] // 2 - 7  # the dots, not the P/Q text
            red = np.all(pixels == (200, 40, 40), axis=-1) & below_labels
            xs = np.flatnonzero(red.any(axis=0))
            centres = [run.mean() for run in np.split(xs, np.flatnonzero(np.diff(xs) > 1) + 1)]
            tick_spacing = (IMAGE_SIZE[0] - 60) / 10
            assert answer == round((centres[1] - centres[0]) / tick_spacing)
            checked["number line"] += 1
    assert checked["bar"] >= 3 and checked["number line"] >= 3


def broken_rows() -> list[dict]:
    rows = list(synth_rows(7, seed=0))
    rows[1]["extra_info"]["question_id"] = rows[0]["extra_info"]["question_id"]
    rows[2]["prompt"] = build_prompt(rows[2]["question"], 2)
    rows[3]["images"] = [{"bytes": b"GIF89a-but-not-an-image", "path": ""}]
    rows[4]["reward_model"]["ground_truth"] = " "
    answer = rows[5]["reward_model"]["ground_truth"]
    rows[5]["hint_steps"] = ["Read the labels.", f"So the answer is \\boxed{{{answer}}}."]
    rows[6]["difficulty"] = 12.0
    return rows


def test_validate_reports_each_defect(tmp_path, capsys):
    path = write_diva(tmp_path / "bad.parquet", broken_rows())
    report = validate_file(path)
    failing = {(finding.check, finding.row) for finding in report.errors}
    assert failing == {
        ("question ids unique", 1),
        ("placeholders match images", 2),
        ("images decode", 3),
        ("answer present", 4),
        ("hints do not leak the answer", 5),
        ("difficulty in [1, 9]", 6),
    }
    assert main(["validate", str(path)]) == 1
    text = capsys.readouterr().out
    assert "ERROR: question ids unique: 1 row(s)" in text and "same id as row 0" in text
    assert "FAILED: 6 error(s)" in text


def test_validate_reports_missing_columns_and_unreadable_files(tmp_path):
    table = pa.Table.from_pylist(list(synth_rows(2)), schema=SCHEMA).drop_columns(["hint_steps", "question"])
    pq.write_table(table, tmp_path / "old.parquet")
    report = validate_file(tmp_path / "old.parquet")
    assert {finding.detail for finding in report.errors} == {"missing column 'question'", "missing column 'hint_steps'"}
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    assert not validate_file(tmp_path / "junk.parquet").ok
    corrupt = corrupt_data_pages(write_diva(tmp_path / "corrupt.parquet", list(synth_rows(2))))
    report = validate_file(corrupt)  # footer fine, data pages not: a finding naming the file, not a traceback
    assert [(f.check, f.detail.split(" (")[0]) for f in report.errors] == [
        ("file readable", f"corrupt parquet file: {corrupt}: cannot read the rows from row 0 on")
    ]


@pytest.mark.parametrize("rows", [3, 9])
def test_every_figure_kind_appears(rows):
    questions = {row["question"].split(".")[0] for row in synth_rows(rows)}
    assert len(questions) >= min(rows, len(FIGURES))


def test_files_written_before_visual_entropy_existed_still_validate(tmp_path, capsys):
    out = tmp_path / "synth.parquet"
    assert main(["synth", "--output", str(out), "--n", "4"]) == 0
    table = pq.read_table(out)
    infos = [
        {k: v for k, v in info.items() if k != "visual_entropy"} for info in table.column("extra_info").to_pylist()
    ]
    column = table.schema.get_field_index("extra_info")
    old = tmp_path / "old.parquet"
    pq.write_table(table.set_column(column, "extra_info", pa.array(infos)), old)
    assert "visual_entropy" not in pq.read_schema(old).field("extra_info").type.names
    assert main(["validate", str(old)]) == 0
    assert "OK: 0 error(s)" in capsys.readouterr().out
    # Any other change of the struct is still an error.
    infos = [{**info, "extra": 1} for info in infos]
    pq.write_table(table.set_column(column, "extra_info", pa.array(infos)), old)
    assert validate_file(old).errors
