"""What the Delta Lake and Iceberg readers and writers share: Arrow conversions, the run record.

The run record of a table output is the JSON text under ``RECORD_KEY`` in the commit's custom
metadata (Delta) or the snapshot's summary properties (Iceberg).
"""

from __future__ import annotations

import json
import platform

import dask
import pandas as pd
import pyarrow as pa

from .parquet import _to_pandas

RECORD_KEY = "datamask.run"
TABLE_MARK = "datamask.output"  # Iceberg table property set on tables datamask created

__all__ = ["RECORD_KEY", "TABLE_MARK", "compute_arrow", "empty_frame", "lake_versions", "to_arrow",
           "to_pandas"]


def to_pandas(table: pa.Table) -> pd.DataFrame:
    """Arrow table -> pandas with Arrow dtypes (the package's partition format)."""
    return _to_pandas(table)


def empty_frame(schema: pa.Schema) -> pd.DataFrame:
    return _to_pandas(schema.empty_table())


def to_arrow(frame) -> pa.Table:
    """pandas (or cuDF) frame -> Arrow table without the pandas metadata or index."""
    if isinstance(frame, pa.Table):
        return frame.replace_schema_metadata(None)
    if hasattr(frame, "to_arrow") and not isinstance(frame, pd.DataFrame):  # cuDF
        table = frame.to_arrow(preserve_index=False)
    else:
        table = pa.Table.from_pandas(frame, preserve_index=False)
    return table.replace_schema_metadata(None)


def compute_arrow(data, scheduler=None) -> pa.Table:
    """The whole result as one Arrow table: a Dask DataFrame is computed first (all partitions).

    Computing everything before the first byte is written is what makes a table write one
    transaction without a partial state: a selection that fails leaves nothing to undo.
    """
    if isinstance(data, pa.Table):
        return data.replace_schema_metadata(None)
    if isinstance(data, pd.DataFrame):
        return to_arrow(data)
    meta = to_arrow(data._meta)
    parts = [to_arrow(frame) for frame in dask.compute(*data.to_delayed(), scheduler=scheduler)]
    parts = [part if part.schema.equals(meta.schema) else part.cast(meta.schema) for part in parts if
             part.num_rows]
    return pa.concat_tables(parts) if parts else meta.schema.empty_table()


def lake_versions() -> dict:
    """Versions of Python and of the libraries a table output depends on."""
    from .. import __version__

    versions = {"python": platform.python_version(), "datamask-dask": __version__}
    for module in ("numpy", "pandas", "pyarrow", "dask", "distributed", "torch", "deltalake", "pyiceberg"):
        try:
            versions[module] = getattr(__import__(module), "__version__", None)
        except ImportError:
            versions[module] = None
    return versions


def dumps(record: dict) -> str:
    from .writer import _plain

    return json.dumps(record, sort_keys=True, default=_plain)
