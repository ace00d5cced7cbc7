"""One meaning: one input, the default options and one seed select the same rows however they are run.

Threads, LocalClusters whose workers have 1 GiB or 6 GiB, the CLI, Spark's operator and the Spark
file job all give one selection digest. Workers too small for the options' chunks fail at once,
naming the options that would fit, instead of choosing other chunks.
"""

from __future__ import annotations

import hashlib
import re
import time

import dask.dataframe as dd
import pyarrow.parquet as pq
import pytest

from datamask_dask import datamask_select, read_parquet
from datamask_dask.cli import main
from datamask_dask.errors import OptionError
from datamask_dask.io.sinks import write_parquet
from datamask_dask.run.selection import write_selection
from datamask_dask.sample_data import make_corpus

pytestmark = pytest.mark.slow  # a cluster, a server or a whole job: see the fast subset

SEED = 7


def digest(frame) -> str:
    """The selected ids, sorted and hashed."""
    ids = sorted(int(i) for i in frame.loc[frame["selected"], "chunk_id"])
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:12]


def written(path) -> str:
    return digest(pq.read_table(path, columns=["chunk_id", "selected"]).to_pandas())


def cluster(memory_limit: str):
    from distributed import Client, LocalCluster

    local = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                         memory_limit=memory_limit)
    return local, Client(local, set_as_default=False)


@pytest.fixture(scope="module")
def small_workers():
    local, client = cluster("1GiB")
    yield client
    client.close()
    local.close()


def test_every_way_of_running_selects_the_same_rows(parquet_dir, small_workers, tmp_path):
    out = datamask_select(read_parquet(parquet_dir), ratio=0.1, seed=SEED)
    threads = digest(out.compute(scheduler="threads"))
    digests = {"threads": threads}
    write_selection(read_parquet(parquet_dir), tmp_path / "1gib", ratio=0.1, seed=SEED,
                    scheduler=small_workers)
    digests["1 GiB workers"] = written(tmp_path / "1gib")
    local, client = cluster("6GiB")
    with local, client:
        write_selection(read_parquet(parquet_dir), tmp_path / "6gib", ratio=0.1, seed=SEED, scheduler=client)
    digests["6 GiB workers"] = written(tmp_path / "6gib")
    assert main(["select", "--input", str(parquet_dir), "--output", str(tmp_path / "cli"), "--ratio", "0.1",
                 "--seed", str(SEED)]) == 0
    digests["CLI"] = written(tmp_path / "cli")
    if _has_spark():
        from conftest import read_files, spark_worker_environment
        from datamask_spark import datamask_select as spark_select
        from datamask_spark.files import write_file_selection
        from pyspark.sql import SparkSession

        spark_worker_environment()
        spark = (SparkSession.builder.master("local[2]").appName("datamask-conformance")
                 .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                 .getOrCreate())
        try:
            sdf = read_files(spark, parquet_dir)
            digests["Spark"] = digest(sdf.transform(spark_select, ratio=0.1, seed=SEED).toPandas())
            write_file_selection(spark, str(parquet_dir), tmp_path / "spark-files", ratio=0.1, seed=SEED)
            digests["Spark file job"] = written(tmp_path / "spark-files")
        finally:
            spark.stop()
    assert set(digests.values()) == {threads}, digests


def _has_spark() -> bool:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return False
    return True


def test_workers_too_small_for_the_chunks_fail_at_once_naming_what_fits(small_workers, tmp_path):
    """Facility's default chunk over 20,000 rows needs more than half of a 1 GiB worker: the task stops
    before learning and names the max_chunk_rows that fits; with it the job runs on the same workers."""
    path = tmp_path / "table"
    write_parquet(dd.from_pandas(make_corpus(20_000, 64, seed=5), npartitions=1, sort=False), path)
    start = time.perf_counter()
    message = r"partition 0: the workers' memory is too small.*max_chunk_rows=\d+.*memory_budget="
    with small_workers.as_current(), pytest.raises(OptionError, match=message) as caught:
        datamask_select(read_parquet(path), ratio=0.1, algorithm="Facility").compute()
    assert time.perf_counter() - start < 60
    fits = int(re.search(r"max_chunk_rows=(\d+)", str(caught.value)).group(1))
    assert 2 <= fits < 20_000
    with small_workers.as_current():
        out = datamask_select(read_parquet(path), ratio=0.1, algorithm="Facility", max_chunk_rows=fits,
                              refine_epochs=2).compute()
    assert out["selected"].sum() == 2000
