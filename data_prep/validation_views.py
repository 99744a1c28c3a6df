"""A validation file that reports greedy and sampled accuracy in one pass (``validation_views``).

verl's validation decodes every row with ``rollout.val_kwargs`` and averages each data source's scores over
``val_kwargs.n`` samples. The paper validates with temperature 0.6, top-p 0.95 and the mean over k samples per
question; greedy decoding answers one way per question, so on a small set whole groups of questions flip together
and curves move in steps. :func:`validation_views` writes each question twice:

* ``<data_source>_greedy``: column ``validation_sampling="greedy"`` (the project's agent loop decodes it greedily,
  :mod:`verl_ext.rollout.agent_loop`) and ``__rollout_n__=1`` (verl's per-row sample count);
* ``<data_source>_sampled``: ``validation_sampling="sampled"`` (``val_kwargs``' sampling) and ``__rollout_n__=k``.

``extra_info.question_id`` gets the view as a suffix, so the copies stay distinct questions. verl then logs
``val-core/<data_source>_greedy/acc/mean@1`` and ``val-core/<data_source>_sampled/acc/mean@k``.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

GREEDY, SAMPLED = "greedy", "sampled"


def _view(table: pa.Table, view: str, samples: int) -> pa.Table:
    sources = pc.binary_join_element_wise(table.column("data_source").cast(pa.string()), pa.scalar(f"_{view}"), "")
    table = table.set_column(table.schema.get_field_index("data_source"), "data_source", sources)
    if "extra_info" in table.column_names:
        rows = table.column("extra_info").to_pylist()
        for row in rows:
            if row is not None and row.get("question_id") is not None:
                row["question_id"] = f"{row['question_id']}#{view}"
        table = table.set_column(
            table.schema.get_field_index("extra_info"),
            "extra_info",
            pa.array(rows, type=table.schema.field("extra_info").type),
        )
    table = table.append_column("validation_sampling", pa.array([view] * len(table), pa.string()))
    return table.append_column("__rollout_n__", pa.array([1 if view == GREEDY else samples] * len(table), pa.int64()))


def validation_views(source: str | Path, output: str | Path, samples: int) -> int:
    """Write ``source``'s rows twice to ``output`` (module docstring): greedy, then ``samples`` samples each.
    Returns the row count written."""
    if samples < 1:
        raise ValueError(f"samples must be at least 1, got {samples}")
    table = pq.read_table(source)
    for column in ("validation_sampling", "__rollout_n__"):
        if column in table.column_names:
            raise ValueError(f"{source}: already has a {column!r} column (is it a validation_views output?)")
    if "data_source" not in table.column_names:
        raise ValueError(f"{source}: no 'data_source' column; verl groups validation scores by it")
    both = pa.concat_tables([_view(table, GREEDY, samples), _view(table, SAMPLED, samples)])
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(both, output)
    return len(both)
