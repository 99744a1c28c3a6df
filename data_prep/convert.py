"""``diva-prep convert``: a downloaded dataset (geometry3k, MMK12, JSONL, the paper's benchmarks) -> DIVA parquet.

Per input row: strip ``<image>`` tags from the question, check that every image decodes (or that its path exists
inside the input folder), require a non-empty answer, and build the row with
``prompt = build_prompt(question, len(images))`` and ``question_id = "<data_source>/<split>/<row index>"``.
Rows that fail go to the quarantine file; the command fails (and writes no output) when the bad fraction exceeds
``max_bad_fraction``. Rows are checked on a thread pool (PIL and zlib release the GIL while decoding) and written
in input order, so the output is byte-for-byte the same on every run.
"""

from __future__ import annotations

import itertools
import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from data_prep.errors import PrepError
from data_prep.images import image_entry
from data_prep.layouts import AUTO, LAYOUT_NAMES, RawRecord, count_rows, detect_layout, read_layout
from data_prep.parquet_io import DEFAULT_ROW_GROUP_SIZE, DivaParquetWriter
from data_prep.quarantine import BadRow, Quarantine
from verl_ext.data.schema import IMAGE_PLACEHOLDER, build_prompt

CHUNK_ROWS = 64  # rows handed to the thread pool at a time: bounds memory to a few chunks of images


@dataclass
class ConvertSummary:
    output: Path
    quarantine: Path
    rows_in: int = 0
    rows_written: int = 0
    bad_rows: int = 0
    reasons: Counter = field(default_factory=Counter)
    failed: bool = False
    layout: str = ""
    detected: bool = False  # the layout came from --layout auto

    @property
    def bad_fraction(self) -> float:
        return self.bad_rows / self.rows_in if self.rows_in else 0.0


def default_quarantine_path(output: str | Path) -> Path:
    output = Path(output)
    return output.with_name(output.stem + ".quarantine.jsonl")


def clean_question(text) -> str:
    """The bare question: ``<image>`` tags removed (the prompt gets its own, one per image), whitespace tidied."""
    if text is None:
        return ""
    return " ".join(str(text).replace(IMAGE_PLACEHOLDER, " ").split())


def _string_list(value, key: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise BadRow(f"bad optional field: {key!r} must be a list of strings")
    return [item.strip() for item in value if item.strip()]


def build_row(record: RawRecord, split: str, data_source: str) -> dict:
    """One DIVA row from one input record; raises :class:`BadRow` with the reason when the record is unusable."""
    if record.error:
        raise BadRow(record.error)
    question = clean_question(record.question)
    if not question:
        raise BadRow("empty question")
    answer = "" if record.answer is None else str(record.answer).strip()
    if not answer:
        raise BadRow("empty answer")
    if not record.images:
        raise BadRow("no image: every DIVA row needs at least one image")
    images = [image_entry(cell, record.root) for cell in record.images]
    optional = record.optional
    difficulty = optional.get("difficulty")
    if difficulty is not None:
        if isinstance(difficulty, bool) or not isinstance(difficulty, (int, float)) or not 1 <= difficulty <= 9:
            raise BadRow(f"bad optional field: 'difficulty' must be a number in [1, 9], got {difficulty!r}")
        difficulty = float(difficulty)
    text_in_image = optional.get("text_in_image", True)
    if not isinstance(text_in_image, bool):
        raise BadRow(f"bad optional field: 'text_in_image' must be true or false, got {text_in_image!r}")
    question_id = f"{data_source}/{split}/{record.index}"
    return {
        "data_source": data_source,
        "prompt": build_prompt(question, len(images)),
        "images": images,
        "ability": record.ability,
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {
            "split": split,
            "index": record.index,
            "question_id": question_id,
            "answer": answer,
            "question": question,
        },
        "question": question,
        "paraphrases": _string_list(optional.get("paraphrases"), "paraphrases"),
        "hint_steps": _string_list(optional.get("hint_steps"), "hint_steps"),
        "text_in_image": text_in_image,
        "difficulty": difficulty,
    }


def _try_build(record: RawRecord, split: str, data_source: str) -> tuple[RawRecord, dict | None, str | None]:
    try:
        return record, build_row(record, split, data_source), None
    except BadRow as exc:
        return record, None, str(exc)


def convert(
    input_path: str | Path,
    layout: str,
    output: str | Path,
    split: str = "train",
    data_source: str | None = None,
    quarantine_path: str | Path | None = None,
    max_bad_fraction: float = 0.0,
    workers: int | None = None,
    row_group_size: int = DEFAULT_ROW_GROUP_SIZE,
    progress: bool = True,
) -> ConvertSummary:
    """Convert ``input_path`` (a file, or for parquet layouts a folder of ``*.parquet``) to a DIVA parquet.

    Returns a :class:`ConvertSummary`; ``failed`` is True (and ``output`` untouched) when more than
    ``max_bad_fraction`` of the rows were quarantined. Raises :class:`PrepError` for unusable input as a whole.
    """
    input_path, output = Path(input_path), Path(output)
    if layout not in LAYOUT_NAMES:
        raise PrepError(f"--layout {layout!r} is not one of {list(LAYOUT_NAMES)}")
    if not input_path.exists():
        raise PrepError(f"--input {str(input_path)!r} does not exist")
    if not 0.0 <= max_bad_fraction <= 1.0:
        raise PrepError(f"--max-bad-fraction must be in [0, 1], got {max_bad_fraction}")
    detected = layout == AUTO
    if detected:
        layout = detect_layout(input_path)
    if data_source is None:
        data_source = input_path.stem if layout == "jsonl" else layout
    summary = ConvertSummary(output=output, quarantine=Path(quarantine_path or default_quarantine_path(output)))
    summary.layout, summary.detected = layout, detected
    workers = workers or min(8, os.cpu_count() or 1)
    records = read_layout(input_path, layout)
    total = count_rows(input_path, layout)
    with (
        Quarantine(summary.quarantine) as quarantine,
        DivaParquetWriter(output, row_group_size) as writer,
        ThreadPoolExecutor(max_workers=workers) as pool,
        tqdm(total=total, desc=f"convert {layout}", unit="row", disable=not progress) as bar,
    ):
        while chunk := list(itertools.islice(records, CHUNK_ROWS)):
            built = pool.map(_try_build, chunk, itertools.repeat(split), itertools.repeat(data_source))
            for record, row, reason in built:
                summary.rows_in += 1
                if row is None:
                    quarantine.add(record.index, reason, source=record.source)
                else:
                    writer.write(row)
            bar.update(len(chunk))
            bar.set_postfix(bad=quarantine.count)
        summary.bad_rows, summary.reasons = quarantine.count, quarantine.reasons
        if summary.rows_in == 0:
            raise PrepError(f"--input {str(input_path)!r} holds no rows")
        if summary.bad_fraction > max_bad_fraction or summary.bad_rows == summary.rows_in:
            summary.failed = True  # leaving the writer without commit removes the temporary output
        else:
            writer.commit()
            summary.rows_written = writer.rows_written
    return summary


def format_summary(summary: ConvertSummary, max_bad_fraction: float) -> str:
    lines = [f"rows read: {summary.rows_in}, written: {summary.rows_written}, quarantined: {summary.bad_rows}"]
    if summary.detected:
        lines.insert(0, f"layout: {summary.layout} (found by --layout auto)")
    for reason, count in summary.reasons.most_common():
        lines.append(f"  {count:6d}  {reason}")
    if summary.bad_rows:
        lines.append(f"quarantine file (row index and reason per line): {summary.quarantine}")
    if summary.failed:
        lines.append(
            f"FAILED: bad fraction {summary.bad_fraction:.4f} exceeds --max-bad-fraction {max_bad_fraction}; "
            f"{summary.output} was not written. Fix the rows listed in the quarantine file, or raise "
            "--max-bad-fraction to accept dropping them."
        )
    else:
        lines.append(f"wrote {summary.output}")
    return "\n".join(lines)
