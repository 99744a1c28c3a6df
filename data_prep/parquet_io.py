"""Streaming parquet I/O in the DIVA schema: bounded memory, row groups, atomic replacement of the output."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

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


def iter_parquet_rows(path: str | Path, columns: list[str] | None = None, batch_size: int = 64) -> Iterator[dict]:
    """Rows of a parquet file as Python dicts, read one small batch at a time."""
    parquet = pq.ParquetFile(path)
    for batch in parquet.iter_batches(batch_size=batch_size, columns=columns):
        yield from batch.to_pylist()


def num_rows(path: str | Path) -> int:
    return pq.ParquetFile(path).metadata.num_rows
