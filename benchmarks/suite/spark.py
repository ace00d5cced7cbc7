"""The Spark integration (``datamask_spark.datamask_select``) on a ``local[2]`` session
(``data.SHAPES["Spark"]``). Skipped where pyspark or a Java runtime is missing."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from . import data

SHAPE = data.SHAPES["Spark"]


class Spark:
    timeout = 600
    number = 1
    repeat = (1, 3, 120.0)
    warmup_time = 0

    def setup(self):
        try:
            import datamask_spark
            from datamask_spark.job import SETTINGS
            from pyspark.sql import SparkSession
        except ImportError as error:
            raise NotImplementedError(f"no Spark: {error}") from error
        if not shutil.which("java") and not os.environ.get("JAVA_HOME"):
            raise NotImplementedError("no Java runtime")
        import datamask_dask

        # Spark's Python workers run this interpreter and import both packages from this checkout.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        roots = {str(Path(m.__file__).parents[1]) for m in (datamask_dask, datamask_spark)}
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        os.environ["PYTHONPATH"] = os.pathsep.join(paths + sorted(roots - set(paths)))
        self.spark = (SparkSession.builder.master("local[2]").appName("datamask-asv").config(map=SETTINGS)
                      .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                      .config("spark.sql.shuffle.partitions", "2").getOrCreate())
        self.spark.sparkContext.setLogLevel("ERROR")
        source = data.parquet_table(SHAPE["rows"], SHAPE["dim"], SHAPE["files"], clusters=SHAPE["clusters"])
        self.sdf = self.spark.read.parquet(str(source))
        self.selected = self._job()  # Python workers started and the selection code imported

    def teardown(self):
        self.spark.stop()

    def _job(self) -> int:
        from datamask_spark import datamask_select

        return datamask_select(self.sdf, SHAPE["ratio"]).where("selected").count()

    def time_select(self):
        self._job()

    def track_selected_rows(self):
        return self.selected

    track_selected_rows.unit = "rows"
