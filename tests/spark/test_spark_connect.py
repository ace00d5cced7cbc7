"""The Spark integration over Spark Connect: a local Connect server (``remote("local[2]")``), one per module.

Skipped when the installed pyspark cannot start one (``pip install "pyspark[connect]"``).
"""

from __future__ import annotations

import warnings

import pytest

pytest.importorskip("pyspark", reason="the Spark integration needs pyspark (pip install '.[spark]')")
pytest.importorskip("grpc", reason="Spark Connect needs pyspark[connect] (grpcio)")

from conftest import FAST, read_files, spark_worker_environment  # noqa: E402
from datamask_spark import datamask_select  # noqa: E402

import datamask_dask  # noqa: E402
from datamask_dask.errors import InputDataError  # noqa: E402

pytestmark = pytest.mark.slow  # a cluster, a server or a whole job: see the fast subset

@pytest.fixture(scope="module")
def connect():
    from conftest import spark_settings, stop_local_spark
    from pyspark.sql import SparkSession

    spark_worker_environment()
    stop_local_spark()  # the other modules' classic session: a local Connect server needs the process
    try:  # the server starts with the classic session's settings; its Connect session cannot set the
        # static ones again, and says so for each
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Failed to set spark", UserWarning)
            session = SparkSession.builder.remote("local[2]").config(map=spark_settings()).getOrCreate()
    except Exception as exc:  # no local Connect server in this pyspark
        pytest.skip(f"cannot start a local Spark Connect server: {exc}")
    yield session
    session.stop()


def test_connect_runs_the_sharded_search_on_the_executors(connect, parquet_dir, monkeypatch):
    """Above ONE_TASK_PARTITIONS the sharded stages run as DataFrame steps over Connect (8 partitions):
    every row's copy in the other half is set aside, never both selected."""
    from datamask_spark import operator
    from datamask_spark.shards import sharded_summaries as shards_on_spark
    from pyspark.sql import functions as F

    from datamask_dask.dedup import search

    monkeypatch.setattr(search, "ONE_TASK_PARTITIONS", 0)
    monkeypatch.setattr(search, "ONE_TASK_ROWS", 0)  # whatever the rows Spark counts in its plan pass
    calls = []
    monkeypatch.setattr(operator, "sharded_summaries",
                        lambda *args: calls.append(args) or shards_on_spark(*args))
    sdf = read_files(connect, parquet_dir)
    both = sdf.unionByName(sdf.withColumn("chunk_id", F.col("chunk_id") + 100_000))
    got = both.transform(datamask_select, ratio=0.1, seed=7, **FAST).where("selected").select("chunk_id")
    ids = {r["chunk_id"] for r in got.collect()}
    assert len(calls) == 1 and calls[0][3] == 8  # the sharded stages ran, on 8 partitions
    assert len(ids) == 320 and not any(i + 100_000 in ids for i in ids)


def test_connect_same_rows_as_dask_and_errors(connect, parquet_dir, tmp_path):
    import pyarrow.parquet as pq
    from datamask_spark import write_file_selection
    from datamask_spark.writer import write_selection
    from pyspark.sql import functions as F

    sdf = read_files(connect, parquet_dir)
    got = sdf.transform(datamask_select, ratio=0.1, seed=7, **FAST).where("selected").select("chunk_id")
    ids = {r["chunk_id"] for r in got.collect()}
    want = datamask_dask.datamask_select(datamask_dask.read_parquet(parquet_dir), ratio=0.1, seed=7,
                                         **FAST).compute(scheduler="sync")
    assert ids == set(want.loc[want["selected"], "chunk_id"])
    record = write_selection(sdf, tmp_path / "out", ratio=0.1, seed=7, **FAST)  # the job's writer
    written = pq.read_table(tmp_path / "out", columns=["chunk_id", "selected"]).to_pandas()
    assert record["selected"] == 160 and set(written.loc[written["selected"], "chunk_id"]) == ids
    record = write_file_selection(connect, parquet_dir, tmp_path / "files", ratio=0.1, seed=7, **FAST)
    written = pq.read_table(tmp_path / "files", columns=["chunk_id", "selected"]).to_pandas()
    assert record["selected"] == 160 and set(written.loc[written["selected"], "chunk_id"]) == ids
    bad = sdf.withColumn("quality_score", F.when(F.col("chunk_id") == 5, F.lit(float("nan")))
                         .otherwise(F.col("quality_score")))
    with pytest.raises(InputDataError, match=r"partition 0: quality column 'quality_score' has 1 NaN"):
        datamask_select(bad, ratio=0.1, **FAST)
