"""Difficulty states saved in a run's checkpoints: ``global_step_N/diva_difficulty.json`` per saved step N.

Read with :func:`verl_ext.difficulty.persistence.load_state` (checksum verified). A file that fails to load is left
out and reported (a report is still useful without one step's state); the temporary files of a save in progress
(``.diva_difficulty.json.*.tmp``) are never read, and the rename that completes a save is atomic, so a run that is
still going is read safely.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from verl_ext.difficulty.persistence import STATE_FILENAME, DifficultyStateFileError, load_state

STEP_FOLDER = re.compile(r"global_step_(\d+)$")
# Where checkpoints sit relative to a run folder: the launcher's CKPT_DIR holds global_step_N itself; the CPU
# preflight's work folder holds them under checkpoints/.
CHECKPOINT_SUBDIRS = ("", "checkpoints")


@dataclass
class DifficultyStates:
    """``difficulties[step]`` = the ``(Q_step,)`` difficulties of the questions seen by saved step ``step``."""

    difficulties: dict[int, np.ndarray] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def levels(self, d_min: float = 1.0, d_max: float = 9.0) -> list[int]:
        """Integer levels covering ``[d_min, d_max]`` and every stored difficulty (rounded half up)."""
        lo, hi = math.ceil(d_min), math.floor(d_max)
        for values in self.difficulties.values():
            if values.size:
                lo = min(lo, int(np.floor(values.min() + 0.5)))
                hi = max(hi, int(np.floor(values.max() + 0.5)))
        return list(range(lo, hi + 1))

    def counts(self, levels: list[int]) -> np.ndarray:
        """``(L, S)`` questions per level (rows, ``levels``) per saved step (columns, ascending steps)."""
        out = np.zeros((len(levels), len(self.difficulties)), dtype=np.int64)
        for column, values in enumerate(self.difficulties.values()):
            rounded = np.floor(values + 0.5).astype(np.int64) - levels[0]
            out[:, column] = np.bincount(rounded, minlength=len(levels))[: len(levels)]
        return out


def state_files(run_dir: Path) -> dict[int, Path]:
    """``{step: path}`` of the difficulty states under ``run_dir`` (see :data:`CHECKPOINT_SUBDIRS`)."""
    found: dict[int, Path] = {}
    for sub in CHECKPOINT_SUBDIRS:
        base = run_dir / sub if sub else run_dir
        if not base.is_dir():
            continue
        for folder in base.iterdir():
            match = STEP_FOLDER.match(folder.name)
            if match and (folder / STATE_FILENAME).is_file():
                found.setdefault(int(match.group(1)), folder / STATE_FILENAME)
    return dict(sorted(found.items()))


def read_states(run_dir: Path) -> DifficultyStates:
    states = DifficultyStates()
    for step, path in state_files(run_dir).items():
        try:
            state = load_state(str(path))
            values = np.asarray(state["questions"]["difficulty"], dtype=np.float64)
        except (DifficultyStateFileError, FileNotFoundError, KeyError, TypeError, ValueError) as err:
            states.notes.append(f"difficulty state of step {step} left out: {err}")
            continue
        states.difficulties[step] = values[np.isfinite(values)]
    return states
