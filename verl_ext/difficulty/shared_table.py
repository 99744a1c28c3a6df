"""A difficulty table in shared memory, read by DataLoader workers without Ray.

DataLoader workers are forked copies of the dataset and must never call Ray. The dataset owns one
:class:`SharedDifficultyTable`, created in the trainer process before the workers start; its
storage is a ``torch`` tensor moved to shared memory, so a value the trainer writes after the
workers started is visible to them at their next read (no copy, no message).

Shape: ``values`` is a float64 tensor of shape ``(N,)``, one entry per dataset question row.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence

import numpy as np
import torch


class SharedDifficultyTable:
    """Difficulty per question, indexed by dataset row, in shared memory.

    Args:
        question_ids: the stable question id of each row (str or int), unique.
        initial: starting difficulty of every row.
    """

    def __init__(self, question_ids: Sequence[Hashable], initial: float = 5.0):
        self._row_of: dict[Hashable, int] = {}
        for row, qid in enumerate(question_ids):
            if qid in self._row_of:
                raise ValueError(
                    f"question_ids: id {qid!r} appears at rows {self._row_of[qid]} and {row}; ids must be unique"
                )
            self._row_of[qid] = row
        self.values = torch.full((len(self._row_of),), float(initial), dtype=torch.float64).share_memory_()
        # Each row's starting difficulty (trainer process only): what a full refresh returns unseen rows to.
        self.initial = self.values.clone()

    def __len__(self) -> int:
        return self.values.numel()

    def row_of(self, question_id: Hashable) -> int:
        try:
            return self._row_of[question_id]
        except KeyError:
            raise KeyError(f"question id {question_id!r} is not in this dataset's difficulty table") from None

    def read(self, row: int) -> float:
        """Current difficulty of dataset row ``row`` (cheap; safe in DataLoader workers)."""
        return float(self.values[row])

    def _rows_of_snapshot(self, snapshot: Mapping[Hashable, float]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rows, values)`` tensors of the snapshot entries that are rows of this table (others are ignored)."""
        pairs = [(self._row_of[qid], value) for qid, value in snapshot.items() if qid in self._row_of]
        rows = torch.as_tensor([row for row, _ in pairs], dtype=torch.long)
        return rows, torch.as_tensor([value for _, value in pairs], dtype=torch.float64)

    @staticmethod
    def _as_rows_and_values(rows: Iterable[int], values: Iterable[float]) -> tuple[torch.Tensor, torch.Tensor]:
        return (
            torch.as_tensor(np.asarray(list(rows), dtype=np.int64)),
            torch.as_tensor(np.asarray(list(values), dtype=np.float64)),
        )

    def write_snapshot(self, snapshot: Mapping[Hashable, float]) -> int:
        """Copy ``{question_id: difficulty}`` into the table; ids of other datasets are ignored.

        Returns the number of rows written. Vectorised: one index-put for the whole snapshot.
        """
        rows, values = self._rows_of_snapshot(snapshot)
        self.values[rows] = values
        return rows.numel()

    def write_rows(self, rows: Iterable[int], values: Iterable[float]) -> None:
        rows_t, values_t = self._as_rows_and_values(rows, values)
        self.values[rows_t] = values_t

    def set_initial(self, rows: Iterable[int], values: Iterable[float]) -> None:
        """Give ``rows`` their own starting difficulty (e.g. the parquet ``difficulty`` column)."""
        rows_t, start = self._as_rows_and_values(rows, values)
        self.values[rows_t] = start
        self.initial[rows_t] = start

    def reset(self) -> None:
        """Every row back to its starting difficulty."""
        self.values.copy_(self.initial)

    def replace_all(self, snapshot: Mapping[Hashable, float]) -> int:
        """The whole table at once: rows in ``snapshot`` take its values, all others their starting difficulty.

        Built aside and copied in one pass, so a DataLoader worker reading meanwhile never sees rows that the
        snapshot moved back at their starting values. Returns the number of rows taken from ``snapshot``.
        """
        fresh = self.initial.clone()
        rows, values = self._rows_of_snapshot(snapshot)
        fresh[rows] = values
        self.values.copy_(fresh)
        return rows.numel()
