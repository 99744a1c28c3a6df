"""Checks of the data files a run names: one implementation for the job and for the launcher.

:class:`~verl_ext.data.dataset.DivaDataset` runs them inside the Ray job, after verl has copied the files; the
launcher runs them on the submitting machine before any Ray process starts (``recipe/diva_grpo/prelaunch.py``), so
a wrong file is refused in seconds with the same message, not after a minute of Ray start-up under a traceback.

- :func:`parquet_columns`: the file is a readable parquet file named ``*.parquet`` (verl picks a file's reader by
  its suffix; its footer and schema parse); returns its columns.
- :func:`check_verl_columns`: every file has the columns verl's dataset and the reward read (``data_source``, the
  prompt, ``reward_model``).
- :func:`check_diva_columns`: a training file has every column of the DIVA format (:mod:`verl_ext.data.schema`).
- :func:`check_distinct_files`: the training and validation files are not the same set of files (DIVA's dataset
  could not tell training, expanded with variants, from validation, never perturbed; for any method, a validation
  score on the training questions measures nothing).

Every failure is a ``ValueError`` whose message names the file and what to do. This module imports neither verl,
torch nor Ray (the launcher's check runs in about a second).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from verl_ext.data.schema import missing_columns

PARQUET_SUFFIX = ".parquet"
# Columns every data file needs, whatever the method: verl's dataset reads the prompt (``data.prompt_key``), the
# reward function the data source and ``reward_model.ground_truth``.
VERL_COLUMNS = ("data_source", "prompt", "reward_model")


def normalised_files(files: Any) -> frozenset[str] | None:
    """``files`` (one path or a list; ``None``) as a set of absolute paths; URLs (``hdfs://...``) kept as given."""
    if files is None:
        return None
    if isinstance(files, str | os.PathLike):
        files = [files]
    out = set()
    for f in files:
        f = os.fspath(f)
        out.add(f if "://" in f else os.path.abspath(os.path.expanduser(f)))
    return frozenset(out)


def same_files_error(files: Iterable[str]) -> ValueError:
    return ValueError(
        f"data.train_files and data.val_files are the same files {sorted(files)}: validation would score the "
        "training questions, and DivaDataset could not tell training (expanded with variants) from validation "
        "(never perturbed). Point data.val_files (VAL_FILES) at a separate file of held-out questions."
    )


def check_distinct_files(train_files: Any, val_files: Any) -> None:
    """``ValueError`` when the training and validation files are the same set of files (after normalisation)."""
    train, val = normalised_files(train_files), normalised_files(val_files)
    if train is not None and train == val:
        raise same_files_error(train)


def missing_diva_columns_error(files: list[str], missing: list[str]) -> ValueError:
    return ValueError(
        f"DivaDataset: training files {files} lack the DIVA column(s) {missing}; build them with the "
        "project's data-prep CLI (format: verl_ext/data/schema.py)"
    )


def check_diva_columns(names: Iterable[str], files: list[str]) -> None:
    """``ValueError`` naming ``files`` when the column ``names`` lack any column of the DIVA format."""
    missing = missing_columns(names)
    if missing:
        raise missing_diva_columns_error(files, missing)


def check_verl_columns(names: Iterable[str], path: str, prompt_key: str = "prompt") -> None:
    """``ValueError`` naming ``path`` when the column ``names`` lack a column verl's dataset or the reward reads."""
    present = set(names)
    missing = [c for c in (prompt_key if c == "prompt" else c for c in VERL_COLUMNS) if c not in present]
    if missing:
        raise ValueError(
            f"data file {path} lacks the column(s) {missing} that verl's dataset and the reward read (it has "
            f"{sorted(names)}); build it with `diva-prep convert` (format: docs/data.md)"
        )


def parquet_metadata(path: str):
    """The parquet footer of the file at ``path`` (schema and row count, read in milliseconds whatever the file's
    size); ``ValueError`` naming the file when it is missing, not named ``*.parquet``, or not readable parquet."""
    import pyarrow.parquet as pq  # here, so that importing this module stays cheap

    if not os.path.exists(path):
        raise ValueError(f"data file {path} does not exist; prepare it with `diva-prep convert` or fix the path")
    if os.path.isdir(path):
        raise ValueError(f"data file {path} is a folder; name the parquet file(s) in it")
    if not path.endswith(PARQUET_SUFFIX):
        raise ValueError(
            f"data file {path} is not a parquet file: the recipe reads parquet, and verl picks a file's reader by "
            "its suffix (.parquet); convert it with `diva-prep convert`"
        )
    try:
        return pq.read_metadata(path)
    except (OSError, ValueError) as err:  # pyarrow raises ArrowInvalid (a ValueError) for a missing footer
        raise ValueError(
            f"data file {path} is not a readable parquet file ({err}); convert it again with `diva-prep convert`, "
            "or check it with `diva-prep validate`"
        ) from None


def parquet_columns(path: str) -> list[str]:
    """Column names of the parquet file at ``path``; ``ValueError`` naming it (:func:`parquet_metadata`)."""
    return list(parquet_metadata(path).schema.to_arrow_schema().names)


def check_data_files(
    train_files: Any, val_files: Any, diva: bool = True, skip: Iterable[str] = (), prompt_key: str = "prompt"
) -> dict[str, Any]:
    """All checks on a run's data files; returns ``{"checked": [paths], "skipped": [paths], "rows": {path: n},
    "split": {path: "train" | "val"}}``.

    Args:
        train_files, val_files: ``data.train_files`` / ``data.val_files`` (a path or a list of paths).
        diva: the run uses :class:`~verl_ext.data.dataset.DivaDataset`: training files need the DIVA columns.
            ``False`` (verl's own dataset, e.g. the GRPO baseline): verl's columns only.
        skip: paths not to open here (e.g. paths that only the cluster's nodes see); URLs are always skipped.
        prompt_key: ``data.prompt_key``.
    Raises:
        ValueError: the first problem found, naming the file.
    """
    check_distinct_files(train_files, val_files)
    skip = set(skip)
    report: dict[str, Any] = {"checked": [], "skipped": [], "rows": {}, "split": {}}
    for split, files in (("train", train_files), ("val", val_files)):
        for path in sorted(normalised_files(files) or ()):
            if "://" in path or path in skip:
                # URLs are copied by verl inside the job, which checks them there.
                report["skipped"].append(path)
                continue
            metadata = parquet_metadata(path)
            names = list(metadata.schema.to_arrow_schema().names)
            check_verl_columns(names, path, prompt_key)
            if diva and split == "train":
                check_diva_columns(names, [path])
            if metadata.num_rows == 0:
                raise ValueError(f"data file {path} has no rows; prepare it again with `diva-prep convert`")
            report["checked"].append(path)
            report["rows"][path] = metadata.num_rows
            report["split"][path] = split
    return report


__all__ = [
    "check_data_files",
    "check_distinct_files",
    "check_diva_columns",
    "check_verl_columns",
    "missing_diva_columns_error",
    "normalised_files",
    "parquet_columns",
    "parquet_metadata",
    "same_files_error",
]
