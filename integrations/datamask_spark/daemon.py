"""Spark's Python daemon with the selection imported before it forks a worker.

Spark forks a Python worker from its daemon whenever a task finds no idle worker to reuse: under
``pyspark.daemon`` every fresh worker imports torch and the package again before its first task runs.
Forked from this daemon, a worker starts with them imported, and with their objects out of the garbage
collector's sight (``gc.freeze``): Spark's worker runs a full collection after every task before it
takes the next, and scanning the imports' objects there would hold each task back.
:func:`datamask_spark.job.get_spark` sets it; on a session of your own:
``--conf spark.python.daemon.module=datamask_spark.daemon``.
"""

import gc

from pyspark.daemon import manager

# The imports start a few idle native threads (BLAS's, the allocator's), each with fork handlers of its
# own: forking after them is what PyTorch's fork-started data loaders do too.
import datamask_spark  # noqa: F401  (its passes, and through them torch, pandas and pyarrow)

gc.freeze()  # the imports live as long as the workers: their collections scan only what tasks make

if __name__ == "__main__":
    manager()
