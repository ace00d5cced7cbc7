"""Spark's Python daemon with the selection imported before it forks a worker.

Spark starts each Python worker by forking its daemon, and forks a fresh one whenever no idle worker is
free (jobs side by side, a worker it did not take back): under ``pyspark.daemon`` every fresh worker
imports torch and the package again before its first task runs. Forked from this daemon, a worker starts
with them imported. :func:`datamask_spark.job.get_spark` sets it; on a session of your own:
``--conf spark.python.daemon.module=datamask_spark.daemon``.
"""

from pyspark.daemon import manager

import datamask_spark  # noqa: F401  (its passes, and through them torch, pandas and pyarrow)
import datamask_spark.shards  # noqa: F401

if __name__ == "__main__":
    manager()
