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
- :func:`selection_columns`: the selection-only output (id, selected, optional score, run id),
  which joins back to the source on the id.
- :func:`select_table`: read, select, write, with an optional incremental run: only the rows
  added to the source since the snapshot the output's last run recorded are selected (under the
  same ratio), and appended; earlier selections are kept as they are.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
import uuid
from pathlib import Path
from urllib.parse import parse_qs

import dask
import pyarrow as pa

from .. import progress as progress_bars
from .. import telemetry
from ..errors import OptionError
from ..partition import adapters
from ..plan.types import Plan
from ._lake import compute_arrow, lake_versions
from .output import RUN_RECORD, check_target, output_lock, publish, read_record, remove_own, staging_path
from .parquet import to_arrow
from .pieces import Pieces, to_dask
from .records import as_json, dumps
from .storage import Location, resolve
from .summary import SAMPLE_ROWS, signature_share, summarise_table_run, table_part_summary

__all__ = ["ParquetSink", "TableInput", "TableRunReport", "TableURI", "parse_table_uri", "read_table",
           "select_table", "selection_columns", "table_pieces", "table_record", "table_sink",
           "write_table_output"]

log = logging.getLogger(__name__)

OUTPUT_COLUMNS = ("all", "selection")
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
    text = os.fspath(uri)
    base, _, query = text.partition("?") if text.startswith(("delta", "iceberg://")) else (text, "", "")
    params = {k: v[-1] for k, v in parse_qs(query).items()}
    unknown = set(params) - {"version", "timestamp", "snapshot_id"}
    if unknown:
        raise OptionError(f"unknown option(s) {sorted(unknown)} in the table URI {text}")
    if base.startswith("delta://"):
        location = base[len("delta://"):]
        if not location.startswith("/"):
            raise OptionError(f"a local Delta table URI is delta:///absolute/path (three slashes), "
                              f"not {text}")
        return TableURI(text, "delta", location, version=_int(params.get("version")),
                        timestamp=params.get("timestamp"))
    if base.startswith("delta+"):
        return TableURI(text, "delta", base[len("delta+"):], version=_int(params.get("version")),
                        timestamp=params.get("timestamp"))
    if base.startswith("iceberg://"):
        catalog, _, identifier = base[len("iceberg://"):].partition("/")
        if not catalog or "." not in identifier:
            raise OptionError(f"an Iceberg table URI is iceberg://CATALOG/namespace.table, not {text}")
        return TableURI(text, "iceberg", identifier, catalog=catalog,
                        snapshot_id=_int(params.get("snapshot_id")))
    if "://" in base and not base.startswith("file://"):
        return TableURI(text, "parquet", base)
    return TableURI(text, "parquet", base.removeprefix("file://"))


def _int(value):
    return None if value is None else int(value)


@dataclasses.dataclass(frozen=True)
class TableInput:
    """What :func:`read_table` read: the frame, the table, and the snapshot (``version``)."""

    frame: object
    table: TableURI
    version: int | None  # Delta version or Iceberg snapshot id; None for parquet (or an empty table)
    since: int | None = None
    files: int | None = None  # data files (partitions) read

    def describe(self) -> dict:
        return {"uri": self.table.uri, "format": self.table.format, "version": self.version,
                "since": self.since}


def read_table(uri, *, columns=None, row_filter=None, since=None, catalog_properties=None,
               storage_options=None) -> TableInput:
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
    """
    table = uri if isinstance(uri, TableURI) else parse_table_uri(uri)
    pieces = table_pieces(table, columns=columns, row_filter=row_filter, since=since,
                          catalog_properties=catalog_properties, storage_options=storage_options)
    frame = to_dask(pieces, f"datamask-read-{table.format}")
    version = pieces.source.get("version", pieces.source.get("snapshot_id"))
    return TableInput(frame, table, version, since, len(pieces))


def table_pieces(uri, *, columns=None, row_filter=None, since=None, catalog_properties=None,
                 storage_options=None) -> Pieces:
    """A table URI's partitions as :class:`~.pieces.Pieces` (arguments: :func:`read_table`), for
    engines that read each piece in their own tasks (Dask, ``datamask_spark.files``)."""
    table = uri if isinstance(uri, TableURI) else parse_table_uri(uri)
    if table.format == "delta":
        from .delta import delta_pieces

        return delta_pieces(table.location, table.version, table.timestamp, columns,
                            storage_options=storage_options, since_version=since)
    if table.format == "iceberg":
        from .iceberg import iceberg_pieces

        return iceberg_pieces(table.catalog, table.location, table.snapshot_id, columns, row_filter,
                              since_snapshot_id=since, **(catalog_properties or {}))
    if row_filter is not None or since is not None:
        raise OptionError("row filters and incremental runs need a Delta or Iceberg input, not parquet")
    from .parquet import parquet_pieces

    pieces = parquet_pieces(table.location, storage_options=storage_options)
    return pieces if columns is None else pieces.select(columns)


def selection_columns(ddf, run_id: str, *, id_column="chunk_id", selected_column="selected",
                      score_column=None, explain=False):
    """The selection-only result: id, selected, the score if there is one, the explain columns if
    asked, and the run id."""
    from ..partition.explain import COLUMNS

    names = [id_column, selected_column] + ([score_column] if score_column else [])
    names += list(COLUMNS) if explain else []
    frame = ddf[names]
    return frame.assign(**{RUN_ID_COLUMN: run_id}).astype({RUN_ID_COLUMN: "string[pyarrow]"})


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


def write_table_output(data, uri, *, mode: str = "error", record: dict | None = None, inputs=(),
                       catalog_properties=None, storage_options=None, scheduler=None) -> dict:
    """Write a result to a table URI, all or nothing, with its run record.

    Parameters
    ----------
    data : dask.dataframe.DataFrame, pandas.DataFrame or pyarrow.Table
        Computed completely before anything is written.
    uri : str or path or TableURI
        Parquet directory, ``delta://...`` or ``iceberg://...``.
    mode : {"error", "append", "overwrite"}
        ``"append"`` for Delta and Iceberg only. Existing outputs are written into only when
        datamask wrote them (:mod:`datamask_dask.io.output`).
    record : dict, optional
        The run record.
    inputs : iterable of str or TableURI
        The job's inputs: the output may not be one of them.

    Returns
    -------
    dict
        ``rows`` and, for tables, ``version`` (Delta) or ``snapshot_id`` (Iceberg).
    """
    table = uri if isinstance(uri, TableURI) else parse_table_uri(uri)
    sources = _other_than(table, inputs)
    if table.format == "delta":
        from .delta import write_delta

        return write_delta(data, table.location, mode=mode, record=record, storage_options=storage_options,
                           inputs=[s.location for s in sources if s.format != "iceberg"], scheduler=scheduler)
    if table.format == "iceberg":
        from .iceberg import write_iceberg

        return write_iceberg(data, table.catalog, table.location, mode=mode, record=record,
                             inputs=[(s.catalog, s.location) for s in sources if s.format == "iceberg"],
                             scheduler=scheduler, **(catalog_properties or {}))
    if mode == "append":
        raise OptionError("mode='append' needs a Delta or Iceberg output; a parquet output is written whole")
    return _write_parquet_dir(data, resolve(table.location, storage_options), overwrite=mode == "overwrite",
                              record=record, inputs=[s.location for s in sources if s.format == "parquet"],
                              scheduler=scheduler)


def _write_parquet_dir(data, target: Location, *, overwrite: bool, record, inputs, scheduler) -> dict:
    """One ``part.0.parquet`` and the run record, published by the rules of :mod:`.output`."""
    from .output import publish_objects
    from .parquet import write_table
    from .writer import _fsync_dir, _write_atomic

    check_target(target, overwrite=overwrite, inputs=inputs)
    result = compute_arrow(data, scheduler=scheduler)  # before the lock: a failing selection writes nothing
    if not target.local:
        def write() -> None:
            with target.child("part.0.parquet").open_write() as handle:
                write_table(result, handle)

        with output_lock(target):
            check_target(target, overwrite=overwrite, inputs=inputs)
            publish_objects(target, ["part.0.parquet"], write, record or {}, default=str)
        return {"rows": result.num_rows}
    target = Path(target.path)
    with output_lock(target):
        check_target(target, overwrite=overwrite, inputs=inputs)
        staging = staging_path(target)
        try:
            staging.mkdir()
            _write_atomic(staging / "part.0.parquet", lambda handle: write_table(result, handle))
            _write_atomic(staging / RUN_RECORD, lambda handle: handle.write(
                dumps({**(record or {}), "files": ["part.0.parquet"]}, indent=1).encode()))
            publish(staging, target)
            _fsync_dir(target.parent)
        finally:
            remove_own(staging)
    return {"rows": result.num_rows}


def _other_than(target: TableURI, inputs) -> list[TableURI]:
    """``inputs`` as table URIs; refuses an output that is one of them."""
    sources = [s if isinstance(s, TableURI) else parse_table_uri(s) for s in inputs if s is not None]
    for source in sources:
        if source.key == target.key:
            from .output import UnsafeOutputError

            raise UnsafeOutputError(f"the output {target.uri} is the input {source.uri}: write the selection "
                                    "elsewhere (the input is never modified)")
    return sources


def table_sink(target: TableURI, *, mode: str, run_id: str, schema: pa.Schema, inputs=(),
               catalog_properties=None, storage_options=None):
    """Where the tasks of a table run write their partitions, and how the driver commits them.

    A sink has ``writer(table, number) -> descriptor`` (picklable: each task calls it with its
    partition's Arrow table), ``commit(descriptors, schema, record) -> dict`` (the driver: one
    transaction, metadata only) and ``abort()`` (a failure before the commit: remove the files).
    The target is checked here, before anything is computed (the rules of :mod:`.output`).
    """
    sources = _other_than(target, inputs)
    if target.format == "delta":
        from .delta import DeltaSink

        return DeltaSink.open(target.location, mode=mode, run_id=run_id, storage_options=storage_options,
                              inputs=[s.location for s in sources if s.format != "iceberg"])
    if target.format == "iceberg":
        from .iceberg import IcebergSink

        return IcebergSink(target.catalog, target.location, mode=mode, run_id=run_id, schema=schema,
                           inputs=[(s.catalog, s.location) for s in sources if s.format == "iceberg"],
                           **(catalog_properties or {}))
    if mode == "append":
        raise OptionError("mode='append' needs a Delta or Iceberg output; a parquet output is written whole")
    return ParquetSink(resolve(target.location, storage_options), overwrite=mode == "overwrite",
                       run_id=run_id, inputs=[s.location for s in sources if s.format == "parquet"])


@dataclasses.dataclass(frozen=True)
class ParquetParts:
    """The task side of :class:`ParquetSink`: partition N as ``part.N.parquet`` in the run's work folder."""

    work: Location

    def __call__(self, table: pa.Table, number: int) -> dict | None:
        from .parquet import write_table

        if not table.num_rows:
            return None
        part = self.work.child(f"part.{number}.parquet")
        with part.open_write() as handle:
            write_table(table, handle)
        return {"name": part.name, "rows": table.num_rows}


class ParquetSink:
    """A parquet directory written by many tasks and published whole (the rules of :mod:`.output`):
    parts go to a hidden sibling, then are renamed into place (local disk) or copied in with the run
    record last (object stores, :func:`~.output.publish_objects`)."""

    def __init__(self, target: Location, *, overwrite: bool, run_id: str, inputs=()):
        self.target, self.overwrite, self.inputs = target, overwrite, list(inputs)
        check_target(target, overwrite=overwrite, inputs=self.inputs)
        self.work = target.sibling(f".{target.name}.datamask-{run_id}")
        self.writer = ParquetParts(self.work)

    def markers(self, run_id: str) -> Location:
        """Where the completion markers of run ``run_id`` live (:class:`RunMarkers`)."""
        return self.target.sibling(f".{self.target.name}.datamask-markers-{run_id}")

    def commit(self, written: list, schema: pa.Schema, record: dict) -> dict:
        from .output import publish_objects
        from .parquet import write_table

        names = [w["name"] for w in written if w] or ["part.0.parquet"]
        if not any(written):  # an empty table still gets its schema
            with self.work.child(names[0]).open_write() as handle:
                write_table(schema.empty_table(), handle)
        with output_lock(self.target):
            check_target(self.target, overwrite=self.overwrite, inputs=self.inputs)
            if self.target.local:
                text = dumps({**(record or {}), "files": names}, indent=1)
                self.work.child(RUN_RECORD).write_bytes(text.encode())
                publish(Path(self.work.path), Path(self.target.path))
            else:
                def copy() -> None:
                    for name in names:
                        self.work.child(name).copy_to(self.target.child(name))

                publish_objects(self.target, names, copy, record or {}, default=str)
        self.work.remove()
        return {"rows": sum(w["rows"] for w in written if w)}

    def abort(self) -> None:
        self.work.remove()


# --------------------------------------------------------------------------- one run


@dataclasses.dataclass(frozen=True)
class TableRunReport:
    """Outcome of :func:`select_table`: the output written, what was read, the run record."""

    output: str
    rows: int
    selected: int
    run_id: str
    source: dict
    written: dict
    record: dict
    seconds: float


def select_table(input_uri, output_uri, ratio=None, *, output_columns: str = "all", mode: str = "error",
                 incremental: bool = False, config=None, scheduler=None, row_filter=None,
                 catalog_properties=None, storage_options=None, progress: bool | None = None,
                 summary_rows: int = SAMPLE_ROWS, resume: bool = True, **options) -> TableRunReport:
    """Read a table URI, select (:func:`~datamask_dask.datamask_select`), write to a table URI.

    The run record, with its summary (see :mod:`datamask_dask.io.summary`), goes into the
    output: the commit's metadata (Delta), the snapshot's summary (Iceberg), or
    ``_datamask_run.json`` (parquet).

    Parameters
    ----------
    input_uri, output_uri : str or path
        Table URIs (see the module notes).
    ratio, config, **options
        As for :func:`~datamask_dask.datamask_select`.
    output_columns : {"all", "selection"}
        Every column plus ``selected`` (and the score), or the selection table only: id,
        ``selected``, the score column if asked, ``run_id``.
    mode : {"error", "append", "overwrite"}
        How the output is written (see :func:`write_table_output`).
    incremental : bool
        Select only among the rows added to the input (Delta or Iceberg, appended to only)
        since the version/snapshot recorded by the output's newest run, and append them to the
        output; earlier selections stay as they are. With no earlier run, the whole input is
        selected (and written with ``mode``). With no new rows nothing is written.
    row_filter : str, optional
        Iceberg input only: rows to consider, pushed down.
    progress : bool, optional
        Progress bar on stderr (see :mod:`datamask_dask.progress`); by default only where watched.
    summary_rows : int
        Rows sampled (stratified by partition) for the run summary's comparison with quality
        top-k and random; 0 skips it.
    resume : bool
        Reuse the partitions an interrupted run of the same job wrote (same input, options and
        output, the output unchanged since): their data files, not yet committed, and completion
        markers are kept when a run fails. ``False`` computes every partition again.
    catalog_properties, storage_options : dict, optional
        Iceberg catalog properties; the storage options of the input and output (fsspec's for
        parquet paths, deltalake's for Delta tables).

    Returns
    -------
    TableRunReport
    """
    from ..config import load_config
    from ..dask_engine.operator import apply_plan, column_reads, compute_plan, partitions, selection_spec

    start = time.perf_counter()
    if output_columns not in OUTPUT_COLUMNS:
        raise OptionError(f"output_columns must be one of {OUTPUT_COLUMNS}, not {output_columns!r}")
    source_uri, target = parse_table_uri(input_uri), parse_table_uri(output_uri)
    since, previous = None, None
    if incremental:
        if source_uri.format == "parquet":
            raise OptionError("an incremental run needs a Delta or Iceberg input (it is keyed on their "
                             "versions)")
        previous = table_record(target, catalog_properties=catalog_properties,
                                storage_options=storage_options)
        if previous is not None:
            seen = previous.get("input", {})
            if seen.get("table") != list(source_uri.key):
                raise OptionError(f"the output {target.uri} was made from {seen.get('uri')}, not "
                                 f"{source_uri.uri}: an incremental run continues the runs of the same input")
            if mode == "overwrite":
                raise OptionError("an incremental run appends to its output; mode='overwrite' would drop the "
                                 "earlier selections (run without incremental to select the whole input "
                                 "again)")
            since = seen.get("version")
            mode = "append"
            if ratio is None and not options and config is None:
                ratio = previous.get("settings", {}).get("ratio")
    source = read_table(source_uri, row_filter=row_filter, since=since, catalog_properties=catalog_properties,
                        storage_options=storage_options)
    settings = load_config(config, ratio=ratio, backend=adapters.backend(source.frame._meta), **options)
    if since is not None and not source.files:  # nothing added since the last run: nothing to write
        return TableRunReport(target.uri, 0, 0, uuid.uuid4().hex, source.describe(), {}, {},
                              time.perf_counter() - start)
    spec = selection_spec(source.frame, ratio, config=config, scheduler=scheduler, **options)
    plan = compute_plan(source.frame, spec, scheduler=scheduler, progress=progress)  # validates the input
    planned = time.perf_counter()
    # The run's id: the same job on the same input over the same output state resumes (and its
    # commit is recognised if it already happened); any other is a new run.
    newest = table_record(target, catalog_properties=catalog_properties, storage_options=storage_options)
    run_id = _run_key(plan, settings, target, mode, output_columns, (newest or {}).get("run_id"))
    record = {"format": 1, "tool": "datamask-dask", "kind": "selection", "run_id": run_id,
              "input": {**source.describe(), "table": list(source_uri.key), "row_filter": row_filter},
              "output": {"uri": target.uri, "columns": output_columns, "mode": mode},
              "incremental": {"since": since, "previous_run": previous.get("run_id")} if previous else None,
              "settings": settings, "seed": settings.get("seed"), "profile": settings.get("profile"),
              "versions": lake_versions()}
    meta = apply_plan(source.frame, spec, plan)._meta
    columns = None
    if output_columns == "selection":
        columns = {"id_column": spec.id_column, "selected_column": spec.selected_column,
                   "score_column": spec.score_column, "explain": spec.explain}
        meta = selection_columns(meta, run_id, **columns)
    # Each task writes its partition's file and a completion marker; the driver commits the files'
    # names in one transaction.
    schema = to_arrow(meta).schema
    sink = table_sink(target, mode=mode, run_id=run_id, schema=schema, inputs=[source_uri],
                      catalog_properties=catalog_properties, storage_options=storage_options)
    markers = RunMarkers(sink.markers(run_id))
    if newest is not None:  # markers its run could not remove after committing: it is complete
        sink.markers(newest.get("run_id")).remove()
    parts = partitions(source.frame)
    if columns is not None:  # the select pass reads what it uses: no text column to decode for nothing
        used = [spec.id_column, *spec.select_columns]
        used += [spec.token_column] if spec.token_column in source.frame.columns else []  # for the summary
        parts = column_reads(source.frame, list(dict.fromkeys(used)), "datamask-read")
    done = markers.read(len(parts)) if resume else {}
    todo = [number for number in range(len(parts)) if number not in done]
    log.info("planned %s: %d rows in %d partitions (%.1f s)", target.uri, sum(plan.rows), len(parts),
             planned - start)
    if done:
        log.info("resuming the unfinished run on %s: %d finished partition(s) reused, %d to compute",
                 target.uri, len(done), len(todo))
    per_part = math.ceil(summary_rows / max(len(parts), 1))
    seed = int(settings.get("seed") or 0)
    plan_node = dask.delayed(plan, traverse=False, name=f"datamask-plan-{run_id}")
    tasks = [dask.delayed(_select_part, pure=True)(parts[number], plan_node, number, spec, columns, run_id,
                                                   per_part, seed, sink.writer, markers,
                                                   dask_key_name=f"datamask-select-{run_id}-{number}")
             for number in todo]
    try:
        outputs = progress_bars.compute(*tasks, scheduler=scheduler, progress=progress)
    except BaseException:
        if not markers.any():  # nothing finished: nothing to resume
            sink.abort()
        raise
    written_at = time.perf_counter()
    results = {**done, **{number: output for number, output in zip(todo, outputs, strict=True)}}
    files = [results[number][0] for number in range(len(parts))]
    parts = [results[number][1] for number in range(len(parts))]
    rows, selected = sum(p["rows"] for p in parts), sum(p["selected"] for p in parts)
    summary = summarise_table_run(parts, settings, spec, sample_rows=summary_rows, seed=seed)
    record.update(rows=rows, selected=selected, finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                  partitions=[{k: p[k] for k in ("partition", "rows", "selected")} for p in parts],
                  stages=telemetry.add_up([plan.stages, *(p.pop("stages") for p in parts)]),
                  summary=summary, reused=sorted(done),
                  phases={"plan": planned - start, "select and write": written_at - planned,
                          "summary": time.perf_counter() - written_at})
    record = as_json(record)
    written = sink.commit(files, schema, record)
    markers.clear()
    log.info("committed %s (%s): %d rows, %d selected (%.1f s in all)", target.uri, target.format, rows,
             selected, time.perf_counter() - start)
    return TableRunReport(target.uri, rows, selected, run_id, source.describe(), written, record,
                          time.perf_counter() - start)


def _run_key(plan: Plan, settings: dict, target: TableURI, mode: str, output_columns: str, newest) -> str:
    """A table run's id: its plan (the input's content digests, quotas), settings, output and the
    output's newest datamask run before it."""
    import hashlib

    identity = dumps({"digests": list(plan.digests), "cells": plan.identity()["cells"],
                      "ranges": dict(plan.ranges), "settings": settings, "output": target.uri,
                      "mode": mode, "columns": output_columns, "after": newest})
    return hashlib.blake2b(identity.encode(), digest_size=16).hexdigest()


class RunMarkers:
    """Completion markers of a table run's partitions, so an interrupted run resumes.

    A task writes ``part-N.json`` (its file's descriptor and its part of the run summary) and
    ``part-N.sample.parquet`` (its rows sampled for the summary) after its data file; the next run of
    the same job reads them and computes only the other partitions. Cleared once committed.
    """

    def __init__(self, location: Location):
        self.location = location

    def write(self, number: int, written, part: dict) -> None:
        from .parquet import write_table

        sample = part.pop("sample")
        with self.location.child(f"part-{number}.sample.parquet").open_write() as handle:
            write_table(to_arrow(sample), handle)
        marker = dumps({"written": written, "part": part}).encode()
        self.location.child(f"part-{number}.json").write_bytes(marker)
        part["sample"] = sample

    def read(self, count: int) -> dict:
        """``{partition: (written, part)}`` of the finished partitions."""
        import json

        import pandas as pd
        import pyarrow.parquet as pq

        present, done = set(self.location.list()), {}
        for number in range(count):
            if f"part-{number}.json" not in present or f"part-{number}.sample.parquet" not in present:
                continue
            try:
                marker = json.loads(self.location.child(f"part-{number}.json").read_bytes())
                sample = self.location.child(f"part-{number}.sample.parquet")
                table = pq.read_table(sample.path, filesystem=None if sample.local else sample.fs)
            except (OSError, ValueError):
                continue
            part = marker["part"]
            part["sample"] = table.to_pandas(types_mapper=pd.ArrowDtype, ignore_metadata=True)
            done[number] = (marker["written"], part)
        return done

    def any(self) -> bool:
        return any(name.endswith(".json") for name in self.location.list())

    def clear(self) -> None:
        self.location.remove()


def _select_part(frame, plan: Plan, number: int, spec, columns: dict | None, run_id: str, sample_rows: int,
                 seed: int, write, markers: RunMarkers):
    """One partition of a table run, in one task: selected, written by ``write`` (a sink's writer),
    and its part of the summary. Returns what ``write`` returned (the file's descriptor) and the part.

    One task, so the learning curves and stage seconds its learner left on this thread are its own.
    """
    from ..partition.select import select_partition

    out = select_partition(frame, plan, {"number": number})
    part = table_part_summary(out, number, spec, sample_rows, seed, signature_share(plan))
    part["stages"] = telemetry.take()
    if columns is not None:
        out = selection_columns(out, run_id, **columns)
    with telemetry.timed("write"):
        written = write(to_arrow(out), number)
        markers.write(number, written, part)
    return written, part
