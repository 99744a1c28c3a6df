"""Fixtures for the DIVA dataset tests: a small training parquet and a validation parquet."""

import pytest
from diva_data_fixtures import make_row, write_parquet


@pytest.fixture(scope="module")
def parquet_files(tmp_path_factory):
    """Six training questions (two with two images) and three validation questions."""
    root = tmp_path_factory.mktemp("diva_data")
    train_rows = [make_row(f"q{i}", index=i) for i in range(4)]
    from diva_data_fixtures import picture, png_bytes

    two = [png_bytes(picture(seed=20)), png_bytes(picture(40, 40, seed=21))]
    train_rows += [make_row(f"q{i}", index=i, images=two, difficulty=2.0) for i in range(4, 6)]
    val_rows = [make_row(f"v{i}", index=i) for i in range(3)]
    return write_parquet(root / "train.parquet", train_rows), write_parquet(root / "val.parquet", val_rows), root
