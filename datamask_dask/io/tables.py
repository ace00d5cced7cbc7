"""Table URIs for the CLI and the API: parquet paths, Delta Lake and Iceberg tables, in and out.

URIs (a query string picks a snapshot: time travel)::

    /data/corpus  or  file.parquet           parquet file or (hive-)partitioned directory
    delta:///abs/path/table[?version=N | ?timestamp=2026-01-01T00:00:00Z]
    delta+s3://bucket/table                  any deltalake URI after ``delta+``
    iceberg://CATALOG/namespace.table[?snapshot_id=N]

- :func:`read_table`: any of them as a Dask DataFrame, with the snapshot read (:class:`TableInput`).
- :func:`write_table_output`: a result as a parquet directory, Delta commit or Iceberg snapshot,
  each with the run record (``_datamask_run.json``, the commit's custom metadata, the snapshot's
  summary); the Delta and Iceberg writes are one transaction.
- :class:`SelectionOnly`: the selection-only output (id, selected, optional score, run id),
  which joins back to the source on the id, on either engine.

A selection run over them is :func:`datamask_dask.run.tables.select_table`.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

from ..errors import OptionError
from ..partition.adapters import is_cudf
from .output import UnsafeOutputError, read_record
from .pieces import Pieces, to_dask
from .storage import resolve, uri_text

if TYPE_CHECKING:
    import dask.dataframe as dd

__all__ = ["TableInput", "TableURI", "parse_table_uri", "read_table", "SelectionOnly", "table_pieces",
           "open_sink", "selected_counts", "table_record", "write_table_output"]

RUN_ID_COLUMN = "run_id"


@dataclasses.dataclass(frozen=True)
class TableURI:
    """A parsed table URI: ``format`` is ``"parquet"``, ``"delta"`` or ``"iceberg"``."""

    uri: str
    format: str
    location: str  # parquet / delta: the path or URI; iceberg: the identifier
    catalog: str | None = None
    version: int | None = None
    timestamp: str | None = None
    snapshot_id: int | None = None

    @property
    def key(self) -> tuple:
        """What identifies the table (not the snapshot), to compare an output with an input."""
        if self.format == "iceberg":
            return ("iceberg", self.catalog, self.location)
        location = self.location
        if "://" not in location:
            location = str(Path(location).resolve())
        return (self.format, location.rstrip("/"))


def parse_table_uri(uri) -> TableURI:
    """Parse a table URI (see the module notes); anything else is a parquet path."""
    text = uri_text(uri)
    base, _, query = text.partition("?") if text.startswith(("delta", "iceberg://")) else (text, "", "")
    params = {k: v[-1] for k, v in parse_qs(query).items()}
    unknown = set(params) - {"version", "timestamp", "snapshot_id"}
    if unknown:
        raise OptionError(f"unknown option(s) {sorted(unknown)} in the table URI {text}")
    if base.startswith("delta://"):
        location = base[len("delta://"):]
        if not location.startswith("/"):
            meant = f"delta://{os.path.abspath(location)}{'?' + query if query else ''}"
            raise OptionError(f"a local Delta table URI is delta:///absolute/path (three slashes), "
                              f"not {text} (for the folder {location} here: {meant})")
        return TableURI(text, "delta", location, version=_int(params, "version", text),
                        timestamp=params.get("timestamp"))
    if base.startswith("delta+"):
        return TableURI(text, "delta", base[len("delta+"):], version=_int(params, "version", text),
                        timestamp=params.get("timestamp"))
    if base.startswith("iceberg://"):
        catalog, _, identifier = base[len("iceberg://"):].partition("/")
        if not catalog or "." not in identifier:
            raise OptionError(f"an Iceberg table URI is iceberg://CATALOG/namespace.table, not {text}")
        return TableURI(text, "iceberg", identifier, catalog=catalog,
                        snapshot_id=_int(params, "snapshot_id", text))
    if "://" in base and not base.startswith("file://"):
        return TableURI(text, "parquet", base)
    return TableURI(text, "parquet", base.removeprefix("file://"))


def _int(params: dict, key: str, text: str) -> int | None:
    """The URI's ``?key=N``, a whole number (None where it has none)."""
    if key not in params:
        return None
    try:
        return int(params[key])
    except ValueError:
        raise OptionError(f"?{key}={params[key]} in the table URI {text} is not a whole number: "
                          f"give ?{key}=N") from None


@dataclasses.dataclass(frozen=True)
class TableInput:
    """What :func:`read_table` read: the frame, the table, and the snapshot (``version``)."""

    frame: dd.DataFrame
    table: TableURI
    version: int | None  # Delta version or Iceberg snapshot id; None for parquet (or an empty table)
    since: int | None = None
    files: int | None = None  # data files (partitions) read


def read_table(uri, *, columns=None, row_filter=None, since=None, catalog_properties=None,
               storage_options=None, backend: str = "pandas") -> TableInput:
    """Read a table URI as a Dask DataFrame (parquet, ``delta://``, ``iceberg://``).

    Parameters
    ----------
    uri : str or path or TableURI
    columns : list of str, optional
        Projection (pushed down for every format).
    row_filter : str, optional
        Iceberg only: a pyiceberg row filter, pushed down.
    since : int, optional
        Delta version / Iceberg snapshot: read only the rows added after it.
    catalog_properties : dict, optional
        Iceberg catalog properties (beyond pyiceberg's configuration).
    storage_options : dict, optional
        Delta storage options.
    backend : {"pandas", "cudf"}
        ``"cudf"``: a parquet table is read by cuDF's GPU reader, into cuDF partitions
        (:func:`~.parquet.read_parquet`); Delta and Iceberg tables are read by pyarrow either way.
    """
    table = uri if isinstance(uri, TableURI) else parse_table_uri(uri)
    pieces = table_pieces(table, columns=columns, row_filter=row_filter, since=since,
                          catalog_properties=catalog_properties, storage_options=storage_options)
    return TableInput(pieces_frame(pieces, table, backend), table, pieces_version(pieces), since, len(pieces))


def selected_counts(uri, column: str = "selected", *, catalog_properties=None,
                    storage_options=None) -> tuple[int, int]:
    """Rows and selected rows of a written output (a parquet file or directory, a Delta or Iceberg table:
    its current version), reading only ``column``; the keywords are :func:`read_table`'s."""
    import dask

    values = read_table(uri, columns=[column], catalog_properties=catalog_properties,
                        storage_options=storage_options).frame[column]
    rows, chosen = dask.compute(values.size, values.sum(), scheduler="threads")
    return int(rows), int(chosen)


def pieces_frame(pieces: Pieces, table: TableURI, backend: str = "pandas") -> dd.DataFrame:
    """``table``'s ``pieces`` as a Dask DataFrame, a partition a piece (``backend="cudf"``: a parquet
    table read by cuDF's GPU reader)."""
    if backend == "cudf" and table.format == "parquet":
        from .parquet import to_cudf_dask

        return to_cudf_dask(pieces)
    return to_dask(pieces, f"datamask-read-{table.format}")


def pieces_version(pieces: Pieces) -> int | None:
    """The Delta version or Iceberg snapshot id the pieces were listed at (None: parquet)."""
    return pieces.source.get("version", pieces.source.get("snapshot_id"))


def table_pieces(uri, *, columns=None, row_filter=None, since=None, catalog_properties=None,
                 storage_options=None) -> Pieces:
    """A table URI's partitions as :class:`~.pieces.Pieces` (arguments: :func:`read_table`), for
    engines that read each piece in their own tasks (Dask, ``datamask_spark.files``)."""
    table = uri if isinstance(uri, TableURI) else parse_table_uri(uri)
    if row_filter is not None and table.format != "iceberg":  # read whole, the filter would be ignored
        raise OptionError(f"row_filter (--row-filter) needs an Iceberg input, whose scan applies it; a "
                          f"{table.format} input is read whole: write the rows to consider to a table of "
                          "their own first")
    if table.format == "delta":
        from .delta import delta_pieces

        return delta_pieces(table.location, table.version, table.timestamp, columns,
                            storage_options=storage_options, since_version=since)
    if table.format == "iceberg":
        from .iceberg import iceberg_pieces

        return iceberg_pieces(table.catalog, table.location, table.snapshot_id, columns, row_filter,
                              since_snapshot_id=since, **(catalog_properties or {}))
    if since is not None:
        raise OptionError("an incremental run (since=, --incremental) needs a Delta or Iceberg input, not "
                          "parquet")
    from .parquet import parquet_pieces

    pieces = parquet_pieces(table.location, storage_options=storage_options)
    return pieces if columns is None else pieces.select(columns)


@dataclasses.dataclass(frozen=True)
class SelectionOnly:
    """The selection-only output, ``(frame, run_id) -> frame``: the id, ``selected``, the score if there
    is one, the explain columns if asked, and the run id, which join back to the source on the id.
    ``frame``: a partition (pandas or cuDF), a Dask DataFrame, or an Arrow table (Spark's tasks)."""

    id_column: str = "chunk_id"
    selected_column: str = "selected"
    score_column: str | None = None
    explain: bool = False

    @classmethod
    def of(cls, options) -> SelectionOnly:
        """As resolved ``options`` (:class:`~datamask_dask.options.SelectOptions`) name the columns."""
        return cls(options.id_column, options.selected_column, options.score_column, bool(options.explain))

    @property
    def names(self) -> list[str]:
        from ..partition.explain import COLUMNS

        names = [self.id_column, self.selected_column] + ([self.score_column] if self.score_column else [])
        return names + (list(COLUMNS) if self.explain else [])

    @staticmethod
    def reads(spec, available) -> list[str]:
        """The input columns a selection-only run reads (of ``available``): what the selection and the
        run summary use, no text decoded for nothing."""
        used = [spec.id_column, *spec.select_columns]
        used += [spec.token_column] if spec.token_column in available else []
        return list(dict.fromkeys(used))

    def __call__(self, frame, run_id: str):
        import pyarrow as pa

        if isinstance(frame, pa.Table):
            table = frame.select(self.names)
            return table.append_column(pa.field(RUN_ID_COLUMN, pa.large_string()),
                                       pa.array([run_id] * table.num_rows, pa.large_string()))
        meta = getattr(frame, "_meta", frame)
        return frame[self.names].assign(**{RUN_ID_COLUMN: run_id}).astype(
            {RUN_ID_COLUMN: "str" if is_cudf(meta) else "string[pyarrow]"})


def table_record(uri, *, catalog_properties=None, storage_options=None) -> dict | None:
    """The run record of the newest datamask write to a table output, or None (no table, no record)."""
    table = uri if isinstance(uri, TableURI) else parse_table_uri(uri)
    if table.format == "delta":
        from .delta import delta_record

        return delta_record(table.location, storage_options)
    if table.format == "iceberg":
        from .iceberg import iceberg_record

        return iceberg_record(table.catalog, table.location, **(catalog_properties or {}))
    return read_record(table.location) if resolve(table.location, storage_options).exists() else None


def open_sink(uri, *, mode: str = "error", inputs=(), catalog_properties=None, storage_options=None,
              single_file: bool = False):
    """The sink of a table URI (:mod:`.sinks`), checked before anything is computed.

    ``mode``: ``"error"`` (the output may not exist), ``"append"`` (Delta and Iceberg) or
    ``"overwrite"``; an existing output is written into only when datamask wrote it. ``inputs``:
    the job's inputs (table URIs or paths), which the output may not be. ``single_file``: a parquet
    output written as one file (a table is never one).
    """
    target = uri if isinstance(uri, TableURI) else parse_table_uri(uri)
    if single_file and target.format != "parquet":
        raise OptionError(f"single_file=True writes one parquet file, not a {target.format} table "
                          f"({target.uri})")
    sources = [s if isinstance(s, TableURI) else parse_table_uri(s) for s in inputs if s is not None]
    for source in sources:
        if source.key == target.key:
            raise UnsafeOutputError(f"the output {target.uri} is the input {source.uri}: write the selection "
                                    "elsewhere (the input is never modified)")
    if target.format == "delta":
        from .delta import DeltaSink

        return DeltaSink(target.location, mode=mode, storage_options=storage_options,
                         inputs=[s.location for s in sources if s.format != "iceberg"])
    if target.format == "iceberg":
        from .iceberg import IcebergSink

        return IcebergSink(target.catalog, target.location, mode=mode, **(catalog_properties or {}),
                           inputs=[(s.catalog, s.location) for s in sources if s.format == "iceberg"])
    if mode == "append":
        raise OptionError("mode='append' needs a Delta or Iceberg output; a parquet output is written whole")
    if mode not in ("error", "overwrite"):
        raise OptionError(f"mode must be 'error', 'append' or 'overwrite', not {mode!r}")
    from .sinks import ParquetSink

    return ParquetSink(resolve(target.location, storage_options), overwrite=mode == "overwrite",
                       single_file=single_file, inputs=[s.location for s in sources if s.format != "iceberg"])


def write_table_output(data, uri, *, mode: str = "error", record: dict | None = None, inputs=(),
                       catalog_properties=None, storage_options=None, scheduler=None) -> dict:
    """Write a result to a table URI (a parquet directory, ``delta://...`` or ``iceberg://...``), all
    or nothing, with its run record (:func:`.sinks.write_output`). ``mode`` and ``inputs`` (the job's
    inputs, which the output may not be) as :func:`open_sink`.

    Returns
    -------
    dict
        ``rows`` and, for tables, ``version`` (Delta) or ``snapshot_id`` (Iceberg).
    """
    from .sinks import write_output

    sink = open_sink(uri, mode=mode, inputs=inputs, catalog_properties=catalog_properties,
                     storage_options=storage_options)
    return write_output(sink, data, record or {}, scheduler=scheduler)
