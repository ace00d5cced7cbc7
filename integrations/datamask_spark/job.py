"""A whole Spark selection job: parquet in, every row plus ``selected`` out (the CLI's ``--engine spark``).

    from datamask_spark.job import select_parquet
    rows, selected, seconds = select_parquet("corpus/", "selected/", ratio=0.1)
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

from datamask_dask.io.output import (
    RUN_RECORD,
    check_target,
    library_versions,
    output_lock,
    publish,
    remove_own,
    staging_path,
)

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

    A local ``target`` follows the package's output rules (:mod:`datamask_dask.io.output`): it may
    not overlap ``source``, ``overwrite`` replaces only an output of an earlier datamask run, one
    run writes it at a time, and Spark writes into a hidden staging sibling that is renamed into
    place with a run record (``_datamask_run.json``) once complete. Remote URIs (``s3a://``...)
    are handed to Spark's own committer as they are (``overwrite`` then means Spark's mode).

    Returns
    -------
    (rows, selected, seconds) : tuple
        Rows written, rows selected, and the job's wall time (plan, select and write).
    """
    source, target = str(source), str(target)
    if "://" not in source and not Path(source).exists():
        raise FileNotFoundError(f"--input {source} does not exist")
    local = "://" not in target
    if local:
        check_target(target, overwrite=overwrite, inputs=[] if "://" in source else [source])
    spark = spark or get_spark(master)
    started = time.perf_counter()
    with output_lock(target) if local else contextlib.nullcontext():
        destination = staging_path(Path(target)) if local else target
        try:
            with spark_errors():
                out = datamask_select(spark.read.parquet(source), config=config, **options)
                out.write.mode("overwrite" if overwrite and not local else "errorifexists").parquet(
                    os.fspath(destination))
            written = spark.read.parquet(os.fspath(destination))
            selected_column = options.get("selected_column") or "selected"
            counts = {row[selected_column]: row["count"]
                      for row in written.groupBy(selected_column).count().collect()}
            rows, selected = sum(counts.values()), counts.get(True, 0)
            if local:
                record = {"tool": "datamask-dask", "kind": "selection", "engine": "spark", "rows": rows,
                          "selected": selected, "input": {"location": source},
                          "versions": library_versions("pyspark"),
                          "files": sorted(os.listdir(destination))}
                Path(destination, RUN_RECORD).write_text(json.dumps(record, indent=1), encoding="utf-8")
                publish(Path(destination), Path(target))
        finally:
            if local:
                remove_own(Path(destination))
    return rows, selected, time.perf_counter() - started
