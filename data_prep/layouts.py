"""Readers for the input layouts users download: geometry3k parquet, MMK12 parquet, JSONL with image files.

Each reader yields :class:`RawRecord` in a fixed order (files sorted by path, rows in file order), so row indices and
therefore question ids are the same on every run over the same input. Row-level problems travel as ``error`` and end
up in the quarantine; problems that make the whole input unreadable (a missing column) raise :class:`PrepError`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data_prep.errors import PrepError
from data_prep.parquet_io import iter_parquet_batches, num_rows, open_parquet


@dataclass
class RawRecord:
    index: int  # 0-based position over the whole input; part of the question id
    source: str  # "<file>#<row in file>" for messages
    root: Path  # folder that image paths are relative to, and may not escape
    question: Any = None
    answer: Any = None
    images: list = field(default_factory=list)  # raw image cells, normalised by images.image_entry
    ability: str = "math"
    optional: dict = field(default_factory=dict)  # JSONL only: paraphrases, hint_steps, difficulty, text_in_image
    error: str | None = None  # a row-level problem found while reading (e.g. a line that is not JSON)


@dataclass(frozen=True)
class ParquetLayout:
    name: str
    question_column: str
    answer_column: str
    image_column: str
    image_is_list: bool
    ability_column: str | None = None

    @property
    def columns(self) -> list[str]:
        names = [self.question_column, self.answer_column, self.image_column]
        return names + ([self.ability_column] if self.ability_column else [])


PARQUET_LAYOUTS = {
    # hiyouga/geometry3k: images (list of {bytes, path}), problem (with "<image>" tags), answer.
    "geometry3k": ParquetLayout("geometry3k", "problem", "answer", "images", image_is_list=True),
    # FanqingM/MMK12: image ({bytes, path} or bytes), question, answer, subject (-> ``ability``).
    "mmk12": ParquetLayout("mmk12", "question", "answer", "image", image_is_list=False, ability_column="subject"),
}
JSONL_REQUIRED_KEYS = ("question", "answer")
JSONL_OPTIONAL_KEYS = ("paraphrases", "hint_steps", "difficulty", "text_in_image")
LAYOUT_NAMES = (*PARQUET_LAYOUTS, "jsonl")


def parquet_files(path: Path) -> list[Path]:
    """``path`` itself, or every ``*.parquet`` below the folder ``path``, sorted for a stable order."""
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(path.rglob("*.parquet"))
        if not files:
            raise PrepError(f"--input {str(path)!r} is a folder with no *.parquet files in it")
        return files
    raise PrepError(f"--input {str(path)!r} does not exist")


def count_rows(path: Path, layout: str) -> int | None:
    """Rows the reader will yield (for the progress bar); None when unknown without reading everything."""
    if layout == "jsonl":
        with open(path, "rb") as handle:
            return sum(1 for line in handle if line.strip())
    return sum(num_rows(file) for file in parquet_files(path))


def read_parquet_layout(path: Path, layout: ParquetLayout, batch_size: int = 64) -> Iterator[RawRecord]:
    files = parquet_files(path)
    root = path if path.is_dir() else path.parent
    for file in files:  # check every file before reading any row: fail fast, not after an hour
        names = open_parquet(file).schema_arrow.names
        missing = [column for column in layout.columns if column not in names]
        if missing:
            plural = "s" if len(missing) > 1 else ""
            raise PrepError(
                f"{file}: missing column{plural} {', '.join(map(repr, missing))}, which layout {layout.name!r} "
                f"expects (expected {layout.columns}, found {names}). Pick the matching --layout or rename the column."
            )
    index = 0
    for file in files:
        row_in_file = 0
        for batch in iter_parquet_batches(file, layout.columns, batch_size):
            for cells in batch:
                images = cells[layout.image_column]
                if not layout.image_is_list:
                    images = [images]
                record = RawRecord(
                    index=index,
                    source=f"{file}#{row_in_file}",
                    root=root,
                    question=cells[layout.question_column],
                    answer=cells[layout.answer_column],
                    images=images if images is not None else [],
                )
                if layout.ability_column and cells.get(layout.ability_column):
                    record.ability = str(cells[layout.ability_column]).strip().lower()
                yield record
                index += 1
                row_in_file += 1


def read_jsonl(path: Path) -> Iterator[RawRecord]:
    """One JSON object per non-blank line: ``question``, ``answer``, ``image`` (path) or ``images`` (paths).

    Image paths are relative to the JSONL file's folder. Optional keys: ``paraphrases``, ``hint_steps``,
    ``difficulty`` (1..9), ``text_in_image``.
    """
    if not path.is_file():
        raise PrepError(f"--input {str(path)!r} is not a file (layout 'jsonl' reads one .jsonl file)")
    root = path.parent
    checked_keys = False
    index = 0
    with open(path, "rb") as handle:  # bytes, so one line that is not UTF-8 is quarantined alone
        for line_number, raw_line in enumerate(handle, start=1):
            if not raw_line.strip():
                continue
            record = RawRecord(index=index, source=f"{path}:{line_number}", root=root)
            index += 1
            try:
                line = raw_line.decode("utf-8")
            except UnicodeDecodeError as exc:
                record.error = f"not UTF-8 text: line {line_number} of {path}: {exc.reason} at byte {exc.start}"
                yield record
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                record.error = f"malformed JSON line: {exc.msg} at column {exc.colno}"
                yield record
                continue
            if not isinstance(obj, dict):
                record.error = f"malformed JSON line: expected an object, got {type(obj).__name__}"
                yield record
                continue
            if not checked_keys:  # the first object defines the columns: missing there means the layout is wrong
                for key in JSONL_REQUIRED_KEYS:
                    if key not in obj:
                        raise PrepError(
                            f"{path}:{line_number}: missing column {key!r}, which layout 'jsonl' expects "
                            f"(each line needs 'question', 'answer' and 'image' or 'images'; found {sorted(obj)})"
                        )
                if "image" not in obj and "images" not in obj:
                    raise PrepError(
                        f"{path}:{line_number}: missing column 'image' (or 'images'), which layout 'jsonl' expects "
                        f"(found {sorted(obj)})"
                    )
                checked_keys = True
            missing = [key for key in JSONL_REQUIRED_KEYS if key not in obj]
            if missing:
                record.error = f"missing key: {missing[0]!r}"
                yield record
                continue
            images = obj.get("images", obj.get("image"))
            if isinstance(images, str):
                images = [images]
            if not isinstance(images, list) or not all(isinstance(item, str) for item in images):
                record.error = "broken image path: 'image' must be a path string or 'images' a list of path strings"
                yield record
                continue
            record.question, record.answer, record.images = obj["question"], obj["answer"], images
            if obj.get("ability"):
                record.ability = str(obj["ability"]).strip().lower()
            record.optional = {key: obj[key] for key in JSONL_OPTIONAL_KEYS if key in obj}
            yield record


def read_layout(path: str | Path, layout: str) -> Iterator[RawRecord]:
    path = Path(path)
    if layout == "jsonl":
        return read_jsonl(path)
    if layout not in PARQUET_LAYOUTS:
        raise PrepError(f"--layout {layout!r} is not one of {list(LAYOUT_NAMES)}")
    return read_parquet_layout(path, PARQUET_LAYOUTS[layout])
