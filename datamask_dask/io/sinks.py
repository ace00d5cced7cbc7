"""Sinks: where a run's tasks write their partitions, and how the driver commits them as one output.

Every sink has the same four parts, which :func:`datamask_dask.run.protocol.execute` drives:

- ``writer(work) -> write``: what each task calls, ``write(frame, number) -> descriptor`` (picklable;
  ``frame`` a pandas or cuDF frame or an Arrow table, ``descriptor`` small JSON data naming the
  partition's data, None for no rows);
- ``holds(work, descriptor) -> bool``: whether that data is still there, whole (a resumed run
  reuses the partition only then);
- ``commit(work, manifest, descriptors, schema, record) -> dict``: the driver publishes every
  partition's data in partition order, with the run record, all or nothing;
- ``abort(work)``: a run that failed before any partition finished removes what its tasks wrote
  outside the work area.

``location`` is where the output lives (its lock and its work area are hidden siblings of it),
``check()`` refuses an output that would lose data (:mod:`.output`) and ``newest_run()`` is the run
id of the newest datamask run that wrote it. Sinks: :class:`ParquetSink` (a directory or a single
file, on local disk or an object store), :class:`~.delta.DeltaSink`, :class:`~.iceberg.IcebergSink`.

A finished result (no selection) goes through the same sinks with :func:`write_output`:
:func:`write_parquet`, :func:`~.delta.write_delta`, :func:`~.iceberg.write_iceberg` and
:func:`~.tables.write_table_output` are its callers.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import uuid
from pathlib import Path

import dask
import pyarrow as pa

from ..partition.adapters import is_cudf
from .commit_journal import begin_commit
from .output import (
    FOOTER_KEY,
    RUN_RECORD,
    UnsafeOutputError,
    check_target,
    output_lock,
    publish,
    read_record,
    staging_path,
)
from .parquet import concatenate, parquet_file, to_arrow, write_table
from .records import dumps
from .staging import Staging, part_stem
from .storage import Location, fsync, resolve


def write_output(sink, data, record: dict, *, scheduler=None, key: str | None = None,
                 rows: list[int] | None = None, progress: bool | None = None, announce=None,
                 name: str | None = None) -> dict:
    """Write ``data`` through ``sink`` and commit it with ``record``, all or nothing, under the
    output's lock: how the package writes a finished result (``write_parquet``, ``write_delta``,
    ``write_iceberg``, ``write_table_output``). A selection run is :func:`datamask_dask.run.protocol.execute`.

    ``data``: a Dask DataFrame, whose partitions are written by their own tasks, in parallel and
    never gathered; or a pandas frame, an Arrow table or a record batch reader, read whole.

    ``key``: a stable name for the staging folder, which then outlives a failed or interrupted
    write: a rerun with the same key reuses the parts it holds (a sink with ``finished_part``, whole
    as parts are written atomically, and of the expected row count) and computes only the others.
    It must change with anything that changes the output (input, options). ``rows``: each
    partition's row count, for the reuse check and for :func:`datamask_dask.progress.compute_parts`'s
    parts, rows/s and time left (shown as ``progress`` says; ``name`` starts its log lines).
    ``announce(message)`` hears of a resume.
    """
    if hasattr(data, "to_delayed"):
        parts, schema = data.to_delayed(), to_arrow(data._meta).schema
    else:
        parts = [data.read_all() if isinstance(data, pa.RecordBatchReader) else to_arrow(data)]
        schema = parts[0].schema
    if rows is not None and len(rows) != len(parts):
        raise ValueError(f"rows: {len(rows)} counts for {len(parts)} partitions")
    sink.check()
    with output_lock(sink.location):
        sink.check()  # as it is now that we hold the lock
        run_id = key or uuid.uuid4().hex
        staging = Staging(sink.location.sibling(f"{_staging_prefix(sink.location)}{run_id}"), run_id)
        written: list = [None] * len(parts)
        finished_part = getattr(sink, "finished_part", None) if key else None
        if finished_part is not None:
            for number in range(len(parts)):
                written[number] = finished_part(staging, number, None if rows is None else rows[number])
        todo = [number for number in range(len(parts)) if written[number] is None]
        if len(todo) < len(parts) and announce is not None:
            announce(f"resuming: {len(parts) - len(todo)} of {len(parts)} parts already done")
        committed = False
        try:
            write = dask.delayed(sink.writer(staging), pure=True)
            tasks = [write(parts[number], number) for number in todo]
            if rows is None:
                results = dask.compute(*tasks, scheduler=scheduler)
            else:
                from ..progress import compute_parts

                results = compute_parts(tasks, [rows[number] for number in todo], scheduler=scheduler,
                                        progress=progress, name=name or record.get("kind", "write"))
            for number, result in zip(todo, results, strict=True):
                written[number] = result
            committed_record = sink.commit(staging, {}, written, schema, record)
            committed = True
            return committed_record
        except BaseException:
            if key is None:  # a keyed write keeps its parts for the rerun
                sink.abort(staging)
            raise
        finally:
            if committed or key is None:
                staging.remove()
            if committed:  # under the lock, any other staging folder of this output is a dead run's
                prefix = _staging_prefix(sink.location)
                for name in sink.location.parent.list():
                    if name.startswith(prefix):
                        sink.location.sibling(name).remove()


def _staging_prefix(location: Location) -> str:
    return f".{location.name}.datamask-write-"


def part_name(number: int) -> str:
    """Partition ``number``'s file in a parquet directory output."""
    return f"part.{number}.parquet"


@dataclasses.dataclass(frozen=True)
class ParquetParts:
    """The task side of :class:`ParquetSink`: partition N as ``part-NNNNN.parquet`` in the work area."""

    work: Location

    def __call__(self, frame, number: int) -> dict | None:
        if not len(frame):
            return None
        part = self.work.child(f"{part_stem(number)}.parquet")
        if is_cudf(frame):  # cuDF's own GPU writer, given a file path where it can: no Python handle
            part.write_with(lambda where: frame.to_parquet(where, index=False))
        else:
            with part.open_write() as handle:
                write_table(frame if isinstance(frame, pa.Table) else to_arrow(frame), handle)
        return {"file": part.name, "bytes": part.size(), "rows": len(frame)}


class ParquetSink:
    """A parquet directory (``part.N.parquet`` per non-empty partition) or, with ``single_file``, one
    file of the partitions' rows in order; published whole by the rules of :mod:`.output`."""

    format = "parquet"

    def __init__(self, target: Location, *, overwrite: bool, single_file: bool = False, inputs=()):
        self.location, self.overwrite, self.single_file = target, overwrite, single_file
        self.inputs = [i for i in inputs if i is not None]
        self.uri = target.uri

    def check(self) -> None:
        if self.single_file and self.location.isdir():
            raise UnsafeOutputError(f"{self.uri} is a directory, and a single-file output cannot take its "
                                    "place: write a directory there (single_file=False), or name a file")
        check_target(self.location, overwrite=self.overwrite, inputs=self.inputs)

    def newest_run(self) -> str | None:
        return (read_record(self.location) or {}).get("run_id")

    def writer(self, work) -> ParquetParts:
        return ParquetParts(work.location)

    def holds(self, work, descriptor: dict) -> bool:
        part = work.child(descriptor["file"])
        try:
            rows = parquet_file(part).metadata.num_rows
            return part.size() == descriptor["bytes"] and rows == descriptor["rows"]
        except (OSError, pa.ArrowException):
            return False

    def commit(self, work, manifest: dict, written: list, schema: pa.Schema, record: dict) -> dict:
        files = {part_name(number): work.child(w["file"]) for number, w in enumerate(written) if w}
        if self.single_file:
            self._commit_file(list(files.values()), schema, record)
        elif self.location.local:
            self._commit_directory(files, schema, record)
        else:
            self._commit_objects(files, schema, record, work, manifest)
        return {"rows": sum(w["rows"] for w in written if w)}

    def _commit_file(self, files: list[Location], schema: pa.Schema, record: dict) -> None:
        """One file: written whole under the target's name (a rename on local disk, one upload on a store)."""
        schema = parquet_file(files[0]).schema_arrow.remove_metadata() if files else schema
        schema = schema.with_metadata({FOOTER_KEY: dumps(record, indent=1).encode()})
        with self.location.open_write() as handle:
            concatenate(files, handle, schema)

    def _commit_directory(self, files: dict, schema: pa.Schema, record: dict) -> None:
        """Linked into a hidden staging sibling, then renamed onto the target in one step."""
        target = Path(self.location.path)
        staging = staging_path(target)
        into = resolve(staging)
        try:
            staging.mkdir()
            names = _fill(into, files, schema, _link)
            into.child(RUN_RECORD).write_bytes(dumps({**record, "files": names}, indent=1).encode())
            publish(staging, target)
            fsync(os.fspath(target.parent))
        finally:
            into.remove()

    def _commit_objects(self, files: dict, schema: pa.Schema, record: dict, work, manifest: dict) -> None:
        """On an object store, where nothing can be renamed: the run record, listing the files, is
        written last, and is what makes the output complete. An earlier output's record goes first,
        then the files it listed that the new one lacks: nothing else in the target is ever removed.

        The manifest records the old and new file names before anything in the target changes: an
        interrupted commit is finished by the next run on the same output.
        """
        target, names = self.location, list(files) or [part_name(0)]
        old = begin_commit(work, manifest, (read_record(target) or {}).get("files", []), names)
        if target.isfile():  # an earlier single-file output of ours: the new directory takes its name
            target.fs.rm_file(target.path)
        target.child(RUN_RECORD).remove()  # from here on the output is not complete
        for name in sorted(set(old) - set(names)):
            target.child(name).remove()
        _fill(target, files, schema, Location.copy_to)
        target.child(RUN_RECORD).write_bytes(dumps({**record, "files": names}, indent=1).encode())

    def abort(self, work) -> None:
        """Nothing to do: every part is in the work area."""

    def finished_part(self, work, number: int, rows: int | None = None) -> dict | None:
        """The descriptor of partition ``number``'s part left in ``work`` by an interrupted write, if it
        is there (whole: parts are written atomically) with ``rows`` rows (when given); else None."""
        part = work.child(f"{part_stem(number)}.parquet")
        try:
            found = parquet_file(part).metadata.num_rows
            descriptor = {"file": part.name, "bytes": part.size(), "rows": found}
        except (OSError, pa.ArrowException):
            return None
        return descriptor if found and (rows is None or found == rows) else None


def _fill(into: Location, files: dict, schema: pa.Schema, put) -> list[str]:
    """``put(file, destination)`` each of ``files`` under its name in ``into``; its names. An empty
    output still gets its schema, as ``part.0.parquet``."""
    for name, file in files.items():
        put(file, into.child(name))
    if files:
        return list(files)
    with into.child(part_name(0)).open_write() as handle:
        write_table(schema.empty_table(), handle)
    return [part_name(0)]


def _link(source: Location, destination: Location) -> None:
    try:
        os.link(source.path, destination.path)
    except OSError:  # no hard links here (another filesystem): copy, then make it durable
        shutil.copyfile(source.path, destination.path)
        with open(destination.path, "rb") as handle:
            os.fsync(handle.fileno())


def write_parquet(ddf, path: str | os.PathLike, *, single_file: bool = False,
                  overwrite: bool = False, inputs=(), scheduler=None, **resume) -> dict:
    """Compute ``ddf`` (on ``scheduler``) and write it as parquet, atomically (the rules of
    :mod:`.output`); its rows written, as ``{"rows": n}``.

    Parameters
    ----------
    path : str or path
        Target directory (``part.N.parquet`` per non-empty partition), or file if ``single_file``:
        local or a URI (``s3://``...; complete once its run record is written, last).
    single_file : bool
        Write one file, the partitions' rows in order (streamed, one partition at a time).
    overwrite : bool
        Replace ``path`` if an earlier datamask writer made it; otherwise an existing path raises
        ``FileExistsError`` (and anything else :class:`~.output.UnsafeOutputError`).
    inputs : iterable of path
        Where ``ddf`` was read from: ``path`` may not be, contain or lie inside any of them.
    **resume
        ``key``, ``rows``, ``progress``, ``announce``, ``name``: resuming and progress, see
        :func:`write_output`.
    """
    sink = ParquetSink(resolve(path), overwrite=overwrite, single_file=single_file, inputs=inputs)
    record = {"tool": "datamask-dask", "kind": "write_parquet"}
    return write_output(sink, ddf, record, scheduler=scheduler, **resume)
