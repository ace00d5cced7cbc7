"""What the Delta Lake and Iceberg readers and writers share: Arrow conversions, the run record.

The run record of a table output is the JSON text under ``RECORD_KEY`` in the commit's custom
metadata (Delta) or the snapshot's summary properties (Iceberg).
"""

from __future__ import annotations

import dask
import pandas as pd
import pyarrow as pa

from .output import library_versions
from .parquet import to_arrow

RECORD_KEY = "datamask.run"
TABLE_MARK = "datamask.output"  # Iceberg table property set on tables datamask created

__all__ = ["RECORD_KEY", "TABLE_MARK", "compute_arrow", "lake_versions"]


def compute_arrow(data, scheduler=None) -> pa.Table:
    """The whole result as one Arrow table: a Dask DataFrame is computed first (all partitions).

    Computing everything before the first byte is written is what makes a table write one
    transaction without a partial state: a selection that fails leaves nothing to undo.
    """
    if isinstance(data, pa.Table):
        return data.replace_schema_metadata(None)
    if isinstance(data, pd.DataFrame):
        return to_arrow(data)
    parts = [to_arrow(frame) for frame in dask.compute(*data.to_delayed(), scheduler=scheduler)]
    return concat_arrow(parts, to_arrow(data._meta).schema)


def concat_arrow(parts: list[pa.Table], schema: pa.Schema) -> pa.Table:
    """Partitions' Arrow tables as one table of ``schema`` (a partition may infer a narrower type)."""
    parts = [part if part.schema.equals(schema) else part.cast(schema) for part in parts if part.num_rows]
    return pa.concat_tables(parts) if parts else schema.empty_table()


def lake_versions() -> dict:
    """Versions of Python and of the libraries a table output depends on."""
    return library_versions("deltalake", "pyiceberg")
