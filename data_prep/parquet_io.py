"""Streaming parquet I/O in the DIVA schema: bounded memory, row groups, atomic replacement of the output."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from data_prep.errors import PrepError
from verl_ext.data.schema import SCHEMA

# Rows of 512x512 images run ~100-300 KB each: 128 rows keep a row group (and our buffer) in the tens of MB,
# while still being large enough for verl's loader to read efficiently.
DEFAULT_ROW_GROUP_SIZE = 128


class DivaParquetWriter:
    """Buffer rows, write each full buffer as one row group of :data:`SCHEMA`.

    Writes to ``<output>.tmp`` and renames onto ``output`` only in :meth:`commit`, so a failed or killed run never
    leaves a truncated file that looks finished. Use as a context manager: leaving without commit removes the temp.
    """

    def __init__(self, output: str | Path, row_group_size: int = DEFAULT_ROW_GROUP_SIZE):
        self.output = Path(output)
        self.output.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = self.output.with_name(self.output.name + ".tmp")
        self.row_group_size = row_group_size
        self._writer = pq.ParquetWriter(self.tmp, SCHEMA)
        self._buffer: list[dict] = []
        self.rows_written = 0

    def write(self, row: dict) -> None:
        self._buffer.append(row)
        if len(self._buffer) >= self.row_group_size:
            self._flush()

    def _flush(self) -> None:
        if self._buffer:
            self._writer.write_table(pa.Table.from_pylist(self._buffer, schema=SCHEMA))
            self.rows_written += len(self._buffer)
            self._buffer = []

    def commit(self) -> None:
        self._flush()
        self._writer.close()
        self._writer = None
        os.replace(self.tmp, self.output)

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self.tmp.unlink(missing_ok=True)

    def __enter__(self) -> DivaParquetWriter:
        return self

    def __exit__(self, *exc) -> None:
        if self._writer is not None:
            self.abort()


def open_parquet(path: str | Path) -> pq.ParquetFile:
    """``pq.ParquetFile(path)``; a file that is not parquet (or is cut short) raises :class:`PrepError` naming it."""
    try:
        return pq.ParquetFile(path)
    except (OSError, ValueError) as exc:  # pyarrow raises ArrowInvalid (a ValueError) for a missing footer
        raise PrepError(
            f"not a parquet file: {path} ({exc}). Check the path, or download or convert it again."
        ) from None


def iter_parquet_batches(
    path: str | Path, columns: list[str] | None = None, batch_size: int = 64
) -> Iterator[list[dict]]:
    """Rows of a parquet file as lists of Python dicts, one small batch at a time.

    Corrupt data pages raise :class:`PrepError` naming the file and the first row that could not be read.
    """
    batches = open_parquet(path).iter_batches(batch_size=batch_size, columns=columns)
    rows_read = 0
    while True:
        try:
            batch = next(batches, None)
            rows = None if batch is None else batch.to_pylist()
        except (OSError, ValueError) as exc:  # e.g. "Deserializing page header failed"
            raise PrepError(
                f"corrupt parquet file: {path}: cannot read the rows from row {rows_read} on ({exc}). "
                "Download or convert it again."
            ) from None
        if rows is None:
            return
        rows_read += len(rows)
        yield rows


def iter_parquet_rows(path: str | Path, columns: list[str] | None = None, batch_size: int = 64) -> Iterator[dict]:
    """Rows of a parquet file as Python dicts, read one small batch at a time."""
    for rows in iter_parquet_batches(path, columns, batch_size):
        yield from rows


def num_rows(path: str | Path) -> int:
    return open_parquet(path).metadata.num_rows
