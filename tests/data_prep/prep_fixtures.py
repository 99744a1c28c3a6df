"""Tiny inputs made on the fly: images, layout files, and DIVA parquet rows with unique questions."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image, ImageDraw

from data_prep.synth import synth_rows
from verl_ext.data.schema import SCHEMA, build_prompt


def png(seed: int, size: tuple[int, int] = (48, 32)) -> bytes:
    image = Image.new("RGB", size, (seed * 37 % 256, seed * 91 % 256, 128))
    ImageDraw.Draw(image).rectangle([4, 4, 4 + seed % 20, 20], fill="black")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def write_parquet(path: Path, columns: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)
    return path


def write_jsonl(path: Path, lines: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for line in lines:
            handle.write(line if isinstance(line, str) else json.dumps(line))
            handle.write("\n")
    return path


def diva_rows_without_variants(n: int) -> list[dict]:
    """``n`` valid DIVA rows with unique question texts and empty paraphrases / hint steps."""
    rows = []
    for index, row in enumerate(synth_rows(n, seed=7)):
        question = f"Item {index}: {row['question']}"
        row["question"] = question
        row["extra_info"]["question"] = question
        row["prompt"] = build_prompt(question, len(row["images"]))
        row["paraphrases"], row["hint_steps"] = [], []
        rows.append(row)
    return rows


def write_diva(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path)
    return path


def corrupt_data_pages(path: Path) -> Path:
    """Overwrite the first page header of the first column with 0xff bytes; the footer stays readable."""
    chunk = pq.ParquetFile(path).metadata.row_group(0).column(0)
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    data = bytearray(path.read_bytes())
    data[start : start + 16] = b"\xff" * 16
    path.write_bytes(bytes(data))
    return path
