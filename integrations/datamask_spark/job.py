"""A whole Spark selection job: parquet in, every row plus ``selected`` out (the CLI's ``--engine spark``).

    from datamask_spark.job import select_parquet
    rows, selected, seconds = select_parquet("corpus/", "selected/", ratio=0.1)
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from datamask_dask.errors import OptionError

from .operator import datamask_select, spark_errors

__all__ = ["get_spark", "select_parquet"]


def get_spark(master: str | None = None, app_name: str = "datamask-select"):
    """The active Spark session, or a new one (``master`` e.g. ``"local[2]"``; None: spark-submit's).

    Spark's Python workers are pointed at this interpreter (``PYSPARK_PYTHON``) unless set already,
    so they find the packages of the current environment.
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    return builder.getOrCreate()


def select_parquet(source, target, *, spark=None, master: str | None = None, config=None,
                   overwrite: bool = False, **options) -> tuple[int, int, float]:
    """Select rows of the parquet ``source`` on Spark and write every row plus ``selected`` to ``target``.

    Local paths are checked first: ``target`` must not exist (unless ``overwrite``) and must not
    overlap ``source``. Remote URIs (``s3a://``...) are handed to Spark as they are.

    Returns
    -------
    (rows, selected, seconds) : tuple
        Rows written, rows selected, and the job's wall time (plan, select and write).
    """
    source, target = str(source), str(target)
    if "://" not in source and not Path(source).exists():
        raise FileNotFoundError(f"--input {source} does not exist")
    if "://" not in target:
        _check_local_target(Path(source), Path(target), overwrite)
    spark = spark or get_spark(master)
    started = time.perf_counter()
    with spark_errors():
        out = datamask_select(spark.read.parquet(source), config=config, **options)
        out.write.mode("overwrite" if overwrite else "errorifexists").parquet(target)
    seconds = time.perf_counter() - started
    written = spark.read.parquet(target)
    selected_column = options.get("selected_column") or "selected"
    counts = written.groupBy(selected_column).count().collect()
    by_value = {row[selected_column]: row["count"] for row in counts}
    return sum(by_value.values()), by_value.get(True, 0), seconds


def _check_local_target(source: Path, target: Path, overwrite: bool) -> None:
    a, b = source.resolve(), target.resolve()
    if a == b or a in b.parents or b in a.parents:
        raise OptionError(f"--output {target} overlaps --input {source}: write the selection elsewhere")
    if target.exists() and not overwrite:
        raise FileExistsError(f"--output {target} exists: remove it or pass --overwrite")
