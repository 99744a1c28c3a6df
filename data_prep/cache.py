"""Per-task result cache for ``variants``: a killed run resumes without paying for finished work again.

One append-only JSONL file per task kind and generation setting under the cache folder (``variants`` keys hints by
model, hint prompt version and image use, paraphrases by model, paraphrase prompt version and count, so changing a
setting of one task does not re-request the other), one line per finished (question, task):
``{"question_id", "task", "content_hash", "result"}``.
A line is written and flushed as soon as its task finishes, so after a kill only in-flight requests are lost.
``content_hash`` ties an entry to the question text and answer: an edited question is generated afresh.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

logger = logging.getLogger(__name__)


def content_hash(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode("utf-8")).hexdigest()[:16]


class ResultCache:
    def __init__(self, directory: str | Path, settings: dict):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        key = content_hash(json.dumps(settings, sort_keys=True))
        self.path = self.directory / f"results-{key}.jsonl"
        settings_file = self.directory / f"results-{key}.settings.json"
        if not settings_file.exists():  # for people wondering which file belongs to which run
            settings_file.write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")
        self._entries: dict[tuple[str, str], dict] = {}
        self.skipped_lines = 0
        if self.path.exists():
            self._load()
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())

    def _load(self) -> None:
        raw = self.path.read_bytes()
        for line in raw.decode("utf-8", errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                self._entries[(entry["question_id"], entry["task"])] = entry
            except (json.JSONDecodeError, KeyError, TypeError):
                self.skipped_lines += 1  # a line cut short by a kill: that task simply runs again
        if raw and not raw.endswith(b"\n"):
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write("\n")  # so the next entry does not glue onto the cut line
        if self.skipped_lines:
            logger.warning("cache %s: ignored %d unreadable line(s)", self.path, self.skipped_lines)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, question_id: str, task: str, hash_: str) -> dict | None:
        entry = self._entries.get((question_id, task))
        return entry["result"] if entry and entry.get("content_hash") == hash_ else None

    def put(self, question_id: str, task: str, hash_: str, result: dict) -> None:
        entry = {"question_id": question_id, "task": task, "content_hash": hash_, "result": result}
        self._entries[(question_id, task)] = entry
        self._file.write(json.dumps(entry, ensure_ascii=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()
