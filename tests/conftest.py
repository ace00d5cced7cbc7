"""Shared fixtures: one real LocalCluster (worker processes) per session and small datasets."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import dask.dataframe as dd
import pytest

from datamask_dask.io.sinks import write_parquet
from datamask_dask.sample_data import make_corpus

#: Learner settings that keep every test cheap (the method's quality is tested elsewhere).
FAST = {"n_epochs": 20, "n_rollout": 8}


#: Fixtures that start a Spark session, a server or a cluster: a test that takes one is slow (pyproject's
#: ``slow`` marker), so that ``-m "not slow"`` stays the fast subset without each test having to say so.
SLOW_FIXTURES = frozenset({"spark", "client", "s3", "cluster", "clusters", "small_workers"})


def pytest_collection_modifyitems(items) -> None:
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


def unlisted(frame):
    """``frame`` as a Dask DataFrame whose rows Dask does not list (as a filtered or persisted frame's):
    the plan wires its near-duplicate search by its partitions alone (``operator.listed_rows``)."""
    import dask.dataframe as dd

    return dd.from_delayed(frame.to_delayed(), meta=frame._meta)


def require_lakehouse():
    """Skip the calling test module unless the lakehouse extra is installed (deltalake, and pyiceberg
    with its SQL catalog); returns the deltalake module."""
    deltalake = pytest.importorskip("deltalake", reason="the lakehouse extra (pip install '.[lakehouse]') is "
                                    "not installed")
    pytest.importorskip("pyiceberg.catalog.sql", reason="the lakehouse extra (pyiceberg[sql-sqlite,pyarrow]) "
                        "is not installed")
    pytest.importorskip("sqlalchemy", reason="pyiceberg's SQL catalog needs sqlalchemy "
                        "(pyiceberg[sql-sqlite])")
    return deltalake


def spark_worker_environment() -> None:
    """Spark's Python workers run this interpreter and find both packages (datamask_dask, datamask_spark)."""
    import os
    import sys
    from pathlib import Path

    import datamask_spark

    import datamask_dask

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    roots = {str(Path(datamask_dask.__file__).parents[1]), str(Path(datamask_spark.__file__).parents[1])}
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths + sorted(roots - set(paths)))


def read_files(spark, directory):
    """One Spark partition per parquet file, in file-name order (as datamask_dask.read_parquet reads)."""
    from pathlib import Path

    files = sorted(Path(directory).glob("*.parquet"), key=lambda p: int(p.name.split(".")[1]))
    frame = None
    for path in files:
        part = spark.read.parquet(str(path))
        frame = part if frame is None else frame.union(part)
    return frame


def spark_settings() -> dict:
    """What the tests' Spark sessions set: the package's own settings (Python workers forked with it
    imported), no UI or progress bars, and a shuffle partition a core."""
    from datamask_spark.job import SETTINGS

    return {**SETTINGS, "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": "2"}


def local_spark():
    """The tests' classic local[2] Spark session: started by the first module that needs it and shared by
    the others (``getOrCreate`` returns the running one; a module that needs a setting sets it for its
    own tests). Stopped at the end of the session, or by a module that needs the process to itself."""
    from pyspark.sql import SparkSession

    spark_worker_environment()
    session = (SparkSession.builder.master("local[2]").appName("datamask-tests").config(map=spark_settings())
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    return session


def stop_local_spark() -> None:
    """Stop the classic Spark session if one runs (a local Spark Connect server needs the process)."""
    if "pyspark" not in sys.modules:
        return
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()


@pytest.fixture(scope="session", autouse=True)
def _stop_spark_at_the_end():
    yield
    stop_local_spark()


@pytest.fixture(scope="session")
def client():
    """A distributed Client on a LocalCluster of 2 worker processes with 1 thread each.

    Not set as Dask's default scheduler: tests pick it explicitly (``scheduler=client``), so
    tests that mean the threaded scheduler still get it.
    """
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                           memory_limit="3GiB")
    client = Client(cluster, set_as_default=False)
    yield client
    client.close()
    cluster.close()


@pytest.fixture(scope="session")
def corpus():
    """1600 rows, 16-d embeddings, in the reference format (Arrow fixed-size-list embeddings)."""
    return make_corpus(1600, 16, seed=3)


@pytest.fixture(scope="session")
def parquet_dir(tmp_path_factory, corpus):
    """The corpus as a partitioned parquet directory of 4 files (part.0 ... part.3)."""
    path = tmp_path_factory.mktemp("data") / "corpus"
    write_parquet(dd.from_pandas(corpus, npartitions=4, sort=False), path)
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """A real S3 API server (moto, its own process) on a free localhost port, with a bucket ``lake``;
    the environment points AWS clients at it while it runs.

    Yields the ``storage_options`` a Python API user passes to reach it (the CLI reads the same
    settings from the environment).
    """
    pytest.importorskip("s3fs", reason="s3fs is not installed (pip install 'datamask-dask[s3]')")
    pytest.importorskip("moto", reason="moto[server] is not installed (the test extra brings it)")
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("moto") / "server.log"
    with open(log, "wb") as out:
        server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                  stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1)
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                pytest.fail(f"the moto server did not start: {log.read_text()[-2000:]}")
            time.sleep(0.1)
    settings = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint, "AWS_ALLOW_HTTP": "true"}
    saved = {key: os.environ.get(key) for key in settings}
    os.environ.update(settings)
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    options = {"key": "testing", "secret": "testing", "endpoint_url": endpoint,
               "client_kwargs": {"region_name": "us-east-1"}}
    import boto3

    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                 aws_secret_access_key="testing").create_bucket(Bucket="lake")
    try:
        yield options
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        s3fs.S3FileSystem.clear_instance_cache()
