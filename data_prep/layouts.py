"""Readers for the input layouts users download: geometry3k parquet, MMK12 parquet, JSONL with image files, and the
six evaluation sets of the paper (:mod:`data_prep.benchmarks`); ``auto`` picks the layout from the columns found.

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

from data_prep.benchmarks import BENCHMARK_LAYOUTS, BenchmarkLayout, Shaped
from data_prep.errors import PrepError
from data_prep.parquet_io import iter_parquet_batches, num_rows, open_parquet
from data_prep.quarantine import BadRow


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

    def read_columns(self, names) -> list[str]:
        return self.columns

    def shape(self, cells: dict) -> Shaped:
        images = cells[self.image_column]
        if not self.image_is_list:
            images = [images]
        ability = cells.get(self.ability_column) if self.ability_column else None
        return Shaped(
            question=cells[self.question_column],
            answer=cells[self.answer_column],
            images=images if images is not None else [],
            ability=str(ability).strip().lower() if ability else "math",
        )


PARQUET_LAYOUTS = {
    # hiyouga/geometry3k: images (list of {bytes, path}), problem (with "<image>" tags), answer.
    "geometry3k": ParquetLayout("geometry3k", "problem", "answer", "images", image_is_list=True),
    # FanqingM/MMK12: image ({bytes, path} or bytes), question, answer, subject (-> ``ability``).
    "mmk12": ParquetLayout("mmk12", "question", "answer", "image", image_is_list=False, ability_column="subject"),
}
PARQUET_LAYOUTS.update(BENCHMARK_LAYOUTS)
JSONL_REQUIRED_KEYS = ("question", "answer")
JSONL_OPTIONAL_KEYS = ("paraphrases", "hint_steps", "difficulty", "text_in_image")
AUTO = "auto"
LAYOUT_NAMES = (*PARQUET_LAYOUTS, "jsonl", AUTO)


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


def detect_layout(path: str | Path) -> str:
    """The layout whose columns the input has (``jsonl`` for a ``.jsonl`` file); among several, the one that
    needs the most columns (MathVision's columns include MMK12's, for instance). :class:`PrepError` naming the
    columns found and the layouts known when none (or two equally specific ones) fit."""
    path = Path(path)
    if path.is_file() and path.suffix == ".jsonl":
        return "jsonl"
    first = parquet_files(path)[0]
    names = set(open_parquet(first).schema_arrow.names)
    fits = [name for name, layout in PARQUET_LAYOUTS.items() if set(layout.columns) <= names]
    known = "; ".join(f"{name}: {', '.join(layout.columns)}" for name, layout in PARQUET_LAYOUTS.items())
    if not fits:
        raise PrepError(
            f"--layout auto: {first} has columns {sorted(names)}, which match no known layout ({known}; "
            "jsonl: a .jsonl file with question, answer, image or images). Pick one with --layout, or rename columns."
        )
    most = max(len(PARQUET_LAYOUTS[name].columns) for name in fits)
    best = [name for name in fits if len(PARQUET_LAYOUTS[name].columns) == most]
    if len(best) > 1:
        raise PrepError(f"--layout auto: {first} fits the layouts {best} equally well; pick one with --layout")
    return best[0]


def read_parquet_layout(
    path: Path, layout: ParquetLayout | BenchmarkLayout, batch_size: int = 64
) -> Iterator[RawRecord]:
    files = parquet_files(path)
    root = path if path.is_dir() else path.parent
    read_columns = {}
    for file in files:  # check every file before reading any row: fail fast, not after an hour
        names = open_parquet(file).schema_arrow.names
        read_columns[file] = layout.read_columns(names)
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
        for batch in iter_parquet_batches(file, read_columns[file], batch_size):
            for cells in batch:
                record = RawRecord(index=index, source=f"{file}#{row_in_file}", root=root)
                try:
                    shaped = layout.shape(cells)
                except BadRow as exc:  # e.g. a benchmark answer that is not among its choices
                    record.error = str(exc)
                else:
                    record.question, record.answer, record.images = shaped.question, shaped.answer, shaped.images
                    record.ability = shaped.ability
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
    if layout == AUTO:
        layout = detect_layout(path)
    if layout == "jsonl":
        return read_jsonl(path)
    if layout not in PARQUET_LAYOUTS:
        raise PrepError(f"--layout {layout!r} is not one of {list(LAYOUT_NAMES)}")
    return read_parquet_layout(path, PARQUET_LAYOUTS[layout])
