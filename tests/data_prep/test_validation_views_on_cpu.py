"""One validation file reporting greedy and sampled accuracy: each question twice, each copy asking for its own
decoding (data_prep.validation_views), and the project's agent loop honouring the greedy copy's request."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from data_prep.swatch import swatch
from data_prep.validation_views import validation_views


def test_each_question_twice_greedy_once_and_sampled_k_times(tmp_path):
    source, out = tmp_path / "val.parquet", tmp_path / "views.parquet"
    swatch(source, 6, seed=3, split="test")
    assert validation_views(source, out, samples=4) == 12
    original, views = pq.read_table(source).to_pylist(), pq.read_table(out).to_pylist()
    greedy, sampled = views[:6], views[6:]
    for view, name, n in ((greedy, "greedy", 1), (sampled, "sampled", 4)):
        for row, src in zip(view, original, strict=True):
            assert row["data_source"] == f"{src['data_source']}_{name}"
            assert row["validation_sampling"] == name and row["__rollout_n__"] == n
            assert row["extra_info"]["question_id"] == f"{src['extra_info']['question_id']}#{name}"
            # The question itself is untouched: prompt, image, answer.
            for column in ("prompt", "images", "reward_model"):
                assert row[column] == src[column]
    ids = [row["extra_info"]["question_id"] for row in views]
    assert len(set(ids)) == len(ids)


def test_refuses_a_views_file_and_a_file_without_data_source(tmp_path):
    source, out = tmp_path / "val.parquet", tmp_path / "views.parquet"
    swatch(source, 2, seed=0, split="test")
    validation_views(source, out, samples=2)
    with pytest.raises(ValueError, match="already has a 'validation_sampling' column"):
        validation_views(out, tmp_path / "again.parquet", samples=2)
    table = pq.read_table(source).drop(["data_source"])
    pq.write_table(table, tmp_path / "bare.parquet")
    with pytest.raises(ValueError, match="no 'data_source' column"):
        validation_views(tmp_path / "bare.parquet", tmp_path / "x.parquet", samples=2)
    with pytest.raises(ValueError, match="samples must be at least 1"):
        validation_views(source, tmp_path / "y.parquet", samples=0)


def test_the_agent_loop_decodes_greedy_rows_greedily_and_keeps_their_seed():
    from types import SimpleNamespace

    from verl_ext.rollout.agent_loop import SeededSingleTurnAgentLoop

    loop = object.__new__(SeededSingleTurnAgentLoop)
    loop.rollout_config = SimpleNamespace(seed=7)
    val_kwargs = {"temperature": 0.6, "top_p": 0.95, "top_k": -1, "logprobs": True}
    row = {"uid": "not-a-run-uid", "raw_prompt": [{"role": "user", "content": "q"}], "index": 3, "global_steps": 2}
    sampled = loop.request_sampling_params(dict(val_kwargs), {**row, "validation_sampling": "sampled"})
    greedy = loop.request_sampling_params(dict(val_kwargs), {**row, "validation_sampling": "greedy"})
    plain = loop.request_sampling_params(dict(val_kwargs), row)
    assert sampled == plain and plain["temperature"] == 0.6 and plain["top_p"] == 0.95
    assert greedy == {**plain, "temperature": 0, "top_p": 1.0, "top_k": -1}
