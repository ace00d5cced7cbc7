"""Shared fixtures: one real LocalCluster (worker processes) per session and small datasets."""

from __future__ import annotations

import dask.dataframe as dd
import pytest

from datamask_dask.io.parquet import write_parquet
from datamask_dask.sample_data import make_corpus

#: Learner settings that keep every test cheap (the method's quality is tested elsewhere).
FAST = {"n_epochs": 20, "n_rollout": 8}


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
