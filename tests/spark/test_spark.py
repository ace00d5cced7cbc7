"""The Spark integration (``datamask_spark``) on a real local[2] Spark session: one session per module.

The corpus is the conftest's 4-file parquet directory, read in Spark one partition per file in file
order (a union of per-file reads), so Spark and Dask see the same partitions.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pyspark", reason="the Spark integration needs pyspark (pip install '.[spark]')")

from conftest import FAST, local_spark, read_files  # noqa: E402
from datamask_spark import datamask_select, spark_errors  # noqa: E402

import datamask_dask  # noqa: E402
from datamask_dask.errors import DataMaskWarning, InputDataError, OptionError  # noqa: E402


@pytest.fixture(scope="module")
def spark():
    return local_spark()  # the session the other Spark modules share


@pytest.fixture(scope="module")
def sdf(spark, parquet_dir):
    return read_files(spark, parquet_dir)


def dask_selected(parquet_dir, **options) -> set:
    out = datamask_dask.datamask_select(datamask_dask.read_parquet(parquet_dir), **options).compute(
        scheduler="sync")
    return set(out.loc[out["selected"], "chunk_id"].tolist())


@pytest.mark.slow
def test_same_rows_as_dask_exact_count_columns_kept(sdf, parquet_dir, corpus):
    out = sdf.transform(datamask_select, ratio=0.1, seed=7, score_column="score", **FAST)
    assert out.columns == sdf.columns + ["selected", "score"]
    got = out.toPandas()
    assert len(got) == len(corpus) and got["selected"].sum() == 160
    assert sorted(got["chunk_id"]) == sorted(corpus["chunk_id"])
    assert got["text"].tolist() == [f"document {i}" for i in got["chunk_id"]]  # rows kept together
    assert set(got.loc[got["selected"], "chunk_id"]) == dask_selected(parquet_dir, ratio=0.1, seed=7, **FAST)
    assert np.isfinite(got.loc[got["selected"], "score"]).all()


@pytest.mark.slow
@pytest.mark.parametrize("algorithm, pieces", [("Facility", "regions"), ("Pair_simi", "regions"),
                                               ("DiSF", "context")])
def test_regions_select_dask_s_rows_on_both_spark_doors(spark, sdf, parquet_dir, tmp_path, algorithm, pieces):
    """``pieces="regions"``: the areas' summaries run on the executors (Facility's curves grouped by
    region, Pair_simi's sums by partition); ``pieces="context"``: DiSF's two rounds, their sums added
    up on the driver in partition order. The rows are Dask's, on the DataFrame door and on the file
    job."""
    import pyarrow.parquet as pq
    from datamask_spark import write_file_selection

    options = {"ratio": 0.1, "seed": 7, "algorithm": algorithm, "pieces": pieces, "max_chunk_rows": 200,
               **FAST}
    want = dask_selected(parquet_dir, **options)
    got = sdf.transform(datamask_select, **options).toPandas()
    assert got["selected"].sum() == 160 and set(got.loc[got["selected"], "chunk_id"]) == want
    write_file_selection(spark, parquet_dir, tmp_path / "out", **options)
    written = pq.read_table(tmp_path / "out", columns=["chunk_id", "selected"]).to_pandas()
    assert set(written.loc[written["selected"], "chunk_id"]) == want


@pytest.mark.slow
def test_spark_and_dask_shadow_the_same_rows_with_the_sharded_search(spark, corpus, tmp_path, monkeypatch):
    """Above ONE_TASK_PARTITIONS both engines run the sharded near-duplicate stages (Spark as DataFrame steps,
    Dask as a graph): the same copies are set aside, so the same rows are selected."""
    import dask.dataframe as dd
    import pandas as pd

    from datamask_dask.dedup import search

    monkeypatch.setattr(search, "ONE_TASK_PARTITIONS", 0)  # the sharded stages (both engines in this process)
    monkeypatch.setattr(search, "ONE_TASK_ROWS", 0)  # whatever the rows Spark counts in its plan pass
    copies = corpus.iloc[:300].assign(chunk_id=corpus["chunk_id"].iloc[:300] + 100_000)
    table = pd.concat([corpus, copies], ignore_index=True)  # exact copies, in the last partitions
    path = tmp_path / "with-copies"
    datamask_dask.write_parquet(dd.from_pandas(table, npartitions=6, sort=False), path)
    options = {"ratio": 0.2, "seed": 7, **FAST}
    got = read_files(spark, path).transform(datamask_select, **options).toPandas()
    chosen = set(got.loc[got["selected"], "chunk_id"])
    assert len(chosen) == round(0.2 * len(table))
    assert chosen == dask_selected(path, **options)
    copied = set(corpus["chunk_id"].iloc[:300])
    assert not any(i in chosen and i + 100_000 in chosen for i in copied)  # never a row and its copy


@pytest.mark.slow
@pytest.mark.parametrize(("persist", "one_task"), [("allowed", False), ("refused", False), ("allowed", True)])
def test_the_sharded_search_runs_on_the_executors_and_gives_dask_s_groups(spark, tmp_path, monkeypatch,
                                                                          persist, one_task):
    """Above ONE_TASK_PARTITIONS and ONE_TASK_ROWS Spark's plan runs the sharded stages as DataFrame
    steps, up to either it finds the candidates on the driver; either way the exact check runs on the
    executors: the driver collects summaries, never a scan, and the plan's shadowed rows and kept
    rows' weights (chains of near-copies, and copies around the threshold, included) are those of the
    Dask graph on the same partitions. A session that refuses to persist (serverless Spark Connect) gets the
    same plan, with a warning."""
    import contextlib

    import dask.dataframe as dd
    import pandas as pd
    import pyarrow as pa
    from datamask_spark import operator as spark_operator
    from pyspark.errors import PySparkException

    from datamask_dask.dask_engine.operator import plan_selection as dask_plan
    from datamask_dask.dedup import search
    from datamask_dask.sample_data import make_corpus

    table = make_corpus(1200, 16, seed=5)
    rng = np.random.default_rng(5)
    emb = np.stack(table["feature_arr"].to_numpy())
    sources = rng.choice(600, 300, replace=False)  # 1-3 near-copies each (cosine ~0.97-0.99), later on
    copies = np.repeat(sources, rng.integers(1, 4, sources.size))
    noise = rng.uniform(0.12, 0.4, (copies.size, 1)) / 4 * rng.standard_normal((copies.size, 16))
    values = np.concatenate([emb, emb[copies] + noise]).astype(np.float32).ravel()
    features = pa.FixedSizeListArray.from_arrays(pa.array(values), 16)
    n = len(table) + copies.size
    table = pd.DataFrame({"chunk_id": np.arange(n), "quality_score": rng.random(n),
                          "feature_arr": pd.Series(pd.arrays.ArrowExtensionArray(features)),
                          "text": [f"document {i}" for i in range(n)]})
    path = tmp_path / "near-copies"
    datamask_dask.write_parquet(dd.from_pandas(table, npartitions=6, sort=False), path)
    # more partitions than one task takes: the table's rows, which the plan pass counts, decide
    monkeypatch.setattr(search, "ONE_TASK_PARTITIONS", 0)
    monkeypatch.setattr(search, "ONE_TASK_ROWS", n if one_task else n - 1)
    searches = []
    for name in ("searched_summaries", "sharded_summaries"):
        real_search = getattr(spark_operator, name)
        monkeypatch.setattr(spark_operator, name, lambda *args, name=name, real_search=real_search:
                            searches.append(name) or real_search(*args))
    collected = []
    real = spark_operator.gather_summaries
    monkeypatch.setattr(spark_operator, "gather_summaries",
                        lambda rows, spec: collected.append(rows) or real(rows, spec))
    sdf, refused = read_files(spark, path), contextlib.nullcontext()
    if persist == "refused":
        def refuse(self, *args, **kwargs):
            raise PySparkException("PERSIST TABLE is not supported on serverless compute")

        monkeypatch.setattr(type(sdf), "persist", refuse)
        refused = pytest.warns(RuntimeWarning, match="Spark cannot persist")  # the scans, the parent links
    with refused:
        _, plan = spark_operator.plan_selection(sdf, 0.2, seed=7, **FAST)
    assert searches == ["searched_summaries" if one_task else "sharded_summaries"]
    assert all("summary" in pickle.loads(row["payload"]) for row in collected[0])  # no scan on the driver
    expected = dask_plan(datamask_dask.read_parquet(path), 0.2, seed=7, **FAST)[1].compute(scheduler="sync")
    assert sum(len(v) for v in plan.shadowed.values()) > 200
    assert max(w.max() for _, w in plan.weights.values()) >= 3  # groups of more than two rows
    assert plan.shadowed.keys() == expected.shadowed.keys()
    for p, rows in expected.shadowed.items():
        np.testing.assert_array_equal(plan.shadowed[p], rows)
    assert plan.weights.keys() == expected.weights.keys()
    for p, (kept, weights) in expected.weights.items():
        np.testing.assert_array_equal(plan.weights[p][0], kept)
        np.testing.assert_array_equal(plan.weights[p][1], weights)


@pytest.mark.slow
def test_write_selection_writes_the_same_rows_from_the_workers(sdf, corpus, parquet_dir, tmp_path):
    """The job's writer (Python workers write parquet): the same rows as Dask, every column, a run record."""
    import pyarrow.parquet as pq
    from datamask_spark.writer import write_selection

    from datamask_dask.io.output import read_record

    record = write_selection(sdf, tmp_path / "out", ratio=0.1, seed=7, score_column="score", **FAST)
    assert read_record(tmp_path / "out") == {**record, "files": [f"part.{n}.parquet" for n in range(4)]}
    assert record["engine"] == "spark" and record["output"]["format"] == "parquet"
    assert (record["rows"], record["selected"]) == (1600, 160)
    assert [p["rows"] for p in record["partitions"]] == [400] * 4
    assert {"read", "select", "learn", "write"} <= set(record["stages"])
    summary = record["summary"]  # the run summary, as Dask's writer makes it
    assert summary["objective"]["datamask"]["objective"] > summary["objective"]["random"]["objective"]
    assert summary["selected_pairs"]["rows"] == 160 and summary["curves"]
    assert record["settings"]["seed"] == 7
    table = pq.read_table(tmp_path / "out")
    assert table.schema.names == sdf.columns + ["selected", "score"]
    got = table.to_pandas()
    assert got["chunk_id"].tolist() == corpus["chunk_id"].tolist()  # partition by partition, in row order
    assert got["text"].tolist() == corpus["text"].tolist()
    assert np.array_equal(np.stack(got["feature_arr"]), np.stack(corpus["feature_arr"]))
    assert set(got.loc[got["selected"], "chunk_id"]) == dask_selected(parquet_dir, ratio=0.1, seed=7, **FAST)


@pytest.mark.slow
def test_spark_doors_take_the_options_the_dask_door_resolves(sdf, parquet_dir, tmp_path):
    """Settings given by keyword, config file, a config's metric section and dask.config resolve alike on
    the Spark operator, the Spark writer and the Dask operator (Spark names no backend)."""
    import dask
    from datamask_spark import operator as spark_operator
    from datamask_spark.writer import write_selection

    from datamask_dask.config import resolve_options
    from datamask_dask.dask_engine.operator import plan_selection
    from datamask_dask.io.records import as_json

    config = tmp_path / "job.yaml"
    config.write_text(f"n_epochs: {FAST['n_epochs']}\nalgorithms:\n  Facility: {{refine_epochs: 3}}\n")
    keywords = {"ratio": 0.2, "lamb": 0.3, "algorithm": "fl", "n_rollout": FAST["n_rollout"]}
    with dask.config.set({"datamask.max_chunk_rows": 900, "datamask.seed": 5}):
        options = resolve_options(config, **keywords)
        spec = spark_operator.plan_selection(sdf, config=config, **keywords)[0]
        assert spec == plan_selection(datamask_dask.read_parquet(parquet_dir), config=config, **keywords)[0]
        record = write_selection(sdf, tmp_path / "out", config=config, **keywords)
    learner = spec.options
    assert (learner.lamb, learner.refine_epochs, learner.seed, spec.max_chunk_rows) == (0.3, 3, 5, 900)
    assert record["settings"] == as_json(options.to_dict())


def _lang_tokens(frame):
    ids = frame["chunk_id"].to_numpy()
    return frame.assign(lang=np.where(ids % 3 == 0, "de", "en"), n_tokens=ids % 50 + 10)


@pytest.mark.slow
def test_groups_prune_and_token_budget_match_dask(spark, sdf, parquet_dir):
    from pyspark.sql import functions as F

    grouped = sdf.withColumn("lang", F.when(F.col("chunk_id") % 3 == 0, "de").otherwise("en")) \
                 .withColumn("n_tokens", (F.col("chunk_id") % 50 + 10).cast("long"))
    options = dict(by="lang", ratio={"de": 0.2, "en": 0.05}, prune=0.1, **FAST)
    got = grouped.transform(datamask_select, **options).where("selected").toPandas()
    assert (got["lang"] == "de").sum() == round(0.2 * 534)
    assert (got["lang"] == "en").sum() == round(0.05 * 1066)

    want = datamask_dask.datamask_select(datamask_dask.read_parquet(parquet_dir).map_partitions(_lang_tokens),
                                         **options).compute(scheduler="sync")
    assert set(got["chunk_id"]) == set(want.loc[want["selected"], "chunk_id"])

    budget = grouped.transform(datamask_select, budget_tokens=5000, **FAST).where("selected").toPandas()
    assert 5000 - 60 * 4 < budget["n_tokens"].sum() <= 5000
    # a group the table lacks is told as Dask's door tells it
    unknown = r"ratio names group\(s\) 'fr' that no row's 'lang' holds"
    with pytest.warns(DataMaskWarning, match=unknown) as caught:
        datamask_select(grouped, by="lang", ratio={"de": 0.2, "fr": 0.1}, **FAST)
    assert [w.filename for w in caught if w.category is DataMaskWarning] == [__file__]  # the user's line


@pytest.mark.slow
def test_a_frame_that_is_not_spark_s_is_told_at_each_door(corpus, tmp_path):
    from datamask_spark import write_selection

    for door, call in (("datamask_select", lambda: datamask_select(corpus, ratio=0.1)),
                       ("write_selection", lambda: write_selection(corpus, tmp_path / "out", ratio=0.1))):
        with pytest.raises(TypeError, match=rf"^datamask_spark\.{door} needs a pyspark DataFrame, got "
                                            r"DataFrame: make one with spark\.createDataFrame"):
            call()
    assert not (tmp_path / "out").exists()


def test_bad_data_names_the_spark_partition(spark, sdf):
    from pyspark.sql import functions as F

    bad = sdf.withColumn("quality_score", F.when(F.col("chunk_id") == 1205, F.lit(float("nan")))
                         .otherwise(F.col("quality_score")))
    with pytest.raises(InputDataError, match=r"partition 3: quality column 'quality_score' has 1 NaN"):
        datamask_select(bad, ratio=0.1, **FAST)
    dup = sdf.withColumn("chunk_id", F.when(F.col("chunk_id") == 1300, F.lit(5)).otherwise(F.col("chunk_id")))
    with pytest.raises(InputDataError, match=r"1 duplicate value\(s\), e\.g\. 5 \(partitions \[0, 3\]\); .* "
                       r"\(drop_duplicates\(subset=\['chunk_id'\], on a Dask or Spark frame\)"):  # either
        datamask_select(dup, ratio=0.1, **FAST)
    with pytest.raises(OptionError, match="n_epoch"):
        datamask_select(sdf, ratio=0.1, n_epoch=3)
    with pytest.raises(InputDataError, match="no column 'quality'"):
        datamask_select(sdf, ratio=0.1, quality_column="quality")


@pytest.mark.slow
def test_a_spark_ml_vector_column_is_told_how_to_become_an_array(spark, sdf, tmp_path):
    """Spark ML's VectorUDT reaches Arrow as a struct: each door names the column and the remedy, which
    selects the rows of the array column."""
    from datamask_spark import write_selection
    from pyspark.ml.functions import array_to_vector, vector_to_array

    vectors = sdf.withColumn("feature_arr", array_to_vector("feature_arr"))
    message = (r"^embedding column 'feature_arr' is a Spark ML vector \(VectorUDT\): give it as an array of "
               r"floats, e\.g\. sdf\.withColumn\('feature_arr', pyspark\.ml\.functions\.vector_to_array")
    for door in (datamask_select, lambda frame, **kw: write_selection(frame, tmp_path / "out", **kw)):
        with pytest.raises(InputDataError, match=message):
            door(vectors, ratio=0.1, **FAST)
    assert not (tmp_path / "out").exists()
    arrays = vectors.withColumn("feature_arr", vector_to_array("feature_arr", "float32"))
    chosen = arrays.transform(datamask_select, ratio=0.1, seed=7, **FAST).where("selected").select("chunk_id")
    assert {row["chunk_id"] for row in chosen.collect()} == (
        {row["chunk_id"] for row in sdf.transform(datamask_select, ratio=0.1, seed=7, **FAST)
         .where("selected").select("chunk_id").collect()})


@pytest.mark.slow
def test_columns_named_with_dots_and_spaces_select_the_same_rows(sdf, tmp_path):
    """Spark reads a dot in a column's name as a field path wherever a name is resolved (``mapInArrow``
    resolves each input column so): every pass and both doors take such columns, with the plain names'
    rows."""
    import pyarrow.parquet as pq
    from datamask_spark import write_selection

    names = {"chunk_id": "doc.id", "quality_score": "quality score", "feature_arr": "feature.arr"}
    dotted = sdf.withColumnsRenamed(names)
    options = {"id_column": "doc.id", "quality_column": "quality score", "embedding_column": "feature.arr"}
    regions = {"pieces": "regions"}  # every pass: plan, exact check, curves, packs, select
    out = dotted.transform(datamask_select, ratio=0.1, seed=7, **options, **regions, **FAST)
    assert out.columns == [*dotted.columns, "selected"]
    chosen = {row["doc.id"] for row in out.where("selected").select("`doc.id`").collect()}
    plain = sdf.transform(datamask_select, ratio=0.1, seed=7, **regions, **FAST)
    assert chosen == {row["chunk_id"] for row in plain.where("selected").select("chunk_id").collect()}
    write_selection(dotted, tmp_path / "out", ratio=0.1, seed=7, **options, **regions, **FAST)
    written = pq.read_table(tmp_path / "out").to_pandas()
    assert list(written.columns) == [*dotted.columns, "selected"]
    assert set(written.loc[written["selected"], "doc.id"]) == chosen


@pytest.mark.slow
def test_select_pass_error_reaches_the_driver_as_the_package_error(sdf):
    from pyspark.sql import functions as F

    # validate="light" and the per-partition scope: the plan pass does not read embeddings (the table
    # scope would, and fail there), so the select pass finds the zero vector
    zero = F.array_repeat(F.lit(0.0).cast("float"), 16)
    bad = sdf.withColumn("feature_arr",
                         F.when(F.col("chunk_id") == 450, zero).otherwise(F.col("feature_arr")))
    out = datamask_select(bad, ratio=0.5, validate="light", diversity_scope="partition", **FAST)
    with pytest.raises(InputDataError, match=r"partition 1") as caught, spark_errors():
        out.where("selected").count()
    assert "Traceback" not in str(caught.value) and "DATAMASK-ERROR" not in str(caught.value)


@pytest.mark.slow
def test_empty_partitions(sdf):
    # the middle 2 of 4 partitions empty (partition p of sdf holds rows 400 p to 400 p + 399)
    mixed = sdf.where("chunk_id < 400 or chunk_id >= 1200")
    got = datamask_select(mixed, ratio=0.1, **FAST).where("selected").count()
    assert got == 80


def test_a_pyspark_older_than_4_is_refused_at_import_naming_the_version():
    """The integration passes Arrow tables to and from the driver (pyspark 4.0): on an older pyspark
    its import fails with the version and the remedy, not later inside a job."""
    import subprocess
    import sys

    code = "import pyspark; pyspark.__version__ = '3.5.3'; import datamask_spark"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "datamask_spark needs pyspark 4.0 or later, and pyspark 3.5.3 is installed" in done.stderr


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="reads a process's parent from /proc")
def test_python_workers_are_forked_with_the_package_imported(spark):
    """The tests' session has datamask_spark.job.SETTINGS, as get_spark's has: every Python worker is
    forked from datamask_spark.daemon, so it starts its first task with torch imported, and with the
    imports' objects frozen out of the collection Spark's worker runs after each task."""

    def origin(batches):  # the worker's parent's command line, torch imported before the task, frozen
        import gc
        import os
        import sys

        import pyarrow as pa

        torch = "torch" in sys.modules
        for _ in batches:
            pass
        parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        frozen = gc.get_freeze_count()
        yield pa.RecordBatch.from_pydict({"parent": [parent], "torch": [torch], "frozen": [frozen]})

    got = spark.range(0, 4, 1, 4).mapInArrow(origin, "parent string, torch boolean, frozen long").collect()
    assert len(got) == 4
    assert all("datamask_spark.daemon" in row["parent"] and row["torch"] for row in got), got
    assert all(row["frozen"] > 10_000 for row in got), got  # the imports' objects, not a handful


@pytest.mark.slow
def test_select_parquet_job_follows_the_output_rules(spark, parquet_dir, tmp_path):
    """The CLI's --engine spark job: exact count, a run record, no overlap with the input, and no
    overwrite of what datamask did not write."""
    from datamask_spark.job import select_parquet

    from datamask_dask.io.output import RUN_RECORD, UnsafeOutputError, read_record

    target = tmp_path / "out"
    rows, selected, _ = select_parquet(parquet_dir, target, spark=spark, ratio=0.1, n_epochs=20, n_rollout=8)
    assert (rows, selected) == (1600, 160)
    assert read_record(target)["engine"] == "spark" and (target / RUN_RECORD).exists()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no staging left behind
    # an earlier datamask output is replaced with --overwrite
    assert select_parquet(parquet_dir, target, spark=spark, overwrite=True, ratio=0.1, n_epochs=20,
                          n_rollout=8)[:2] == (1600, 160)
    with pytest.raises(UnsafeOutputError, match="is the input"):
        select_parquet(parquet_dir, parquet_dir, spark=spark, overwrite=True, ratio=0.1)
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    with pytest.raises(UnsafeOutputError, match="notes.txt"):
        select_parquet(parquet_dir, foreign, spark=spark, overwrite=True, ratio=0.1)
    assert (foreign / "notes.txt").read_text() == "keep"


@pytest.mark.slow
def test_file_selection_reads_the_pieces_in_the_workers(spark, corpus, parquet_dir, tmp_path):
    """Parquet in, parquet out with the workers reading their pieces: the Dask reader's partitions,
    hence Dask's rows; every column with the input's Arrow types; a run record."""
    import pyarrow.parquet as pq
    from datamask_spark.files import write_file_selection

    from datamask_dask.io.output import UnsafeOutputError, read_record

    record = write_file_selection(spark, parquet_dir, tmp_path / "out", ratio=0.1, seed=7, **FAST)
    assert read_record(tmp_path / "out") == {**record, "files": [f"part.{n}.parquet" for n in range(4)]}
    assert (record["rows"], record["selected"]) == (1600, 160)
    assert [p["rows"] for p in record["partitions"]] == [400] * 4
    assert {k: record["input"][k] for k in ("location", "format", "uri", "read_by", "rows")} == {
        "location": str(parquet_dir), "format": "parquet", "uri": str(parquet_dir), "read_by": "workers",
        "rows": [400] * 4}
    assert list(record["input"]["columns"]) == sorted(corpus.columns)  # the input's, not the output's
    assert {"read", "select", "learn", "write"} <= set(record["stages"])
    table = pq.read_table(tmp_path / "out")
    source = pq.read_table(parquet_dir)
    assert table.schema.remove_metadata() == source.schema.remove_metadata().append(
        table.schema.field("selected"))  # fixed-size-list embeddings stay fixed-size lists
    assert table.drop_columns(["selected"]).equals(source.replace_schema_metadata(None))
    got = table.to_pandas()
    assert set(got.loc[got["selected"], "chunk_id"]) == dask_selected(parquet_dir, ratio=0.1, seed=7, **FAST)
    with pytest.raises(UnsafeOutputError, match="inside the input"):
        write_file_selection(spark, parquet_dir, parquet_dir / "out", ratio=0.1)


@pytest.mark.slow
def test_file_selection_bad_input_names_the_partition_and_file(spark, corpus, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datamask_spark.files import write_file_selection

    source = tmp_path / "in"
    source.mkdir()
    table = pa.Table.from_pandas(corpus, preserve_index=False).replace_schema_metadata(None)
    for i in range(4):  # part 3 repeats part 0's rows
        pq.write_table(table.slice(400 * (i % 3), 400), source / f"part.{i}.parquet")
    with pytest.raises(InputDataError, match=r"400 duplicate value\(s\), e\.g\. 0 \(partitions \[0, 3\]\)"):
        write_file_selection(spark, source, tmp_path / "out", ratio=0.1, **FAST)
    pq.write_table(table.slice(400, 400).set_column(
        1, "quality_score", pa.array([float("nan")] * 400, pa.float64())), source / "part.1.parquet")
    with pytest.raises(InputDataError, match=r"partition 1: quality column 'quality_score' has 400 NaN"):
        write_file_selection(spark, source, tmp_path / "out", ratio=0.1, check_ids=False, **FAST)
    pq.write_table(table.slice(400, 400), source / "part.1.parquet")
    pq.write_table(table.slice(800, 400).drop_columns(["quality_score"]), source / "part.2.parquet")
    with pytest.raises(InputDataError, match=r"partition 2: quality column 'quality_score' has 400 NaN, "
                                             r"null or infinite value\(s\) \(every row null: does a file "
                                             r"of the table lack the column\?\)"):
        write_file_selection(spark, source, tmp_path / "out", ratio=0.1, check_ids=False, **FAST)
    (source / "part.3.parquet").write_bytes(b"not parquet")
    with pytest.raises(InputDataError, match=r"part\.3\.parquet.*not a parquet file"):
        write_file_selection(spark, source, tmp_path / "out", ratio=0.1, **FAST)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_file_job_writes_delta_and_iceberg_tables_with_dask_s_rows(spark, parquet_dir, tmp_path):
    """``select_table(engine="spark")`` into a Delta and an Iceberg table, through the sinks the Dask
    engine writes them with: Dask's rows, and the run record in the table's commit; the CLI's
    ``--mode append`` on Spark adds a second commit."""
    import json

    import deltalake

    catalog, tables = _sql_catalog(tmp_path, "out")
    options = dict(ratio=0.1, seed=7, **FAST)
    delta = datamask_dask.select_table(parquet_dir, f"delta://{tmp_path}/delta", engine="spark", spark=spark,
                                       **options)
    iceberg = datamask_dask.select_table(parquet_dir, "iceberg://local/out.selected", engine="spark",
                                         spark=spark, catalog_properties=catalog, **options)
    table = deltalake.DeltaTable(str(tmp_path / "delta"))
    written = {"delta": table.to_pyarrow_table().to_pandas(),
               "iceberg": tables.load_table("out.selected").scan().to_arrow().to_pandas()}
    assert json.loads(table.history()[0]["datamask.run"])["run_id"] == delta.run_id
    assert (delta.selected, iceberg.selected) == (160, 160)
    for rows in written.values():
        assert len(rows) == 1600 and set(rows.loc[rows["selected"], "chunk_id"]) == dask_selected(parquet_dir,
                                                                                                  **options)
    from datamask_dask.cli import main

    assert main(["select", "--engine", "spark", "--input", str(parquet_dir), "--output", f"delta://{tmp_path}/delta",
                 "--mode", "append", "--ratio", "0.1", "--seed", "7", "--n-epochs", str(FAST["n_epochs"]),
                 "--n-rollout", str(FAST["n_rollout"])]) == 0
    table = deltalake.DeltaTable(str(tmp_path / "delta"))
    assert table.version() == 1 and len(table.to_pyarrow_table()) == 3200
    from datamask_spark import write_file_selection, write_selection  # mode goes with the options

    record = write_selection(read_files(spark, parquet_dir), f"delta://{tmp_path}/frame", **options)
    frame = deltalake.DeltaTable(str(tmp_path / "frame")).to_pyarrow_table().to_pandas()
    assert set(frame.loc[frame["selected"], "chunk_id"]) == dask_selected(parquet_dir, **options)
    assert len(frame) == 1600 and record["selected"] == 160

    record = write_file_selection(spark, parquet_dir, f"delta://{tmp_path}/delta", mode="append", **options)
    table = deltalake.DeltaTable(str(tmp_path / "delta"))
    assert table.version() == 2 and len(table.to_pyarrow_table()) == 4800 and record["selected"] == 160
    with pytest.raises(OptionError, match="overwrite=True or mode='append', not both"):
        write_file_selection(spark, parquet_dir, f"delta://{tmp_path}/delta", mode="append", overwrite=True,
                             **options)


def test_the_selection_only_output_is_dask_s_on_spark(spark, parquet_dir, tmp_path):
    """``output_columns="selection"`` on the Spark engine: the columns Dask writes (id, ``selected``, the
    score, the explain columns, the run id), of the same types, with Dask's rows and reasons."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    options = dict(ratio=0.1, seed=7, output_columns="selection", score_column="score", explain=True, **FAST)
    sessions = {"dask": {}, "spark": {"spark": spark}}
    reports = {engine: datamask_dask.select_table(parquet_dir, tmp_path / engine, engine=engine, **session,
                                                  **options) for engine, session in sessions.items()}
    tables = {engine: pq.read_table(tmp_path / engine) for engine in reports}
    for engine, table in tables.items():
        assert [(f.name, f.type) for f in table.schema] == [
            ("chunk_id", pa.int64()), ("selected", pa.bool_()), ("score", pa.float32()),
            ("reason", pa.string()), ("duplicate_of", pa.int64()), ("similarity", pa.float32()),
            ("run_id", pa.large_string())], engine
        assert all(field.nullable for field in table.schema), engine
        assert set(table.column("run_id").to_pylist()) == {reports[engine].run_id}
    rows = {engine: table.drop_columns(["run_id"]).sort_by("chunk_id") for engine, table in tables.items()}
    assert rows["spark"].equals(rows["dask"]) and reports["spark"].selected == 160


def test_incremental_runs_and_row_filters_select_dask_s_rows_on_spark(spark, corpus, tmp_path):
    """Both engines read the input's same pieces: an incremental run on a Delta input selects among the
    rows added since the output's last run, and an Iceberg row filter's rows are selected, as on Dask."""
    import deltalake
    import pyarrow as pa

    rows = pa.Table.from_pandas(corpus, preserve_index=False).replace_schema_metadata(None)
    deltalake.write_deltalake(tmp_path / "delta", rows.slice(0, 1200))
    deltalake.write_deltalake(tmp_path / "delta", rows.slice(1200), mode="append")
    catalog, tables = _sql_catalog(tmp_path, "ns")
    tables.create_table("ns.source", rows.schema).append(rows)
    options = dict(ratio=0.1, seed=7, output_columns="selection", **FAST)
    chosen = {}
    for engine, session in {"dask": {}, "spark": {"spark": spark}}.items():
        out = f"delta://{tmp_path}/{engine}"
        first = datamask_dask.select_table(f"delta://{tmp_path}/delta?version=0", out, engine=engine,
                                           **session, **options)
        second = datamask_dask.select_table(f"delta://{tmp_path}/delta", out, engine=engine, incremental=True,
                                            **session, **options)
        assert (first.rows, second.rows, second.record["incremental"]["since"]) == (1200, 400, 0), engine
        filtered = datamask_dask.select_table("iceberg://local/ns.source", tmp_path / f"{engine}-filtered",
                                              engine=engine, row_filter="chunk_id < 1000",
                                              catalog_properties=catalog, **session, **options)
        assert filtered.rows == 1000 and filtered.record["input"]["row_filter"] == "chunk_id < 1000"
        written = deltalake.DeltaTable(tmp_path / engine).to_pyarrow_table()
        chosen[engine] = (set(written.filter(written["selected"])["chunk_id"].to_pylist()),
                          set(_selected_ids(tmp_path / f"{engine}-filtered")))
    assert chosen["spark"] == chosen["dask"] and len(chosen["spark"][0]) == 120 + 40


def _sql_catalog(tmp_path, namespace: str):
    """A pyiceberg SQL catalog ``local`` (SQLite, its warehouse under ``tmp_path``) holding ``namespace``:
    its properties, and the catalog."""
    from pyiceberg.catalog.sql import SqlCatalog

    (tmp_path / "wh").mkdir()
    properties = {"type": "sql", "uri": f"sqlite:///{tmp_path}/cat.db", "warehouse": f"file://{tmp_path}/wh"}
    catalog = SqlCatalog("local", uri=properties["uri"], warehouse=properties["warehouse"])
    catalog.create_namespace(namespace)
    return properties, catalog


def _selected_ids(path) -> list:
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=["chunk_id", "selected"])
    return table.filter(table["selected"])["chunk_id"].to_pylist()


@pytest.mark.slow
def test_cli_engine_spark_selects_the_rows_of_engine_dask(spark, parquet_dir, tmp_path, capsys):
    """``datamask select --engine spark`` on a parquet directory: the file job, Dask's rows."""
    import pyarrow.parquet as pq

    from datamask_dask.cli import main
    from datamask_dask.io.output import read_record

    flags = ["--ratio", "0.1", "--seed", "7", "--n-epochs", "20", "--n-rollout", "8"]
    for engine in ("spark", "dask"):
        assert main(["select", "--engine", engine, "--input", str(parquet_dir),
                     "--output", str(tmp_path / engine), *flags]) == 0
    assert "-> " + str(tmp_path / "spark") + " (spark)" in capsys.readouterr().out
    assert read_record(tmp_path / "spark")["input"]["read_by"] == "workers"
    chosen = {}
    for engine in ("spark", "dask"):
        table = pq.read_table(tmp_path / engine, columns=["chunk_id", "selected"]).to_pandas()
        chosen[engine] = set(table.loc[table["selected"], "chunk_id"])
    assert len(chosen["spark"]) == 160 and chosen["spark"] == chosen["dask"]
    assert main(["select", "--engine", "spark", "--input", str(parquet_dir), "--output", str(tmp_path / "x"),
                 "--text-column", "text"]) == 1
    assert "--text-column needs --engine dask" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_a_refused_output_is_told_before_spark_starts(parquet_dir, tmp_path):
    """The output and the input are checked first: a refusal does not wait for a JVM to start."""
    import subprocess
    import sys

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.md").write_text("mine")
    code = ("import sys; from datamask_dask.cli import main; code = main(sys.argv[1:]); "
            "from pyspark import SparkContext; print(code, SparkContext._gateway is None)")
    done = subprocess.run([sys.executable, "-c", code, "select", "--engine", "spark", "--input",
                           str(parquet_dir), "--output", str(theirs)], capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.split() == ["1", "True"], (done.stdout, done.stderr[-2000:])
    assert "without a datamask run record" in done.stderr and (theirs / "notes.md").read_text() == "mine"


@pytest.mark.slow
def test_a_cli_spark_job_in_a_batch_log_writes_its_own_lines(parquet_dir, tmp_path):
    """``datamask select --engine spark`` with stderr not a terminal: the job's lines, without Spark's
    console progress bars, its start-up log lines or PySpark's caution about pandas between them."""
    import subprocess
    import sys

    from conftest import spark_worker_environment

    spark_worker_environment()
    done = subprocess.run([sys.executable, "-m", "datamask_dask.cli", "select", "--engine", "spark",
                           "--spark-master", "local[1]", "--input", str(parquet_dir), "--output",
                           str(tmp_path / "out"), "--n-epochs", "20", "--n-rollout", "8"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "datamask: planning" in done.stderr and "datamask: committed" in done.stderr, done.stderr
    assert "[Stage" not in done.stderr and "FutureWarning" not in done.stderr, done.stderr
    assert "log4j" not in done.stderr and "default log level" not in done.stderr, done.stderr
    assert "160 selected" in done.stdout


@pytest.mark.slow
def test_file_selection_reads_delta_and_iceberg_tables(spark, corpus, tmp_path):
    """Delta and Iceberg inputs: the workers read the snapshot's files (deltalake fragments, pyiceberg
    scan tasks), the same partitions as the Dask readers, hence Dask's rows."""
    pytest.importorskip("deltalake", reason="the lakehouse extra (deltalake) is not installed")
    pytest.importorskip("pyiceberg.catalog.sql", reason="the lakehouse extra (pyiceberg) is not installed")
    import deltalake
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datamask_spark.files import write_file_selection

    from datamask_dask.io.tables import read_table

    table = pa.Table.from_pandas(corpus, preserve_index=False).replace_schema_metadata(None)
    table = table.set_column(2, "feature_arr", table.column("feature_arr").cast(pa.list_(pa.float32())))
    deltalake.write_deltalake(tmp_path / "delta", table.slice(0, 1000))
    deltalake.write_deltalake(tmp_path / "delta", table.slice(1000), mode="append")
    properties, catalog = _sql_catalog(tmp_path, "ns")
    iceberg = catalog.create_table("ns.corpus", schema=table.schema)
    iceberg.append(table.slice(0, 1000))
    iceberg.append(table.slice(1000))
    for uri, version in ((f"delta://{tmp_path}/delta", 1),
                         ("iceberg://local/ns.corpus", iceberg.current_snapshot().snapshot_id)):
        out = tmp_path / ("selected-" + uri.split(":")[0])
        record = write_file_selection(spark, uri, out, ratio=0.1, seed=7, catalog_properties=properties,
                                      **FAST)
        assert (record["rows"], record["selected"], record["input"]["files"]) == (1600, 160, 2)
        assert record["input"].get("version", record["input"].get("snapshot_id")) == version
        got = pq.read_table(out, columns=["chunk_id", "selected"]).to_pandas()
        want = datamask_dask.datamask_select(read_table(uri, catalog_properties=properties).frame, ratio=0.1,
                                             seed=7, **FAST).compute(scheduler="sync")
        assert set(got.loc[got["selected"], "chunk_id"]) == set(want.loc[want["selected"], "chunk_id"])


@pytest.mark.slow
@pytest.mark.parametrize("sharded", [False, True])
def test_spark_and_dask_give_the_same_reasons(sdf, parquet_dir, monkeypatch, sharded):
    """explain=True on the same partitions: the same reason, duplicate_of and similarity for every row,
    with the one-task near-duplicate search and with the sharded stages (Spark's DataFrame steps)."""
    import pandas as pd
    import pyarrow as pa

    from datamask_dask.dedup import search

    if sharded:
        monkeypatch.setattr(search, "ONE_TASK_PARTITIONS", 0)
        monkeypatch.setattr(search, "ONE_TASK_ROWS", 0)
    options = {"ratio": 0.1, "seed": 7, "prune": 0.3, "explain": True, **FAST}
    out = sdf.transform(datamask_select, **options)
    assert out.columns[-4:] == ["selected", "reason", "duplicate_of", "similarity"]
    got = out.toPandas().set_index("chunk_id").sort_index()
    want = datamask_dask.datamask_select(datamask_dask.read_parquet(parquet_dir), **options).compute(
        scheduler="sync").set_index("chunk_id").sort_index()
    assert got["reason"].tolist() == want["reason"].astype(str).tolist()
    assert set(got["reason"]) >= {"selected", "near-duplicate", "quality-pruned", "not-chosen"}
    np.testing.assert_array_equal(got["duplicate_of"].fillna(-1).astype(np.int64),
                                  want["duplicate_of"].fillna(-1).astype(np.int64))
    np.testing.assert_allclose(got["similarity"].astype(np.float32), want["similarity"].to_numpy(np.float32))
    assert want["duplicate_of"].dtype == pd.ArrowDtype(pa.int64())


@pytest.mark.slow
def test_file_selection_explains_as_dask_does(spark, parquet_dir, tmp_path):
    """The Spark file job writes the reasons Dask gives on the same partitions."""
    import pandas as pd
    import pyarrow.parquet as pq
    from datamask_spark.files import write_file_selection

    options = {"ratio": 0.1, "seed": 7, "prune": 0.3, "explain": True, **FAST}
    write_file_selection(spark, parquet_dir, tmp_path / "out", **options)
    got = pq.read_table(tmp_path / "out").to_pandas(types_mapper=pd.ArrowDtype)
    got = got.set_index("chunk_id").sort_index()
    want = datamask_dask.datamask_select(datamask_dask.read_parquet(parquet_dir), **options).compute(
        scheduler="sync").set_index("chunk_id").sort_index()
    for column in ("selected", "reason", "duplicate_of"):
        assert got[column].astype(str).tolist() == want[column].astype(str).tolist(), column


_FILE_JOB = """
import sys
from pyspark.sql import SparkSession
from datamask_spark.files import write_file_selection
from datamask_spark.job import SETTINGS

spark = SparkSession.builder.master("local[1]").config(map=SETTINGS).config("spark.ui.enabled", "false")
spark = spark.getOrCreate()
write_file_selection(spark, sys.argv[1], sys.argv[2], ratio=0.1, seed=7, n_epochs=20, n_rollout=8)
"""


@pytest.mark.slow
def test_a_killed_file_job_resumes_to_the_same_bytes(spark, parquet_dir, tmp_path, s3):
    """The Spark file job's driver is killed (SIGKILL) after a partition finished; run again, it reuses
    the finished partitions and writes the uninterrupted job's bytes. On the S3 API server: the sinks'
    protocol is the same on local disk (tests/run/test_sinks.py), where the Spark files job also resumes
    (test_a_resumed_run_learns_a_pack_with_its_finished_members)."""
    import signal
    import subprocess
    import sys
    import time

    from datamask_spark.files import write_file_selection

    from datamask_dask.io.staging import work_location
    from datamask_dask.io.storage import resolve

    options, root = s3, f"s3://lake/spark-{tmp_path.name}"
    reference = write_file_selection(spark, parquet_dir, f"{root}/reference", ratio=0.1, seed=7,
                                     storage_options=options, **FAST)
    target = resolve(f"{root}/out", options)
    work = work_location(target)
    process = subprocess.Popen([sys.executable, "-c", _FILE_JOB, str(parquet_dir), target.uri],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 180

    def finished() -> list[str]:
        try:
            return [n for n in work.list() if n.startswith("part-") and n.endswith(".json")]
        except OSError:
            return []

    while not finished() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    done = finished()
    assert 1 <= len(done) < 4, process.stderr.read().decode()[-3000:]
    assert not target.exists() or not target.child("_datamask_run.json").exists()  # nothing published

    record = write_file_selection(spark, parquet_dir, target.uri, ratio=0.1, seed=7, storage_options=options,
                                  **FAST)
    assert len(record["reused"]) >= len(done) and record["computed"] == sorted(
        set(range(4)) - set(record["reused"]))
    ours = resolve(f"{root}/reference", options)
    names = sorted(n for n in ours.list() if n.endswith(".parquet"))
    assert names == sorted(n for n in target.list() if n.endswith(".parquet"))
    assert all(ours.child(n).read_bytes() == target.child(n).read_bytes() for n in names)
    assert record["selected"] == reference["selected"] and not work.exists()


PACKED_SIZES = (150, 150, 150, 900, 100, 150)  # small partitions around one larger than a chunk


@pytest.fixture(scope="module")
def packed_dir(corpus, tmp_path_factory):
    """The corpus in six parquet files of PACKED_SIZES rows (part.0 ... part.5)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path_factory.mktemp("packed")
    table = pa.Table.from_pandas(corpus, preserve_index=False).replace_schema_metadata(None)
    starts = np.cumsum((0,) + PACKED_SIZES)
    for i, n in enumerate(PACKED_SIZES):
        pq.write_table(table.slice(starts[i], n), path / f"part.{i}.parquet")
    return path


@pytest.mark.slow
def test_packs_select_dask_s_rows_scores_and_reasons(spark, packed_dir):
    """Consecutive small partitions learned as one (the plan's packs) on Spark's pack pass: every row's
    selected, score and reason are Dask's, packed and unpacked partitions alike."""
    from datamask_spark import apply_plan, plan_selection

    options = {"ratio": 0.1, "seed": 7, "prune": 0.3, "max_chunk_rows": 400, "score_column": "score",
               "explain": True, "pieces": "partitions", **FAST}
    sdf = read_files(spark, packed_dir)
    spec, plan = plan_selection(sdf, **options)
    assert [pack.partitions for pack in plan.packs] == [(0, 1, 2), (4, 5)]  # partition 3 in chunks alone
    got = apply_plan(sdf, spec, plan).toPandas().set_index("chunk_id").sort_index()
    want = datamask_dask.datamask_select(datamask_dask.read_parquet(packed_dir), **options).compute(
        scheduler="sync").set_index("chunk_id").sort_index()
    assert got["selected"].sum() == 160 and got["selected"].tolist() == want["selected"].tolist()
    np.testing.assert_array_equal(got["score"].to_numpy(np.float32), want["score"].to_numpy(np.float32))
    assert got["reason"].tolist() == want["reason"].astype(str).tolist()
    assert set(got["reason"]) >= {"selected", "near-duplicate", "quality-pruned", "not-chosen"}
    np.testing.assert_array_equal(got["duplicate_of"].fillna(-1).astype(np.int64),
                                  want["duplicate_of"].fillna(-1).astype(np.int64))


@pytest.mark.slow
def test_pack_pass_errors_reach_the_driver_as_package_errors(spark, packed_dir, tmp_path, monkeypatch):
    """The pack pass runs before any row is selected; a packed partition that changed since the plan,
    or a piece that can no longer be read, fails it with the package's error, naming the partition."""
    import shutil

    from datamask_spark import apply_plan, plan_selection
    from datamask_spark import files as spark_files

    sdf = read_files(spark, packed_dir)
    spec, plan = plan_selection(sdf, ratio=0.1, seed=7, **FAST)
    with pytest.raises(InputDataError, match="partition 1 has 149 rows now but had 150") as caught:
        apply_plan(sdf.where("chunk_id != 200"), spec, plan)  # partition 1 holds rows 150 to 299
    assert "Traceback" not in str(caught.value) and "DATAMASK-ERROR" not in str(caught.value)

    source = tmp_path / "in"
    shutil.copytree(packed_dir, source)
    real = spark_files.plan_files

    def plan_then_break(*args, **kwargs):
        planned = real(*args, **kwargs)
        (source / "part.1.parquet").write_bytes(b"not parquet")
        return planned

    monkeypatch.setattr(spark_files, "plan_files", plan_then_break)
    with pytest.raises(InputDataError, match=r"partition 1: cannot read .*not a parquet file"):
        spark_files.write_file_selection(spark, source, tmp_path / "out", ratio=0.1, **FAST)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("job", ["files", "dataframe"])
def test_a_resumed_run_learns_a_pack_with_its_finished_members(spark, packed_dir, tmp_path, monkeypatch, job):
    """The six partitions are one pack; a run stopped after partitions 0 and 1 resumes the others, whose
    pack is learned again from all its members' rows: the uninterrupted run's bytes, Dask's rows."""
    import pyarrow.parquet as pq
    from datamask_spark import operator as spark_operator
    from datamask_spark import write_file_selection, write_selection
    from datamask_spark.writer import SparkEngine

    options = {"ratio": 0.1, "seed": 7, **FAST}
    assert [pack.partitions for pack in spark_operator.plan_selection(read_files(spark, packed_dir),
                                                                     **options)[1].packs] == [tuple(range(6))]

    def run(name: str) -> dict:
        if job == "files":
            return write_file_selection(spark, packed_dir, tmp_path / name, **options)
        return write_selection(read_files(spark, packed_dir), tmp_path / name, **options)

    reference = run("reference")
    assert reference["computed"] == list(range(6)) and reference["selected"] == 160
    assert reference["summary"]["curves"] and "learn" in reference["stages"]  # the pack pass's, kept
    real = SparkEngine.run

    def stopped(self, plan, todo, task, progress=None):
        real(self, plan, todo[:2], task, progress)
        raise RuntimeError("stopped")

    monkeypatch.setattr(SparkEngine, "run", stopped)
    with pytest.raises(RuntimeError, match="stopped"):
        run("out")
    monkeypatch.undo()
    record = run("out")  # the pack's members 0 and 1 are finished: read again, not written again
    assert (record["reused"], record["computed"]) == ([0, 1], [2, 3, 4, 5])
    ours, theirs = tmp_path / "reference", tmp_path / "out"
    names = sorted(p.name for p in ours.glob("*.parquet"))
    assert names == sorted(p.name for p in theirs.glob("*.parquet")) and len(names) == 6
    assert all((ours / n).read_bytes() == (theirs / n).read_bytes() for n in names)
    table = pq.read_table(tmp_path / "out", columns=["chunk_id", "selected"]).to_pandas()
    assert set(table.loc[table["selected"], "chunk_id"]) == dask_selected(packed_dir, **options)


def test_pack_rows_cross_to_the_pack_pass_whole():
    """A member's pack rows, sent as Arrow rows to the task that learns the pack, arrive as pack_rows made
    them: positions, quality, embeddings, weights and the seconds their extraction took."""
    import dataclasses
    from types import SimpleNamespace

    import pyarrow as pa
    from datamask_spark.operator import PACK_BLOCK, _pack_batch, _pack_pieces

    from datamask_dask.partition.select import PackRows

    rng = np.random.default_rng(0)
    n = PACK_BLOCK + 5  # two batches
    rows = PackRows(partition=3, positions=np.arange(n, dtype=np.int64) * 2, quality=rng.random(n),
                    embeddings=rng.standard_normal((n, 8)).astype(np.float32), tokens=None,
                    weights=rng.random(n) + 1, device="cpu", seconds=0.25)
    batches = [_pack_batch(7, rows, slice(start, start + PACK_BLOCK)) for start in range(0, n, PACK_BLOCK)]
    frame = pa.Table.from_batches(batches).to_pandas()
    plan = SimpleNamespace(spec=SimpleNamespace(budget=None))
    [piece] = _pack_pieces(plan, frame, 7)
    back = piece[7]
    for field in dataclasses.fields(PackRows):
        name = field.name
        np.testing.assert_array_equal(getattr(back, name), getattr(rows, name), err_msg=name)
