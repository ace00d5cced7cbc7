"""``write_selection(sdf, path, ratio=0.1)``: select on Spark and write parquet from the Python workers.

The select pass already holds each partition's rows as Arrow in a Python worker; here that worker
also writes them, with ``selected`` appended, as one parquet file per Spark partition (the Dask
writer's options), and sends Spark one small row per partition. The rows never travel back into
the JVM: ``datamask_select(sdf).write.parquet(path)`` gives the same rows, but Spark's writer
converts every row back from Arrow and writes the embedding list element by element, which costs
more than the selection itself.

The run is the package's one run protocol (:func:`datamask_dask.run.protocol.execute`), with
Spark as its engine (:class:`SparkEngine`): its output rules, and an interrupted run resumes
without selecting its finished partitions again. ``path`` is a local path every executor can write
(a shared file system's) or an object-store URI (``s3://``...), which the workers write through
fsspec with the usual environment variables, no Hadoop connector involved.
"""

from __future__ import annotations

import json
import logging

import pyarrow as pa

from datamask_dask.config import resolve_options
from datamask_dask.io.records import plain
from datamask_dask.io.tables import SelectionOnly, open_sink
from datamask_dask.partition.select import output_schema
from datamask_dask.run.protocol import PartTask, execute
from datamask_dask.run.summary import SAMPLE_ROWS
from datamask_dask.telemetry import Measures

from .operator import (
    SelectTask,
    arrow_schema,
    map_in_arrow,
    partition_number,
    plan_pass,
    require_spark,
    spark_errors,
    spark_packs,
)

log = logging.getLogger("datamask_dask.spark")  # the package's one logger

__all__ = ["SparkEngine", "write_selection"]

RESULT_SCHEMA = "partition int, marker string"


def write_selection(sdf, path, ratio=None, *, config=None, overwrite: bool = False, resume: bool = True,
                    inputs=(), summary_rows: int = SAMPLE_ROWS, input_location: str | None = None,
                    catalog_properties: dict | None = None, storage_options: dict | None = None,
                    **options) -> dict:
    """Select a share of ``sdf``'s rows (DATAMASK) and write every row plus ``selected`` to ``path``.

    Parameters
    ----------
    sdf : pyspark.sql.DataFrame
        Classic or Spark Connect, as for :func:`datamask_spark.datamask_select`.
    path : str or os.PathLike
        Output directory (local or on a file system every executor mounts, or an object-store
        URI), one ``part.N.parquet`` per non-empty Spark partition; or a Delta or Iceberg table URI
        (:mod:`datamask_dask.io.tables`), the partitions' files added in one commit.
    ratio, config, **options
        Exactly as for :func:`datamask_dask.datamask_select`.
    overwrite, resume, summary_rows
        As for :func:`datamask_dask.write_selection`.
    inputs : iterable of path
        Where ``sdf`` was read from: ``path`` may not be, contain or lie inside any of them.
    input_location : str, optional
        The input's location for the run record (``input.location``).
    catalog_properties : dict, optional
        For an Iceberg output: its catalog's properties, as pyiceberg's ``load_catalog`` takes them.
    storage_options : dict, optional
        For an output on an object store: its credentials and endpoint, as for
        :func:`datamask_dask.write_selection` (the executors write with them).

    Returns
    -------
    dict
        The run record (:mod:`datamask_dask.run.protocol`), also in
        ``path/_datamask_run.json``: ``rows``, ``selected``, ``partitions``, ``phases`` (the
        driver's), ``stages`` (worker seconds summed over tasks: read, i.e. Spark's scan and the
        Arrow transfer into the worker; select; write).

    Raises
    ------
    OptionError, InputDataError
        As :func:`datamask_spark.datamask_select`; a select-pass error as the package's own error.
    UnsafeOutputError
        For an output that overlaps an input, or that exists and datamask did not write.
    ResumeError
        An interrupted run on ``path`` used other options or another input.
    """
    require_spark(sdf, "write_selection")
    resolved = resolve_options(config, ratio=ratio, **options)

    def plan():
        return plan_pass(sdf, resolved)[1]

    def tasks(plan, write):
        packs = spark_packs(sdf, plan, write.todo)
        task = write.bind(SelectTask(plan, arrow_schema(sdf), packs))
        return map_in_arrow(sdf, sdf.columns, task, RESULT_SCHEMA), packs

    engine = SparkEngine(plan, tasks, arrow_schema(sdf))
    sink = open_sink(path, mode="overwrite" if overwrite else "error", inputs=[str(p) for p in inputs],
                     catalog_properties=catalog_properties, storage_options=storage_options)
    return execute(engine, sink, resolved, resume=resume, summary_rows=summary_rows,
                   source={"location": input_location}).record


class SparkEngine:
    """Spark as the engine of a run (:class:`datamask_dask.run.protocol.Engine`).

    ``plan()`` runs the plan pass and returns the plan; ``tasks(plan, write)`` runs the pack pass for
    the packs holding a partition of ``write.todo`` (:func:`datamask_spark.operator.learn_packs`) and
    returns the DataFrame of :class:`WriteTask` rows whose collection selects and writes the
    partitions, reading ``write.reads``, and the learned packs; ``schema`` is the input's Arrow schema;
    ``project`` the selection-only output's columns (:class:`datamask_dask.io.tables.SelectionOnly`).
    """

    name = "spark"

    def __init__(self, plan, tasks, schema: pa.Schema, project: SelectionOnly | None = None):
        self._plan, self._tasks, self.input_schema, self.project = plan, tasks, schema, project

    def plan(self, progress=None):
        with spark_errors():
            return self._plan()

    def reads(self, plan) -> list[str]:
        """The input columns the select pass reads: all, or those a selection-only output uses."""
        names = self.input_schema.names
        return names if self.project is None else self.project.reads(plan.spec, names)

    def selected_schema(self, plan) -> pa.Schema:
        """A selected partition's: the columns read, then the selection's."""
        schema = self.input_schema
        read = pa.schema([schema.field(name) for name in self.reads(plan)], metadata=schema.metadata)
        return output_schema(plan.spec, read)

    def schema(self, plan) -> pa.Schema:
        selected = self.selected_schema(plan)
        return selected if self.project is None else self.project(selected.empty_table(), "").schema

    def run(self, plan, todo: list[int], task: PartTask, progress=None) -> tuple[list[dict], dict]:
        write = WriteTask(task, frozenset(todo), self.selected_schema(plan), self.reads(plan))
        with spark_errors():
            frame, packs = self._tasks(plan, write)
            rows = frame.collect()
        markers = []
        for row in rows:
            marker = json.loads(row["marker"])
            marker["sample"] = task.work.sample(marker["partition"])  # written by the task, read back here
            markers.append(marker)
        return markers, {index: result.measures for index, result in packs.items()}


class WriteTask:
    """The ``mapInArrow`` function: one partition (its columns ``reads``) selected and handed to the
    run's part task (summary, write, marker), one row about it. Partitions an earlier run finished are
    skipped."""

    def __init__(self, task: PartTask, todo: frozenset, schema: pa.Schema, reads: list[str],
                 select: SelectTask | None = None):
        self.task, self.todo, self.schema, self.reads, self.select = task, todo, schema, reads, select

    def bind(self, select: SelectTask) -> WriteTask:
        return WriteTask(self.task, self.todo, self.schema, self.reads, select)

    def finished(self, number: int) -> bool:
        return number not in self.todo

    def __call__(self, batches):
        number = partition_number()
        if self.finished(number):
            for _ in batches:  # Spark scanned them already; nothing to select or write
                pass
            return
        measures = Measures()
        with measures.timed("read"):  # Spark's scan and the Arrow transfer into this worker
            batches = list(batches)
        with measures.timed("select"):
            batches, added = self.select.select(batches, measures)
        if batches:
            table = pa.Table.from_batches(batches)
            for field, values in added:
                table = table.append_column(field, values)
        else:
            table = self.schema.empty_table()
        marker = self.task(table, number, measures)
        marker.pop("sample")
        text = json.dumps(marker, default=plain)
        yield pa.RecordBatch.from_pydict({"partition": pa.array([number], pa.int32()),
                                          "marker": pa.array([text], pa.string())})
