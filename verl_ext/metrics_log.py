"""verl's metrics log survives a restart: the previous attempt's file is kept beside the new one, not truncated.

verl's file logger opens its JSONL with mode ``"wb"`` (``verl/utils/tracking.py``, ``FileLogger``): a job that is
resubmitted after a crash (``MAX_RESTARTS``) or relaunched into the same experiment would erase the steps logged so
far. :func:`keep_previous_log` renames a non-empty file at the logger's path to ``<stem>.attempt<k>.jsonl`` first
(k = 1, 2, ...; the rename keeps its modification time), so ``diva-report``, which merges every metrics log of a run
folder in write order (a later line wins for a repeated step), shows the whole run.
"""

from __future__ import annotations

import os


def metrics_log_path(project_name: str, experiment_name: str) -> str:
    """Where verl's file logger writes: ``$VERL_FILE_LOGGER_PATH``, else ``$VERL_FILE_LOGGER_ROOT/<project>/
    <experiment>.jsonl`` (root default ``.``), as ``FileLogger.__init__`` computes it."""
    path = os.environ.get("VERL_FILE_LOGGER_PATH")
    if path:
        return path
    root = os.path.expanduser(os.environ.get("VERL_FILE_LOGGER_ROOT", "."))
    return os.path.join(root, project_name, f"{experiment_name}.jsonl")


def keep_previous_log(path: str) -> str | None:
    """Rename a non-empty file at ``path`` to the first free ``<stem>.attempt<k><ext>``; returns the new path."""
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        return None
    stem, ext = os.path.splitext(path)
    k = 1
    while os.path.exists(f"{stem}.attempt{k}{ext}"):
        k += 1
    kept = f"{stem}.attempt{k}{ext}"
    os.rename(path, kept)
    return kept
