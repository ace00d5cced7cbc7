"""``write_selection`` end to end on parquet (read, plan, learn, write, commit) on a LocalCluster of 2
single-threaded worker processes, the CLI's defaults (the table: ``data.SHAPES["Pipeline"]``)."""

from __future__ import annotations

import shutil
import tempfile

from . import data

SHAPE = data.SHAPES["Pipeline"]


class Pipeline:
    timeout = 600
    number = 1
    repeat = (1, 3, 120.0)
    warmup_time = 0

    def setup_cache(self):
        return str(data.parquet_table(SHAPE["rows"], SHAPE["dim"], SHAPE["files"], SHAPE["clusters"]))

    def setup(self, source):
        from distributed import Client, LocalCluster

        self.cluster = LocalCluster(n_workers=SHAPE["workers"], threads_per_worker=1, dashboard_address=None)
        self.client = Client(self.cluster)
        self.target = tempfile.mkdtemp(prefix="asv-pipeline-")

    def teardown(self, source):
        self.client.close()
        self.cluster.close()
        shutil.rmtree(self.target, ignore_errors=True)

    def _job(self, source):
        from datamask_dask import read_parquet, write_selection

        return write_selection(read_parquet(source), f"{self.target}/out", SHAPE["ratio"], overwrite=True,
                               progress=False)

    def time_select_parquet(self, source):
        self._job(source)

    def track_selected_rows(self, source):
        return self._job(source).selected

    track_selected_rows.unit = "rows"

    def track_largest_worker_mib(self, source):
        """Largest resident memory of a worker process during the job (its peak, from the OS)."""
        import resource

        self._job(source)
        usage = self.client.run(resource.getrusage, resource.RUSAGE_SELF)  # a builtin: workers need no import
        return max(u.ru_maxrss for u in usage.values()) / 2**10  # KiB on Linux

    track_largest_worker_mib.unit = "MiB"

