"""``diva-prep validate``: schema and content checks on a DIVA parquet, with a readable report.

Errors (non-zero exit): missing columns or wrong column types; a prompt that is not one user message; ``<image>``
placeholders that do not match the number of images; images that do not decode; an empty answer; a missing or
repeated question id; a hint step that leaks the answer; a difficulty outside [1, 9].
Warnings: ``extra_info.answer`` differing from the ground truth, a question missing from its prompt, paraphrases
that contain ``<image>`` tags or repeat the question.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

from data_prep.answers import hint_leak, normalize_answer
from data_prep.errors import PrepError
from data_prep.images import decode_size
from data_prep.parquet_io import iter_parquet_batches
from data_prep.quarantine import BadRow
from verl_ext.data.schema import IMAGE_PLACEHOLDER, PROMPT_SUFFIX, SCHEMA, column_type_matches, missing_columns


@dataclass
class Finding:
    severity: str  # "error" | "warning"
    check: str  # short name, e.g. "image decodes"
    row: int | None
    question_id: str | None
    detail: str


@dataclass
class ValidationReport:
    path: Path
    rows: int = 0
    findings: list[Finding] = field(default_factory=list)
    stats: Counter = field(default_factory=Counter)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    @property
    def ok(self) -> bool:
        return not self.errors

    def add(self, severity: str, check: str, row: int | None, question_id: str | None, detail: str) -> None:
        self.findings.append(Finding(severity, check, row, question_id, detail))

    def format(self, max_examples: int = 5) -> str:
        """Counts per check, then up to ``max_examples`` rows for each failing check."""
        lines = [f"validate {self.path}: {self.rows} rows"]
        for key in ("with paraphrases", "with hint steps", "images"):
            if key in self.stats:
                lines.append(f"  {key}: {self.stats[key]}")
        grouped: dict[tuple[str, str], list[Finding]] = defaultdict(list)
        for finding in self.findings:
            grouped[(finding.severity, finding.check)].append(finding)
        for (severity, check), items in sorted(grouped.items()):
            lines.append(f"{severity.upper()}: {check}: {len(items)} row(s)")
            for finding in items[:max_examples]:
                where = "file" if finding.row is None else f"row {finding.row} ({finding.question_id})"
                lines.append(f"    {where}: {finding.detail}")
            if len(items) > max_examples:
                lines.append(f"    ... and {len(items) - max_examples} more")
        verdict = "OK" if self.ok else "FAILED"
        lines.append(f"{verdict}: {len(self.errors)} error(s), {len(self.warnings)} warning(s)")
        return "\n".join(lines)


def _check_row(report: ValidationReport, index: int, row: dict, seen_ids: dict[str, int]) -> None:
    extra = row.get("extra_info") or {}
    qid = extra.get("question_id")
    if not qid:
        report.add("error", "question id present", index, qid, "extra_info.question_id is empty")
    elif qid in seen_ids:
        report.add("error", "question ids unique", index, qid, f"same id as row {seen_ids[qid]}")
    else:
        seen_ids[qid] = index

    prompt = row.get("prompt") or []
    images = row.get("images") or []
    report.stats["images"] += len(images)
    if len(prompt) != 1 or prompt[0].get("role") != "user" or not prompt[0].get("content"):
        report.add("error", "prompt is one user message", index, qid, f"prompt has {len(prompt)} message(s)")
    else:
        text = prompt[0]["content"]
        placeholders = text.count(IMAGE_PLACEHOLDER)
        if placeholders != len(images):
            detail = f"{placeholders} <image> tag(s), {len(images)} image(s)"
            report.add("error", "placeholders match images", index, qid, detail)
        if PROMPT_SUFFIX not in text:
            report.add("warning", "prompt suffix present", index, qid, "prompt lacks the <think>/\\boxed{} suffix")
        if row.get("question") and row["question"].strip() not in text:
            report.add("warning", "question in prompt", index, qid, "the question column is not in the prompt text")

    for number, image in enumerate(images):
        if not image or not image.get("bytes"):
            report.add("error", "images decode", index, qid, f"image {number} has no bytes")
            continue
        try:
            decode_size(image["bytes"])
        except BadRow as exc:
            report.add("error", "images decode", index, qid, f"image {number}: {exc}")

    ground_truth = ((row.get("reward_model") or {}).get("ground_truth") or "").strip()
    if not ground_truth:
        report.add("error", "answer present", index, qid, "reward_model.ground_truth is empty")
    elif normalize_answer(extra.get("answer") or "") != normalize_answer(ground_truth):
        report.add("warning", "extra_info.answer matches", index, qid, "extra_info.answer differs from ground truth")

    question = row.get("question") or ""
    if not question.strip():
        report.add("error", "question present", index, qid, "question column is empty")
    hint_steps = row.get("hint_steps") or []
    if hint_steps:
        report.stats["with hint steps"] += 1
    for number, step in enumerate(hint_steps):
        reason = hint_leak(step, ground_truth, question) if ground_truth else None
        if reason:
            report.add("error", "hints do not leak the answer", index, qid, f"step {number + 1}: {reason}")
    paraphrases = row.get("paraphrases") or []
    if paraphrases:
        report.stats["with paraphrases"] += 1
    for number, paraphrase in enumerate(paraphrases):
        if IMAGE_PLACEHOLDER in paraphrase:
            report.add("warning", "paraphrases clean", index, qid, f"paraphrase {number + 1} contains <image>")
        if " ".join(paraphrase.split()) == " ".join(question.split()):
            report.add("warning", "paraphrases clean", index, qid, f"paraphrase {number + 1} repeats the question")

    difficulty = row.get("difficulty")
    if difficulty is not None and not 1.0 <= difficulty <= 9.0:
        report.add("error", "difficulty in [1, 9]", index, qid, f"difficulty {difficulty}")


def validate_file(path: str | Path, batch_size: int = 64) -> ValidationReport:
    """Check every row of ``path`` (streamed in batches); never raises for bad content, only reports it."""
    path = Path(path)
    report = ValidationReport(path=path)
    try:
        parquet = pq.ParquetFile(path)
    except (OSError, ValueError) as exc:  # pyarrow raises ArrowInvalid (a ValueError) for non-parquet files
        report.add("error", "file readable", None, None, f"cannot open as parquet: {exc}")
        return report
    schema = parquet.schema_arrow
    missing = missing_columns(schema.names)
    for name in missing:
        report.add("error", "schema columns", None, None, f"missing column {name!r}")
    for expected in SCHEMA:
        if expected.name in schema.names and not column_type_matches(expected.name, schema.field(expected.name).type):
            actual = schema.field(expected.name).type
            report.add("error", "schema types", None, None, f"{expected.name}: {actual}, expected {expected.type}")
    if missing:
        return report  # row checks would only repeat the schema error
    seen_ids: dict[str, int] = {}
    index = 0
    try:
        for batch in iter_parquet_batches(path, batch_size=batch_size):
            for row in batch:
                _check_row(report, index, row, seen_ids)
                index += 1
    except PrepError as exc:  # corrupt data pages: report where reading stopped, keep what was checked before
        report.add("error", "file readable", None, None, str(exc))
    report.rows = index
    return report
