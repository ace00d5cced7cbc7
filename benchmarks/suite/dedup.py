"""The near-duplicate search (:mod:`datamask_dask.dedup`) on signed partitions with planted copies
across them: seconds and memory of the one-task and the sharded search, recall of copies at cosine
0.98, false merges of pairs at 0.90, and the exact count of rows shadowed."""

from __future__ import annotations

import time

from . import data

SHAPE = data.SHAPES["NearDuplicates"]


class NearDuplicates:
    timeout = 600
    timer = staticmethod(time.process_time)  # CPU seconds: other processes on a shared machine do not count

    def setup_cache(self):
        from datamask_dask.dedup import search

        parts, planted = data.planted_parts(SHAPE["rows"], SHAPE["rows a partition"], SHAPE["dim"],
                                            SHAPE["planted copies"])
        groups = search.find_groups(parts)
        return {"parts": parts, "rates": data.duplicate_rates(parts, planted, groups),
                "shadowed": sum(len(g.shadowed) for g in groups)}

    def setup(self, cache):
        from datamask_dask.dedup import search

        data.one_thread()
        self.parts = cache["parts"]
        search.find_groups(self.parts[:2])  # compiled kernels loaded before the timed run

    def time_find_groups(self, cache):
        from datamask_dask.dedup import search

        search.find_groups(self.parts)

    def peakmem_find_groups(self, cache):
        from datamask_dask.dedup import search

        search.find_groups(self.parts)

    def time_find_groups_sharded(self, cache):
        from datamask_dask.dedup import stages

        stages.find_groups_sharded(self.parts, shards=2)

    def peakmem_find_groups_sharded(self, cache):
        from datamask_dask.dedup import stages

        stages.find_groups_sharded(self.parts, shards=2)

    def track_recall_098(self, cache):
        """Planted pairs at cosine 0.98 of which at most one row stays eligible, in points."""
        return 100 * cache["rates"][0.98]["handled"]

    track_recall_098.unit = "points"

    def track_false_merges_090(self, cache):
        """Planted pairs at cosine 0.90 that end in one group, in points (lower is better)."""
        return 100 * cache["rates"][0.90]["merged"]

    track_false_merges_090.unit = "points (lower is better)"

    def track_shadowed_rows(self, cache):
        return cache["shadowed"]

    track_shadowed_rows.unit = "rows"
