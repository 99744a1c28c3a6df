"""Atomic checksummed state files and the service's live base + journal store."""

import json
import os

import numpy as np
import pytest

from verl_ext.difficulty import (
    STATE_FILENAME,
    DifficultyStateFileError,
    DifficultyTracker,
    checkpoint_state_path,
    load_state,
    save_state,
)
from verl_ext.difficulty.live_store import LiveStateStore


def trained_tracker(steps=6, seed=0):
    rng = np.random.default_rng(seed)
    t = DifficultyTracker()
    for step in range(steps):
        ids = [f"q{i}" for i in rng.choice(40, 12, replace=False)] + [int(step)]
        t.update(ids, rng.uniform(0, 1, 13), step)
    return t


def test_checkpoint_round_trip_is_exact(tmp_path):
    t = trained_tracker()
    folder = tmp_path / "global_step_6"
    path = save_state(t.state_dict(), checkpoint_state_path(str(folder)))
    assert path == str(folder / STATE_FILENAME)
    assert [p.name for p in folder.iterdir()] == [STATE_FILENAME]  # no temp file left behind
    u = DifficultyTracker()
    u.load_state_dict(load_state(path))
    assert u.snapshot() == t.snapshot()
    assert all(u.state_of(q) == t.state_of(q) for q in t.snapshot())


def test_save_replaces_atomically(tmp_path):
    path = str(tmp_path / STATE_FILENAME)
    save_state(trained_tracker(2).state_dict(), path)
    t = trained_tracker(5, seed=1)
    save_state(t.state_dict(), path)
    assert load_state(path) == json.loads(json.dumps(t.state_dict()))


def test_partial_file_fails_naming_the_file(tmp_path):
    path = str(tmp_path / STATE_FILENAME)
    save_state(trained_tracker().state_dict(), path)
    raw = open(path, "rb").read()
    open(path, "wb").write(raw[: len(raw) // 2])
    with pytest.raises(DifficultyStateFileError, match="partial or corrupt") as err:
        load_state(path)
    assert path in str(err.value)


def test_edited_file_fails_checksum_naming_the_file(tmp_path):
    path = str(tmp_path / STATE_FILENAME)
    save_state(trained_tracker().state_dict(), path)
    data = json.load(open(path))
    data["state"]["questions"]["difficulty"][0] = 5.0 if data["state"]["questions"]["difficulty"][0] != 5.0 else 6.0
    json.dump(data, open(path, "w"))
    with pytest.raises(DifficultyStateFileError, match="checksum") as err:
        load_state(path)
    assert path in str(err.value)


def test_missing_file_is_an_error_not_a_reset(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        load_state(checkpoint_state_path(str(tmp_path)))


def test_live_store_restores_base_plus_journal(tmp_path):
    t = DifficultyTracker()
    store = LiveStateStore(str(tmp_path))
    rng = np.random.default_rng(4)
    for step in range(8):
        record = t.compute_update([f"q{i}" for i in range(step, step + 5)], rng.uniform(0, 1, 5), step, f"r{step}")
        store.append(record)
        t.apply(record)
        if step == 3:
            store.compact(t)
    store.close()
    u = DifficultyTracker()
    assert LiveStateStore(str(tmp_path)).restore_into(u) == 4
    assert u.state_dict()["questions"] == t.state_dict()["questions"]
    assert u.is_applied("r7") and u.is_applied("r2")


def journalled_updates(folder, ids, alphas, steps):
    """A tracker and its live store after ``steps`` updates, each journalled before it is applied (as the actor)."""
    tracker = DifficultyTracker()
    store = LiveStateStore(str(folder))
    for step in range(steps):
        record = tracker.compute_update(ids, alphas, step)
        store.append(record)
        tracker.apply(record)
    return tracker, store


def test_live_store_skips_records_already_in_base(tmp_path):
    # A crash after writing the base but before emptying the journal must not count updates twice.
    t, store = journalled_updates(tmp_path, ["a"], [0.0], steps=3)
    save_state(t.state_dict(), store.base_path)  # base written, journal still full
    store.close()
    u = DifficultyTracker()
    LiveStateStore(str(tmp_path)).restore_into(u)
    assert u.state_of("a")["updates"] == 3


def test_torn_last_journal_line_is_dropped_and_cut(tmp_path):
    t, store = journalled_updates(tmp_path, ["a", "b"], [0.0, 1.0], steps=3)
    store.close()
    with open(store.journal_path, "a") as f:
        f.write('{"version": 4, "step": 3, "ids": ["a"')  # died mid-append
    u = DifficultyTracker()
    store2 = LiveStateStore(str(tmp_path))
    store2.restore_into(u)
    assert u.state_of("a")["updates"] == 3
    # The next append lands on a clean line, so a later restore still works.
    record = u.compute_update(["a"], [0.0], 4)
    store2.append(record)
    u.apply(record)
    store2.close()
    w = DifficultyTracker()
    LiveStateStore(str(tmp_path)).restore_into(w)
    assert w.state_of("a") == u.state_of("a")


def test_corrupt_middle_journal_line_raises_naming_file_and_line(tmp_path):
    t, store = journalled_updates(tmp_path, ["a"], [0.0], steps=3)
    store.close()
    lines = open(store.journal_path).read().split("\n")
    lines[1] = "garbage"
    open(store.journal_path, "w").write("\n".join(lines))
    with pytest.raises(DifficultyStateFileError, match="line 2") as err:
        LiveStateStore(str(tmp_path)).restore_into(DifficultyTracker())
    assert os.path.join(str(tmp_path), "journal.jsonl") in str(err.value)


def test_compaction_keeps_the_journal_short(tmp_path):
    t = DifficultyTracker()
    store = LiveStateStore(str(tmp_path), compact_factor=1.0)
    for step in range(400):
        record = t.compute_update([f"q{i}" for i in range(20)], [0.5] * 20, step)
        store.append(record)
        t.apply(record)
        if store.needs_compaction(t):
            store.compact(t)
    store.close()
    assert sum(1 for _ in open(store.journal_path)) < 4096 / 20 + 2
    u = DifficultyTracker()
    LiveStateStore(str(tmp_path)).restore_into(u)
    assert u.state_of("q0")["updates"] == 400


def test_non_utf8_byte_fails_naming_the_file(tmp_path):
    path = str(tmp_path / STATE_FILENAME)
    save_state(trained_tracker().state_dict(), path)
    raw = bytearray(open(path, "rb").read())
    position = raw.index(b'"difficulty"') + 3
    raw[position] = 0xFF
    open(path, "wb").write(bytes(raw))
    with pytest.raises(DifficultyStateFileError, match="not UTF-8") as err:
        load_state(path)
    assert path in str(err.value) and f"byte {position}" in str(err.value)


def test_every_single_byte_change_fails_with_the_project_error(tmp_path):
    """Any one byte of a state file replaced by any of several values: the project's error naming the file, or
    (never, for a checksummed file) the same state. No other exception type ever escapes."""
    t = DifficultyTracker()
    t.update(["a", "b", 7], [0.0, 1.0, 0.5], 0)
    path = str(tmp_path / STATE_FILENAME)
    save_state(t.state_dict(), path)
    original = open(path, "rb").read()
    expected = load_state(path)
    replacements = (0xFF, 0x80, 0xC3, 0x00, ord("9"), ord('"'), ord("{"), ord("e"))
    failures = 0
    for position in range(len(original)):
        for value in replacements:
            if original[position] == value:
                continue
            damaged = bytearray(original)
            damaged[position] = value
            open(path, "wb").write(bytes(damaged))
            try:
                state = load_state(path)
            except DifficultyStateFileError as err:
                assert path in str(err), str(err)
                failures += 1
            else:
                assert state == expected, (position, value)
    assert failures > 0.99 * len(original) * (len(replacements) - 1)


def test_unreadable_path_fails_naming_the_file(tmp_path):
    path = tmp_path / STATE_FILENAME
    path.mkdir()  # a folder where the file should be: reading it is an OSError
    with pytest.raises(DifficultyStateFileError, match="cannot be read") as err:
        load_state(str(path))
    assert str(path) in str(err.value)


def test_out_of_range_number_fails_naming_the_file(tmp_path):
    path = str(tmp_path / STATE_FILENAME)
    open(path, "w").write('{"sha256": "00", "state": {"version": 1e999}}')
    with pytest.raises(DifficultyStateFileError, match="corrupt") as err:
        load_state(path)
    assert path in str(err.value)


def test_non_utf8_journal_line_raises_naming_file_and_line(tmp_path):
    t, store = journalled_updates(tmp_path, ["a"], [0.0], steps=3)
    store.close()
    lines = open(store.journal_path, "rb").read().split(b"\n")
    lines[2] = lines[2][:5] + b"\xff" + lines[2][6:]
    open(store.journal_path, "wb").write(b"\n".join(lines))
    with pytest.raises(DifficultyStateFileError, match="line 3") as err:
        LiveStateStore(str(tmp_path)).restore_into(DifficultyTracker())
    assert store.journal_path in str(err.value)
