"""The difficulty service's own running record, so a restarted actor comes back where it left off.

Rewriting the whole state (18,000 questions) after every step would cost more than the step's update, so the
store is a base file plus an append-only journal, in one folder:

- ``base.json``: a full state, written atomically by :func:`~verl_ext.difficulty.persistence.save_state`;
- ``journal.jsonl``: one line per update applied since, each a :class:`~verl_ext.difficulty.tracker.UpdateRecord`
  holding the new difficulties (not just the alphas), so replaying it reproduces the state exactly.

An update is appended (and flushed to the OS) before it is applied and acknowledged; a process kill loses
nothing acknowledged. :meth:`LiveStateStore.compact` folds the journal into the base when it grows past a few
times the table size; records whose version is not above the base's are skipped on replay, so a crash between
writing the base and truncating the journal double-counts nothing.

A torn last line (the process died while appending, so that update was never acknowledged) is dropped with a
warning; a bad line anywhere else raises :class:`~verl_ext.difficulty.persistence.DifficultyStateFileError`.
"""

from __future__ import annotations

import json
import logging
import os

from verl_ext.difficulty.persistence import DifficultyStateFileError, load_state, save_state
from verl_ext.difficulty.tracker import DifficultyTracker, UpdateRecord

logger = logging.getLogger(__name__)

BASE_FILENAME = "base.json"
JOURNAL_FILENAME = "journal.jsonl"


class LiveStateStore:
    """Base file + journal in ``folder`` (created if missing).

    Args:
        folder: where the files live; must survive an actor restart (same node or shared storage).
        compact_factor: compact when the journal holds more than ``compact_factor * questions + 4096`` entries.
    """

    def __init__(self, folder: str, compact_factor: float = 4.0):
        self.folder = folder
        self.base_path = os.path.join(folder, BASE_FILENAME)
        self.journal_path = os.path.join(folder, JOURNAL_FILENAME)
        self.compact_factor = compact_factor
        os.makedirs(folder, exist_ok=True)
        self._journal = None
        self._journal_entries = 0

    def restore_into(self, tracker: DifficultyTracker) -> int:
        """Load base + journal into a fresh ``tracker``; returns the number of journal records replayed."""
        base_version = 0
        if os.path.exists(self.base_path):
            state = load_state(self.base_path)
            try:
                tracker.load_state_dict(state)
            except ValueError as err:
                raise DifficultyStateFileError(f"{self.base_path}: {err}") from None
            base_version = int(state["version"])
        replayed = 0
        for record in self._read_journal():
            if record.version > base_version:
                tracker.apply(record)
                replayed += 1
                self._journal_entries += len(record)
        return replayed

    def _read_journal(self):
        if not os.path.exists(self.journal_path):
            return
        with open(self.journal_path, "rb") as f:
            raw = f.read()
        # A complete journal ends with "\n"; bytes after the last one are a torn write.
        complete = raw.rfind(b"\n") + 1
        if complete < len(raw):
            logger.warning(
                "%s: dropping a torn last line (%d bytes): the process died while appending that update, "
                "before acknowledging it",
                self.journal_path,
                len(raw) - complete,
            )
            # Cut it off now, or the next append would glue a good record onto it.
            os.truncate(self.journal_path, complete)
        lines = raw[:complete].split(b"\n")[:-1]
        for number, line in enumerate(lines, start=1):
            try:
                # UnicodeDecodeError is a ValueError: a line that is not UTF-8 is a corrupt record like any other.
                yield UpdateRecord.from_json(json.loads(line.decode("utf-8")))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError, RecursionError) as err:
                raise DifficultyStateFileError(
                    f"{self.journal_path}, line {number}: corrupt journal record ({type(err).__name__}: {err})"
                ) from None

    def append(self, record: UpdateRecord) -> None:
        """Append one record and flush it to the OS (survives a process kill)."""
        if self._journal is None:
            self._journal = open(self.journal_path, "a", encoding="utf-8")  # noqa: SIM115 - kept open on purpose
        self._journal.write(json.dumps(record.to_json(), separators=(",", ":"), allow_nan=False) + "\n")
        self._journal.flush()
        self._journal_entries += len(record)

    def needs_compaction(self, tracker: DifficultyTracker) -> bool:
        return self._journal_entries > self.compact_factor * len(tracker) + 4096

    def compact(self, tracker: DifficultyTracker) -> None:
        """Write the full state as the new base (atomically), then empty the journal."""
        save_state(tracker.state_dict(), self.base_path)
        if self._journal is not None:
            self._journal.close()
        self._journal = open(self.journal_path, "w", encoding="utf-8")  # noqa: SIM115 - kept open on purpose
        self._journal_entries = 0

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None
