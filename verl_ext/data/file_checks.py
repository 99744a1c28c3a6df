"""Checks of the data files a run names: one implementation for the job and for the launcher.

:class:`~verl_ext.data.dataset.DivaDataset` runs them inside the Ray job, after verl has copied the files; the
launcher runs them on the submitting machine before any Ray process starts (``recipe/diva_grpo/prelaunch.py``), so
a wrong file is refused in seconds with the same message, not after a minute of Ray start-up under a traceback.

- :func:`parquet_columns`: the file is a readable parquet file (its footer and schema parse); returns its columns.
- :func:`check_diva_columns`: a training file has every column of the DIVA format (:mod:`verl_ext.data.schema`).
- :func:`check_distinct_files`: the training and validation files are not the same set of files (the dataset
  could not tell training, expanded with variants, from validation, never perturbed).

Every failure is a ``ValueError`` whose message names the file and what to do. This module imports neither verl,
torch nor Ray (the launcher's check runs in about a second).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from verl_ext.data.schema import missing_columns

PARQUET_SUFFIX = ".parquet"


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
        f"DivaDataset: data.train_files and data.val_files are the same files {sorted(files)}, so the "
        "dataset cannot tell training (expanded with variants) from validation (never perturbed). "
        "Point data.val_files at a separate file (a copy is fine)."
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


def parquet_columns(path: str) -> list[str]:
    """Column names of the parquet file at ``path``; ``ValueError`` naming it when it is missing or unreadable.

    Reads the footer only (milliseconds, whatever the file's size): a file cut short, or one that is not parquet,
    has no valid footer.
    """
    import pyarrow.parquet as pq  # here, so that importing this module stays cheap

    if not os.path.exists(path):
        raise ValueError(f"data file {path} does not exist; prepare it with `diva-prep convert` or fix the path")
    try:
        return list(pq.read_schema(path).names)
    except (OSError, ValueError) as err:  # pyarrow raises ArrowInvalid (a ValueError) for a missing footer
        raise ValueError(
            f"data file {path} is not a readable parquet file ({err}); convert it again with `diva-prep convert`, "
            "or check it with `diva-prep validate`"
        ) from None


def check_data_files(
    train_files: Any, val_files: Any, diva: bool = True, skip: Iterable[str] = ()
) -> dict[str, list[str]]:
    """All checks on a run's data files; returns ``{"checked": [...], "skipped": [...]}`` (paths).

    Args:
        train_files, val_files: ``data.train_files`` / ``data.val_files`` (a path or a list of paths).
        diva: the run uses :class:`~verl_ext.data.dataset.DivaDataset`: training files need the DIVA columns and
            must differ from the validation files. ``False`` (verl's own dataset, e.g. the GRPO baseline): only
            readability.
        skip: paths not to open here (e.g. paths that only the cluster's nodes see); URLs are always skipped.
    Raises:
        ValueError: the first problem found, naming the file.
    """
    if diva:
        check_distinct_files(train_files, val_files)
    skip = set(skip)
    report: dict[str, list[str]] = {"checked": [], "skipped": []}
    for split, files in (("train", train_files), ("val", val_files)):
        for path in sorted(normalised_files(files) or ()):
            if "://" in path or path in skip or not path.endswith(PARQUET_SUFFIX):
                # URLs are copied by verl inside the job; json/jsonl files are read by verl's loader as they are.
                report["skipped"].append(path)
                continue
            names = parquet_columns(path)
            if diva and split == "train":
                check_diva_columns(names, [path])
            report["checked"].append(path)
    return report


__all__ = [
    "check_data_files",
    "check_distinct_files",
    "check_diva_columns",
    "missing_diva_columns_error",
    "normalised_files",
    "parquet_columns",
    "same_files_error",
]
