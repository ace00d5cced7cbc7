"""datamask-spark: DATAMASK data selection on PySpark DataFrames.

    from datamask_spark import datamask_select, write_file_selection, write_selection
    out = sdf.transform(datamask_select, ratio=0.1)   # adds a boolean `selected` column
    write_selection(sdf, "selected/", ratio=0.1)       # select and write parquet from the workers
    write_file_selection(spark, "corpus/", "selected/", ratio=0.1)   # parquet files: workers read too

The same options, config files, defaults and quota semantics as
:func:`datamask_dask.datamask_select`; the engine-agnostic core of ``datamask_dask`` (spec, checks,
plan, select step, learner) does the work, Spark only moves the partitions (``mapInArrow``). Only
DataFrame APIs are used, so it also runs over Spark Connect. Installed with
``pip install "datamask-dask[spark]"``.
"""

import pyspark

# before the modules below, so that an older pyspark meets this message and not whatever breaks first
if int(pyspark.__version__.split(".")[0]) < 4:  # Arrow tables to and from the driver came with 4.0
    raise ImportError(f"datamask_spark needs pyspark 4.0 or later, and pyspark {pyspark.__version__} is "
                      "installed: pip install 'datamask-dask[spark]' (or pyspark>=4.0)")

from .files import write_file_selection  # noqa: E402
from .operator import apply_plan, datamask_select, plan_selection, spark_errors, spec_from_spark  # noqa: E402
from .writer import write_selection  # noqa: E402

__all__ = ["apply_plan", "datamask_select", "plan_selection", "spark_errors", "spec_from_spark",
           "write_file_selection", "write_selection"]
