"""SharedDifficultyTable read by persistent DataLoader workers: writes made after they started are seen."""

import os

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from verl_ext.difficulty.shared_table import SharedDifficultyTable


class DifficultyReadingDataset(Dataset):
    """Stands in for DivaDataset's read path: each item reads its question's difficulty from the table."""

    def __init__(self, table: SharedDifficultyTable, question_ids):
        self.table = table
        self.question_ids = list(question_ids)

    def __len__(self):
        return len(self.question_ids)

    def __getitem__(self, index):
        row = self.table.row_of(self.question_ids[index])
        return {"row": row, "difficulty": self.table.read(row), "pid": os.getpid()}


def read_all(loader):
    rows, values, pids = [], [], set()
    for batch in loader:
        rows += batch["row"].tolist()
        values += batch["difficulty"].tolist()
        pids.update(batch["pid"].tolist())
    order = np.argsort(rows)
    return np.asarray(values)[order], pids


def test_two_persistent_workers_see_values_written_after_they_started():
    ids = [f"q{i}" for i in range(12)] + [100, 101, 102, 103]
    table = SharedDifficultyTable(ids, initial=5.0)
    loader = DataLoader(
        DifficultyReadingDataset(table, ids), batch_size=2, num_workers=2, persistent_workers=True, shuffle=False
    )
    values, first_pids = read_all(loader)  # workers start here
    np.testing.assert_array_equal(values, np.full(len(ids), 5.0))
    assert len(first_pids) == 2 and os.getpid() not in first_pids

    written = table.write_snapshot({"q0": 9.0, "q5": 1.5, 101: 7.25, "not_in_this_dataset": 3.0})
    assert written == 3
    values, pids = read_all(loader)
    assert pids == first_pids  # the same two workers, not restarted copies
    want = np.full(len(ids), 5.0)
    want[[0, 5, ids.index(101)]] = [9.0, 1.5, 7.25]
    np.testing.assert_array_equal(values, want)

    table.write_rows(range(len(ids)), np.linspace(1.0, 9.0, len(ids)))
    values, pids = read_all(loader)
    assert pids == first_pids
    np.testing.assert_array_equal(values, np.linspace(1.0, 9.0, len(ids)))


def test_table_rejects_repeated_ids_and_names_unknown_ones():
    with pytest.raises(ValueError, match="question_ids"):
        SharedDifficultyTable(["a", "a"])
    table = SharedDifficultyTable(["a"])
    with pytest.raises(KeyError, match="zzz"):
        table.row_of("zzz")
    assert table.values.is_shared() and table.values.dtype == torch.float64


def test_reset_returns_rows_to_their_own_starting_difficulty():
    table = SharedDifficultyTable(["a", "b", "c"], initial=5.0)
    table.set_initial([1], [8.0])
    table.write_snapshot({"a": 2.0, "b": 3.0, "c": 4.0})
    table.reset()
    assert table.values.tolist() == [5.0, 8.0, 5.0]
