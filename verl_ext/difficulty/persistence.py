"""Atomic, checksummed files holding a :class:`~verl_ext.difficulty.tracker.DifficultyTracker` state.

With every verl checkpoint the state goes to ``<default_local_dir>/global_step_N/diva_difficulty.json``,
beside verl's ``actor/`` and ``data.pt`` of the same step, and is read back on resume.

File layout (one JSON object): ``{"sha256": <hex digest of the state text>, "state": <state>}`` where the
state text is ``json.dumps(state, sort_keys=True, separators=(",", ":"))``. Writing goes to a temporary file in
the same folder, fsync, then ``os.replace`` (atomic on POSIX), so a reader sees the old file or the new one,
never half of one. A truncated, edited or unreadable file (bytes that are not UTF-8, no read permission) fails
and raises :class:`DifficultyStateFileError` naming the file: difficulties are never silently reset.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile

STATE_FILENAME = "diva_difficulty.json"


class DifficultyStateFileError(ValueError):
    """A difficulty state file that is partial, corrupt or not a difficulty state."""


def checkpoint_state_path(step_folder: str) -> str:
    """Path of the difficulty state inside a verl checkpoint step folder (``.../global_step_N``)."""
    return os.path.join(step_folder, STATE_FILENAME)


def _canonical(state: dict) -> str:
    # allow_nan=False: a NaN would make the file unreadable by strict JSON readers; states never hold one.
    return json.dumps(state, sort_keys=True, separators=(",", ":"), allow_nan=False)


def save_state(state: dict, path: str) -> str:
    """Write ``state`` to ``path`` atomically (temp file in the same folder, fsync, ``os.replace``)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    text = _canonical(state)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write('{"sha256":"' + digest + '","state":' + text + "}")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    # Make the rename itself durable.
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path


DIFFICULTY_STATE = "difficulty state"
# Why a missing difficulty state stops a resume (the default reason of load_state).
_DIFFICULTY_REQUIRED = (
    "a DIVA checkpoint step folder must hold one (saved by the difficulty service with the checkpoint). Refusing "
    "to reset difficulties silently."
)


def load_state(path: str, what: str = DIFFICULTY_STATE, required: str = _DIFFICULTY_REQUIRED) -> dict:
    """Read and verify a file written by :func:`save_state`.

    ``what`` names the state in every error (other checkpointed states use the same file format, e.g. a toolkit
    method's batch planner); ``required`` says why a missing file stops the resume.

    Raises:
        FileNotFoundError: no file at ``path`` (message says what was expected there).
        DifficultyStateFileError: the file is partial, corrupt or fails its checksum.
    """
    if not os.path.exists(path):
        raise FileNotFoundError(f"{what} file {path} does not exist; {required}")
    # Bytes first: every way the file can be unreadable (no permission, a folder, bytes that are not UTF-8, JSON
    # that is not a state, numbers out of range) becomes the one error naming the file, never a bare traceback.
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as err:
        raise DifficultyStateFileError(
            f"{what} file {path} cannot be read ({type(err).__name__}: {err.strerror or err}). "
            "Check its permissions, or resume from another checkpoint step."
        ) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DifficultyStateFileError(
            f"{what} file {path} is corrupt: byte {err.start} (0x{raw[err.start]:02x}) is not UTF-8 "
            f"({len(raw)} bytes). Restore it from a backup or resume from another checkpoint step."
        ) from None
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as err:
        raise DifficultyStateFileError(
            f"{what} file {path} is partial or corrupt ({len(raw)} bytes; JSON error: {err}). "
            "Restore it from a backup or resume from another checkpoint step."
        ) from None
    if not isinstance(data, dict) or set(data) != {"sha256", "state"} or not isinstance(data["sha256"], str):
        raise DifficultyStateFileError(f"{path} is not a {what} file (expected keys 'sha256' and 'state')")
    try:
        digest = hashlib.sha256(_canonical(data["state"]).encode("utf-8")).hexdigest()
    except (ValueError, RecursionError) as err:  # e.g. 1e999 parses to inf, which a state never holds
        raise DifficultyStateFileError(
            f"{what} file {path} is corrupt ({type(err).__name__}: {err}). "
            "Restore it from a backup or resume from another checkpoint step."
        ) from None
    if digest != data["sha256"]:
        raise DifficultyStateFileError(
            f"{what} file {path} fails its checksum (stored {data['sha256']}, computed {digest}); "
            "it was modified or damaged. Restore it or resume from another checkpoint step."
        )
    return data["state"]
