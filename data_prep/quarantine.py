"""Bad rows are never dropped silently: each goes to a JSONL quarantine file with its row index and reason."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path


class BadRow(Exception):
    """A problem confined to one input row (undecodable image, empty answer, broken path, ...)."""


class Quarantine:
    """Append-only JSONL of rejected input rows: ``{"row": int, "reason": str, "source": str, ...}``.

    The file is (re)created on open so it always describes the latest run, even when it stays empty.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 (closed in close())
        self.count = 0
        self.reasons: Counter[str] = Counter()

    def add(self, row: int, reason: str, **context) -> None:
        record = {"row": row, "reason": reason, **context}
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.count += 1
        # Group by the reason's first clause so the summary stays short ("undecodable image: ..." -> one key).
        self.reasons[reason.split(":")[0]] += 1

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> Quarantine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
