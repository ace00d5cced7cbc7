"""parquet_pieces: row groups grouped per partition, and (opt-in) row ranges inside a large row group."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
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


def test_files_of_differing_columns_are_read_as_one_table_and_no_column_is_left_out(tmp_path, corpus):
    """A table whose files grew a column (Spark's mergeSchema, as pyarrow's reader does not: it takes
    the first file's columns and drops the rest): every column some file holds is read and written, null
    in the rows of the files that lack it; a column stored as float32 in one file and float64 in another
    is read as float64. Types no one column holds are refused before any task, naming the files."""
    from datamask_dask import InputDataError, select_table

    table = pa.Table.from_pandas(corpus, preserve_index=False).replace_schema_metadata(None)
    source = tmp_path / "in"
    source.mkdir()
    pq.write_table(table.slice(0, 800), source / "part.0.parquet")
    grown = table.slice(800).append_column("source", pa.array(["web"] * (len(corpus) - 800)))
    grown = grown.set_column(1, "quality_score", grown.column("quality_score").cast(pa.float32()))
    pq.write_table(grown, source / "part.1.parquet")
    assert parquet_pieces(source).schema.field("quality_score").type == pa.float64()
    select_table(source, tmp_path / "out", 0.1, n_epochs=20, n_rollout=8)
    written = pq.read_table(tmp_path / "out")
    assert written.column("source").null_count == 800 and written.column("source")[800].as_py() == "web"
    np.testing.assert_array_equal(written.column("quality_score").to_numpy()[800:],
                                  grown.column("quality_score").to_numpy().astype(np.float64))
    assert pc.sum(written.column("selected")).as_py() == len(corpus) // 10

    numbers = pa.array(np.arange(grown.num_rows))
    pq.write_table(grown.set_column(3, "text", numbers), source / "part.1.parquet")
    with pytest.raises(InputDataError, match=r"column 'text' is \w*string in .*part\.0\.parquet and int64 in "
                                             r".*part\.1\.parquet"):
        select_table(source, tmp_path / "again", 0.1)
    assert not (tmp_path / "again").exists()
