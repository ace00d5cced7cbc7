"""Validation up front: one set of checks for the operator's plan pass and ``datamask validate``."""

from __future__ import annotations

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from conftest import FAST

from datamask_dask import InputDataError, OptionError, datamask_select, validate_table, write_selection
from datamask_dask.cli import main
from datamask_dask.io.parquet import read_parquet
from datamask_dask.io.sinks import write_parquet
from datamask_dask.run.selection import work_dir
from datamask_dask.sample_data import make_corpus


def _from_frames(frames: list[pd.DataFrame]) -> dd.DataFrame:
    """A dask DataFrame whose partitions are exactly ``frames``."""
    with dask.config.set({"dataframe.convert-string": False}):
        return dd.from_map(lambda i: frames[i], range(len(frames)), meta=frames[0].iloc[:0],
                           enforce_metadata=False)


def _object_embeddings(frame: pd.DataFrame) -> pd.DataFrame:
    vectors = np.asarray(frame["feature_arr"].array.__arrow_array__().combine_chunks().flatten())
    rows = list(vectors.reshape(len(frame), -1).copy())
    return frame.assign(feature_arr=pd.Series(rows, index=frame.index, dtype=object))


@pytest.fixture()
def broken(corpus):
    """Four partitions, each with different problems."""
    frame = _object_embeddings(corpus)
    frame.loc[[3, 9], "quality_score"] = [np.nan, np.inf]  # partition 0
    frame.at[410, "feature_arr"] = np.zeros(16, dtype=np.float32)  # partition 1
    frame.at[420, "feature_arr"] = np.full(16, np.nan, dtype=np.float32)
    frame.at[830, "feature_arr"] = frame.at[830, "feature_arr"] * np.float32(1e20)  # partition 2
    frame.loc[1250, "chunk_id"] = 7  # partition 3: a duplicate of partition 0's id 7
    return _from_frames([frame.iloc[i:i + 400] for i in range(0, 1600, 400)])


def test_good_table(parquet_dir, capsys):
    report = validate_table(read_parquet(parquet_dir), scheduler="threads")
    assert report.ok and report.problems == []
    assert (report.rows, report.partitions, report.dim) == (1600, 4, 16)
    assert report.summary() == "OK: 1600 rows in 4 partition(s), 16-d embeddings, 4 columns"
    assert report.selection() == "the selection takes 160 rows"
    report.raise_if_failed()
    assert main(["validate", "--input", str(parquet_dir)]) == 0
    out = capsys.readouterr().out
    assert "OK: 1600 rows in 4 partition(s)" in out
    assert "datamask validate: the selection takes 160 rows" in out


def test_the_rows_each_group_would_get_are_told(corpus):
    """Per-group ratios round per group: what a selection would take is said before it runs."""
    frame = corpus.assign(lang=np.where(np.arange(len(corpus)) % 4 == 0, "de", "en"))
    report = validate_table(dd.from_pandas(frame, npartitions=2, sort=False), ratio={"de": 0.5}, by="lang")
    assert report.ok and report.planned == {"de": 200, "en": 0}
    assert report.selection() == "the selection takes 200 rows (de: 200, en: 0)"
    absent = validate_table(dd.from_pandas(frame, npartitions=2, sort=False), ratio={"de": 0.5, "De": 0.1},
                            by="lang")
    assert absent.selection() == ("the selection takes 200 rows (de: 200, en: 0); ratio names 'De', which "
                                  "no row's group is")
    one_row_groups = validate_table(dd.from_pandas(frame, npartitions=2, sort=False), by="chunk_id")
    assert one_row_groups.selection().startswith("the selection takes 0 rows (0: 0, 1: 0,")


def test_every_problem_is_listed_with_column_partition_and_rows(broken):
    report = validate_table(broken, ratio=0.1, scheduler="sync")
    assert not report.ok
    found = {(p.partition, p.column, p.rows) for p in report.problems}
    assert found == {(0, "quality_score", (3, 9)), (1, "feature_arr", (10,)), (1, "feature_arr", (20,)),
                     (2, "feature_arr", (30,)), (None, "chunk_id", ())}
    text = report.summary()
    assert text.startswith("5 problem(s) found:")
    assert "partition 0: quality column 'quality_score' has 2 NaN, null or infinite value(s) at rows " \
           "[3, 9] (ids [3, 9]): fill or drop them" in text
    assert "partition 1: embedding column 'feature_arr' has all-zero vectors in 1 row(s), first at rows " \
           "[10] (ids [410])" in text
    assert "partition 1: embedding column 'feature_arr' has NaN or infinite values in 1 row(s)" in text
    assert "partition 2: embedding column 'feature_arr' has vectors with a norm outside" in text
    assert "'chunk_id' has 1 duplicate value(s), e.g. 7 (partitions [0, 3])" in text
    with pytest.raises(InputDataError) as raised:
        report.raise_if_failed()
    assert len(raised.value.problems) == 5


def test_the_operator_stops_at_the_same_check(broken):
    report = validate_table(broken, scheduler="sync")
    with pytest.raises(InputDataError) as raised:
        datamask_select(broken, ratio=0.1, **FAST).compute(scheduler="sync")
    # The plan pass raises the first bad partition's problems, worded exactly as validate lists them.
    first = str(raised.value).splitlines()
    assert first and all(line in [p.message for p in report.problems] for line in first)


def test_structural_problems(corpus):
    frames = [_object_embeddings(make_corpus(300, 16, seed=1)),
              _object_embeddings(make_corpus(300, 8, seed=2)).assign(chunk_id=np.arange(300, 600)),
              _object_embeddings(make_corpus(300, 16, seed=3)).assign(chunk_id=np.arange(600, 900))]
    frames[2].at[5, "feature_arr"] = frames[2].at[5, "feature_arr"][:3]
    frames[2] = frames[2].astype({"chunk_id": "Int64"})
    frames[2].loc[7, "chunk_id"] = None
    report = validate_table(_from_frames(frames), scheduler="sync")
    messages = [p.message for p in report.problems]
    assert any("partition 2: embedding column 'feature_arr' is ragged" in m and "rows [5]" in m
               for m in messages)
    assert any("partition 2: id column 'chunk_id' has 1 null value(s) at rows [7]" in m for m in messages)
    assert any("partition 1: embedding column 'feature_arr' has 8 dimensions but 16 elsewhere" in m
               for m in messages)


def test_types_and_schema(corpus):
    text = dd.from_pandas(corpus.assign(quality_score=corpus["quality_score"].astype(str)), npartitions=2)
    report = validate_table(text)
    assert [p.column for p in report.problems] == ["quality_score"]
    assert "quality column 'quality_score' must be numeric, got dtype string: cast it to float64 (Dask: " \
        "astype, Spark: cast)" in report.problems[0].message
    words = pa.array([["a", "b"]] * len(corpus), pa.list_(pa.string()))
    report = validate_table(dd.from_pandas(corpus.assign(feature_arr=pd.arrays.ArrowExtensionArray(words)),
                                           npartitions=2))
    assert "holds lists of string, not numbers" in report.summary()
    report = validate_table(dd.from_pandas(corpus.drop(columns=["quality_score", "chunk_id"]), npartitions=2))
    assert {p.column for p in report.problems} == {"quality_score", "chunk_id"}  # every missing column
    said_once = "1 problem(s) found:\n  1. there are no columns "
    assert report.summary().startswith(said_once)
    tokens = dd.from_pandas(corpus.assign(n_tokens=np.where(np.arange(1600) == 5, -1, 10)), npartitions=2)
    report = validate_table(tokens, budget_tokens=1000)
    assert "token column 'n_tokens' has 1 missing, infinite or negative value(s) at rows [5]" \
        in report.summary()
    groups = dd.from_pandas(corpus.assign(lang=np.where(np.arange(1600) == 900, None, "en")), npartitions=2)
    report = validate_table(groups, by="lang")
    assert "group column 'lang' has 1 null value(s) at rows [100]" in report.summary()
    listed = dd.from_pandas(corpus.assign(pages=pd.arrays.ArrowExtensionArray(words)), npartitions=2)
    for options, said in (({"id_column": "pages"}, "id column 'pages' holds list<item: string> values, not "
                           "single ones (integers or strings): name another column with id_column"),
                          ({"by": "pages"}, "group column 'pages' holds list<item: string> values")):
        assert said in validate_table(listed, **options).summary()  # before any task


@pytest.mark.parametrize(("options", "message"), [
    ({"ratio": 1.5}, "ratio=1.5 is out of range"),
    ({"ratio": 0.9, "prune": 0.5}, "ratio=0.9 cannot be met"),
    ({"n_epoch": 3}, "unknown option 'n_epoch'"),
    ({"memory_budget": "lots"}, "memory_budget"),
    ({"validate": "some"}, "option validate='some' is invalid"),
    ({"oversample": float("nan")}, "oversample"),
])
def test_option_problems(corpus, options, message):
    report = validate_table(dd.from_pandas(corpus, npartitions=2), scheduler="sync", **options)
    assert len(report.problems) == 1 and message in report.problems[0].message
    with pytest.raises(OptionError, match=message.split("=")[0]):
        datamask_select(dd.from_pandas(corpus, npartitions=2), **options).compute(scheduler="sync")


def test_validate_command_lists_problems(tmp_path, corpus, capsys):
    frame = corpus.copy()
    frame.loc[[5, 1500], "quality_score"] = np.nan
    write_parquet(dd.from_pandas(frame, npartitions=4, sort=False), tmp_path / "bad")
    assert main(["validate", "--input", str(tmp_path / "bad")]) == 1
    err = capsys.readouterr().err
    assert "2 problem(s) found" in err
    assert "partition 0: quality column 'quality_score' has 1 NaN" in err and "ids [5]" in err
    assert "partition 3: quality column 'quality_score' has 1 NaN" in err and "ids [1500]" in err
    assert main(["validate", "--input", str(tmp_path / "bad"), "--id-column", "doc_id"]) == 1
    err = capsys.readouterr().err  # in the command line's words, as select says it
    assert "  1. there is no column 'doc_id'; available columns are" in err  # the input named once, above
    assert "Name yours with --id-column, --quality-column" in err
    assert main(["validate", "--input", str(tmp_path / "missing")]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_validation_on_the_cluster(client, corpus):
    frame = corpus.copy()
    frame.loc[1500, "chunk_id"] = 3
    report = validate_table(dd.from_pandas(frame, npartitions=4, sort=False), scheduler=client)
    assert [p.message.split(";")[0] for p in report.problems] == [
        "id column 'chunk_id' has 1 duplicate value(s), e.g. 3 (partitions [0, 3])"]


def test_an_id_repeated_within_and_across_partitions_is_one_example(corpus):
    frame = corpus.copy()
    frame.loc[[1, 2, 700, 701, 1500], "chunk_id"] = 0  # the first row's id, 5 more times: partitions 0, 3, 7
    frame.loc[4, "chunk_id"] = 5
    report = validate_table(dd.from_pandas(frame, npartitions=8, sort=False), scheduler="sync")
    assert [p.message.split(";")[0] for p in report.problems] == [
        "id column 'chunk_id' has 6 duplicate value(s), e.g. 0 (partitions [0, 3, 7]), 5 (partitions [0])"]


def test_full_validation_fails_before_any_learning(tmp_path, corpus):
    frame = _object_embeddings(corpus)
    frame.at[1599, "feature_arr"] = np.zeros(16, dtype=np.float32)  # the last row of the last partition
    ddf = _from_frames([frame.iloc[i:i + 400] for i in range(0, 1600, 400)])
    with pytest.raises(InputDataError, match=r"partition 3: .*all-zero.*ids \[1599\]"):
        write_selection(ddf, tmp_path / "full", scheduler="sync", validate="full", **FAST)
    assert not work_dir(tmp_path / "full").exists()  # failed in the plan pass: nothing was learned
    # "light" reads only the small columns up front (with the per-partition scope: the table scope
    # reads the embeddings in the plan pass anyway): the same row fails when its chunk is learned.
    with pytest.raises(InputDataError, match=r"partition 3: .*all-zero.*ids \[1599\]"):
        write_selection(ddf, tmp_path / "light", scheduler="sync", validate="light",
                        diversity_scope="partition", **FAST)
    light = work_dir(tmp_path / "light")  # kept only when a partition finished before the failure
    assert not light.exists() or any(light.glob("part-*.json"))


def test_embedding_span_is_a_view_inside_a_chunk_and_a_copy_across_chunks():
    from datamask_dask.partition.adapters import embedding_source

    rng = np.random.default_rng(0)
    matrix = rng.standard_normal((10, 4)).astype(np.float32)
    chunks = [pa.FixedSizeListArray.from_arrays(pa.array(matrix[a:b].reshape(-1)), 4)
              for a, b in ((0, 6), (6, 10))]
    series = pd.Series(pd.arrays.ArrowExtensionArray(pa.chunked_array(chunks)), name="feature_arr")
    source = embedding_source(series, "partition 0")
    inside, across = source.span(1, 5), source.span(4, 9)
    np.testing.assert_array_equal(inside, matrix[1:5])
    np.testing.assert_array_equal(across, matrix[4:9])
    assert not inside.flags.owndata and not inside.flags.writeable  # Arrow's memory, read-only
    assert across.flags.owndata  # rows from two chunks: gathered into a new array
    np.testing.assert_array_equal(source.rows(np.arange(4, 9)), across)


def test_the_dimension_is_probed_from_the_first_partition_with_rows():
    """``validate="light"`` reads the dimension from the first partition with rows, checked as a select
    task checks its column, on either engine (:func:`adapters.probe_dimension`)."""
    from datamask_dask.partition import adapters

    def column(rows):
        return pd.Series(pd.arrays.ArrowExtensionArray(pa.array(rows, pa.list_(pa.float32()))), name="emb")

    assert adapters.probe_dimension([column([]), column([[0.1, 0.2, 0.3]])]) == 3
    assert adapters.probe_dimension([column([])]) is None
    with pytest.raises(InputDataError, match="partition 1: embedding column 'emb'"):
        adapters.probe_dimension([column([]), column([None, [0.1, 0.2]])])
