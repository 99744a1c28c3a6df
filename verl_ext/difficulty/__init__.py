"""Per-question difficulty for DIVA-GRPO: update rules, tracker, persistence and the Ray service.

Pure pieces (no Ray): :mod:`.rules`, :mod:`.alphas`, :mod:`.tracker`, :mod:`.persistence`, :mod:`.live_store`.
The Ray actor and its trainer-side client live in :mod:`.service`; DataLoader workers read
:class:`.shared_table.SharedDifficultyTable` only. Import both explicitly: this package imports neither Ray, torch
nor verl, so the service's actor process starts in well under a second.
"""

from verl_ext.difficulty.alphas import per_response_values, question_alphas
from verl_ext.difficulty.persistence import (
    STATE_FILENAME,
    DifficultyStateFileError,
    checkpoint_state_path,
    load_state,
    save_state,
)
from verl_ext.difficulty.rules import binned_update, continuous_update, make_update_rule
from verl_ext.difficulty.tracker import DifficultyTracker, UpdateRecord

__all__ = [
    "STATE_FILENAME",
    "DifficultyStateFileError",
    "DifficultyTracker",
    "UpdateRecord",
    "binned_update",
    "checkpoint_state_path",
    "continuous_update",
    "load_state",
    "make_update_rule",
    "per_response_values",
    "question_alphas",
    "save_state",
]
