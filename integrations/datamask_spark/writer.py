"""``write_selection(sdf, path, ratio=0.1)``: select on Spark and write parquet from the Python workers.

The select pass already holds each partition's rows as Arrow in a Python worker; here that worker
also writes them, with ``selected`` appended, as one parquet file per Spark partition
(:func:`datamask_dask.io.parquet.write_table`, the Dask writer's options), and sends Spark one
small row per partition (rows, selected, file, stage seconds). The rows never travel back into the
JVM. ``datamask_select(sdf).write.parquet(path)`` gives the same files' rows, but Spark's
writer converts every row back from Arrow and writes the embedding list element by element, which
costs more than the selection itself (``benchmarks/bench_spark.py --engines spark-writer`` measures it).

The output follows the package's rules (:mod:`datamask_dask.io.output`): it may not overlap the
inputs, ``overwrite`` replaces only an output of an earlier datamask run, one run writes it at a
time, and it appears complete or not at all (a hidden staging sibling, renamed into place with its
run record ``_datamask_run.json``). ``path`` is a local path every executor can write (a shared
file system's) or an object-store URI (``s3://``...): the workers then write through fsspec with
the credentials of the usual environment variables, no Hadoop connector involved, and the output
is committed as :func:`datamask_dask.io.output.publish_objects` does (its run record last).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from datamask_dask import telemetry
from datamask_dask.config import load_config
from datamask_dask.io.output import (
    RUN_RECORD,
    check_target,
    library_versions,
    output_lock,
    publish,
    publish_objects,
)
from datamask_dask.io.parquet import write_table
from datamask_dask.io.records import dumps, plain
from datamask_dask.io.storage import Location, resolve
from datamask_dask.io.summary import SAMPLE_ROWS, partition_summary, signature_share, summarise_run
from datamask_dask.io.writer import part_stem

from .operator import SelectTask, arrow_schema, partition_number, plan_selection, select_task, spark_errors

log = logging.getLogger("datamask_dask.spark")  # the package's one logger

__all__ = ["write_run", "write_selection"]

RESULT_SCHEMA = ("partition int, rows long, selected long, file string, bytes long, stages string, "
                 "summary string")


def write_selection(sdf, path, ratio=None, *, config=None, overwrite: bool = False, inputs=(),
                    summary_rows: int = SAMPLE_ROWS,
                    input_location: str | None = None, **options) -> dict:
    """Select a share of ``sdf``'s rows (DATAMASK) and write every row plus ``selected`` to ``path``.

    Parameters
    ----------
    sdf : pyspark.sql.DataFrame
        Classic or Spark Connect, as for :func:`datamask_spark.datamask_select`.
    path : str or os.PathLike
        Output directory (local or on a file system every executor mounts), one
        ``part-NNNNN.parquet`` per non-empty Spark partition.
    ratio, config, **options
        Exactly as for :func:`datamask_dask.datamask_select`.
    overwrite : bool
        Replace ``path`` if an earlier datamask run wrote it (anything else is refused).
    inputs : iterable of path
        Where ``sdf`` was read from: ``path`` may not be, contain or lie inside any of them.
    input_location : str, optional
        The input's location for the run record (``input.location``).
    summary_rows : int
        Rows of the written files sampled for the run summary (see
        :mod:`datamask_dask.io.summary`: the selection against quality top-k and random, groups,
        tokens, learning curves, near-duplicate pairs within and across partitions); 0 skips
        the sample.

    Returns
    -------
    dict
        The run record also written to ``path/_datamask_run.json``: ``rows``, ``selected``, per
        partition ``partitions`` (rows, selected), ``files``, ``seconds`` (the driver's phases:
        plan; select, i.e. selecting and writing in the workers; commit) and ``stages`` (worker
        seconds summed over tasks: read, i.e. Spark's scan and the Arrow transfer into the worker;
        select, of it extract and learn; write).

    Raises
    ------
    OptionError, InputDataError
        As :func:`datamask_spark.datamask_select`; a select-pass error as the package's own error.
    UnsafeOutputError
        For an output that overlaps an input, or that exists and datamask did not write.
    """
    def run(staging: Location):
        spec, plan = plan_selection(sdf, ratio, config=config, **options)
        task = WriteTask(select_task(sdf, spec, plan), staging)
        return spec, plan, sdf.mapInArrow(task, RESULT_SCHEMA), arrow_schema(sdf)

    return write_run(run, path, settings=load_config(config, ratio=ratio, **options), overwrite=overwrite,
                     inputs=inputs, summary_rows=summary_rows, extra={"input": {"location": input_location}})


def write_run(run, path, *, settings: dict, overwrite: bool, inputs, summary_rows: int, extra: dict,
              storage_options: dict | None = None) -> dict:
    """Run a Spark selection whose tasks write the parts, and publish it with its run record.

    ``run(staging)`` plans and returns ``(spec, plan, results, schema)``: ``results`` is the
    DataFrame of :class:`WriteTask` rows whose collection selects and writes the parts into
    ``staging`` (a :class:`~datamask_dask.io.storage.Location`), ``schema`` the input's Arrow
    schema (for the empty table's file). Everything else (the output's rules, the run summary and
    record) is the same whatever the tasks read; ``extra`` goes into the run record as it is.
    """
    target = resolve(path, storage_options)
    inputs = [str(p) for p in inputs]
    check_target(target, overwrite=overwrite, inputs=inputs)
    started = time.perf_counter()
    with output_lock(target):
        check_target(target, overwrite=overwrite, inputs=inputs)
        staging = target.sibling(f".{target.name}.tmp-{time.time_ns():x}")
        try:
            staging.makedirs()
            with spark_errors():
                spec, plan, tasks, schema = run(staging)
                planned = time.perf_counter()
                log.info("planned %s: %d rows in %d partitions (%.1f s)", target.uri, sum(plan.rows),
                         len(plan.rows), planned - started)
                results = sorted((row.asDict() for row in tasks.collect()), key=lambda r: r["partition"])
            selected_at = time.perf_counter()
            files = [r["file"] for r in results if r["file"]]
            if not files:  # an empty table still gets its schema
                files = [f"{part_stem(0)}.parquet"]
                with staging.child(files[0]).open_write() as handle:
                    write_table(_with_selection(schema.empty_table(), spec), handle)
            worker_stages = telemetry.add_up([plan.stages] + [json.loads(r["stages"]) for r in results])
            # The run summary as Dask's writer makes it: the partitions' parts, then a sample of the files.
            markers = {r["partition"]: {"summary": json.loads(r["summary"] or "{}")} for r in results}
            summary = summarise_run([staging.child(f) for f in files], markers, settings, spec,
                                    sample_rows=summary_rows, seed=int(spec.options.seed or 0))
            record = {"tool": "datamask-dask", "kind": "selection", "engine": "spark",
                      "rows": sum(r["rows"] for r in results),
                      "selected": sum(r["selected"] for r in results),
                      "partitions": [{k: r[k] for k in ("partition", "rows", "selected")} for r in results],
                      **extra, "files": files, "seed": spec.options.seed,
                      "settings": settings, "summary": summary,
                      "versions": library_versions("pyspark"),
                      "seconds": {"plan": round(planned - started, 3),
                                  "select": round(selected_at - planned, 3),
                                  "commit": round(time.perf_counter() - selected_at, 3)},
                      "stages": {k: round(v, 3) for k, v in worker_stages.items()}}
            if target.local:
                staging.child(RUN_RECORD).write_bytes(dumps(record, indent=1).encode())
                publish(Path(staging.path), Path(target.path))
            else:
                def copy() -> None:
                    for name in files:
                        staging.child(name).copy_to(target.child(name))

                publish_objects(target, files, copy, {k: v for k, v in record.items() if k != "files"},
                                default=plain)
        finally:
            staging.remove()
    log.info("committed %s: %d rows, %d selected (%.1f s in all)", target.uri, record["rows"],
             record["selected"], time.perf_counter() - started)
    return record


class WriteTask:
    """The ``mapInArrow`` function: one partition selected and written, one row about it."""

    def __init__(self, select: SelectTask, directory: Location):
        self.select, self.directory = select, directory

    def __call__(self, batches):
        telemetry.take()  # what ran on this worker before is not this partition's
        telemetry.take_curves()
        with telemetry.timed("read"):  # Spark's scan and the Arrow transfer into this worker
            batches = list(batches)
        with telemetry.timed("select"):
            batches, added = self.select.select(batches)
        number = partition_number()
        rows = sum(b.num_rows for b in batches)
        selected, name, size, summary = 0, "", 0, {}
        if rows:
            with telemetry.timed("write"):
                table = pa.Table.from_batches(batches)
                for field, values in added:
                    table = table.append_column(field, values)
                part = self.directory.child(f"{part_stem(number)}.parquet")
                with part.open_write() as handle:
                    write_table(table, handle)
                name, size = part.name, part.size()
            selected = int(np.count_nonzero(added[0][1].to_numpy(zero_copy_only=False)))
            with telemetry.timed("summary"):
                summary = self._summary(table, number)
        yield pa.RecordBatch.from_pydict(
            {"partition": pa.array([number], pa.int32()), "rows": pa.array([rows], pa.int64()),
             "selected": pa.array([selected], pa.int64()), "file": pa.array([name], pa.string()),
             "bytes": pa.array([size], pa.int64()),
             "stages": pa.array([json.dumps(telemetry.take())], pa.string()),
             "summary": pa.array([json.dumps(summary, default=plain)], pa.string())})

    def _summary(self, table: pa.Table, number: int) -> dict:
        """Groups, tokens, learning curves and the selected rows' signatures, as Dask's writer
        summarises a partition."""
        plan = self.select.plan
        spec = plan.spec
        names = [spec.selected_column, spec.embedding_column, spec.by, spec.token_column]
        present = [n for n in dict.fromkeys(names) if n is not None and n in table.column_names]
        frame = table.select(present).to_pandas(types_mapper=pd.ArrowDtype)
        return partition_summary(frame, spec.selected_column, spec.by, spec.token_column,
                                 spec.embedding_column, number=number, share=signature_share(plan))


def _with_selection(table: pa.Table, spec) -> pa.Table:
    table = table.append_column(pa.field(spec.selected_column, pa.bool_()), pa.array([], pa.bool_()))
    if spec.score_column:
        table = table.append_column(pa.field(spec.score_column, pa.float32()), pa.array([], pa.float32()))
    if spec.explain:
        from datamask_dask.partition.explain import arrow_fields

        for field in arrow_fields(table.schema.field(spec.id_column).type):
            table = table.append_column(field, pa.array([], field.type))
    return table
