"""The table-wide near-duplicate search on Dask, wired into the plan's graph (:func:`table_groups`):
in one task for a few partitions (:func:`~datamask_dask.dedup.search.find_groups`), or any number
on a local scheduler, else the stages of :mod:`datamask_dask.dedup.stages` on a cluster, so that no
task holds more than a shard of the table.

The stages have two wirings, which give the same groups:

- **Task to task** (:func:`task_groups`, up to ``SHUFFLE_PARTITIONS`` partitions' worth of shards):
  every records task sends one piece to every bucket task, in memory, one band a round. Cheapest
  where it fits, but its edges grow as the shards squared (about 3.5 x partitions**2 tasks at 4
  partitions a shard), which no scheduler holds at 10**4 partitions. Where the table's rows are
  known, a shard holds at least ``SHARD_ROWS`` rows (:func:`shard_partitions`), so a table of many
  small partitions has few shards.
- **DataFrame shuffles** (:func:`shuffled_groups`, above): every all-to-all step is a Dask
  DataFrame shuffle by :func:`shuffle_method`. A p2p shuffle has O(partitions) tasks, so the graph
  grows about linearly; each record is converted to Arrow and back and written to disk on the
  way, which costs more worker time than the task-to-task pieces where those fit.

Every task orders what it receives (a bucket's records by row reference, as the records arrive in
the in-process stages), so the groups equal :func:`~datamask_dask.dedup.stages.find_groups_sharded`'s
whatever order a shuffle delivers rows in.
"""

from __future__ import annotations

import operator
import sys

import dask
import numpy as np
import pandas as pd
import pyarrow as pa
from dask.delayed import Delayed

from ..graph_keys import listed, named_task
from ..progress import client_of
from .groups import DuplicateGroups
from .search import candidate_edges, find_groups, one_task
from .stages import (
    BANDS,
    CANDIDATES,
    PARTITIONS_PER_ROW_SHARD,
    PARTITIONS_PER_SHARD,
    ROUND_BANDS,
    ROUNDS,
    _best_edges,
    _lookup,
    attach_block,
    band_plan,
    band_records,
    band_rounds,
    best_parents,
    bucket_edges,
    confirm_block,
    deliver,
    forward_weights,
    merge_edges,
    merges_before,
    partition_groups,
    request_vectors,
    shard_count,
    vector_block,
)

__all__ = ["shuffle_method", "shuffled_groups", "table_groups", "task_groups", "wired_by_rows"]

# Tables of more shards than this many partitions make (at 4 a shard) take the DataFrame shuffles: the
# task-to-task graph grows as shards**2 and is scheduled task by task, while the shuffles cost more
# worker time per row but keep a flat peak.
SHUFFLE_PARTITIONS = 256
# Where the rows are known, a shard (and a vector block) takes consecutive partitions up to about this
# many rows, 4 partitions at least: its tasks hold ~56 bytes a row of one band's records (~14 MB).
SHARD_ROWS = 250_000
# A graph built for a local scheduler (threads: one process holds every task's result) finds its
# candidates in one task at any number of partitions: the sharded graph's tasks, or a shuffle's in
# memory, cost the local scheduler far more than the search, and spread no memory across machines.
LOCAL_ONE_TASK = True

# Bands whose records one task makes at once (64 bytes a row each, its bucket number included):
# ~51 MB for 100k rows.
RECORD_BANDS = 8
_WORDS = ["w0", "w1", "w2", "w3"]
_RECORDS = pd.DataFrame({"bucket": np.zeros(0, np.int64), "key": np.zeros(0, np.uint64),
                         "ref": np.zeros(0, np.uint64), "quality": np.zeros(0),
                         **{w: np.zeros(0, np.uint64) for w in _WORDS}})
_EDGES = pd.DataFrame({"worse": np.zeros(0, np.uint64), "better": np.zeros(0, np.uint64),
                       "quality": np.zeros(0)})
_BINARY = pd.ArrowDtype(pa.binary())  # a unit vector's float32 bytes, of any dimension
_ASKED = pd.DataFrame({"shard": np.zeros(0, np.int64), "worse": np.zeros(0, np.uint64),
                       "better": np.zeros(0, np.uint64), "quality": np.zeros(0)})
_ATTACHED = _ASKED.assign(vector=pd.Series([], dtype=_BINARY))
_LINKS = pd.DataFrame({"child": np.zeros(0, np.int64), "parent": np.zeros(0, np.int64)})
_ROWS = pd.DataFrame({"partition": np.zeros(0, np.int64), "position": np.zeros(0, np.int64),
                      "weight": np.zeros(0, np.int64), "parent": np.zeros(0, np.int64)})
_IS_PARENT = -1  # the weight that marks a row as some row's parent (not a group member count)
_POSITION = (1 << 32) - 1  # a row reference is partition << 32 | position
_PREFIX = "datamask-plan-duplicates"  # the search's tasks on the dashboard


def table_groups(inputs: list, cosine: float, vectors: list | None = None, known_rows: int | None = None
                 ) -> list:
    """The near-duplicate groups of the whole table as a Dask graph: one Delayed per partition of
    ``inputs`` (Delayed search inputs, signatures and no embeddings), computing to its entry of
    :func:`~datamask_dask.dedup.search.find_groups` for the inputs with ``vectors`` merged in
    (where candidates are confirmed on exact cosine): per partition, a Delayed read of its
    embedding column (or ``{"embeddings": ...}``), never computed as a task of its own but run again
    inside the exact check's tasks for the candidate rows alone (:func:`rereads`). The wiring (see
    the module notes) follows the partitions, the table's rows where ``known_rows`` gives them, and
    whether a cluster runs the graph, all known when it is built, and the groups are the same
    whichever it takes; no task holds the table's embeddings."""
    per = shard_partitions(len(inputs), known_rows)  # a shard's and a vector block's partitions
    if one_task(len(inputs), known_rows) or not wired_by_rows(len(inputs)):
        if vectors is None:
            found = named_task(_PREFIX, find_groups, listed(_PREFIX, inputs), cosine, nout=len(inputs))
            return [found[i] for i in range(len(inputs))]
        return task_groups(inputs, cosine, None, vectors, per)  # candidates in one task, checked in blocks
    counts = [named_task(_PREFIX, _rows_of, part) for part in inputs]
    rows = named_task(_PREFIX, sum, listed(_PREFIX, counts))
    if shard_count(len(inputs), per) <= shard_count(SHUFFLE_PARTITIONS, PARTITIONS_PER_SHARD):
        return task_groups(inputs, cosine, rows, vectors, per)
    return shuffled_groups(inputs, cosine, rows, vectors)


def wired_by_rows(n_parts: int) -> bool:
    """Whether the table's rows can change the wiring of :func:`table_groups` for ``n_parts``
    partitions: not where the partitions alone make it one task, nor on a local scheduler (no
    Client is current or Dask's default while the graph is built: the writers make theirs current)."""
    return not one_task(n_parts) and not (LOCAL_ONE_TASK and client_of(None) is None)


def shard_partitions(n_parts: int, known_rows: int | None) -> int:
    """Consecutive partitions a shard of the task-to-task wiring takes: ``PARTITIONS_PER_SHARD``, or
    where the table's rows are known, as many as hold about ``SHARD_ROWS`` rows."""
    if not known_rows or not n_parts:
        return PARTITIONS_PER_SHARD
    return max(PARTITIONS_PER_SHARD, int(SHARD_ROWS * n_parts // known_rows))


def _rows_of(part: dict) -> int:
    return len(part["quality"])


def shuffle_method() -> str:
    """The shuffle method of :func:`shuffled_groups`: ``dask.config``'s ``dataframe.shuffle.method``
    where set, else ``p2p`` with a distributed Client (as Dask's default, disk-backed) and ``tasks``
    (in memory) without one, where Dask's default, ``disk`` (partd), costs time quadratic in the
    partitions."""
    configured = dask.config.get("dataframe.shuffle.method", None)
    if configured:
        return configured
    return "tasks" if client_of(None) is None else "p2p"


def shuffled_groups(inputs: list, cosine: float, rows, vectors: list | None = None) -> list:
    """:func:`table_groups`' stages wired by DataFrame shuffles: about linear in the partitions.

    1. **records**: one task per partition and ``RECORD_BANDS`` bands makes the band records,
       placed by ``key % buckets`` into ``buckets`` partitions of about ``PARTITIONS_PER_SHARD``
       partitions' worth of one band each;
    2. **edges**: each bucket partition's candidates verified, each worse row's best edge shuffled
       by worse row;
    3. **parents**: each shadowed row's best better neighbour;
    4. **counts**: ``ROUNDS`` rounds of each shadowed row's count moving to its parent (a group-by
       and a join a round, :func:`forwarded_counts`);
    5. **deliver**: shadowed and kept rows indexed by partition number, so that each partition's
       groups are one output partition: a partition receives only its own rows.

    With ``vectors``, each worse row's candidates are confirmed on exact cosine between 2 and 3:
    the candidates shuffled to the vector blocks of their better rows, whose tasks read those rows'
    vectors, then to those of their worse rows, which read theirs and keep each row's best
    confirmed edge.
    """
    import dask.dataframe as dd

    method = shuffle_method()
    n_parts = len(inputs)
    plan = named_task(f"{_PREFIX}-plan", band_plan, rows)
    rounds = band_rounds(BANDS, RECORD_BANDS)
    buckets = shard_count(n_parts * BANDS, PARTITIONS_PER_SHARD)  # a bucket task: ~4 partitions x 1 band
    records = dd.from_delayed(
        [named_task(f"{_PREFIX}-records", _records, part, number, plan, bands, buckets)
         for number, part in enumerate(inputs) for bands in rounds],
        meta=_RECORDS, prefix=f"{_PREFIX}-records", verify_meta=False)
    row_shards = shard_count(n_parts, PARTITIONS_PER_ROW_SHARD)
    exact = vectors is not None
    edges = (_by_number(records, "bucket", buckets, method)
             .map_partitions(_edges, cosine, exact, meta=_EDGES, token=f"{_PREFIX}-buckets"))
    by_worse = edges.shuffle("worse", npartitions=row_shards, ignore_index=True, shuffle_method=method)
    if vectors is not None:
        by_worse = _confirmed(by_worse, vectors, cosine, row_shards, method)
    links = by_worse.map_partitions(_parents, meta=_LINKS, token=f"{_PREFIX}-parents")
    counts = forwarded_counts(links, row_shards, method)
    results = dd.concat([links.map_partitions(_shadowed, meta=_ROWS),
                         counts.map_partitions(_kept, meta=_ROWS),
                         links[["parent"]].map_partitions(_parent_rows, meta=_ROWS)])
    # partition p's rows in output partition p: divisions 0, 1, ..., n_parts
    delivered = _by_number(results, "partition", n_parts, method)
    # not fused: dask's blockwise fusion of the counting rounds' graph takes exponential time
    parts = delivered.optimize(fuse=False).to_delayed(optimize_graph=False)
    return [named_task(f"{_PREFIX}-groups", _partition_groups, part) for part in parts]


def _confirmed(by_worse, vectors: list, cosine: float, row_shards: int, method: str):
    """:func:`shuffled_groups`' candidate edges (shuffled by worse row) confirmed on exact cosine,
    as each worse row's best confirmed edge, shuffled by worse row. Each vector block's task reads
    its own partitions again for the rows its edges name (:func:`rereads`)."""
    import dask.dataframe as dd

    per = PARTITIONS_PER_SHARD
    blocks = shard_count(len(vectors), per)
    reads = rereads(vectors)
    firsts = range(0, len(vectors), per)
    asked = by_worse.map_partitions(_asked, meta=_ASKED, token=f"{_PREFIX}-requests")
    asked = _by_number(asked, "shard", blocks, method).to_delayed()  # block t's requests in partition t
    attached = dd.from_delayed([named_task(f"{_PREFIX}-attach", _attached, asked[t], reads[first:first + per],
                                           first, blocks) for t, first in enumerate(firsts)],
                               meta=_ATTACHED, prefix=f"{_PREFIX}-attach", verify_meta=False)
    attached = _by_number(attached, "shard", blocks, method).to_delayed()
    confirmed = dd.from_delayed([named_task(f"{_PREFIX}-confirm", _confirm, attached[t],
                                            reads[first:first + per], first, cosine)
                                 for t, first in enumerate(firsts)],
                                meta=_EDGES, prefix=f"{_PREFIX}-confirm", verify_meta=False)
    return confirmed.shuffle("worse", npartitions=row_shards, ignore_index=True, shuffle_method=method)


class _Reread:
    """A partition's read (a Delayed's culled graph) run again, synchronously, inside the task that
    calls it: the scheduler never holds its result, so the exact check reads the embeddings only
    where and when it needs them (the scans keep none)."""

    def __init__(self, graph: dict, key):
        self.graph, self.key = graph, key

    def __call__(self):
        from dask.local import get_sync

        return get_sync(self.graph, self.key)

    def __dask_tokenize__(self):
        return ("datamask-reread", self.key)


def rereads(vectors: list) -> list:
    """Per Delayed partition read of ``vectors``: a :class:`_Reread` of it, or the Delayed itself
    where its graph holds persisted futures (their data already live on the cluster, and a future
    cannot be read inside another task)."""
    from dask.core import get_dependencies

    distributed = sys.modules.get("distributed")  # not imported: no future can be in the graph
    futures_of = distributed.futures_of if distributed is not None else (lambda _: [])
    # the reads' layers merged once (they share most of them): culling each read's own graph
    # would walk the table's graph once a partition
    graph, seen = {}, {}
    for v in vectors:
        for layer in v.__dask_graph__().layers.values():
            if id(layer) not in seen:
                seen[id(layer)] = layer  # kept alive: a graph made on the fly frees its layers, and ids recur
                graph.update(layer)
    found = []
    for v in vectors:
        if futures_of(v):
            found.append(v)
            continue
        culled, todo = {}, [v.key]
        while todo:  # the read's own tasks
            key = todo.pop()
            if key not in culled:
                culled[key] = graph[key]
                todo.extend(get_dependencies(graph, key))
        found.append(_Reread(culled, v.key))
    return found


def task_groups(inputs: list, cosine: float, rows, vectors: list | None = None,
                per: int = PARTITIONS_PER_SHARD) -> list:
    """:func:`table_groups`' stages wired task to task, in memory. The exchange has ~shards**2 edges, so the
    graph is written as one task dict (a Delayed call per task merges its arguments' graphs each
    time: quadratic in the graph). Bands go in rounds, each round's records made once the previous
    round's buckets are done, so the workers hold one round's records at a time (``ROUND_BANDS`` x
    56 bytes a row). ``rows`` None: the candidates come from one task
    (:func:`~datamask_dask.dedup.search.candidate_edges`) instead, and ``vectors`` are required.
    With ``vectors`` the candidates are confirmed on exact cosine in one vector block per
    ``per`` partitions (:func:`~datamask_dask.dedup.stages.attach_block`,
    :func:`~datamask_dask.dedup.stages.confirm_block`), each reading its partitions again.
    """
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph

    n_parts = len(inputs)
    shards = shard_count(n_parts, per)  # key shards; row shards take 4 times their partitions
    row_shards = shard_count(n_parts, per * PARTITIONS_PER_ROW_SHARD // PARTITIONS_PER_SHARD)
    token = tokenize(inputs, cosine, rows, vectors, per)
    exact, held = vectors is not None, []
    layer = f"{_PREFIX}-{token}"
    dsk: dict = {}

    def task(stage: str, index: tuple, *spec) -> tuple:
        key = (f"{_PREFIX}-{stage}-{token}", *index)
        dsk[key] = spec
        return key

    def pick(source: tuple, index) -> tuple:  # one item of a task's result, as a task of its own
        key = (f"{source[0]}-item", *source[1:], index)
        dsk[key] = (operator.getitem, source, index)
        return key

    if rows is None:
        found = task("candidates", (), candidate_edges, [part.key for part in inputs], cosine, row_shards)
        edges = [[pick(found, t)] for t in range(row_shards)]
    else:
        plan = task("plan", (), band_plan, rows.key)
        # one records task per block of partitions (a shard's worth): the shuffle's picks grow with
        # blocks x shards, not partitions x shards
        firsts = range(0, n_parts, per)
        done, edges = None, [[] for _ in range(row_shards)]
        for r, bands in enumerate(band_rounds(BANDS, ROUND_BANDS)):
            records = [task("records", (r, first), _block_records,
                            [part.key for part in inputs[first:first + per]], first, plan,
                            shards, bands, done) for first in firsts]
            buckets = [task("buckets", (r, s), bucket_edges, [pick(x, s) for x in records], row_shards,
                            cosine, exact) for s in range(shards)]
            done = task("round", (r,), sum, [pick(b, "pairs") for b in buckets])
            pieces = [pick(b, "pieces") for b in buckets]
            if merges_before(r):  # so that the edges do not pile up
                edges = [[task("edges", (r, t), merge_edges, edges[t], exact)] if edges[t] else []
                         for t in range(row_shards)]
            edges = [edges[t] + [pick(p, t) for p in pieces] for t in range(row_shards)]
    if vectors is not None:
        # each row shard's candidates to the vector blocks of their better rows, then of their worse
        blocks, firsts = shard_count(n_parts, per), range(0, n_parts, per)
        found_reads = rereads(vectors)
        reads = [r if isinstance(r, _Reread) else r.key for r in found_reads]
        # persisted reads are the graph's dependencies; the others run inside the block tasks
        held = [v for v, r in zip(vectors, found_reads, strict=True) if not isinstance(r, _Reread)]
        asked = [task("requests", (s,), request_vectors, edges[s], blocks, per) for s in range(row_shards)]
        attached = [task("attach", (t,), attach_block, [pick(a, t) for a in asked], reads[first:first + per],
                         first, blocks, per) for t, first in enumerate(firsts)]
        confirmed = [task("confirm", (t,), confirm_block, [pick(a, t) for a in attached],
                          reads[first:first + per], first, cosine, row_shards)
                     for t, first in enumerate(firsts)]
        edges = [[pick(c, s) for c in confirmed] for s in range(row_shards)]
    parents = [task("parents", (s,), best_parents, edges[s], row_shards) for s in range(row_shards)]
    pending, roots = [pick(p, "pending") for p in parents], []
    for f in range(ROUNDS):
        moved = [task("forward", (f, s), forward_weights, parents[s], [pick(p, s) for p in pending],
                      row_shards) for s in range(row_shards)]
        roots.append([pick(m, "roots") for m in moved])
        pending = [pick(m, "pending") for m in moved]
    delivered = [pick(task("deliver", (s,), deliver, parents[s], [r[s] for r in roots],
                           [pick(p, s) for p in pending], n_parts), "pieces") for s in range(row_shards)]
    groups = [task("groups", (i,), partition_groups, [pick(d, i) for d in delivered]) for i in range(n_parts)]
    depends = [*inputs, *([] if rows is None else [rows]), *held]
    graph = HighLevelGraph.from_collections(layer, dsk, dependencies=depends)
    return [Delayed(key, graph, layer=layer) for key in groups]


def _block_records(parts: list, first: int, plan: dict, shards: int, bands: range, _previous) -> list:
    """:func:`~datamask_dask.dedup.stages.band_records` of one round of bands for consecutive
    partitions ``first, first + 1, ...``, one piece per shard with their records in partition order
    (as a bucket task would concatenate them). ``_previous``: the previous round's finished buckets,
    only an ordering."""
    pieces = [band_records(part, first + i, plan, shards, bands) for i, part in enumerate(parts)]
    return [tuple(np.concatenate(column) for column in zip(*by_shard, strict=True))
            for by_shard in zip(*pieces, strict=True)]


def forwarded_counts(links, shards: int, method: str):
    """Each kept row that shadowed rows reach and how many reach it (``ref, count``): each shadowed
    row's count of one climbs its parents (``links``: ``child, parent``) for ``ROUNDS`` rounds, as
    :func:`~datamask_dask.dedup.stages.forward_weights` moves them (counts still climbing after the
    last round are dropped there too)."""
    import dask.dataframe as dd

    pending = links.map_partitions(_first_step, meta=pd.DataFrame({"target": np.zeros(0, np.int64),
                                                                   "count": np.zeros(0, np.int64)}))
    # nullable, so that a target with no parent gets <NA>, not a float NaN beside int64 references
    nexts = links.rename(columns={"child": "target", "parent": "next"}).astype({"next": "Int64"})
    roots = []
    for _ in range(ROUNDS):
        summed = pending.groupby("target").sum(split_out=shards, shuffle_method=method).reset_index()
        step = summed.merge(nexts, on="target", how="left", npartitions=shards, shuffle_method=method)
        roots.append(step[step["next"].isna()][["target", "count"]])
        pending = step[~step["next"].isna()].map_partitions(_moved, meta=summed._meta)
    every = dd.concat(roots)
    return every.groupby("target").sum(split_out=shards, shuffle_method=method).reset_index()


def _by_number(frame, column: str, n: int, method: str):
    """``frame`` shuffled so that output partition ``i`` holds the rows whose ``column`` is ``i``
    (``0 <= column < n``): ``set_index`` on known divisions, which places rows by a search of the
    divisions (a hash shuffle would hash every value, as float64)."""
    return frame.set_index(column, divisions=list(range(n + 1)), shuffle_method=method)


def _records(part: dict, number: int, plan: dict, bands: range, buckets: int) -> pd.DataFrame:
    (key, ref, quality, words), = band_records(part, number, plan, 1, bands)
    return pd.DataFrame({"bucket": (key % np.uint64(buckets)).astype(np.int64), "key": key, "ref": ref,
                         "quality": quality, **{w: words[:, i] for i, w in enumerate(_WORDS)}})


def _edges(records: pd.DataFrame, cosine: float, exact: bool = False) -> pd.DataFrame:
    """One bucket partition's verified edges: its records in row-reference order, as the in-process
    stages pass them (a bucket is sorted by reference, whatever order the shuffle delivered)."""
    records = records.sort_values("ref", kind="stable")
    piece = (records["key"].to_numpy(), records["ref"].to_numpy(), records["quality"].to_numpy(),
             records[_WORDS].to_numpy(np.uint64))
    worse, better, quality = bucket_edges([piece], 1, cosine, exact)["pieces"][0]
    return pd.DataFrame({"worse": worse, "better": better, "quality": quality})


def _binary(unit: np.ndarray) -> pd.Series:
    width = unit.shape[1] * 4
    offsets = pa.py_buffer((np.arange(unit.shape[0] + 1, dtype=np.int64) * width).astype(np.int32))
    data = pa.py_buffer(np.ascontiguousarray(unit, dtype=np.float32).tobytes())
    array = pa.Array.from_buffers(pa.binary(), unit.shape[0], [None, offsets, data])
    return pd.Series(pd.arrays.ArrowExtensionArray(array))


def _unbinary(column: pd.Series) -> np.ndarray:
    values = column.tolist()
    if not values:
        return np.zeros((0, 0), dtype=np.float32)
    return np.frombuffer(b"".join(values), dtype=np.float32).reshape(len(values), -1)


def _asked(edges: pd.DataFrame) -> pd.DataFrame:
    """One row shard's candidate edges, each worse row's best (merge_edges), with the vector block
    of their better rows."""
    worse, better, quality = _best_edges(edges["worse"].to_numpy(np.uint64),
                                         edges["better"].to_numpy(np.uint64), edges["quality"].to_numpy(),
                                         keep=CANDIDATES)
    return pd.DataFrame({"shard": vector_block(better), "worse": worse, "better": better, "quality": quality})


def _attached(asked: pd.DataFrame, reads: list, first: int, blocks: int) -> pd.DataFrame:
    """One vector block's requests with their better rows' vectors, an edge a row (the shuffle
    spills them), with the vector block of their worse rows."""
    requests = [(asked["worse"].to_numpy(np.uint64), asked["better"].to_numpy(np.uint64),
                 asked["quality"].to_numpy())]
    frames = [_ATTACHED]
    for shard, (worse, better, quality, named, vectors) in enumerate(attach_block(requests, reads, first,
                                                                                     blocks)):
        if worse.size:
            frames.append(pd.DataFrame({"shard": shard, "worse": worse, "better": better, "quality": quality,
                                        "vector": _binary(vectors[_lookup(named, better)])}))
    return pd.concat(frames, ignore_index=True)


def _confirm(attached: pd.DataFrame, reads: list, first: int, cosine: float) -> pd.DataFrame:
    better = attached["better"].to_numpy(np.uint64)
    named, once = np.unique(better, return_index=True)
    piece = (attached["worse"].to_numpy(np.uint64), better, attached["quality"].to_numpy(), named,
             _unbinary(attached["vector"])[once] if named.size else np.zeros((0, 0), dtype=np.float32))
    (worse, better, quality), = confirm_block([piece], reads, first, cosine, 1)
    return pd.DataFrame({"worse": worse, "better": better, "quality": quality})


def _parents(edges: pd.DataFrame) -> pd.DataFrame:
    found = best_parents([(edges["worse"].to_numpy(), edges["better"].to_numpy(),
                           edges["quality"].to_numpy())], 1)
    return pd.DataFrame({"child": found["child"].view(np.int64), "parent": found["parent"].view(np.int64)})


def _first_step(links: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"target": links["parent"].to_numpy(), "count": np.ones(len(links), np.int64)})


def _moved(step: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"target": step["next"].to_numpy(np.int64),
                         "count": step["count"].to_numpy(np.int64)})


def _rows(ref: np.ndarray, weight: np.ndarray, parent: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({"partition": ref >> 32, "position": ref & _POSITION, "weight": weight,
                         "parent": parent})


def _shadowed(links: pd.DataFrame) -> pd.DataFrame:
    ref = links["child"].to_numpy()
    return _rows(ref, np.zeros(len(ref), np.int64), links["parent"].to_numpy())


def _kept(counts: pd.DataFrame) -> pd.DataFrame:
    ref = counts["target"].to_numpy(np.int64)  # a kept row also stands for itself
    return _rows(ref, counts["count"].to_numpy(np.int64) + 1, np.full(len(ref), -1))


def _parent_rows(links: pd.DataFrame) -> pd.DataFrame:
    ref = np.unique(links["parent"].to_numpy(np.int64))
    return _rows(ref, np.full(len(ref), _IS_PARENT, np.int64), np.full(len(ref), -1))


def _partition_groups(rows: pd.DataFrame) -> DuplicateGroups:
    """One partition's entry of :func:`~datamask_dask.dedup.search.find_groups` from its rows
    (weight 0: shadowed, with its parent; ``_IS_PARENT``: some row's parent; else kept, standing for
    ``weight`` rows)."""
    position, weight = rows["position"].to_numpy(np.uint64), rows["weight"].to_numpy(np.int64)
    kept, child = weight > 0, weight == 0
    return partition_groups([(position[child], position[kept], weight[kept],
                              rows["parent"].to_numpy(np.int64)[child], position[weight == _IS_PARENT])])
