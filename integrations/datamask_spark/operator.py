"""The Spark operator: ``datamask_select(sdf, ratio=0.1)`` adds a boolean ``selected`` column.

It mirrors the Dask operator (:mod:`datamask_dask.dask_engine.operator`) pass for pass and reuses its
engine-agnostic core; Spark only moves partitions, through DataFrame APIs (no RDD, SparkContext,
broadcast or accumulator), so it runs on classic Spark and on Spark Connect alike.

1. **Plan** (eager, at call time): one ``mapInArrow`` over the plan columns (id, quality, group,
   tokens, and with ``validate="full"`` the embeddings). Each Spark partition is checked and
   summarised by :func:`datamask_dask.partition.checks.summarise_partition`; the task emits one
   row (partition number, pickled summary, or the :class:`~datamask_dask.errors.DataMaskError` the
   checks raised), collected on the driver. Duplicate ids are found by a DataFrame aggregation
   (``groupBy(id)``, count > 1) rather than by shipping every id to the driver.
   :func:`datamask_dask.plan.reduce.make_plan` turns the summaries into exact global quotas.
   With ``diversity_scope="table"`` (the default) each task keeps its scan instead (checks and
   SimHash signatures, ~44 bytes a row; the plan rows are persisted) and near-duplicates across
   the table are set aside with the search the Dask operator's graph runs, so both engines select
   the same rows (:func:`plan_summaries`): up to ``ONE_TASK_PARTITIONS`` partitions or
   ``ONE_TASK_ROWS`` rows (the scans count them) the signatures are collected and the candidates
   found on the driver in one task; beyond, by the sharded stages on the executors
   (:mod:`datamask_spark.shards`); the candidates are confirmed on exact cosine on the executors
   and only the summaries are collected (the same groups).
2. **Packs** (eager, at call time, only where the plan has packs: table scope, consecutive
   partitions whose eligible rows fit in one chunk together): one ``mapInArrow`` over the select
   columns emits each member partition's eligible rows of its packed cells
   (:func:`datamask_dask.partition.select.pack_rows`), one row per data row; ``groupBy(pack)``
   and ``applyInPandas`` learn each pack from its members' rows in member order
   (:func:`~datamask_dask.partition.select.learn_pack`); the results, a few bytes a row, are
   collected on the driver (:func:`learn_packs`).
3. **Select** (lazy): one ``mapInArrow`` over the whole rows. Each task runs
   :func:`datamask_dask.partition.select.select_partition` on the columns the learner needs
   (embeddings stay an Arrow list column), a packed partition taking its part of its pack's result,
   and yields its input batches unchanged with ``selected`` (and the score column) appended. The
   plan and the pack results reach the executors inside the function's closure.
   :func:`datamask_spark.writer.write_selection` runs the same step but has the worker write the
   rows as parquet itself.

The partition number is the Spark partition id (``TaskContext.partitionId()``): same input
partitioning and seed give the same ``selected``, and the same rows as the Dask operator on the same
partitions. The input is read once per pass and must give the same rows each time:
``cache()`` or checkpoint a non-deterministic input first (a partition whose row count changed
between the passes fails, naming it).

Bad input fails in the plan pass with the package's own :class:`~datamask_dask.errors.InputDataError`
or :class:`~datamask_dask.errors.OptionError`, raised on the driver and naming the Spark partition.
The pack pass raises the package's errors on the driver too. Errors that only the select pass can
see (``validate="light"``) are raised by Spark's action; wrap it in :func:`spark_errors` to get the
package's error instead of Spark's Python traceback.
"""

from __future__ import annotations

import base64
import json
import pickle
import re
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np
import pandas as pd
import pyarrow as pa

from datamask_dask import errors as _errors
from datamask_dask.config import resolve_options
from datamask_dask.dedup.search import one_task
from datamask_dask.errors import DataMaskError
from datamask_dask.io.pieces import to_pandas
from datamask_dask.options import SelectOptions
from datamask_dask.partition.checks import (
    SHOW,
    scan_partition,
    summarise_partition,
)
from datamask_dask.partition.select import (
    PackResult,
    PackRows,
    area_sums,
    context_round,
    learn_pack,
    pack_curve,
    pack_rows,
    select_partition,
    selection_arrays,
    selection_fields,
)
from datamask_dask.partition.spec import SelectSpec, spec_from_meta
from datamask_dask.plan.reduce import make_plan, share_regions, warn_plan
from datamask_dask.plan.types import EMPTY_SUMMARY, PartitionSummary, Plan
from datamask_dask.telemetry import Measures

from .shards import PIECE_SCHEMA, cached, searched_summaries, sharded_summaries

__all__ = ["apply_plan", "datamask_select", "plan_selection", "spark_errors", "spec_from_spark"]

_MARK = re.compile(r"DATAMASK-ERROR (\w+) ([A-Za-z0-9+/=]+) END")
# a plan task's row: partition, its rows, whether its checks failed, pickled summary, scan or error
PLAN_SCHEMA = "partition int, rows long, failed boolean, payload binary"
# a pack pass row: one eligible row of a packed cell (pack_rows), its pack and member partition
# seconds: the member's extraction of its rows (PackRows.seconds), the same on each of them; area: in
# regions, the area the row was routed to (PackRows.areas), null otherwise
PACK_ROWS_SCHEMA = ("pack int, partition int, position long, quality double, embedding array<float>, "
                    "tokens double, weight double, device string, seconds double, area long")
PACK_BLOCK = 4096  # pack rows per Arrow batch: a batch stays small whatever the dimension
# a learned pack: its pickled learn_pack result (each member's part, and what learning it measured)
PACK_RESULT_SCHEMA = "pack int, payload binary"
# what the plan pass found of the areas, pickled: a region's curves (pack_curve) or a partition's
# sums by area (area_sums)
AREAS_SCHEMA = "pack int, partition int, found binary"
# a partition's part of a round of the context, pickled (context_round)
CONTEXT_ROUND_SCHEMA = "partition int, payload binary"


def datamask_select(sdf, ratio: float | Mapping | None = None, *, config=None, **options):
    """Select a share of rows that is both high in quality and diverse (DATAMASK) in a Spark DataFrame.

    Parameters
    ----------
    sdf : pyspark.sql.DataFrame
        Classic or Spark Connect. One row per document with an id, quality score(s) and an
        embedding (``array<float>`` or ``array<double>``, one dimension for the whole table).
    ratio, config, **options
        Exactly as for :func:`datamask_dask.datamask_select` (``prune``, ``by``,
        ``budget_tokens``, ``quality_column`` weights, ``seed``, learner options, ...).

    Returns
    -------
    pyspark.sql.DataFrame
        ``sdf``'s rows, columns and partitions plus the boolean ``selected`` column (and the
        score column if asked). The plan pass has run (it reads the plan columns once); the
        select pass runs with the returned DataFrame's first action.

    Raises
    ------
    OptionError, InputDataError
        For bad options or schema at once; for bad data in the plan pass (naming the Spark
        partition, column and rows); for a ratio or budget the data cannot meet.

    Warns
    -----
    DataMaskWarning
        As :func:`datamask_dask.datamask_select` warns.

    Examples
    --------
    >>> out = sdf.transform(datamask_select, ratio=0.1, n_epochs=200)   # doctest: +SKIP
    >>> out.write.parquet("s3://bucket/selected/")                      # doctest: +SKIP
    """
    spec, plan = _warned_plan(sdf, ratio, config, options)
    return apply_plan(sdf, spec, plan)


def plan_selection(sdf, ratio: float | Mapping | None = None, *, config=None, **options):
    """Validate the options against ``sdf``'s schema and run the plan pass (eagerly).

    Returns
    -------
    spec : SelectSpec
    plan : dict
        What :func:`apply_plan` and :func:`~datamask_dask.partition.select.select_partition` follow.
    """
    return _warned_plan(sdf, ratio, config, options)


def _warned_plan(sdf, ratio, config, options: dict):
    """:func:`plan_pass` of the options, warning of the plan (:func:`~datamask_dask.plan.reduce.warn_plan`)
    at the line that called the public door."""
    spec, plan = plan_pass(sdf, resolve_options(config, ratio=ratio, **options))
    warn_plan(plan, stacklevel=3)
    return spec, plan


def plan_pass(sdf, options: SelectOptions):
    """The spec and the plan of resolved ``options`` (:func:`datamask_dask.config.resolve_options`) on
    ``sdf``."""
    spec = spec_from_spark(sdf, options)
    plan = make_plan(*plan_inputs(sdf, spec), spec)
    return spec, spark_pending(plan, arrow_schema(sdf), reader(sdf))


def require_spark(sdf, caller: str = "datamask_select") -> None:
    """A TypeError where ``sdf`` is not a Spark DataFrame (classic or Connect), e.g. a pandas frame."""
    if not (hasattr(sdf, "mapInArrow") and hasattr(sdf, "schema")):
        raise TypeError(f"datamask_spark.{caller} needs a pyspark DataFrame, got {type(sdf).__name__}: "
                        "make one with spark.createDataFrame(...) or spark.read.parquet(...)")


def spec_from_spark(sdf, options: SelectOptions) -> SelectSpec:
    """Check resolved options against a Spark DataFrame's schema (no data is read)."""
    require_spark(sdf)
    column = options.embedding_column
    # Spark ML's vectors cross to Arrow as a struct of sparse and dense parts: name the one-line remedy
    if column in sdf.columns and type(sdf.schema[column].dataType).__name__ == "VectorUDT":
        raise _errors.InputDataError(
            f"embedding column {column!r} is a Spark ML vector (VectorUDT): give it as an array of floats, "
            f"e.g. sdf.withColumn({column!r}, pyspark.ml.functions.vector_to_array({column!r}, 'float32'))")
    return spec_from_meta(empty_frame(arrow_schema(sdf)), options)


def apply_plan(sdf, spec: SelectSpec, plan: Plan):
    """The select pass: ``sdf`` plus the ``selected`` column (lazy), following ``plan``."""
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import StructField, StructType

    schema = arrow_schema(sdf)
    fields = list(sdf.schema.fields) + [StructField(f.name, from_arrow_type(f.type), f.nullable)
                                        for f in selection_fields(spec, schema)]
    task = SelectTask(plan, schema, spark_packs(sdf, plan))
    return map_in_arrow(sdf, sdf.columns, task, StructType(fields))


# --------------------------------------------------------------------------- plan pass


def plan_inputs(sdf, spec: SelectSpec) -> tuple[list[dict], tuple | None, int | None]:
    """The plan pass: per-partition summaries, the duplicate-id report and the embedding dimension."""
    partitions = partition_count(sdf) if spec.pieces == "regions" else 1  # regions share out their sample
    task = SummaryTask(spec, arrow_schema(sdf.select(*[_col(c) for c in spec.plan_columns])), partitions)
    with ThreadPoolExecutor(1) as pool:
        # The id check is a Spark job of its own: submitted beside the plan pass, its tasks take the
        # slots the plan pass's last tasks leave idle and run while the driver searches duplicates.
        ids = pool.submit(id_report, sdf, spec.id_column) if spec.check_ids else None
        def vectors(read):  # the exact check reads the embeddings again (table scope), as the scans did
            return map_in_arrow(sdf, [spec.embedding_column], read, PIECE_SCHEMA)

        scans = map_in_arrow(sdf, spec.plan_columns, task, PLAN_SCHEMA)
        summaries = plan_summaries(scans, spec, vectors=vectors)
        ids = ids.result() if ids is not None else None
    dim = None
    if spec.embedding_column not in spec.plan_columns:  # else every summary holds its dimension
        dim = probe_dimension(sdf, spec.embedding_column)
    return summaries, ids, dim


def plan_summaries(plan_rows, spec: SelectSpec, then=None, vectors=None) -> list[PartitionSummary]:
    """Each partition's summary, in partition order, from the plan pass's rows (a DataFrame of
    :data:`PLAN_SCHEMA`, one row per partition), which this runs.

    With ``diversity_scope="table"`` the rows hold scans, and near-duplicates across the table are
    set aside by the search the Dask operator runs (:func:`datamask_dask.dedup.search.one_task`
    decides where its candidates are found by the partitions and the rows the scans count; the same
    groups either way): on the driver for a few partitions or rows (each partition's signatures
    collected, ~44 bytes a row, :func:`datamask_spark.shards.searched_summaries`), else by the
    sharded stages on the executors (:func:`datamask_spark.shards.sharded_summaries`); the
    candidates are confirmed on exact cosine on the executors, and only the summaries reach the
    driver (and, searched there, the confirmed edges, which the driver groups). The scans are
    persisted meanwhile
    (:func:`datamask_spark.shards.cached`), without their embeddings, which the exact check reads
    again: ``vectors(function)`` runs a ``mapInArrow`` function over the input's embedding column
    (task ``k`` on partition ``k``). ``then``: called once every partition is scanned.
    """
    if spec.diversity_scope != "table":
        rows = plan_rows.collect()
        if then is not None:
            then()
        return gather_summaries(rows, spec)
    with cached(plan_rows, "the plan pass's scans") as scans:
        heads = scans.select("partition", "rows", "failed").collect()
        if then is not None:
            then()
        failed = sorted(row["partition"] for row in heads if row["failed"])
        if failed:  # the first failed partition's error, raised on the driver
            raise pickle.loads(scans.where(f"partition = {failed[0]}").first()["payload"])["error"]  # noqa: S301 (this job's own task payloads)
        n_rows = sum(row["rows"] for row in heads)
        n_parts = max((row["partition"] for row in heads), default=-1) + 1
        search = searched_summaries if one_task(n_parts, n_rows) else sharded_summaries
        return gather_summaries(search(scans, spec.duplicate_cosine, n_rows, n_parts, vectors), spec)


def gather_summaries(rows: list, spec: SelectSpec) -> list[PartitionSummary]:
    """Each partition's summary, in partition order, from the plan pass's collected rows."""
    payloads = {row["partition"]: pickle.loads(row["payload"]) for row in rows}  # noqa: S301 (this job's own task payloads)
    failed = [payloads[p]["error"] for p in sorted(payloads) if "error" in payloads[p]]
    if failed:
        raise failed[0]
    # Spark may skip empty partitions entirely: they plan no rows (select_partition treats a
    # partition beyond the plan as planned empty).
    count = max(payloads, default=-1) + 1
    return [payloads[p]["summary"] if p in payloads else EMPTY_SUMMARY for p in range(count)]


class SummaryTask:
    """The plan pass's ``mapInArrow`` function: one partition's checks and summary, as one row."""

    def __init__(self, spec: SelectSpec, schema: pa.Schema, partitions: int = 1):
        self.spec, self.schema, self.partitions = spec, schema, partitions

    def __call__(self, batches):
        number = partition_number()
        _limit_threads()  # the signing product runs on torch
        batches = list(batches)
        frame = to_pandas(pa.Table.from_batches(batches)) if batches else empty_frame(self.schema)
        try:
            if self.spec.diversity_scope == "table":  # checks and signatures; summarised on the driver
                payload = {"scan": scan_partition(frame, number, self.spec, self.partitions)}
            else:
                payload = {"summary": summarise_partition(frame, number, self.spec)}
        except DataMaskError as exc:  # reported by the driver, not as a Spark task failure
            payload = {"error": exc}
        yield pa.RecordBatch.from_pydict({"partition": pa.array([number], pa.int32()),
                                          "rows": pa.array([len(frame)], pa.int64()),
                                          "failed": pa.array(["error" in payload], pa.bool_()),
                                          "payload": pa.array([pickle.dumps(payload)], pa.binary())})


def id_report(sdf, id_column: str) -> tuple[int, list]:
    """Duplicate ids as :func:`datamask_dask.partition.checks.id_report` gives them: a count and examples.

    A DataFrame aggregation (one shuffle of the id column), so no single task holds every id.
    """
    from pyspark.sql import functions as F

    return duplicate_ids(sdf.select(_col(id_column).alias("id"), F.spark_partition_id().alias("part")))


def duplicate_ids(ids) -> tuple[int, list]:
    """:func:`id_report` of a DataFrame of ``id`` and ``part`` (the partition each row is in)."""
    from pyspark.sql import functions as F

    dups = (ids.where(F.col("id").isNotNull()).groupBy("id")
            .agg(F.count(F.lit(1)).alias("n"), F.array_sort(F.collect_set("part")).alias("parts"))
            .where(F.col("n") > 1))
    n_dup = dups.agg(F.sum(F.col("n") - 1).alias("extra")).collect()[0]["extra"] or 0
    if not n_dup:
        return 0, []
    first = dups.orderBy("id").limit(SHOW).collect()
    examples = [(row["id"], [int(p) for p in row["parts"]]) for row in first]
    return int(n_dup), examples


def probe_dimension(sdf, column: str) -> int | None:
    """The length of one non-null embedding (``validate="light"``)."""
    from pyspark.sql import functions as F

    rows = sdf.where(_col(column).isNotNull()).select(F.size(_col(column)).alias("d")).limit(1).collect()
    return int(rows[0]["d"]) if rows else None


# --------------------------------------------------------------------------- pack pass


def spark_packs(sdf, plan: Plan, todo=None) -> dict:
    """:func:`learn_packs` over the Spark partitions of ``sdf``."""
    return learn_packs(plan, arrow_schema(sdf), reader(sdf), todo)


def spark_pending(plan: Plan, schema: pa.Schema, read) -> Plan:
    """The plan the select pass follows, from a :attr:`~datamask_dask.plan.types.Plan.pending` one (any
    other as it is): its regions' quotas shared (:func:`spark_regions`), or its context's rounds
    learned (:func:`spark_context_round`). ``read`` as for :func:`learn_packs`."""
    while plan.pending:
        if plan.context is not None:
            plan = spark_context_round(plan, schema, read)
        else:
            plan = spark_regions(plan, schema, read)
    return plan


def spark_context_round(plan: Plan, schema: pa.Schema, read) -> Plan:
    """The context's next round (``pieces="context"``): every piece learned as the round learns it (its
    packs by :func:`learn_packs`, each partition's picks by
    :func:`~datamask_dask.partition.select.context_round`), added up on the driver in partition order,
    as every engine adds them, one partition's d x d sums at a time
    (:meth:`~datamask_dask.plan.types.Plan.with_round`)."""
    found = read(ContextRoundTask(plan, schema, learn_packs(plan, schema, read))).persist()
    total, last = None, -1
    try:
        with spark_errors():
            found.count()  # every partition learned at once; their picks reach the driver one at a time
            for row in found.toLocalIterator(prefetchPartitions=True):
                if row["partition"] <= last:
                    raise RuntimeError(f"spark_context_round: partition {row['partition']} came after "
                                       f"{last}; please report this with the run record")
                last = row["partition"]
                picks = pickle.loads(row["payload"])  # noqa: S301 (this job's own task payloads)
                total = picks if total is None else total + picks
    finally:
        found.unpersist()
    return plan.with_round(total)


def spark_regions(plan: Plan, schema: pa.Schema, read) -> Plan:
    """``plan`` with its regions' quotas shared (``pieces="regions"``) by
    :func:`~datamask_dask.plan.reduce.share_regions` on the driver, from what the plan pass finds of
    the areas: Facility's curves, each region's from its members' rows grouped by region; Pair_simi's
    sums by area, each partition's (which move no rows). ``read`` as for :func:`learn_packs`."""
    if plan.spec.options.metric == "pair_simi":
        found = read(AreaSumsTask(plan, schema))
    else:
        def curve(rows):  # a plain function: Spark reads its arity to tell whether it takes the key
            _limit_threads()
            index = int(rows["pack"].iloc[0])
            try:
                curves = pack_curve(_pack_pieces(plan, rows, index), plan, index)
            except DataMaskError as exc:
                raise RuntimeError(transport(exc)) from None
            return pd.DataFrame({"pack": np.array([index], dtype=np.int32),
                                 "partition": np.array([-1], dtype=np.int32),
                                 "found": [pickle.dumps(curves, protocol=5)]})

        found = read(PackRowsTask(plan, schema, range(len(plan.packs)))).groupBy("pack").applyInPandas(
            curve, AREAS_SCHEMA)
    with spark_errors():
        collected = found.collect()
    # in pack, then partition order: Pair_simi's sums are added up in the order of every engine
    summaries = [pickle.loads(row["found"])  # noqa: S301 (this job's own task payloads)
                 for row in sorted(collected, key=lambda row: (row["pack"], row["partition"]))]
    return share_regions(plan, summaries)


def partition_count(sdf) -> int:
    """``sdf``'s partitions (on Spark Connect, which has no RDD, by a small job)."""
    try:
        return sdf.rdd.getNumPartitions()
    except Exception:  # Spark Connect
        from pyspark.sql.functions import spark_partition_id

        return sdf.select(spark_partition_id().alias("p")).distinct().count()


def learn_packs(plan: Plan, schema: pa.Schema, read, todo=None) -> dict:
    """The pack pass (eager): learn the plan's packs that hold a partition of ``todo`` (None: all),
    each from all its members' rows, finished members included; their results, ``{pack index:
    PackResult}``, which the select tasks take.

    ``read(task)``: the DataFrame (of ``task.output``, :data:`PACK_ROWS_SCHEMA` here) that ``task`` (a
    :class:`PackRowsTask`) makes when mapped over the input's partitions (``task.columns`` of ``schema``).
    """
    wanted = [index for index, pack in enumerate(plan.packs)
              if todo is None or not set(todo).isdisjoint(pack.partitions)]
    if not wanted:
        return {}
    def learn(rows):  # a plain function: Spark reads its arity to tell whether it takes the key
        return learn_group(plan, rows)

    rows = read(PackRowsTask(plan, schema, wanted))
    learned = rows.groupBy("pack").applyInPandas(learn, PACK_RESULT_SCHEMA)
    with spark_errors():
        collected = learned.collect()
    return {row["pack"]: pickle.loads(row["payload"]) for row in collected}  # noqa: S301 (this job's own task payloads)


class PackRowsTask:
    """The pack pass's ``mapInArrow`` function: a member partition's eligible rows of the ``packs``
    (plan indices) it is in, one row each (:data:`PACK_ROWS_SCHEMA`); other partitions emit nothing."""

    output = PACK_ROWS_SCHEMA

    def __init__(self, plan: Plan, schema: pa.Schema, packs):
        self.plan, self.schema, self.packs = plan, schema, frozenset(packs)
        self.members = frozenset(p for index in self.packs for p in plan.packs[index].partitions)
        self.columns = [c for c in plan.spec.select_columns if c in schema.names]

    def __call__(self, batches):
        number = partition_number()
        frame = self._frame(number, batches)
        if frame is None:
            return
        try:
            found = self._found(frame, number)
        except DataMaskError as exc:
            raise RuntimeError(transport(exc)) from None
        yield from self._batches(found)

    def _frame(self, number: int, batches) -> pd.DataFrame | None:
        """Partition ``number``'s rows as the pass reads them (None: not a member of the packs)."""
        if number not in self.members:
            for _ in batches:  # Spark scanned them already; not in a pack to learn
                pass
            return None
        _limit_threads()
        batches = [b for b in batches if b.num_rows]
        table = pa.Table.from_batches(batches).select(self.columns) if batches else None
        return to_pandas(table) if table is not None else empty_frame(self.schema)[self.columns]

    def _found(self, frame: pd.DataFrame, number: int):
        return pack_rows(frame, self.plan, {"number": number})

    def _batches(self, pieces: dict[int, PackRows]):
        for index, rows in pieces.items():
            if index in self.packs:
                for start in range(0, rows.positions.size, PACK_BLOCK):
                    yield _pack_batch(index, rows, slice(start, start + PACK_BLOCK))


class AreaSumsTask(PackRowsTask):
    """The regions' Pair_simi pass's ``mapInArrow`` function: a member partition's sums by area
    (:func:`~datamask_dask.partition.select.area_sums`), one row (:data:`AREAS_SCHEMA`)."""

    output = AREAS_SCHEMA

    def __init__(self, plan: Plan, schema: pa.Schema):
        super().__init__(plan, schema, range(len(plan.packs)))

    def _found(self, frame: pd.DataFrame, number: int):
        return number, area_sums(pack_rows(frame, self.plan, {"number": number}), self.plan)

    def _batches(self, found):
        number, summaries = found
        payload = pickle.dumps(summaries, protocol=5)
        yield pa.RecordBatch.from_pydict({"pack": pa.array([-1], pa.int32()),
                                          "partition": pa.array([number], pa.int32()),
                                          "found": pa.array([payload], pa.binary())})


def _pack_batch(index: int, rows: PackRows, span: slice) -> pa.RecordBatch:
    """Rows ``span`` of a member's :class:`~datamask_dask.partition.select.PackRows` of pack ``index``."""
    n, dim = rows.embeddings[span].shape
    embeddings = pa.ListArray.from_arrays(pa.array(np.arange(0, (n + 1) * dim, dim, dtype=np.int32)),
                                          pa.array(rows.embeddings[span].ravel(), pa.float32()))
    optional = {name: pa.nulls(n, pa.float64()) if values is None else pa.array(values[span], pa.float64())
                for name, values in (("tokens", rows.tokens), ("weight", rows.weights))}
    return pa.RecordBatch.from_pydict({
        "pack": pa.array(np.full(n, index, dtype=np.int32)),
        "partition": pa.array(np.full(n, rows.partition, dtype=np.int32)),
        "position": pa.array(rows.positions[span], pa.int64()),
        "quality": pa.array(rows.quality[span], pa.float64()), "embedding": embeddings, **optional,
        "device": pa.array([rows.device] * n, pa.string()),
        "seconds": pa.array(np.full(n, rows.seconds, dtype=np.float64)),
        "area": pa.nulls(n, pa.int64()) if rows.areas is None else pa.array(rows.areas[span], pa.int64())})


def learn_group(plan: Plan, rows: pd.DataFrame) -> pd.DataFrame:
    """The pack pass's ``applyInPandas`` step: one pack learned from its rows (:data:`PACK_ROWS_SCHEMA`),
    as one row of :data:`PACK_RESULT_SCHEMA`."""
    _limit_threads()
    index = int(rows["pack"].iloc[0])
    pieces = _pack_pieces(plan, rows, index)
    try:
        out = learn_pack(pieces, plan, index)
    except DataMaskError as exc:
        raise RuntimeError(transport(exc)) from None
    payload = pickle.dumps(out, protocol=5)
    return pd.DataFrame({"pack": np.array([index], dtype=np.int32), "payload": [payload]})


def _pack_pieces(plan: Plan, rows: pd.DataFrame, index: int) -> list[dict[int, PackRows]]:
    """Pack ``index``'s rows (:data:`PACK_ROWS_SCHEMA`) as its members' :func:`pack_rows` would give them."""
    rows = rows.sort_values(["partition", "position"])  # member order, rows in position order
    return [{index: PackRows(
        partition=int(number), positions=member["position"].to_numpy(np.int64),
        quality=member["quality"].to_numpy(np.float64),
        embeddings=np.stack(member["embedding"].to_numpy()).astype(np.float32, copy=False),
        tokens=None if plan.spec.budget is None else member["tokens"].to_numpy(np.float64),
        weights=None if member["weight"].isna().all() else member["weight"].to_numpy(np.float64),
        device=str(member["device"].iloc[0]), seconds=float(member["seconds"].iloc[0]),
        areas=None if member["area"].isna().all() else member["area"].to_numpy(np.int64))}
        for number, member in rows.groupby("partition", sort=True)]


# --------------------------------------------------------------------------- select pass


class SelectTask:
    """The select pass's ``mapInArrow`` function: one partition's rows (of ``schema``) plus ``selected``;
    it reads only the columns the learner needs. ``packs``: the pack pass's results
    (:func:`learn_packs`), where the plan has packs."""

    def __init__(self, plan: Plan, schema: pa.Schema, packs: dict[int, PackResult] | None = None):
        self.plan, self.schema, self.packs = plan, schema, packs or {}
        wanted = dict.fromkeys(plan.spec.select_columns + [plan.spec.id_column])
        self.columns = [c for c in wanted if c in schema.names]

    def __call__(self, batches):
        batches, added = self.select(batches)
        start = 0
        for batch in batches:
            stop = start + batch.num_rows
            schema, arrays = batch.schema, list(batch.columns)
            for field, values in added:
                schema = schema.append(field)
                arrays.append(values.slice(start, batch.num_rows))
            yield pa.RecordBatch.from_arrays(arrays, schema=schema)
            start = stop

    def select(self, batches, measures: Measures | None = None
               ) -> tuple[list[pa.RecordBatch], list[tuple[pa.Field, pa.Array]]]:
        """Run :func:`~datamask_dask.partition.select.select_partition` on one partition (``measures``:
        where its stage seconds and curves go).

        Returns
        -------
        batches : list of pyarrow.RecordBatch
            The partition's non-empty input batches, unchanged.
        added : list of (pyarrow.Field, pyarrow.Array)
            ``selected`` (and the score column) for all of the partition's rows, in batch order.
        """
        spec = self.plan.spec
        number = partition_number()
        _limit_threads()
        batches = [b for b in batches if b.num_rows]
        packs = self.packs.values()
        try:
            if not batches:  # still checked against the plan (a partition that lost its rows fails)
                select_partition(empty_frame(self.schema)[self.columns], self.plan, {"number": number}, packs,
                                 measures)
                return [], []
            table = pa.Table.from_batches(batches).select(self.columns)
            out = select_partition(to_pandas(table), self.plan, {"number": number}, packs, measures)
        except DataMaskError as exc:
            raise RuntimeError(transport(exc)) from None
        return batches, selection_arrays(out, spec, self.schema)


class ContextRoundTask(SelectTask):
    """A round of the context's ``mapInArrow`` function: one partition's
    :func:`~datamask_dask.partition.select.context_round`, pickled in one row
    (:data:`CONTEXT_ROUND_SCHEMA`)."""

    output = CONTEXT_ROUND_SCHEMA
    members = None  # every partition is read

    def __call__(self, batches):
        number = partition_number()
        _limit_threads()
        batches = [b for b in batches if b.num_rows]
        table = pa.Table.from_batches(batches).select(self.columns) if batches else None
        frame = to_pandas(table) if table is not None else empty_frame(self.schema)[self.columns]
        try:
            picks = context_round(frame, self.plan, {"number": number}, self.packs.values())
        except DataMaskError as exc:
            raise RuntimeError(transport(exc)) from None
        payload = pickle.dumps(picks, protocol=5)
        yield pa.RecordBatch.from_pydict({"partition": pa.array([number], pa.int32()),
                                          "payload": pa.array([payload], pa.binary())})


def _limit_threads() -> None:
    """One torch and Arrow thread per Spark task core (``spark.task.cpus``), as the Dask workers have:
    tasks in the other slots have the other cores (Spark sets ``OMP_NUM_THREADS`` for BLAS itself).
    The learner takes one thread whatever this says (:mod:`datamask_dask.threads`)."""
    import torch
    from pyspark import TaskContext

    context = TaskContext.get()
    cpus = max(1, int(context.cpus() if context is not None and hasattr(context, "cpus") else 1))
    if torch.get_num_threads() != cpus:
        torch.set_num_threads(cpus)
    if pa.cpu_count() != cpus:
        pa.set_cpu_count(cpus)


# --------------------------------------------------------------------------- errors


def transport(exc: DataMaskError) -> str:
    """``exc``'s message, plus a marker :func:`spark_errors` turns back into the same error on the driver."""
    body = base64.b64encode(json.dumps({"kind": type(exc).__name__, "message": str(exc)}).encode()).decode()
    return f"{exc}\nDATAMASK-ERROR {type(exc).__name__} {body} END"


@contextmanager
def spark_errors():
    """Turn a Spark action's failure caused by bad input back into the package's own error.

        with spark_errors():
            out.write.parquet(path)

    Raises the :class:`~datamask_dask.errors.InputDataError` (or ``OptionError``) a worker raised,
    with the worker's message (naming the partition, column and rows), instead of Spark's
    ``PythonException``; any other failure propagates unchanged.
    """
    try:
        yield
    except DataMaskError:
        raise
    except Exception as exc:
        found = _MARK.search(str(exc))  # the package error a worker raised, carried by Spark's
        if found is None:
            raise
        payload = json.loads(base64.b64decode(found.group(2)))
        kind = getattr(_errors, payload["kind"], None)
        if not (isinstance(kind, type) and issubclass(kind, DataMaskError)):
            kind = DataMaskError
        raise kind(payload["message"]) from None


# --------------------------------------------------------------------------- helpers


def partition_number() -> int:
    """The Spark partition this task works on."""
    from pyspark import TaskContext

    return int(TaskContext.get().partitionId())


def arrow_schema(sdf) -> pa.Schema:
    """A Spark DataFrame's schema as Arrow's."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(sdf.schema)


def empty_frame(schema: pa.Schema) -> pd.DataFrame:
    """An empty pandas frame with Arrow dtypes (the ``meta`` the core validates against)."""
    return to_pandas(schema.empty_table())


def reader(sdf):
    """The ``read`` of :func:`learn_packs` over ``sdf``: a task's columns of each partition, as the task
    maps them."""
    return lambda task: map_in_arrow(sdf, task.columns, task, task.output)


def map_in_arrow(sdf, columns: list[str], function, schema):
    """``sdf.mapInArrow(function, schema)`` over ``columns`` of ``sdf``. They travel as ``c0, c1, ...``
    and get their names back in the task: ``mapInArrow`` resolves each column by its name, which Spark
    reads as a field path where the name holds a dot."""
    columns = list(columns)
    positional = sdf.select(*[_col(c).alias(f"c{i}") for i, c in enumerate(columns)])
    return positional.mapInArrow(_Renamed(function, columns), schema)


class _Renamed:
    """A ``mapInArrow`` function given its batches with the columns' own names (:func:`map_in_arrow`)."""

    def __init__(self, function, names: list[str]):
        self.function, self.names = function, names

    def __call__(self, batches):
        return self.function(batch.rename_columns(self.names) for batch in batches)


def _col(name: str):
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")
