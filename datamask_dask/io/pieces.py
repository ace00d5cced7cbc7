"""A table cut into pieces that any engine reads one at a time, wherever its tasks run.

The Dask readers (:func:`~.parquet.read_parquet`, :func:`~.delta.read_delta`,
:func:`~.iceberg.read_iceberg`) make one partition of each piece; ``datamask_spark.files`` runs one
Spark task per piece, whose Python worker reads it. Both engines therefore see the same partitions
in the same order, hence select the same rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pandas as pd
import pyarrow as pa

from .. import telemetry
from ..errors import InputDataError

__all__ = ["Pieces", "to_dask", "to_pandas"]


@dataclass(frozen=True)
class Pieces:
    """A table's partitions, listed once, each read on its own.

    ``items``: one picklable description per piece (a file's row groups, a Delta file fragment, an
    Iceberg scan task), in partition order. ``reader(item, columns) -> pyarrow.Table``, picklable
    (it travels to the workers), reads ``columns`` in ``schema``'s types. ``source``: what was read,
    for run records (``format``, ``uri`` and the snapshot, ``version``). ``rows``: each piece's row
    count, and ``nbytes`` its size in memory (at most), where the listing knows them (None otherwise).
    """

    schema: pa.Schema
    items: list
    reader: Callable
    source: dict = field(default_factory=dict)
    rows: list | None = None
    nbytes: list | None = None

    def __len__(self) -> int:
        return len(self.items)

    def select(self, columns: list[str]) -> Pieces:
        """The same pieces, read as ``columns`` only."""
        missing = [c for c in columns if c not in self.schema.names]
        if missing:
            raise InputDataError(f"columns not in {self.source.get('uri', 'the table')}: {missing} (it has "
                                 f"{self.schema.names})")
        return replace(self, schema=pa.schema([self.schema.field(c) for c in columns]))

    def read(self, number: int, columns: list[str] | None = None) -> pa.Table:
        """Piece ``number``'s ``columns`` (all by default)."""
        return self.reader(self.items[number], list(self.schema.names) if columns is None else list(columns))


def to_dask(pieces: Pieces, label: str):
    """A Dask DataFrame of Arrow-typed pandas partitions, one per piece (one empty partition for a
    table without pieces). Column projections reach the reader: unread columns are never decoded."""
    import dask.dataframe as dd

    meta = to_pandas(pieces.schema.empty_table())
    if not len(pieces):
        return dd.from_pandas(meta, npartitions=1)
    return dd.from_map(_read, pieces.items, reader=pieces.reader, schema=pieces.schema, meta=meta,
                       label=label, enforce_metadata=False)


@telemetry.timed_read
def _read(item, reader: Callable, schema: pa.Schema, columns: list[str] | None = None) -> pd.DataFrame:
    return to_pandas(reader(item, list(schema.names) if columns is None else list(columns)))


def to_pandas(table: pa.Table) -> pd.DataFrame:
    """Arrow as pandas with Arrow dtypes (the package's frames), pandas' stored dtypes ignored."""
    return table.to_pandas(types_mapper=pd.ArrowDtype, ignore_metadata=True)
