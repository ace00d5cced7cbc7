"""A whole Spark selection job: parquet in, every row plus ``selected`` out (the CLI's ``--engine spark``).

    from datamask_spark.job import select_parquet
    rows, selected, seconds = select_parquet("corpus/", "selected/", ratio=0.1)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["SETTINGS", "get_spark", "select_parquet"]

#: What a session for selections sets: Python workers forked with the package already imported.
SETTINGS = {"spark.python.daemon.module": "datamask_spark.daemon"}
_ERRORS_ONLY = Path(__file__).with_name("log4j2-errors.properties")


def get_spark(master: str | None = None, app_name: str = "datamask-select", *, progress: bool = True,
              quiet: bool = False):
    """The active Spark session, or a new one (``master`` e.g. ``"local[2]"``; None: spark-submit's).

    A new session's Python workers are pointed at this interpreter (``PYSPARK_PYTHON``) unless set
    already, so they find the packages of the current environment, and are forked from
    :mod:`datamask_spark.daemon` (:data:`SETTINGS`), so they start with the package imported.
    ``progress=False``: without Spark's console progress bars (``spark.ui.showConsoleProgress``);
    ``quiet=True``: Spark logs only its errors, from the JVM's start on (the driver's log4j2
    configuration, unless ``spark.driver.extraJavaOptions`` is set already).
    """
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    given = SparkConf()  # spark-submit's --conf and spark-defaults.conf: the user's say first
    settings = {**SETTINGS, **({} if progress else {"spark.ui.showConsoleProgress": "false"})}
    if quiet:
        settings["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile={_ERRORS_ONLY.as_uri()}"
    for key, value in settings.items():
        if not given.contains(key):
            builder = builder.config(key, value)
    if master:
        builder = builder.master(master)
    session = builder.getOrCreate()
    if quiet:
        session.sparkContext.setLogLevel("ERROR")  # where the JVM ran before, or the user set its options
    return session


def select_parquet(source, target, *, spark=None, master: str | None = None, config=None,
                   overwrite: bool = False, resume: bool = True, **options) -> tuple[int, int, float]:
    """Select rows of ``source`` on Spark and write every row plus ``selected`` as parquet to ``target``:
    :func:`datamask_dask.select_table` with ``engine="spark"``, on ``spark`` (None: a session of
    ``master``, see :func:`get_spark`).

    ``source`` is a table URI (:mod:`datamask_dask.io.tables`: a parquet path or URI, ``delta://...``,
    ``iceberg://CATALOG/ns.table``) and ``target`` a local path or an object-store URI
    (``s3://``...): Spark schedules one task per piece of the Dask readers and its Python worker
    reads and writes with pyarrow through fsspec (:mod:`datamask_spark.files`: the same partitions,
    hence the same rows, as ``engine="dask"``; no Hadoop connector). It follows the package's output
    rules (no overlap with ``source``, ``overwrite`` replaces only an output of an earlier datamask
    run, one run at a time, complete or absent, with a run record), and an interrupted job resumes
    (``resume=False`` starts over).

    Returns
    -------
    (rows, selected, seconds) : tuple
        Rows written, rows selected, and the job's wall time (plan, select and write).
    """
    from datamask_dask.run.tables import select_table

    report = select_table(source, target, engine="spark", spark=spark or get_spark(master), config=config,
                          mode="overwrite" if overwrite else "error", resume=resume, **options)
    return report.rows, report.selected, report.seconds
