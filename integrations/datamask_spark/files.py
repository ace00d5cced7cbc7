"""Tables in, tables out on Spark, with the Python workers reading their pieces themselves.

    from datamask_spark.files import write_file_selection
    record = write_file_selection(spark, "corpus/", "selected/", ratio=0.1)
    record = write_file_selection(spark, "delta:///data/corpus", "selected/", ratio=0.1)

:func:`~datamask_spark.writer.write_selection` takes any DataFrame, so Spark scans the rows and
hands them to the Python workers through ``mapInArrow``: the JVM converts a column of 768-float
lists to Arrow element by element, slower than pyarrow reads it, and twice a selection. A table
every executor can read (a parquet file or directory, a Delta or Iceberg table:
:func:`datamask_dask.io.tables.table_pieces`) needs no such detour: Spark schedules one task per
piece (a ``spark.range`` with one row per partition), whose Python worker reads it with pyarrow
(deltalake's fragments, pyiceberg's scan tasks with their deletes), as a Dask worker does. The
plan pass, the pack pass, the select pass and the writing are the Spark operator's own tasks; only
where their batches come from differs. Only DataFrame APIs are used (Spark Connect works).

The partitions are the Dask readers' pieces (:func:`datamask_dask.run.tables.select_table` lists
them once, for either engine), so ``--engine spark`` and ``--engine dask`` select the same rows of
the same input with the same seed. :func:`write_file_selection` is ``select_table(...,
engine="spark")``: the package's one run protocol, so an interrupted job resumes, and a piece it
finished is not read again.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import pyarrow as pa

from datamask_dask.errors import InputDataError, OptionError
from datamask_dask.io.pieces import Pieces
from datamask_dask.io.tables import SelectionOnly
from datamask_dask.options import SelectOptions
from datamask_dask.partition import adapters
from datamask_dask.partition.spec import spec_from_meta
from datamask_dask.plan.reduce import make_plan
from datamask_dask.run.summary import SAMPLE_ROWS

from .operator import (
    PLAN_SCHEMA,
    SelectTask,
    SummaryTask,
    duplicate_ids,
    empty_frame,
    learn_packs,
    partition_number,
    plan_summaries,
    spark_pending,
    transport,
)
from .shards import PIECE_SCHEMA
from .writer import RESULT_SCHEMA, SparkEngine

__all__ = ["files_engine", "plan_files", "write_file_selection"]


def write_file_selection(spark, source, path, ratio=None, *, config=None, overwrite: bool = False,
                         resume: bool = True, summary_rows: int = SAMPLE_ROWS,
                         catalog_properties: dict | None = None,
                         storage_options: dict | None = None, **options) -> dict:
    """Select a share of ``source``'s rows (DATAMASK) on Spark and write every row plus ``selected``
    to ``path`` as parquet, the Python workers reading the pieces and writing the parts themselves.

    Parameters
    ----------
    spark : pyspark.sql.SparkSession
        Classic or Spark Connect; its executors must read ``source`` and write ``path``: local
        paths (of a file system they all mount) or object-store URIs (``s3://``...), which the
        workers reach through fsspec with the usual environment variables (no Hadoop connector).
    source : str or os.PathLike
        A table URI (:mod:`datamask_dask.io.tables`): a parquet file or directory (hive
        ``key=value`` subdirectories become columns), ``delta://...`` or ``iceberg://CATALOG/ns.table``,
        at a snapshot if the URI names one.
    path : str or os.PathLike
        Output directory, one ``part-NNNNN.parquet`` per non-empty piece, or a Delta or Iceberg
        table URI.
    ratio, config, **options
        Exactly as for :func:`datamask_dask.datamask_select`.
    overwrite, resume, summary_rows
        As for :func:`datamask_dask.write_selection`; the rest of
        :func:`datamask_dask.run.tables.select_table`'s keywords (``output_columns``,
        ``incremental``, ``row_filter``, ``mode``) go with ``options``.
    catalog_properties, storage_options
        Iceberg catalog properties, and the storage options of a Delta input (deltalake's keys)
        or of parquet paths (fsspec's), as for :func:`datamask_dask.io.tables.read_table`; they
        travel to the workers with the pieces.

    Returns
    -------
    dict
        The run record, also written to ``path/_datamask_run.json`` (as ``write_selection``'s;
        ``input`` says what was read: format, uri, snapshot, files, and ``read_by = "workers"``).

    Raises
    ------
    OptionError, InputDataError
        As :func:`datamask_spark.datamask_select`, naming the partition (the piece's number) and,
        for a piece that cannot be read, its file.
    UnsafeOutputError
        For an output that overlaps ``source``, or that exists and datamask did not write.
    """
    from datamask_dask.run.tables import select_table

    mode = options.pop("mode", None)  # a Delta or Iceberg output's, e.g. "append"
    if mode is not None and overwrite:
        raise OptionError(f"give overwrite=True or mode={mode!r}, not both (overwrite=True is "
                          "mode='overwrite')")
    try:
        return select_table(source, path, ratio, engine="spark", spark=spark, config=config,
                            mode=mode or ("overwrite" if overwrite else "error"), resume=resume,
                            summary_rows=summary_rows, catalog_properties=catalog_properties,
                            storage_options=storage_options, **options).record
    except pa.ArrowInvalid as exc:  # the listing met a file that is not parquet, named by pyarrow
        raise InputDataError(f"cannot read the input {os.fspath(source)}: {exc}") from None


def files_engine(spark, files: Pieces, options: SelectOptions, *,
                 project: SelectionOnly | None = None) -> SparkEngine:
    """Spark as the engine of a run over a table's pieces (:func:`datamask_dask.io.tables.table_pieces`),
    each read by the Python worker of its task (see the module notes). ``project``: the columns
    written where only the selection's are (read: only what it uses)."""

    def plan():
        return plan_files(spark, files, options)[1]

    def pack_rows(task):  # a pack's members are read even where an earlier run finished them
        return piece_tasks(spark, files).mapInArrow(_ReadPiece(task, files, task.columns, task.members),
                                                    task.output)

    def tasks(plan, write):
        packs = learn_packs(plan, files.schema, pack_rows, write.todo)
        select = write.bind(SelectTask(plan, files.schema, packs))
        read = _ReadPiece(select, files, write.reads, write.todo)
        return piece_tasks(spark, files).mapInArrow(read, RESULT_SCHEMA), packs

    return SparkEngine(plan, tasks, files.schema, project)


def plan_files(spark, files: Pieces, options: SelectOptions):
    """The plan pass of resolved ``options`` over ``files``' pieces, each read by the task that checks it.

    Returns
    -------
    spec : SelectSpec
    plan : dict
        As :func:`datamask_spark.operator.plan_selection`'s, with partition ``k`` = piece ``k``.
    """
    meta = empty_frame(files.schema)
    spec = spec_from_meta(meta, options)
    tasks = piece_tasks(spark, files)
    columns = spec.plan_columns
    schema = pa.schema([files.schema.field(c) for c in columns])
    summarise = _ReadPiece(SummaryTask(spec, schema, len(files.items)), files, columns)
    with ThreadPoolExecutor(1) as pool:
        id_check = []

        def check_ids():  # after the scans, not beside them: its tasks then reuse the scans' Python
            # workers (a new one imports torch, ~3 s) and run while near-duplicates are searched
            if spec.check_ids:
                id_check.append(pool.submit(duplicate_ids, _ids(tasks, files, spec.id_column)))

        def vectors(read):  # the exact check's reads of the embedding column, piece k in task k
            return tasks.mapInArrow(_ReadPiece(read, files, [spec.embedding_column]), PIECE_SCHEMA)

        summaries = plan_summaries(tasks.mapInArrow(summarise, PLAN_SCHEMA), spec, then=check_ids,
                                   vectors=vectors)
        ids = id_check[0].result() if id_check else None
    dim = None
    if spec.embedding_column not in spec.plan_columns:  # else every summary holds its dimension
        dim = adapters.fixed_dimension(meta[spec.embedding_column].dtype)
        if dim is None:  # read on the driver, a file at a time, up to the first with rows
            dim = adapters.probe_dimension(
                files.read(number, [spec.embedding_column]).to_pandas(types_mapper=pd.ArrowDtype).iloc[:, 0]
                for number in range(len(files)))
    plan = make_plan(summaries, ids, dim, spec)

    def pack_rows(task):
        return tasks.mapInArrow(_ReadPiece(task, files, task.columns, task.members), task.output)

    return spec, spark_pending(plan, files.schema, pack_rows)


def piece_tasks(spark, files: Pieces):
    """One row per piece, each in its own Spark partition (partition ``k`` holds ``k``)."""
    if not len(files):
        raise InputDataError(f"the input {files.source.get('uri', '')} has no data files to select from")
    n = len(files)
    return spark.range(0, n, 1, n)


class _ReadPiece:
    """A ``mapInArrow`` function over :func:`piece_tasks`: task ``k`` reads piece ``k``'s ``columns``
    with pyarrow and runs ``task`` on its batches, as if Spark had sent them; only the pieces of
    ``todo`` (None: all) are read."""

    def __init__(self, task, files: Pieces, columns: list[str], todo=None):
        self.task, self.files, self.columns, self.todo = task, files, list(columns), todo

    def __call__(self, batches):
        for _ in batches:  # the task's one row of spark.range, its partition number
            pass
        number = partition_number()
        if self.todo is None or number in self.todo:  # finished, or not a pack's member: not read
            yield from self.task(self._batches(number))

    def _batches(self, number: int):
        # A generator: the read runs when the task takes the batches, inside the task's "read" clock.
        try:
            table = self.files.read(number, self.columns)
        except (OSError, pa.ArrowException, InputDataError) as exc:
            error = InputDataError(f"partition {number}: cannot read {self.columns}: {exc}")
            raise RuntimeError(transport(error)) from None
        yield from table.to_batches()


def _ids(tasks, files: Pieces, id_column: str):
    """A DataFrame of every row's id and partition, read by the workers, for :func:`duplicate_ids`."""
    from pyspark.sql.pandas.types import from_arrow_type, to_arrow_type
    from pyspark.sql.types import IntegerType, StructField, StructType

    spark_type = from_arrow_type(files.schema.field(id_column).type)
    schema = StructType([StructField("id", spark_type), StructField("part", IntegerType())])
    return tasks.mapInArrow(_ReadPiece(_IdTask(to_arrow_type(spark_type)), files, [id_column]), schema)


class _IdTask:
    """Each row's id (in Spark's Arrow type for it) and its partition number."""

    def __init__(self, id_type: pa.DataType):
        self.id_type = id_type

    def __call__(self, batches):
        number = partition_number()
        for batch in batches:
            part = pa.repeat(pa.scalar(number, pa.int32()), batch.num_rows)
            yield pa.RecordBatch.from_arrays([batch.column(0).cast(self.id_type), part], names=["id", "part"])
