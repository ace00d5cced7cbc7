"""Iceberg tables in and out (``pyiceberg``, ``pip install datamask-dask[lakehouse]``).

- :func:`get_catalog`: a catalog by name from pyiceberg's usual configuration
  (``~/.pyiceberg.yaml``, ``$PYICEBERG_HOME/.pyiceberg.yaml``, ``PYICEBERG_CATALOG__<NAME>__*``
  environment variables) and/or explicit properties; a ``Catalog`` object passes through.
- :func:`read_iceberg`: a table (at a snapshot: time travel) as a Dask DataFrame with one
  partition per scan task of ``table.scan(...).plan_files()``; the column projection and the
  row filter are pushed down (manifests and file statistics prune files, the reader prunes
  row groups and filters rows; delete files are applied).
- :func:`write_iceberg`: one transaction, ``mode`` explicit: ``"error"`` (default: the table
  may not exist; it is created and filled in one commit), ``"append"`` or ``"overwrite"``.
  The run record goes into the snapshot's summary properties (``datamask.run``).

Safety (:mod:`datamask_dask.io.output`): an existing table is appended to or overwritten only
when datamask created it (table property ``datamask.output``) and every snapshot carries a run
record; the output may not be the input table. An overwrite is a new snapshot: the previous
one stays readable until snapshots are expired.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

import pyarrow as pa

from ..errors import WRITE_INTO_TABLE, InputDataError, OptionError, StorageError
from .output import RECORD_KEY, UnsafeOutputError
from .parquet import float_lists, to_arrow
from .pieces import Pieces, to_dask
from .records import dumps, loads_record
from .storage import environment_endpoint, reach, resolve

TABLE_MARK = "datamask.output"  # the table property of the tables datamask created
METRICS_MODE = "write.metadata.metrics.column"  # Iceberg's table property of a column's file statistics
__all__ = ["IcebergSink", "get_catalog", "iceberg_pieces", "iceberg_record", "read_iceberg", "write_iceberg"]


def get_catalog(catalog, **properties):
    """A pyiceberg catalog: a ``Catalog`` as is, or one loaded by name (config file, environment)."""
    try:
        from pyiceberg.catalog import Catalog, load_catalog
    except ImportError as error:  # pragma: no cover - exercised only without the extra
        raise ImportError("Iceberg tables need pyiceberg: pip install 'datamask-dask[lakehouse]'") from error
    if isinstance(catalog, Catalog):
        return catalog
    try:
        return load_catalog(catalog, **{**_environment_store(catalog, properties), **properties})
    except ValueError as error:  # not configured, or its properties incomplete
        # (pyiceberg's words for a catalog it has no URI for name its own CLI's --uri)
        reason = "no URI is configured for it" if "URI missing" in str(error) else str(error)
        variables = f"PYICEBERG_CATALOG__{str(catalog).upper()}__"
        raise OptionError(f"the Iceberg catalog {catalog!r} could not be loaded ({reason}): define it in "
                          f".pyiceberg.yaml (in $PYICEBERG_HOME or the home folder) or by {variables}URI and "
                          f"its other {variables}* environment variables") from error


def _environment_store(name: str, properties: dict) -> dict:
    """The environment's S3 endpoint and region (``AWS_ENDPOINT_URL``, ``AWS_REGION``), as pyiceberg's
    ``s3.*`` properties, where the catalog's configuration and ``properties`` name none: its file IO
    reads only those, where s3fs, pyarrow and deltalake read the environment."""
    from pyiceberg.utils.config import Config

    configured = {**(Config().get_catalog_config(name) or {}), **properties}
    found = {"s3.endpoint": environment_endpoint(),
             "s3.region": os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")}
    return {key: value for key, value in found.items() if value and key not in configured}


def _load_input(catalog, identifier):
    """The input table ``identifier`` of ``catalog``; one that is not there is said so, naming both."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    try:
        return catalog.load_table(identifier)
    except (NoSuchTableError, NoSuchNamespaceError) as error:
        raise FileNotFoundError(f"the Iceberg table {_identifier(identifier)} does not exist in the catalog "
                                f"{catalog.name}: check the URI (iceberg://{catalog.name}/"
                                f"{_identifier(identifier)})") from error
    except OSError:  # its metadata unread: a store that cannot be reached is told as for parquet
        warehouse = str(catalog.properties.get("warehouse") or "")
        if warehouse.startswith("s3://"):
            try:
                reach(resolve(warehouse))
            except StorageError as unreached:
                raise StorageError(f"{unreached} (or the catalog {catalog.name}'s s3.* properties: "
                                   "s3.endpoint, s3.access-key-id...)", unreached.reason) from None
        raise


def _identifier(identifier) -> str:
    return identifier if isinstance(identifier, str) else ".".join(identifier)


def _plain_schema(schema: pa.Schema) -> pa.Schema:
    """Large Arrow types (pyiceberg's reads) as their plain forms; field-id metadata dropped."""
    def plain(kind):
        if pa.types.is_large_string(kind):
            return pa.string()
        if pa.types.is_large_binary(kind):
            return pa.binary()
        if pa.types.is_large_list(kind) or pa.types.is_list(kind):
            return pa.list_(plain(kind.value_type))
        return kind

    return pa.schema([pa.field(f.name, plain(f.type), f.nullable) for f in schema])


def read_iceberg(catalog, identifier, snapshot_id: int | None = None, columns: list[str] | None = None,
                 row_filter=None, *, since_snapshot_id: int | None = None, case_sensitive: bool = True,
                 **properties):
    """Read an Iceberg table as a Dask DataFrame, one partition per scan task.

    Parameters
    ----------
    catalog : str or pyiceberg Catalog
        A catalog name (pyiceberg's configuration: ``.pyiceberg.yaml``, ``PYICEBERG_HOME``,
        environment) or a catalog object; ``**properties`` are passed to ``load_catalog``.
    identifier : str or tuple
        ``"namespace.table"``.
    snapshot_id : int, optional
        Read this snapshot (time travel); the current one by default.
    columns : list of str, optional
        Projection, pushed down to the scan.
    row_filter : str or pyiceberg BooleanExpression, optional
        E.g. ``"quality_score > 0.5"``; pushed down (file pruning, row-group pruning, filtering).
    since_snapshot_id : int, optional
        Read only the data files added after this snapshot (incremental runs); the table must
        only have been appended to since (otherwise ``InputDataError``).

    Returns
    -------
    dask.dataframe.DataFrame
        One partition per scan task (one empty partition when there is none).
        :func:`~datamask_dask.io.tables.read_table` also returns the snapshot read.
    """
    pieces = iceberg_pieces(catalog, identifier, snapshot_id, columns, row_filter,
                            since_snapshot_id=since_snapshot_id, case_sensitive=case_sensitive, **properties)
    return to_dask(pieces, "datamask-read-iceberg")


def iceberg_pieces(catalog, identifier, snapshot_id=None, columns=None, row_filter=None, *,
                   since_snapshot_id=None, case_sensitive=True, **properties) -> Pieces:
    """The scan tasks of an Iceberg snapshot as :class:`~.pieces.Pieces` (arguments: :func:`read_iceberg`)."""
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan

    cat = get_catalog(catalog, **properties)
    table = _load_input(cat, identifier)
    current = table.current_snapshot()
    for wanted, fix in ((snapshot_id, "change ?snapshot_id= in the URI"),
                        (since_snapshot_id, "run without --incremental (since=) to read the whole table")):
        if wanted is not None and table.snapshot_by_id(wanted) is None:
            raise OptionError(f"the Iceberg table {_identifier(identifier)} has no snapshot {wanted} (its "
                              f"current is {current and current.snapshot_id}): {fix}")
    if row_filter is not None:
        _check_row_filter(row_filter, table, case_sensitive)
    scan = table.scan(row_filter=row_filter if row_filter is not None else AlwaysTrue(),
                      selected_fields=tuple(columns) if columns is not None else ("*",),
                      case_sensitive=case_sensitive, snapshot_id=snapshot_id)
    args = (table.metadata, table.io, scan.projection(), scan.row_filter, scan.case_sensitive)
    schema = _plain_schema(ArrowScan(*args).to_table([]).schema)
    if columns is not None:
        schema = pa.schema([schema.field(c) for c in columns])
    snapshot = scan.snapshot()
    tasks = list(scan.plan_files()) if snapshot is not None else []
    if since_snapshot_id is not None:
        old = {task.file.file_path for task in table.scan(snapshot_id=since_snapshot_id).plan_files()}
        now = {task.file.file_path for task in table.scan(snapshot_id=scan.snapshot_id).plan_files()} \
            if snapshot is not None else set()
        if old - now:
            raise InputDataError(f"the Iceberg table {_identifier(identifier)} lost {len(old - now)} data "
                                 f"file(s) of snapshot {since_snapshot_id} since (an overwrite, delete or "
                                 "compaction): an incremental run needs a table that was only appended to")
        tasks = [task for task in tasks if task.file.file_path not in old]
    tasks.sort(key=lambda task: task.file.file_path)
    source = {"format": "iceberg", "catalog": cat.name, "identifier": _identifier(identifier),
              "snapshot_id": None if snapshot is None else snapshot.snapshot_id, "files": len(tasks)}
    # a data file's rows, as the manifests state them, are the task's where nothing is deleted or filtered
    whole = row_filter is None and not any(task.delete_files for task in tasks)
    rows = [task.file.record_count for task in tasks] if whole else None
    return Pieces(schema, tasks, TaskReader(args, schema), source, rows)


def _check_row_filter(row_filter, table, case_sensitive: bool) -> None:
    """A row filter pyiceberg cannot read, or that names a column the table lacks or compares one with a
    value of another type, refused in one line naming it (the parser's own error lists every token it
    expected)."""
    from pyiceberg.expressions.parser import parse
    from pyiceberg.expressions.visitors import bind
    from pyparsing import ParseException

    said = f"row_filter (--row-filter) {row_filter!r}"
    try:
        expression = parse(row_filter) if isinstance(row_filter, str) else row_filter
    except ParseException:
        raise OptionError(f"{said} is not a filter pyiceberg reads: write it as, e.g., \"language = 'en' "
                          "and quality_score > 0.5\"") from None
    try:
        bind(table.schema(), expression, case_sensitive)
    except ValueError as error:
        columns = ", ".join(field.name for field in table.schema().fields)
        raise OptionError(f"{said}: {error} (the table's columns: {columns})") from None


class TaskReader:
    """Reads a scan task of :func:`iceberg_pieces` (pyiceberg applies deletes and the row filter)."""

    def __init__(self, scan: tuple, schema: pa.Schema):
        self.scan, self.schema = scan, schema

    def __call__(self, task, columns: list[str]) -> pa.Table:
        from pyiceberg.io.pyarrow import ArrowScan

        metadata, io, projection, row_filter, case_sensitive = self.scan
        projection = projection.select(*columns, case_sensitive=case_sensitive)  # unread columns stay unread
        scan = ArrowScan(metadata, io, projection, row_filter, case_sensitive)
        table = scan.to_table([task]).replace_schema_metadata(None).select(columns)
        schema = pa.schema([self.schema.field(c) for c in columns])
        return table if table.schema.equals(schema) else table.cast(schema)


# --------------------------------------------------------------------------- writing


def _records(table) -> list[dict | None]:
    """Run records of the snapshots, newest first along the current branch's ancestry."""
    records, snapshot = [], table.current_snapshot()
    while snapshot is not None:
        text = (snapshot.summary.additional_properties or {}).get(RECORD_KEY) if snapshot.summary else None
        records.append(loads_record(text))
        parent = snapshot.parent_snapshot_id
        snapshot = table.snapshot_by_id(parent) if parent is not None else None
    return records


def iceberg_record(catalog, identifier, **properties) -> dict | None:
    """The run record of the newest datamask snapshot of an Iceberg table, or None."""
    cat = get_catalog(catalog, **properties)
    try:
        table = _load_input(cat, identifier)
    except FileNotFoundError:
        return None
    return next((r for r in _records(table) if r), None)


def _iceberg_schema(schema: pa.Schema) -> pa.Schema:
    """Arrow types Iceberg has: fixed-size lists (embeddings) become lists."""
    def plain(kind):
        if pa.types.is_fixed_size_list(kind) or pa.types.is_large_list(kind) or pa.types.is_list(kind):
            return pa.list_(plain(kind.value_type))
        return kind

    return pa.schema([pa.field(f.name, plain(f.type), f.nullable) for f in schema])


def write_iceberg(data, catalog, identifier, *, mode: str = "error", record: dict | None = None,
                  inputs=(), scheduler=None, **properties) -> dict:
    """Write a result (usually a selection) as one Iceberg transaction (:class:`IcebergSink`).

    Parameters
    ----------
    data : dask.dataframe.DataFrame, pandas.DataFrame, pyarrow.Table or pyarrow.RecordBatchReader
        A Dask DataFrame's partitions are written by their own tasks (computed on ``scheduler``),
        each a data file.
    catalog, identifier
        As :func:`read_iceberg`. A missing namespace is created.
    mode : {"error", "append", "overwrite"}
        ``"error"``: the table is created, with its rows, in one commit (it may not exist).
        ``"append"`` (created if missing) / ``"overwrite"``: an existing table must be one
        datamask created and wrote (see the module notes).
    record : dict, optional
        The run record: JSON under ``datamask.run`` in the snapshot summary.
    inputs : iterable of (catalog name, identifier)
        Input tables the output may not be.

    Returns
    -------
    dict
        ``snapshot_id`` committed and ``rows`` written.
    """
    from .sinks import write_output

    sink = IcebergSink(catalog, identifier, mode=mode, inputs=inputs, **properties)
    return write_output(sink, data, record or {}, scheduler=scheduler)


def _plain_target(target, schema: pa.Schema) -> pa.Schema:
    """The target table's Arrow schema (field order of ``schema``), for an append or overwrite."""
    wanted = _plain_schema(target.schema().as_arrow())
    missing = [n for n in schema.names if n not in wanted.names]
    if missing or len(wanted) != len(schema):
        raise InputDataError(f"the result's columns {schema.names} do not match the Iceberg table's "
                         f"{wanted.names}")
    return pa.schema([wanted.field(n) for n in schema.names])


# --------------------------------------------------------------------------- distributed writes


@dataclasses.dataclass(frozen=True)
class IcebergFiles:
    """The task side of :class:`IcebergSink`: writes one partition as a data file under the table's
    ``data/`` folder through the table's FileIO (picklable; no catalog travels to the workers)."""

    location: str
    io: object
    run_id: str

    def __call__(self, frame, number: int) -> dict | None:
        from .parquet import write_table  # looked up at call time (tests inject failures there)

        if not len(frame):
            return None
        table = frame if isinstance(frame, pa.Table) else to_arrow(frame)
        table = table.cast(_iceberg_schema(table.schema))
        path = f"{self.location.rstrip('/')}/data/datamask-{self.run_id}-{number:05d}.parquet"
        with self.io.new_output(path).create(overwrite=True) as out:
            write_table(table, out)
        return {"path": path, "rows": table.num_rows}


class IcebergSink:
    """An Iceberg table written by many tasks and committed once, by the driver, as one transaction.

    Tasks write data files (:class:`IcebergFiles`); :meth:`commit` registers them all in one snapshot
    (``add_files``: the driver reads their footers, never their rows) with the run record in its
    summary. A new table is created in the same transaction, so a failure before the commit
    leaves no table; the files of a failed run belong to no snapshot (:meth:`abort` removes them).
    """

    format = "iceberg"

    def __init__(self, catalog, identifier, *, mode: str, inputs=(), **properties):
        if mode not in ("error", "append", "overwrite"):
            raise OptionError(f"mode must be 'error', 'append' or 'overwrite', not {mode!r}")
        self.catalog = get_catalog(catalog, **properties)
        self.name, self.mode, self.inputs = _identifier(identifier), mode, list(inputs)
        self.uri = f"iceberg://{self.catalog.name}/{self.name}"
        self.check()
        if self.catalog.table_exists(self.name):
            table = self.catalog.load_table(self.name)
            self.table_location, self.io = table.location(), table.io
        else:
            namespace = self.name.rsplit(".", 1)[0] if "." in self.name else None
            if namespace:
                self.catalog.create_namespace_if_not_exists(namespace)
            # Only where the table will live: it is created, with the result's schema, by the commit.
            creating = self._create(pa.schema([pa.field("datamask", pa.bool_())]))
            self.table_location, self.io = creating.table_metadata.location, creating._table.io
        self.location = resolve(self.table_location)

    def check(self) -> None:
        for source in self.inputs:
            if source is not None and tuple(source) == (self.catalog.name, self.name):
                raise UnsafeOutputError(f"the output Iceberg table {self.name} is the input: write the "
                                        "selection to another table (the input is never modified)")
        if not self.catalog.table_exists(self.name):
            return
        # someone else's table is said before a mode is asked for, which would then be refused
        said = "" if self.mode == "error" else f"mode={self.mode!r} refused: "
        table = self.catalog.load_table(self.name)
        if table.properties.get(TABLE_MARK) != "true":
            raise UnsafeOutputError(f"{said}the Iceberg table {self.name} was not created by datamask (no "
                                    f"{TABLE_MARK} property); choose another output")
        foreign = sum(1 for r in _records(table) if r is None)
        if foreign:
            raise UnsafeOutputError(f"{said}the Iceberg table {self.name} has {foreign} snapshot(s) "
                                    "without a datamask run record; choose another output")
        if self.mode == "error":
            raise FileExistsError(f"the Iceberg table {self.name} exists; pass {WRITE_INTO_TABLE} to "
                                  "write into it (a table datamask wrote)")

    def newest_run(self) -> str | None:
        return (iceberg_record(self.catalog, self.name) or {}).get("run_id")

    def writer(self, work) -> IcebergFiles:
        return IcebergFiles(self.table_location, self.io, work.run_id)

    def holds(self, work, descriptor: dict) -> bool:
        return self.io.new_input(descriptor["path"]).exists()

    def _create(self, schema: pa.Schema):
        # the parts carry no statistics of their embeddings (parquet.write_options): none are collected
        no_metrics = {f"{METRICS_MODE}.{name}.element": "none" for name in float_lists(schema)}
        return self.catalog.create_table_transaction(self.name, schema=schema,
                                                     properties={TABLE_MARK: "true", **no_metrics})

    def commit(self, work, manifest: dict, written: list, schema: pa.Schema, record: dict) -> dict:
        from pyiceberg.expressions import AlwaysTrue

        schema = _iceberg_schema(schema)
        exists = self.catalog.table_exists(self.name)
        if exists:
            schema = _plain_target(self.catalog.load_table(self.name), schema)
        paths = [w["path"] for w in written if w]
        summary = {RECORD_KEY: dumps(record)}
        transaction = self.catalog.load_table(self.name).transaction() if exists else self._create(schema)
        if exists and self.mode == "overwrite":
            transaction.delete(AlwaysTrue(), snapshot_properties=summary)
        if paths:
            transaction.add_files(paths, snapshot_properties=summary, check_duplicate_files=False)
        else:
            transaction.append(schema.empty_table(), snapshot_properties=summary)
        transaction.commit_transaction()
        snapshot = self.catalog.load_table(self.name).current_snapshot()
        return {"snapshot_id": None if snapshot is None else snapshot.snapshot_id,
                "rows": sum(w["rows"] for w in written if w)}

    def abort(self, work) -> None:
        """Remove this run's data files (none is in a snapshot yet)."""
        with contextlib.suppress(Exception):
            data = resolve(f"{self.table_location.rstrip('/')}/data")
            for name in data.list():
                if name.startswith(f"datamask-{work.run_id}-"):
                    data.child(name).remove()
