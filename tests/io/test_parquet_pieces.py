"""parquet_pieces: row groups grouped per partition, and (opt-in) row ranges inside a large row group."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datamask_dask.io.parquet import parquet_pieces, read_parquet


@pytest.fixture
def files(tmp_path):
    table = pa.table({"a": np.arange(10_000), "s": [f"doc {i}" for i in range(10_000)]})
    pq.write_table(table, tmp_path / "one.parquet")  # one row group
    (tmp_path / "hive" / "lang=en").mkdir(parents=True)
    pq.write_table(table, tmp_path / "hive" / "lang=en" / "x.parquet", row_group_size=1500)
    return tmp_path


def test_default_pieces_are_whole_row_groups(files):
    """What the selection plans its quotas on: unchanged, a large row group stays one partition."""
    assert parquet_pieces(files / "one.parquet", 3000).items == [(str(files / "one.parquet"), (0,), {})]
    grouped = parquet_pieces(files / "hive", 3000).items
    assert [groups for _, groups, _ in grouped] == [(0, 1), (2, 3), (4, 5), (6,)]
    assert parquet_pieces(files / "hive", 3000, split_row_groups=True).items == grouped  # none too large


def test_a_large_row_group_is_split_into_row_ranges(files):
    items = parquet_pieces(files / "one.parquet", 3000, split_row_groups=True).items
    assert [item[3] for item in items] == [(0, 2500), (2500, 5000), (5000, 7500), (7500, 10_000)]
    assert parquet_pieces(files / "hive", 1000, split_row_groups=True).rows == [750, 750] * 6 + [1000]
    frame = read_parquet(files / "one.parquet", rows_per_partition=3000, split_row_groups=True)
    assert frame.npartitions == 4
    assert frame.map_partitions(len).compute().tolist() == [2500] * 4
    whole = frame.compute()
    assert whole["a"].tolist() == list(range(10_000)) and whole["s"].iloc[7777] == "doc 7777"
    assert read_parquet(files / "one.parquet", rows_per_partition=3000, split_row_groups=True,
                        columns=["s"]).partitions[2].compute()["s"].iloc[0] == "doc 5000"


def test_row_ranges_keep_hive_columns(files):
    frame = read_parquet(files / "hive", rows_per_partition=1000, split_row_groups=True)
    assert frame.npartitions == 13  # each full row group in two ranges, the last one whole
    whole = frame.compute()
    assert whole["a"].tolist() == list(range(10_000)) and set(whole["lang"]) == {"en"}


def test_pieces_know_their_size_in_memory(files):
    """What a run holds in memory where the table fits: the footers' uncompressed bytes, close to the
    Arrow table read; a row group cut into ranges shares its bytes out."""
    pieces = parquet_pieces(files / "hive", 3000)
    for number in range(len(pieces)):
        read = pieces.read(number)
        assert 0.7 * read.nbytes <= pieces.nbytes[number] <= 1.5 * read.nbytes
    whole = parquet_pieces(files / "one.parquet", 3000).nbytes
    split = parquet_pieces(files / "one.parquet", 3000, split_row_groups=True).nbytes
    assert len(split) == 4 and sum(split) - whole[0] in range(4)


def test_a_directory_without_parquet_files_is_named(tmp_path):
    """Not a table of no columns, whose every column would be reported missing."""
    from datamask_dask.errors import InputDataError

    (tmp_path / "empty" / "lang=en").mkdir(parents=True)
    with pytest.raises(InputDataError, match=r"empty holds no parquet files: point to a parquet file"):
        read_parquet(tmp_path / "empty")
