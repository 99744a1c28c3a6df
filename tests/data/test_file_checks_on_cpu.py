"""The data-file checks: the launcher's pre-Ray check and the dataset inside the job refuse the same files with
the same messages (one implementation, verl_ext.data.file_checks)."""

import pyarrow.parquet as pq
import pytest
from diva_data_fixtures import PROCESSOR, data_config

from recipe.diva_grpo.prelaunch import check_launch
from verl_ext.data.dataset import DivaDataset
from verl_ext.data.file_checks import check_data_files, normalised_files, parquet_columns


def in_job_error(train, val, root, path, split=None) -> str:
    with pytest.raises(ValueError) as err:
        DivaDataset(str(path), None, data_config([train], [val], root / "cache"), processor=PROCESSOR, split=split)
    return str(err.value)


def prelaunch_error(train, val) -> str:
    with pytest.raises(ValueError) as err:
        check_launch([f"data.train_files={train}", f"data.val_files={val}"], remote=False)
    return str(err.value)


def test_same_file_for_training_and_validation(parquet_files):
    train, _, root = parquet_files
    message = prelaunch_error(train, train)
    assert "same files" in message and str(train) in message
    assert in_job_error(train, train, root, train) == message


def test_training_file_without_the_diva_columns(parquet_files, tmp_path):
    train, val, root = parquet_files
    plain = tmp_path / "plain.parquet"
    pq.write_table(pq.read_table(train).drop_columns(["paraphrases", "hint_steps"]), plain)
    message = prelaunch_error(plain, val)
    assert "lack the DIVA column(s) ['paraphrases', 'hint_steps']" in message and str(plain) in message
    assert in_job_error(plain, val, root, plain) == message


@pytest.mark.parametrize("damage", ["truncated", "not_parquet"])
def test_unreadable_parquet(parquet_files, tmp_path, damage):
    train, val, root = parquet_files
    bad = tmp_path / "bad.parquet"
    raw = open(train, "rb").read()
    bad.write_bytes(raw[: len(raw) // 2] if damage == "truncated" else b"question,answer\n1,2\n")
    message = prelaunch_error(bad, val)
    assert f"data file {bad} is not a readable parquet file" in message
    assert in_job_error(bad, val, root, bad) == message
    # a broken validation file is refused the same way
    assert f"data file {bad} is not a readable parquet file" in prelaunch_error(train, bad)


def test_missing_file_names_it(parquet_files, tmp_path):
    _, val, _ = parquet_files
    with pytest.raises(ValueError, match="does not exist") as err:
        parquet_columns(str(tmp_path / "nope.parquet"))
    assert str(tmp_path / "nope.parquet") in str(err.value)
    assert "does not exist" in prelaunch_error(tmp_path / "nope.parquet", val)


def test_good_files_pass_and_plain_verl_runs_check_verls_columns_only(parquet_files, tmp_path):
    train, val, _ = parquet_files
    report = check_data_files(str(train), [str(val)], diva=True)
    assert sorted(report["checked"]) == sorted(normalised_files([train, val]))
    assert report["rows"] == {str(train): pq.read_metadata(train).num_rows, str(val): pq.read_metadata(val).num_rows}
    plain = tmp_path / "plain.parquet"
    pq.write_table(pq.read_table(train).drop_columns(["paraphrases"]), plain)
    # verl's own dataset (the GRPO baseline): the DIVA columns are not required
    assert check_data_files(str(plain), str(val), diva=False)["checked"] == [str(plain), str(val)]
    # but training and validation differ for every method
    with pytest.raises(ValueError, match="the same files"):
        check_data_files(str(plain), str(plain), diva=False)
    # URLs are copied by verl inside the job, which checks them there
    report = check_data_files(["hdfs://x/train.parquet"], ["hdfs://x/val.parquet"], diva=True)
    assert report["checked"] == [] and report["skipped"] == ["hdfs://x/train.parquet", "hdfs://x/val.parquet"]


def test_a_file_that_is_not_parquet_is_refused_whatever_its_name(parquet_files, tmp_path):
    train, val, _ = parquet_files
    jsonl = tmp_path / "val.jsonl"
    jsonl.write_text('{"prompt": "x"}\n')
    with pytest.raises(ValueError, match=r"is not a parquet file: the recipe reads parquet") as err:
        check_data_files(str(train), str(jsonl), diva=True)
    assert str(jsonl) in str(err.value)
    with pytest.raises(ValueError, match="is a folder"):
        check_data_files(str(train), str(tmp_path), diva=True)
    empty = tmp_path / "empty.parquet"
    pq.write_table(pq.read_table(val).slice(0, 0), empty)
    with pytest.raises(ValueError, match=f"data file {empty} has no rows"):
        check_data_files(str(train), str(empty), diva=True)
