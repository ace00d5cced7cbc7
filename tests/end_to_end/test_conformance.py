"""One meaning: one input, the default options and one seed select the same rows however they are run.

At a size where a float summed in another order turns rows (100,000 rows in two files, every
metric): threads, LocalClusters of one-thread and of two-thread workers with different memory and the
Spark file job give one selection digest. Facility and Pair_simi are learned in regions (chunks of
30,000 rows: the k-means, the routing and the areas' curves or sums on every way); for Facility, the
CLI and Spark's operator give it too.
Workers too small for the options' chunks, or for any task, fail at once, naming what fits, instead
of choosing other chunks or stalling.
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
from datamask_dask.errors import DataMaskError, OptionError
from datamask_dask.io.sinks import write_parquet
from datamask_dask.run.selection import write_selection
from datamask_dask.sample_data import make_corpus

pytestmark = pytest.mark.slow  # a cluster, a server or a whole job: see the fast subset

SEED = 7
ROWS, DIM = 100_000, 64
METRICS = ("Facility", "Pair_simi", "DiSF")
# the table in chunks of 30,000 rows: more than one, so Facility and Pair_simi learn it in regions
CHANGES = {"Facility": {"max_chunk_rows": 30_000}, "Pair_simi": {"max_chunk_rows": 30_000}}


def digest(frame) -> str:
    """The selected ids, sorted and hashed."""
    ids = sorted(int(i) for i in frame.loc[frame["selected"], "chunk_id"])
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:12]


def written(path) -> str:
    return digest(pq.read_table(path, columns=["chunk_id", "selected"]).to_pandas())


def cluster(memory_limit: str, n_workers: int = 2, threads_per_worker: int = 1):
    from distributed import Client, LocalCluster

    local = LocalCluster(n_workers=n_workers, threads_per_worker=threads_per_worker, processes=True,
                         dashboard_address=":0", memory_limit=memory_limit)
    return local, Client(local, set_as_default=False)


def local_client(n_workers: int, threads_per_worker: int, memory_limit: str):
    """A cluster as a user starts one (get_client: each thread's BLAS and OpenMP threads set)."""
    from datamask_dask import get_client

    return get_client("cpu", n_workers=n_workers, threads_per_worker=threads_per_worker,
                      memory_limit=memory_limit, set_as_default=False, dashboard_address=":0")


@pytest.fixture(scope="module")
def small_workers():
    local, client = cluster("1280MiB")
    yield client
    client.close()
    local.close()


@pytest.fixture(scope="module")
def clusters():
    """Two workers of one thread, and one worker of two threads, with different memory."""
    made = {"2 workers x 1 thread, 8 GiB": local_client(2, 1, "8GiB"),
            "1 worker x 2 threads, 16 GiB": local_client(1, 2, "16GiB")}
    yield made
    for client in made.values():
        client.shutdown()


@pytest.fixture(scope="module")
def spark():
    """The tests' shared local[2] session, with Spark's default shuffle partitions for these tests."""
    pytest.importorskip("pyspark", reason="the Spark comparison needs the spark extra")
    from conftest import local_spark

    session = local_spark()
    shuffle = session.conf.get("spark.sql.shuffle.partitions")
    session.conf.unset("spark.sql.shuffle.partitions")
    # a file a partition, as Dask reads them (Spark would split each file in two on local[2]): the
    # regions' sample is drawn per partition, so the same partitions give the same rows
    session.conf.set("spark.sql.files.minPartitionNum", "1")
    yield session
    session.conf.unset("spark.sql.files.minPartitionNum")
    session.conf.set("spark.sql.shuffle.partitions", shuffle)


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """100,000 clustered rows with near-copies and skewed quality, in two parquet files."""
    path = tmp_path_factory.mktemp("conformance") / "table"
    write_parquet(dd.from_pandas(make_corpus(ROWS, DIM, seed=2), npartitions=2, sort=False), path)
    return path


@pytest.mark.parametrize("algorithm", METRICS)
def test_every_way_of_running_selects_the_same_rows(table, algorithm, clusters, spark, tmp_path):
    options = {"ratio": 0.1, "seed": SEED, "algorithm": algorithm, **CHANGES.get(algorithm, {})}
    threads = digest(datamask_select(read_parquet(table), **options).compute(scheduler="threads"))
    digests = {"threads": threads}
    # summary_rows=0: the run summary is drawn after the rows are chosen and has no say in them
    for name, client in clusters.items():
        write_selection(read_parquet(table), tmp_path / name, scheduler=client, summary_rows=0, **options)
        digests[name] = written(tmp_path / name)
    from datamask_spark.files import write_file_selection

    # the CLI and Spark's operator wire the same steps as the writers above: once, on a regions' run
    if algorithm == "Facility":
        flags = [f"--{key.replace('_', '-')}={value}" for key, value in options.items()]
        assert main(["select", "--input", str(table), "--output", str(tmp_path / "cli"), *flags]) == 0
        digests["CLI"] = written(tmp_path / "cli")
        from conftest import read_files
        from datamask_spark import datamask_select as spark_select

        selection = read_files(spark, table).transform(spark_select, **options).select("chunk_id", "selected")
        digests["Spark"] = digest(selection.toPandas())
    write_file_selection(spark, str(table), tmp_path / "spark-files", summary_rows=0, **options)
    digests["Spark file job"] = written(tmp_path / "spark-files")
    assert set(digests.values()) == {threads}, digests


def test_workers_too_small_for_the_chunks_fail_at_once_naming_what_fits(small_workers, tmp_path):
    """Facility's default chunk of 100,000 rows at d = 192 needs more than a 1.25 GiB worker leaves a
    task below Dask's pause threshold: the task stops before learning and names the max_chunk_rows that
    fits; with it the job runs on the same workers."""
    path = tmp_path / "table"
    write_parquet(dd.from_pandas(make_corpus(100_000, 192, seed=5), npartitions=1, sort=False), path)
    start = time.perf_counter()
    message = r"partition 0: the workers' memory is too small.*max_chunk_rows=\d+.*memory_budget="
    with small_workers.as_current(), pytest.raises(OptionError, match=message) as caught:
        datamask_select(read_parquet(path), ratio=0.1, algorithm="Facility").compute()
    assert time.perf_counter() - start < 60
    fits = int(re.search(r"max_chunk_rows=(\d+)", str(caught.value)).group(1))
    assert 2 <= fits < 100_000
    with small_workers.as_current():
        out = datamask_select(read_parquet(path), ratio=0.1, algorithm="Facility", max_chunk_rows=fits,
                              refine_epochs=2).compute()
    assert out["selected"].sum() == 10_000


def test_a_pack_larger_than_the_workers_allow_fails_in_the_plan_naming_it(tmp_path):
    """Four partitions that each fit a fresh 1 GiB worker, packed into one chunk that does not: the plan
    stops before any select task, naming the pack and the max_chunk_rows that fits."""
    path = tmp_path / "table"
    write_parquet(dd.from_pandas(make_corpus(32_000, 768, seed=6), npartitions=4, sort=False), path)
    local, client = cluster("1GiB")
    try:
        start = time.perf_counter()
        message = r"the pack of partitions 0-3: the workers' memory is too small.*max_chunk_rows=\d+"
        with client.as_current(), pytest.raises(OptionError, match=message):
            datamask_select(read_parquet(path), ratio=0.1, algorithm="Facility").compute()
        assert time.perf_counter() - start < 60
    finally:
        client.close()
        local.close()


def test_workers_with_no_room_for_a_task_fail_at_once(table):
    """700 MiB workers hold little beside their own process, below the threshold where Dask pauses
    them: the job stops within a minute with the error that says what to change, instead of stalling
    on paused workers or dying worker after worker."""
    client = local_client(2, 1, "700MiB")
    try:
        start = time.perf_counter()
        with client.as_current(), pytest.raises(DataMaskError, match="memory_budget=") as caught:
            datamask_select(read_parquet(table), ratio=0.1, algorithm="Facility").compute()
        assert time.perf_counter() - start < 60
    finally:
        client.shutdown()
    assert "max_chunk_rows=" in str(caught.value) and "more memory" in str(caught.value)
