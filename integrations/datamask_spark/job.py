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
from datamask_dask.io.output import check_target
from datamask_dask.io.tables import parse_table_uri

from .files import write_file_selection
from .operator import datamask_select, spark_errors
from .writer import write_selection

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
    """Select rows of ``source`` on Spark and write every row plus ``selected`` as parquet to ``target``.

    ``source`` is a table URI (:mod:`datamask_dask.io.tables`: a parquet path, ``delta://...``,
    ``iceberg://CATALOG/ns.table``). Unless it is a remote parquet path (``s3a://``...), and when
    ``target`` is local (or mounted): :func:`datamask_spark.files.write_file_selection`, Spark
    scheduling one task per piece of the Dask readers and its Python worker reading and writing
    with pyarrow (the same partitions, hence the same rows, as ``--engine dask``). A remote parquet
    ``source`` is scanned by Spark and handed to the workers
    (:func:`datamask_spark.writer.write_selection`). Both follow the package's output rules (no
    overlap with ``source``, ``overwrite`` replaces only an output of an earlier datamask run, one
    run at a time, complete or absent, with a run record). A remote ``target`` (``s3a://``...) goes
    through Spark's own writer and committer (``overwrite`` then means Spark's mode; parquet
    sources only).

    Returns
    -------
    (rows, selected, seconds) : tuple
        Rows written, rows selected, and the job's wall time (plan, select and write).
    """
    source, target = str(source), str(target)
    table = parse_table_uri(source)
    remote_parquet = table.format == "parquet" and "://" in table.location
    if table.format == "parquet" and not remote_parquet and not Path(table.location).exists():
        raise FileNotFoundError(f"--input {source} does not exist")
    local = "://" not in target
    if not local and table.format != "parquet":
        raise OptionError(f"--engine spark writes a {table.format} input to a local or mounted parquet "
                          f"directory, not {target}: pick a local --output, or use --engine dask")
    if local:
        check_target(target, overwrite=overwrite, inputs=[] if "://" in table.location else [table.location])
    spark = spark or get_spark(master)
    started = time.perf_counter()
    if local:
        if remote_parquet:
            record = write_selection(spark.read.parquet(source), target, config=config, overwrite=overwrite,
                                     input_location=source, **options)
        else:
            record = write_file_selection(spark, source, target, config=config, overwrite=overwrite,
                                          **options)
        return record["rows"], record["selected"], time.perf_counter() - started
    with spark_errors():
        out = datamask_select(spark.read.parquet(source), config=config, **options)
        out.write.mode("overwrite" if overwrite else "errorifexists").parquet(target)
    written = spark.read.parquet(target)
    selected_column = options.get("selected_column") or "selected"
    counts = {row[selected_column]: row["count"]
              for row in written.groupBy(selected_column).count().collect()}
    return sum(counts.values()), counts.get(True, 0), time.perf_counter() - started
