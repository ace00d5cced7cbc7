"""The plan pass in table scope holds no table of embeddings: the scans keep none, and the exact
check reads its candidate rows' embeddings again, a block of partitions per task."""

from __future__ import annotations

import tracemalloc

import dask.dataframe as dd
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from datamask_dask.dask_engine.operator import compute_plan, plan_selection
from datamask_dask.dedup.stages import PARTITIONS_PER_SHARD
from datamask_dask.sample_data import make_embeddings

# The exact check holds its candidate rows' vectors between its two steps, never the table's: a
# table whose copies are a small share of its rows, as real corpora are, keeps the bound below clear.
SHARE = 0.05


def _files(folder, n_parts: int, rows: int, dim: int) -> int:
    """A table of near-copies (so the exact check has rows to read), one parquet file a partition;
    its embeddings' bytes."""
    quality, emb = make_embeddings(n_parts * rows, dim, duplicate_share=SHARE, seed=0)
    for p in range(n_parts):
        span = slice(p * rows, (p + 1) * rows)
        vectors = pa.FixedSizeListArray.from_arrays(pa.array(emb[span].ravel()), dim)
        pq.write_table(pa.table({"chunk_id": np.arange(span.start, span.stop),
                                 "quality_score": quality[span].astype(np.float64), "feature_arr": vectors}),
                       folder / f"part-{p:05d}.parquet")
    return emb.nbytes


def _plan(folder):
    ddf = dd.read_parquet(folder)
    # by partition: regions would also send the k-means its sample, which is bounded on its own
    # (plan.regions.SAMPLE_VALUES) and here, the table being small, every row
    spec, _ = plan_selection(ddf, ratio=0.1, diversity_scope="table", pieces="partitions")
    return compute_plan(ddf, spec, scheduler="threads", progress=False)[0]


def test_the_plan_pass_holds_a_block_of_embeddings_not_the_table(tmp_path):
    """Four vector blocks of partitions: the numpy memory the plan pass holds at its peak (the
    embeddings it converts are numpy arrays; Arrow's reads are not counted) stays under half the
    table's embeddings, where scans that kept theirs held all of them until the search ran."""
    n_parts = 4 * PARTITIONS_PER_SHARD
    (tmp_path / "warm").mkdir()
    (tmp_path / "table").mkdir()
    _files(tmp_path / "warm", 2, 200, 512)
    _plan(tmp_path / "warm")  # libraries loaded, first-call allocations done
    table_bytes = _files(tmp_path / "table", n_parts, 1000, 512)
    tracemalloc.start()
    try:
        plan = _plan(tmp_path / "table")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sum(len(rows) for rows in plan.shadowed.values()) > 0  # copies found: the exact check read rows
    assert peak < table_bytes / 2, f"peak {peak / 2**20:.1f} MiB of {table_bytes / 2**20:.1f} MiB"
