"""verl's metrics log: the ``file`` logger's JSONL, read and merged over the launches of one run.

Format (``verl/utils/tracking.py``, ``FileLogger``): one JSON object per line, ``{"step": <int>, "data": {<metric
key>: <value>, ...}}``, written unbuffered, one line per ``Tracking.log`` call: the initial validation
(``val_before_train``) at the starting step, then one line per training step holding that step's training metrics
and, at validation steps, its ``val-core/...`` / ``val-aux/...`` metrics. NaN is written as ``null``. The logger
truncates its file when it opens it, so the launcher gives each launch its own file (``VERL_FILE_LOGGER_PATH``) and
a resumed run's files are merged here: in write order (modification time, then name), a later line's values win for
the same step (a resumed run repeats the steps after its checkpoint).

A run that is still going may have a last line cut short: it is left out (and reported). Any other line that is
not such an object raises :class:`ReportError` naming the file and line.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path


class ReportError(ValueError):
    """Input ``diva-report`` cannot use; the message names the file (and line) and what is wrong."""


@dataclass
class MetricLog:
    """Metrics of one run, merged over its log files: ``steps[step][key] = value`` (finite floats only)."""

    files: list[Path] = field(default_factory=list)
    steps: dict[int, dict[str, float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def keys(self) -> set[str]:
        return {key for values in self.steps.values() for key in values}


def is_metric_log(path: Path) -> bool:
    """Whether ``path``'s first non-blank line is a verl file-logger record (other JSONL files are not logs)."""
    try:
        with open(path, "rb") as handle:
            for raw in handle:
                if raw.strip():
                    record = json.loads(raw)
                    return isinstance(record, dict) and set(record) == {"step", "data"}
    except (OSError, ValueError):
        return False
    return False


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None  # strings, lists and null (verl writes NaN as null) are not plottable numbers
    value = float(value)
    return value if math.isfinite(value) else None


def read_metric_log(path: str | Path) -> tuple[list[tuple[int, dict[str, float]]], str | None]:
    """``([(step, metrics), ...], note)`` of one log file, in line order; ``note`` says when a cut-short last
    line was left out. Raises :class:`ReportError` naming ``path`` and the line of a malformed record."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise ReportError(f"{path}: cannot read the metrics log ({err.strerror or err})") from None
    lines = raw.split(b"\n")
    note = None
    if lines and lines[-1].strip():
        # No newline after the last record: the writer is still on it (or died on it). Keep it if it is whole.
        try:
            json.loads(lines[-1])
        except ValueError:
            note = f"{path}: last line {len(lines)} is incomplete (the run is still writing it); left out"
            lines = lines[:-1]
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as err:
            raise ReportError(f"{path}:{number}: not a JSON line ({err}): {line[:80]!r}") from None
        if not isinstance(record, dict) or not isinstance(record.get("data"), dict):
            raise ReportError(f'{path}:{number}: expected {{"step": <int>, "data": {{...}}}}, got {line[:80]!r}')
        step = record.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ReportError(f"{path}:{number}: 'step' must be an integer >= 0, got {step!r}")
        values = {str(k): v for k, v in ((k, _number(v)) for k, v in record["data"].items()) if v is not None}
        records.append((step, values))
    return records, note


def merge_logs(paths: list[Path]) -> MetricLog:
    """Merge log files in write order (mtime, then name); later values win for the same step and key."""
    ordered = sorted(paths, key=lambda p: (os.stat(p).st_mtime, str(p)))
    log = MetricLog(files=ordered)
    for path in ordered:
        records, note = read_metric_log(path)
        if note:
            log.notes.append(note)
        for step, values in records:
            log.steps.setdefault(step, {}).update(values)
    log.steps = dict(sorted(log.steps.items()))
    return log
