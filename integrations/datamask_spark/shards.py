"""The table-wide near-duplicate search on Spark, on the executors: the driver never holds a signature.

The stages of :mod:`datamask_dask.dedup.stages` (the Dask operator runs them as a task graph), each a
DataFrame step over the plan pass's scans, so that no task holds more than a shard:

1. band records (one ``mapInArrow`` over the scans, making ``ROUND_BANDS`` bands at a time), as
   one row per round, shard and partition holding that shard's piece (the arrays the Dask graph
   moves, pickled: Spark shuffles a few large binary values, not a row per record),
   repartitioned by round and shard (Spark's shuffle spills to disk, so the rounds need no
   barrier between them);
2. per shard, the buckets' candidates found on their signatures
   (:func:`~datamask_dask.dedup.stages.bucket_edges`), edges repartitioned by the worse row;
3. per shard of worse rows, each row's best candidates sent to the vector blocks (consecutive
   partitions) of their better rows (:func:`~datamask_dask.dedup.stages.request_vectors`), which
   add those rows' embeddings (:func:`~datamask_dask.dedup.stages.attach_vectors`), then to those
   of their worse rows, which confirm them on exact cosine
   (:func:`~datamask_dask.dedup.stages.confirm_edges`): each vector block's requests and its
   partitions' embeddings meet in one task by a cogroup on the block. The embeddings are read
   again from the input (a ``mapInArrow`` per step, :class:`VectorRows`): the scans keep none and
   nothing holding them is persisted. The confirmed edges repartitioned by the worse row, each
   shadowed row's best better neighbour (:func:`~datamask_dask.dedup.stages.best_parents`);
4. ``ROUNDS`` rounds of forwarding each shadowed row's count to its parent (DataFrame joins), as
   :func:`~datamask_dask.dedup.stages.forward_weights` does;
5. the groups grouped by partition, joined to the partition's scan and summarised there
   (:func:`~datamask_dask.partition.checks.summarise_scan`): only the summaries reach the driver.

Every stage orders what it receives (a shard's pieces by partition, as the Dask graph passes them),
so the groups equal the Dask graph's on the same partitions whatever order Spark's shuffles
deliver rows in.
"""

from __future__ import annotations

import functools
import itertools
import pickle
import warnings
from contextlib import contextmanager
from functools import reduce

import numpy as np
import pyarrow as pa

from datamask_dask.dedup.groups import DuplicateGroups
from datamask_dask.dedup.simhash import SIGNATURE_BYTES
from datamask_dask.dedup.stages import (
    PARTITIONS_PER_SHARD,
    ROUNDS,
    attach_vectors,
    band_plan,
    band_records,
    band_rounds,
    best_parents,
    bucket_edges,
    confirm_edges,
    read_rows,
    request_vectors,
    shard_count,
    wanted_rows,
)
from datamask_dask.partition.adapters import embedding_rows
from datamask_dask.partition.checks import duplicate_input, summarise_scan

RECORD_SCHEMA = "round int, shard int, partition int, piece binary"  # a pickled band_records piece
# Bands a bucket task takes at once: Spark's shuffle spills to disk, so rounds bound only a task's
# records, and fewer, larger pieces cost less to pickle and shuffle. The groups do not depend on it.
ROUND_BANDS = 2
EDGE_SCHEMA = "worse long, better long, quality double"
PIECE_SCHEMA = "shard int, piece binary"  # a pickled piece for a vector block: embeddings or edges
PARENT_SCHEMA = "child long, parent long"
# a partition's groups: its shadowed rows and their parents' refs, its kept rows and their weights,
# the positions of its rows that are some row's parent
GROUPS_SCHEMA = ("partition int, shadowed array<struct<position: long, parent: long>>, "
                 "kept array<struct<position: long, weight: long>>, parents array<long>")
_POSITION = 0xFFFFFFFF  # a row reference is partition << 32 | position
_PIECE_ROWS = 1 << 14  # rows of unit embeddings a VectorRows piece holds


def searched_summaries(scans, cosine: float, n_rows: int, n_parts: int, vectors):
    """The plan pass's summaries with near-duplicates across the table set aside (collected rows),
    for a table whose candidates one task finds (:func:`~datamask_dask.dedup.search.one_task`):
    each partition's search inputs (signatures, ~44 bytes a row, never the embeddings) collected,
    the candidates found on the driver (:func:`~datamask_dask.dedup.search.candidate_edges`) and
    confirmed on the executors, which read the embeddings of the candidates' rows alone (the driver
    knows them). The confirmed edges (at most a few a row) come back to the driver, which groups them
    as the Dask operator's one task does (:func:`~datamask_dask.dedup.search.split_groups`); each
    partition's groups are joined to its scan and summarised on the executors."""
    from datamask_dask.dedup.search import candidate_edges, split_groups

    blocks = shard_count(n_parts, PARTITIONS_PER_SHARD)
    inputs = {row["partition"]: pickle.loads(row["piece"])  # noqa: S301 (this job's own task payloads)
              for row in scans.mapInArrow(SearchInputs(), "partition int, piece binary").collect()}
    empty = {"quality": np.zeros(0), "codes": np.zeros(0, dtype=np.int64), "labels": [],
             "signatures": np.zeros((0, SIGNATURE_BYTES), dtype=np.uint8)}
    parts = [inputs.get(p, empty) for p in range(n_parts)]
    (edges,) = candidate_edges(parts, cosine, 1)
    requests = request_vectors([edges], blocks)
    wanted = [{p: wanted_rows(requests, p, side) for p in range(n_parts)} for side in (1, 0)]
    session = scans.sparkSession
    # the driver's frames go to Spark as Arrow tables and come back as one: no Python worker converts
    # them row by row
    asked = session.createDataFrame(pa.Table.from_batches([_pieces(requests)]), PIECE_SCHEMA)
    confirmed = _confirmed_edges(scans, asked, cosine, blocks, vectors, wanted).toArrow()
    found = best_parents([tuple(confirmed.column(c).to_numpy().astype(dtype) for c, dtype in
                                (("worse", np.int64), ("better", np.int64), ("quality", np.float64)))], 1)
    offsets = np.concatenate([[0], np.cumsum([len(part["quality"]) for part in parts])])
    parent = np.full(int(offsets[-1]), -1, dtype=np.int64)
    parent[_table_rows(found["child"], offsets)] = _table_rows(found["parent"], offsets)
    groups = _groups_table(split_groups(offsets, parent))
    return _summarised(scans, session.createDataFrame(groups, GROUPS_SCHEMA))


def _groups_table(groups: list[DuplicateGroups]) -> pa.Table:
    """Each partition's groups, partition ``p`` in row ``p``, as an Arrow table of ``GROUPS_SCHEMA``."""

    def lists(columns: list[list[np.ndarray]], names: list[str] | None = None) -> pa.ListArray:
        """Row ``p``: partition ``p``'s items, ``columns[i][p]`` their column ``i`` (``names``: structs)."""
        offsets = np.concatenate([[0], np.cumsum([len(items) for items in columns[0]], dtype=np.int64)])
        arrays = [pa.array(np.concatenate([np.zeros(0, np.int64), *column]), pa.int64())
                  for column in columns]
        items = pa.StructArray.from_arrays(arrays, names=names) if names else arrays[0]
        return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), items)

    return pa.table({"partition": pa.array(range(len(groups)), pa.int32()),
                     "shadowed": lists([[g.shadowed for g in groups], [g.parent for g in groups]],
                                       ["position", "parent"]),
                     "kept": lists([[g.kept for g in groups], [g.weights for g in groups]],
                                   ["position", "weight"]),
                     "parents": lists([[g.parents for g in groups]])})


def _table_rows(refs: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Row references ``partition << 32 | position`` as rows of the table."""
    refs = refs.astype(np.uint64)
    return offsets[(refs >> np.uint64(32)).astype(np.int64)] + (refs & np.uint64(_POSITION)).astype(np.int64)


def sharded_summaries(scans, cosine: float, n_rows: int, n_parts: int, vectors):
    """The plan pass's summaries with near-duplicates across the table set aside (collected rows).

    ``scans``: the plan pass's rows (``partition, rows, failed, payload``; each payload a pickled
    ``{"scan": ...}``), none failed, best persisted (it is read twice: for band records, to summarise).
    ``vectors(function)``: a DataFrame of ``function`` (a ``mapInArrow`` function, :class:`VectorRows`)
    run over the input's embedding column, task ``k`` on partition ``k``, as the scans read it.
    Returns the collected rows of the same schema whose payloads are pickled ``{"summary": ...}``.
    ``n_rows`` sizes the bands, ``n_parts`` the shards (as the Dask graph's).
    """
    shards = shard_count(n_parts, PARTITIONS_PER_SHARD)
    plan = band_plan(n_rows)
    records = scans.mapInArrow(BandRecords(plan, shards), RECORD_SCHEMA)
    buckets = records.repartition(len(band_rounds(rounds_of=ROUND_BANDS)) * shards, "round", "shard")
    edges = buckets.mapInArrow(BucketEdges(cosine), EDGE_SCHEMA)
    asked = edges.repartition(shards, "worse").mapInArrow(RequestVectors(shards), PIECE_SCHEMA)
    confirmed = _confirmed_edges(scans, asked, cosine, shards, vectors)
    return _summaries(scans, confirmed.repartition(shards, "worse").mapInArrow(BestParents(), PARENT_SCHEMA))


def _confirmed_edges(scans, asked, cosine: float, blocks: int, vectors, wanted=(None, None)):
    """Stage 3 from the candidates' requests (``asked``: piece rows for the vector blocks): the edges
    confirmed on exact cosine (``EDGE_SCHEMA``). ``wanted``: the rows each partition's better and
    worse reads keep (None: every row)."""
    better = vectors(VectorRows(wanted[0]))
    # cogrouped, not a union repartitioned: a union would run the reads inside its own tasks, whose
    # partition numbers are the union's
    attached = (asked.groupBy("shard").cogroup(better.groupBy("shard"))
                .applyInPandas(functools.partial(attach_frame, blocks), PIECE_SCHEMA))
    worse = vectors(VectorRows(wanted[1]))  # read again, not persisted: no step holds the embeddings
    return (attached.groupBy("shard").cogroup(worse.groupBy("shard"))
            .applyInPandas(functools.partial(confirm_frame, cosine), EDGE_SCHEMA))


def _summaries(scans, parents):
    """Stages 4-5: the weights forwarded along the parent links, the groups joined to their scans."""
    from pyspark.sql import functions as F

    with cached(parents, "the near-duplicate search's parent links") as parents:  # read by every round
        roots = forwarded_counts(parents)
        partition = F.shiftright(F.col("ref"), 32).cast("int").alias("partition")
        position = F.col("ref").bitwiseAND(F.lit(_POSITION)).alias("position")
        shadowed = (parents.select(F.col("child").alias("ref"), "parent")
                    .select(partition, position, "parent").groupBy("partition")
                    .agg(F.collect_list(F.struct("position", "parent")).alias("shadowed")))
        kept = (roots.select(partition, position, (F.col("count") + 1).alias("weight"))
                .groupBy("partition").agg(F.collect_list(F.struct("position", "weight")).alias("kept")))
        # the rows that are some row's parent, in their own partitions (explain names them by id)
        named = (parents.select(F.col("parent").alias("ref")).distinct().select(partition, position)
                 .groupBy("partition").agg(F.collect_list("position").alias("parents")))
        return _summarised(scans, shadowed, kept, named)


def _summarised(scans, *groups):
    """Stage 5: each partition's groups (the columns of ``GROUPS_SCHEMA``, in one or more frames of a
    row per partition that has any) joined to its scan and summarised there, collected."""
    from pyspark.sql.pandas.types import to_arrow_schema

    joined = reduce(lambda frame, group: frame.join(group, "partition", "left"), groups, scans)
    return joined.mapInArrow(Summarise(to_arrow_schema(scans.schema)), scans.schema).collect()


@contextmanager
def cached(frame, what: str):
    """``frame`` persisted on the executors for the block, then unpersisted. Where the session
    refuses to persist (serverless Spark Connect services do), ``frame`` itself, with a warning
    naming ``what``: its rows are then computed again each time they are read."""
    from pyspark import StorageLevel
    from pyspark.errors import PySparkException

    try:
        kept = frame.persist(StorageLevel.MEMORY_AND_DISK)
    except PySparkException as exc:
        warnings.warn(f"Spark cannot persist {what} ({exc}): they are computed again each time they are "
                      "read, which costs time but gives the same selection", RuntimeWarning, stacklevel=3)
        kept = None
    if kept is None:
        yield frame
        return
    try:
        yield kept
    finally:
        kept.unpersist()


def forwarded_counts(parents):
    """Each kept row that shadowed rows reach and how many reach it (``ref, count``): every shadowed
    row's count of one climbs its parents for ``ROUNDS`` rounds, as
    :func:`~datamask_dask.dedup.stages.forward_weights` moves it (counts still climbing after the
    last round are dropped there too)."""
    from pyspark.sql import functions as F

    pending = parents.select(F.col("parent").alias("target"), F.lit(1).cast("long").alias("count"))
    links = parents.select(F.col("child").alias("target"), F.col("parent").alias("next"))
    roots = []
    for _ in range(ROUNDS):
        step = pending.groupBy("target").agg(F.sum("count").alias("count")).join(links, "target", "left")
        roots.append(step.where(F.col("next").isNull()).select(F.col("target").alias("ref"), "count"))
        pending = step.where(F.col("next").isNotNull()).select(F.col("next").alias("target"), "count")
    return reduce(lambda a, b: a.unionAll(b), roots).groupBy("ref").agg(F.sum("count").alias("count"))


def _rows(batches):
    """The rows of a task's Arrow batches as one table (None for none)."""
    batches = [b for b in batches if b.num_rows]
    return pa.Table.from_batches(batches) if batches else None


def _uint64(column: pa.ChunkedArray) -> np.ndarray:
    return column.to_numpy().view(np.uint64)


def _int64(values: np.ndarray) -> pa.Array:
    return pa.array(np.asarray(values, dtype=np.uint64).view(np.int64), pa.int64())


class BandRecords:
    """Stage 1: the band records of each scanned partition of the task, one row per round and shard."""

    def __init__(self, plan: dict, shards: int):
        self.plan, self.shards = plan, shards

    def __call__(self, batches):
        for batch in batches:
            for row in batch.select(["partition", "payload"]).to_pylist():
                part = duplicate_input(pickle.loads(row["payload"])["scan"])  # noqa: S301 (this job's own task payloads)
                for r, bands in enumerate(band_rounds(rounds_of=ROUND_BANDS)):  # a round's records at a time
                    pieces = band_records(part, row["partition"], self.plan, self.shards, bands)
                    yield pa.RecordBatch.from_pydict(
                        {"round": pa.array([r] * self.shards, pa.int32()),
                         "shard": pa.array(range(self.shards), pa.int32()),
                         "partition": pa.array([row["partition"]] * self.shards, pa.int32()),
                         "piece": pa.array([pickle.dumps(p, protocol=5) for p in pieces], pa.binary())})


class SearchInputs:
    """Each scanned partition's search inputs (:func:`~datamask_dask.partition.checks.duplicate_input`),
    pickled, one row per partition."""

    def __call__(self, batches):
        for batch in batches:
            for row in batch.select(["partition", "payload"]).to_pylist():
                part = duplicate_input(pickle.loads(row["payload"])["scan"])  # noqa: S301 (this job's own task payloads)
                yield pa.RecordBatch.from_pydict({"partition": pa.array([row["partition"]], pa.int32()),
                                                  "piece": pa.array([pickle.dumps(part, protocol=5)],
                                                                    pa.binary())})


class VectorRows:
    """A ``mapInArrow`` function over the input's embedding column: its partition's unit embeddings
    of the ``wanted`` rows (positions per partition; None: every row) as pieces for the partition's
    vector block, ``_PIECE_ROWS`` rows each."""

    def __init__(self, wanted: dict | None = None):
        self.wanted = wanted

    def __call__(self, batches):
        from datamask_dask.io.pieces import to_pandas

        from .operator import partition_number

        number = partition_number()
        positions = None if self.wanted is None else self.wanted.get(number, np.zeros(0, dtype=np.int64))
        if positions is not None and not positions.size:  # no candidate here: the column is not converted
            return
        batches = [b for b in batches if b.num_rows]
        if not batches:
            return
        series = to_pandas(pa.Table.from_batches(batches)).iloc[:, 0]
        positions = np.arange(len(series)) if positions is None else positions
        source = embedding_rows(series, number)
        shard = pa.array([number // PARTITIONS_PER_SHARD], pa.int32())
        for start in range(0, positions.size, _PIECE_ROWS):  # pieces well under Arrow's 2 GiB a value
            piece = pickle.dumps(read_rows(source, number, positions[start:start + _PIECE_ROWS]), protocol=5)
            yield pa.RecordBatch.from_pydict({"shard": shard, "piece": pa.array([piece], pa.binary())})


def _pieces(pieces: list) -> pa.RecordBatch:
    """One row per shard: its piece, pickled."""
    return pa.RecordBatch.from_pydict({"shard": pa.array(range(len(pieces)), pa.int32()),
                                       "piece": pa.array([pickle.dumps(p, protocol=5) for p in pieces],
                                                         pa.binary())})


def _unpickled(frame) -> list:
    """A cogrouped side's pieces (a pandas frame of piece rows), unpickled."""
    return [pickle.loads(piece) for piece in frame["piece"]]  # noqa: S301 (this job's own task payloads)


def _piece_frame(pieces: list):
    """:func:`_pieces` as the pandas frame a cogroup returns."""
    return _pieces(pieces).to_pandas()


class RequestVectors:
    """Stage 3: one shard of worse rows' candidate edges, each row's best, sent to the vector blocks
    of their better rows."""

    def __init__(self, shards: int):
        self.shards = shards

    def __call__(self, batches):
        table = _rows(batches)
        if table is None:
            return
        edges = [(_uint64(table.column("worse")), _uint64(table.column("better")),
                  table.column("quality").to_numpy())]
        yield _pieces(request_vectors(edges, self.shards))


def attach_frame(blocks: int, requests, vectors):
    """Stage 3 (a cogroup's function, with ``blocks`` bound): one vector block's requests with their
    better rows' embeddings, sent to the vector blocks of their worse rows. A function, not a
    callable object: Spark tells ``(left, right)`` from ``(key, left, right)`` by its arguments."""
    return _piece_frame(attach_vectors(_unpickled(requests), _unpickled(vectors), blocks))


def confirm_frame(cosine: float, attached, vectors):
    """Stage 3 (a cogroup's function, with ``cosine`` bound): one vector block's candidate edges
    confirmed on exact cosine, as edges."""
    import pandas as pd

    (worse, better, quality), = confirm_edges(_unpickled(attached), _unpickled(vectors), cosine, 1)
    return pd.DataFrame({"worse": worse.view(np.int64), "better": better.view(np.int64), "quality": quality})


class BucketEdges:
    """Stage 2: the candidate pairs of the task's shards' buckets, as each worse row's best edges
    ``(worse, better, quality)``."""

    def __init__(self, cosine: float):
        self.cosine = cosine

    def __call__(self, batches):
        table = _rows(batches)
        if table is None:
            return
        columns = [table.column(c).to_pylist() for c in ("round", "shard", "partition")]
        rows = sorted(zip(*columns, range(table.num_rows), strict=True))
        pieces = table.column("piece")
        # several (round, shard) may hash to one task; each one's pieces in partition order, as the
        # Dask graph passes them
        for _, bucket in itertools.groupby(rows, key=lambda row: row[:2]):
            mine = [pickle.loads(pieces[i].as_py()) for *_, i in bucket]  # noqa: S301 (this job's own task payloads)
            worse, better, quality = bucket_edges(mine, 1, self.cosine, exact=True)["pieces"][0]
            yield pa.RecordBatch.from_arrays([_int64(worse), _int64(better), pa.array(quality, pa.float64())],
                                             names=["worse", "better", "quality"])


class BestParents:
    """Stage 3: each shadowed row of one shard of worse rows and its best better neighbour."""

    def __call__(self, batches):
        table = _rows(batches)
        if table is None:
            return
        worse, better = _uint64(table.column("worse")), _uint64(table.column("better"))
        found = best_parents([(worse, better, table.column("quality").to_numpy())], 1)
        yield pa.RecordBatch.from_arrays([_int64(found["child"]), _int64(found["parent"])],
                                         names=["child", "parent"])


class Summarise:
    """Stage 5: each partition's scan summarised without its shadowed rows, with its kept rows'
    weights, as a row of the plan pass's ``schema`` (Arrow)."""

    def __init__(self, schema: pa.Schema):
        self.schema = schema

    def __call__(self, batches):
        for batch in batches:
            for row in batch.to_pylist():
                kept = sorted((k["position"], k["weight"]) for k in row["kept"] or [])
                shadowed = sorted((c["position"], c["parent"]) for c in row["shadowed"] or [])
                groups = DuplicateGroups(shadowed=np.array([c for c, _ in shadowed], dtype=np.int64),
                                         kept=np.array([k for k, _ in kept], dtype=np.int64),
                                         weights=np.array([w for _, w in kept], dtype=np.int64),
                                         parent=np.array([p for _, p in shadowed], dtype=np.int64),
                                         parents=np.unique(np.asarray(row["parents"] or [], dtype=np.int64)))
                summary = summarise_scan(pickle.loads(row["payload"])["scan"], groups)  # noqa: S301 (this job's own task payloads)
                out = {"partition": row["partition"], "rows": row["rows"], "failed": False,
                       "payload": pickle.dumps({"summary": summary})}
                yield pa.RecordBatch.from_pylist([out], schema=self.schema)
