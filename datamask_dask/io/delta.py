"""Delta Lake tables in and out (the ``deltalake`` package, ``pip install datamask-dask[lakehouse]``).

- :func:`read_delta`: a table (at a version or a timestamp: time travel) as a Dask DataFrame of
  Arrow-typed pandas partitions, one partition per data file of the snapshot, column
  projection done by the reader.
- :func:`write_delta` and :class:`DeltaSink`: one committed transaction, whose data files are
  written first (one a partition): a failure anywhere before the commit leaves the table as it
  was (the files written before it belong to no version and are removed). ``mode`` is explicit:
  ``"error"`` (default: the table may not exist), ``"append"`` or ``"overwrite"``. The run record
  goes into the commit's custom metadata (``datamask.run``). A new local table is built in a
  hidden folder and renamed into place, so a failed first write leaves nothing behind.

Safety (the rules of :mod:`datamask_dask.io.output`): an existing table is appended to or
overwritten only when every commit in its history carries a datamask run record; a directory
that is not a Delta table is never written into; the output may not be the input. An overwrite
is itself a new version: the previous one stays readable by time travel until someone vacuums.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import time
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa

from ..errors import WRITE_INTO_TABLE, InputDataError, OptionError
from .output import RECORD_KEY, UnsafeOutputError, check_inputs, publish
from .parquet import to_arrow, variable_lists
from .pieces import Pieces, to_dask
from .records import dumps, loads_record
from .storage import environment_endpoint, reach, resolve

__all__ = ["DeltaSink", "delta_pieces", "delta_record", "read_delta", "write_delta"]


def _deltalake():
    try:
        import deltalake
    except ImportError as error:  # pragma: no cover - exercised only without the extra
        raise ImportError("Delta Lake tables need the deltalake package: pip install "
                          "'datamask-dask[lakehouse]'") from error
    return deltalake


_ENDPOINT_KEYS = ("aws_endpoint_url", "aws_endpoint", "endpoint_url", "endpoint")  # deltalake's spellings
# fsspec's (s3fs's) names of the S3 settings, as deltalake names them: one storage_options for every sink
_FSSPEC_KEYS = {"key": "AWS_ACCESS_KEY_ID", "secret": "AWS_SECRET_ACCESS_KEY", "token": "AWS_SESSION_TOKEN",
                "endpoint_url": "AWS_ENDPOINT_URL", "profile": "AWS_PROFILE"}
_CLIENT_KEYS = {"region_name": "AWS_REGION", "endpoint_url": "AWS_ENDPOINT_URL"}  # of client_kwargs
_FSSPEC = {*_FSSPEC_KEYS, "client_kwargs", "config_kwargs", "anon"}
_DELTA_KEYS = {value.lower(): key for key, value in _FSSPEC_KEYS.items()} | {"aws_endpoint": "endpoint_url"}
# options the probe through fsspec can follow (any other is deltalake's own: no probe)
_PROBED = {*_FSSPEC, *_DELTA_KEYS, "aws_region", "region", "aws_allow_http", "allow_http"}


def _fsspec(storage_options: dict | None) -> dict | None:
    """``storage_options`` in fsspec's names, for the files datamask itself keeps beside a table (its
    lock, its probe): deltalake's names of the credentials, endpoint and region as s3fs takes them."""
    if storage_options is None:
        return None
    options: dict = {}
    for key, value in storage_options.items():
        if key in _FSSPEC:
            options[key] = value
        elif str(key).lower() in _DELTA_KEYS:
            options[_DELTA_KEYS[str(key).lower()]] = value
        elif str(key).lower() in ("aws_region", "region"):
            options.setdefault("client_kwargs", {})["region_name"] = value
    return options


def _reach_store(path, storage_options) -> None:
    """A table on S3 is reached through fsspec first, once where a job first meets it (its pieces, its
    record, the sink's check): its store's credentials, endpoint and bucket are then told as for parquet
    (deltalake's own errors are its credential chain's log). Options fsspec has no names for (deltalake's
    own) are left to deltalake."""
    if os.fspath(path).startswith("s3://") and {str(k).lower() for k in storage_options or {}} <= _PROBED:
        reach(resolve(path, _fsspec(storage_options)))


def _store(path, storage_options: dict | None) -> dict | None:
    """deltalake's options for the table at ``path``: fsspec's names (``key``, ``secret``,
    ``endpoint_url``, ``client_kwargs``' ``region_name``..., as the parquet sinks take them) in
    deltalake's, and an S3 endpoint given as ``http://`` (there, or the environment's
    ``AWS_ENDPOINT_URL``, which s3fs and pyarrow take as it is) allowed, where deltalake alone refuses it
    without ``AWS_ALLOW_HTTP``; an ``AWS_ALLOW_HTTP`` set anywhere stands."""
    if not os.fspath(path).startswith("s3://"):  # fsspec's names are the S3 ones here
        return storage_options
    options: dict = {}
    for key, value in (storage_options or {}).items():
        if key in _FSSPEC_KEYS:
            options[_FSSPEC_KEYS[key]] = value
        elif key == "client_kwargs":  # botocore's client: its region and endpoint
            options.update({_CLIENT_KEYS[name]: held for name, held in value.items() if name in _CLIENT_KEYS})
        elif key == "anon":
            options["AWS_SKIP_SIGNATURE"] = str(bool(value)).lower()
        elif key != "config_kwargs":  # botocore's retries and timeouts: deltalake has its own
            options[key] = value
    given = {str(key).lower(): value for key, value in options.items()}
    endpoint = next((given[key] for key in _ENDPOINT_KEYS if key in given), None) or environment_endpoint()
    if (str(endpoint or "").startswith("http://") and not {"aws_allow_http", "allow_http"} & given.keys()
            and "AWS_ALLOW_HTTP" not in os.environ):
        options["AWS_ALLOW_HTTP"] = "true"
    return options if options else storage_options


def _open(path, version=None, timestamp=None, storage_options=None, fix="change ?version= in the URI"):
    """The Delta table at ``path`` (at ``version`` or ``timestamp``); a version it lacks is refused
    saying ``fix``."""
    deltalake = _deltalake()
    from deltalake.exceptions import DeltaError, TableNotFoundError

    try:
        table = deltalake.DeltaTable(os.fspath(path), version=version,
                                     storage_options=_store(path, storage_options))
    except TableNotFoundError as error:
        raise FileNotFoundError(f"the Delta table {path} does not exist (no transaction log there): check "
                                "the URI") from error
    except DeltaError as error:
        if version is None:  # deltalake's first line says what; the rest is its Rust backtrace
            said = str(error).strip()
            reason = said.splitlines()[0] if said else type(error).__name__
            raise InputDataError(f"the Delta table {path} could not be opened: {reason}: check its "
                                 "_delta_log (the table's writer may have left it damaged)") from error
        latest = _open(path, storage_options=storage_options).version()
        raise OptionError(f"the Delta table {path} has no version {version} (its latest is {latest}): "
                          f"{fix}") from error
    if timestamp is not None:
        if version is not None:
            raise OptionError("pass version or timestamp, not both")
        moment = _moment(timestamp)
        # in ms; deltalake would read the earliest version for a time before it
        earliest = min(commit["timestamp"] for commit in table.history())
        if moment.timestamp() * 1000 < earliest:
            made = datetime.datetime.fromtimestamp(earliest / 1000, tz=datetime.UTC).isoformat()
            raise OptionError(f"the Delta table {path} has no version as of {moment.isoformat()} (its "
                              f"earliest readable one is of {made}): change ?timestamp= in the URI")
        table.load_as_version(moment)
    return table


def _moment(timestamp) -> datetime.datetime:
    """A time-travel ``timestamp``: a datetime, or ISO 8601 text (a date, ``Z`` or an offset); without a
    zone, UTC (as the commit log's times are)."""
    if isinstance(timestamp, str):
        try:
            timestamp = datetime.datetime.fromisoformat(timestamp)
        except ValueError:
            raise OptionError(f"the timestamp {timestamp!r} is not an ISO 8601 time: give one such as "
                              "2026-01-31, 2026-01-31T12:00:00Z or 2026-01-31T12:00:00+01:00") from None
    return timestamp if timestamp.tzinfo is not None else timestamp.replace(tzinfo=datetime.UTC)


def _paths(table) -> list[str]:
    actions = pa.table(table.get_add_actions(flatten=True))
    return [str(p) for p in actions.column("path").to_pylist()]


def read_delta(path, version: int | None = None, timestamp=None, columns: list[str] | None = None, *,
               storage_options: dict | None = None, since_version: int | None = None):
    """Read a Delta table as a Dask DataFrame of Arrow-typed pandas partitions.

    Parameters
    ----------
    path : str or path
        Table location (a local path or any URI deltalake takes: ``s3://``, ``az://``...).
    version : int, optional
        Read this version (time travel); the latest by default.
    timestamp : datetime or str, optional
        Read the version current at this time (RFC 3339 text or a datetime); not with ``version``.
    columns : list of str, optional
        Columns to read (the others are never read from the files).
    storage_options : dict, optional
        Passed to deltalake (credentials, endpoints).
    since_version : int, optional
        Read only the data files added after this version (incremental runs). The table must
        have only been appended to since: a file of that version that is gone now (an
        overwrite, a delete, a compaction) raises ``InputDataError``.

    Returns
    -------
    dask.dataframe.DataFrame
        One partition per data file (one empty partition for a table without files).
        :func:`~datamask_dask.io.tables.read_table` also returns the version read.
    """
    pieces = delta_pieces(path, version, timestamp, columns, storage_options=storage_options,
                          since_version=since_version)
    return to_dask(pieces, "datamask-read-delta")


def delta_pieces(path, version=None, timestamp=None, columns=None, *, storage_options=None,
                 since_version=None) -> Pieces:
    """The data files of a Delta snapshot as :class:`~.pieces.Pieces` (arguments: :func:`read_delta`)."""
    _reach_store(path, storage_options)
    table = _open(path, version, timestamp, storage_options)
    dataset = table.to_pyarrow_dataset()
    fragments = list(dataset.get_fragments())
    if since_version is not None:
        old = set(_paths(_open(path, since_version, None, storage_options,
                               "run without --incremental (since=) to read the whole table")))
        now = {f.path for f in fragments}
        gone = old - now
        if gone:
            raise InputDataError(f"the Delta table {path} lost {len(gone)} data file(s) of version "
                             f"{since_version} since (an overwrite, delete or compaction): an "
                             "incremental run needs a table that was only appended to; run on the "
                             "whole table instead")
        fragments = [f for f in fragments if f.path not in old]
    fragments.sort(key=lambda f: f.path)
    pieces = Pieces(dataset.schema, fragments, FragmentReader(dataset.schema),
                    {"format": "delta", "uri": os.fspath(path), "version": table.version(),
                     "files": len(fragments)}, _file_rows(table, fragments))
    return pieces if columns is None else pieces.select(columns)


def _file_rows(table, fragments: list) -> list[int] | None:
    """Each data file's rows, as the log's file statistics state them (None where one lacks them). The
    log holds a file's path URL-encoded."""
    actions = pa.table(table.get_add_actions(flatten=True)).select(["path", "num_records"]).to_pylist()
    records = {unquote(action["path"]): action["num_records"] for action in actions}
    rows = [records.get(fragment.path) for fragment in fragments]
    return None if None in rows else [int(n) for n in rows]


class FragmentReader:
    """Reads a data file of :func:`delta_pieces` (partition columns filled in by the dataset)."""

    def __init__(self, schema: pa.Schema):
        self.schema = schema

    def __call__(self, fragment, columns: list[str]) -> pa.Table:
        schema = pa.schema([self.schema.field(c) for c in columns])
        table = fragment.to_table(schema=self.schema, columns=columns)
        return table.cast(schema) if not table.schema.equals(schema) else table


# --------------------------------------------------------------------------- writing


def delta_history_records(path, storage_options=None) -> list[dict | None]:
    """The datamask run record of every commit, newest first (None where a commit has none)."""
    table = _open(path, storage_options=storage_options)
    return [loads_record(commit.get(RECORD_KEY)) for commit in table.history()]


def delta_record(path, storage_options=None) -> dict | None:
    """The run record of the newest datamask commit of a Delta table, or None."""
    deltalake = _deltalake()
    _reach_store(path, storage_options)
    if not deltalake.DeltaTable.is_deltatable(os.fspath(path), storage_options=_store(path, storage_options)):
        return None
    return next((r for r in delta_history_records(path, storage_options) if r), None)


def write_delta(data, path, *, mode: str = "error", record: dict | None = None, inputs=(),
                storage_options: dict | None = None, scheduler=None) -> dict:
    """Write a result (usually a selection) as one committed Delta transaction (:class:`DeltaSink`).

    Parameters
    ----------
    data : dask.dataframe.DataFrame, pandas.DataFrame, pyarrow.Table or pyarrow.RecordBatchReader
        A Dask DataFrame's partitions are written by their own tasks (computed on ``scheduler``),
        each a data file; the others are read whole first.
    mode : {"error", "append", "overwrite"}
        ``"error"``: the table ``path`` may not exist yet. ``"append"`` / ``"overwrite"``: it may
        exist only as a table datamask wrote (every commit carries a run record).
    record : dict, optional
        The run record, stored as JSON under ``datamask.run`` in the commit's custom metadata.
    inputs : iterable of str
        Input locations the output may not be.

    Returns
    -------
    dict
        ``version``: the version committed; ``rows``: rows written.
    """
    from .sinks import write_output

    sink = DeltaSink(path, mode=mode, inputs=inputs, storage_options=storage_options)
    return write_output(sink, data, record or {}, scheduler=scheduler)


# --------------------------------------------------------------------------- distributed writes


@dataclasses.dataclass(frozen=True)
class DeltaFiles:
    """The task side of :class:`DeltaSink`: one partition as a data file of the table, written through
    deltalake's own storage layer (so the table's ``storage_options`` apply)."""

    root: str  # the table, or the work area's copy of a new local table
    run_id: str
    storage_options: dict | None = None

    def filesystem(self):
        from deltalake.fs import DeltaStorageHandler
        from pyarrow import fs

        if "://" not in self.root:
            os.makedirs(self.root, exist_ok=True)
        return fs.PyFileSystem(DeltaStorageHandler(self.root, _store(self.root, self.storage_options)))

    def __call__(self, frame, number: int) -> dict | None:
        """Write one partition's rows as a data file; its add-action fields (None for no rows)."""
        from .parquet import write_table  # looked up at call time (tests inject failures there)

        if not len(frame):
            return None
        table = frame if isinstance(frame, pa.Table) else to_arrow(frame)
        table = table.cast(variable_lists(table.schema))
        name = f"part-{number:05d}-{self.run_id}.parquet"
        filesystem = self.filesystem()
        with filesystem.open_output_stream(name) as out:
            write_table(table, out)
        return {"path": name, "size": filesystem.get_file_info(name).size, "rows": table.num_rows,
                "modification_time": int(time.time() * 1000)}


class DeltaSink:
    """A Delta table written by many tasks and committed once, by the driver (see the module notes).

    Each task writes its partition as a data file of the table (:class:`DeltaFiles`) and hands back
    a small descriptor; :meth:`commit` adds them all in one commit with the run record, so the driver
    holds only file names and sizes, never the rows. A commit is recognised by the run's app id, so
    a run that committed but died before it cleaned up does not commit twice.
    """

    format = "delta"

    def __init__(self, path, *, mode: str, inputs=(), storage_options=None):
        if mode not in ("error", "append", "overwrite"):
            raise OptionError(f"mode must be 'error', 'append' or 'overwrite', not {mode!r}")
        self.uri = os.fspath(path)
        self.location = resolve(self.uri, _fsspec(storage_options))
        self.mode, self.inputs, self.storage_options = mode, list(inputs), storage_options

    def check(self) -> None:
        location = self.uri
        for source in self.inputs:
            if source is not None and str(source).rstrip("/") == location.rstrip("/"):
                raise UnsafeOutputError(f"the output Delta table {location} is the input: write the "
                                        "selection to another table (the input is never modified)")
        check_inputs(self.location, [source for source in self.inputs if source is not None])
        _reach_store(location, self.storage_options)
        options = _store(location, self.storage_options)
        if not _deltalake().DeltaTable.is_deltatable(location, storage_options=options):
            # On local disk only: on a store, an interrupted first run's files sit at the table's prefix
            target = self.location
            if target.local and target.exists() and (not target.isdir() or target.list()):
                raise UnsafeOutputError(f"{location} exists and is not a Delta table: datamask writes a "
                                        "Delta output only into a new location or a Delta table it wrote")
            return
        foreign = sum(1 for r in delta_history_records(location, self.storage_options) if r is None)
        if foreign:  # said before a mode is asked for, which would then be refused
            said = "" if self.mode == "error" else f"mode={self.mode!r} refused: "
            raise UnsafeOutputError(f"{said}the Delta table {location} has {foreign} commit(s) without a "
                                    "datamask run record (someone else's table); choose another output")
        if self.mode == "error":
            raise FileExistsError(f"the Delta table {location} exists; pass {WRITE_INTO_TABLE} to write "
                                  "into it (a table datamask wrote)")

    def newest_run(self) -> str | None:
        return (delta_record(self.uri, self.storage_options) or {}).get("run_id")

    def _root(self, work) -> str:
        """Where the files go: the table, or for a new local table the work area (Delta's log holds
        relative paths, so the finished table is renamed into place whole)."""
        if self.location.local and not self.location.exists():
            return work.child("table").path
        return self.uri

    def writer(self, work) -> DeltaFiles:
        return DeltaFiles(self._root(work), work.run_id, self.storage_options)

    def holds(self, work, descriptor: dict) -> bool:
        from pyarrow import fs

        info = self.writer(work).filesystem().get_file_info(descriptor["path"])
        return info.type == fs.FileType.File and info.size == descriptor["size"]

    def commit(self, work, manifest: dict, written: list, schema: pa.Schema, record: dict) -> dict:
        """Commit the files in one transaction (a commit of this run already made is not made again)."""
        deltalake = _deltalake()
        from deltalake.transaction import AddAction

        root = self._root(work)
        actions = [AddAction(w["path"], w["size"], {}, w["modification_time"], True,
                             json.dumps({"numRecords": w["rows"]})) for w in written if w]
        app = deltalake.Transaction(app_id=f"datamask-{work.run_id}", version=1)
        properties = deltalake.CommitProperties(custom_metadata={RECORD_KEY: dumps(record)},
                                                app_transactions=[app])
        schema = variable_lists(schema)
        if deltalake.DeltaTable.is_deltatable(root, storage_options=_store(root, self.storage_options)):
            table = _open(root, storage_options=self.storage_options)
            if (table.transaction_version(app.app_id) or 0) < app.version:  # not committed already
                table.create_write_transaction(actions, self.mode, schema, commit_properties=properties)
        else:
            from deltalake.transaction import create_table_with_add_actions

            create_table_with_add_actions(root, deltalake.Schema.from_arrow(schema), actions, mode="error",
                                          storage_options=_store(root, self.storage_options),
                                          commit_properties=properties)
        if root != self.uri:
            publish(Path(root), Path(self.location.path))
        return {"version": _open(self.uri, storage_options=self.storage_options).version(),
                "rows": sum(w["rows"] for w in written if w)}

    def abort(self, work) -> None:
        """Remove this run's data files from an existing table (none is part of a version yet)."""
        if self._root(work) != self.uri:
            return  # a new table's files are in the work area
        with contextlib.suppress(Exception):
            from pyarrow import fs

            filesystem = self.writer(work).filesystem()
            for info in filesystem.get_file_info(fs.FileSelector("", recursive=False)):
                if info.base_name.endswith(f"-{work.run_id}.parquet"):
                    filesystem.delete_file(info.path)
