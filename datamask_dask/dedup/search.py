"""The table-wide near-duplicate rule in one task, and which wiring a table of ``n`` partitions takes.

With ``diversity_scope="table"`` the plan pass hands each partition the positions of its rows that
are *shadowed*: near-copies of a better row elsewhere in the table (or in the partition). Shadowed
rows are left out of the quality sketches, so the quotas stay exact over the rows that remain, and
the select pass treats them as ineligible; a kept row *stands for* the rows it shadows (its
weight), and Facility weighs it so (:mod:`datamask_dask.learn.metrics`), so setting the copies
aside does not change which rows the objective asks to cover.

The rule, the same at every size and on every engine: a row is shadowed when a verified better
row is its near-duplicate, and its best such row (highest quality, then lowest partition, then
lowest row) is its parent; a kept row stands for itself and for the shadowed rows whose parents
lead to it within ``ROUNDS`` steps. On a chain ``a ~ b ~ c`` with ``a`` and ``c`` not
near-duplicates, ``b`` at the bottom is shadowed by the better of the two, and ``a`` and ``c`` both
stay. Candidates are the rows that share a band (:func:`~datamask_dask.dedup.stages.band_plan`)
and the ``by`` group, in the pairs of :func:`~datamask_dask.dedup.stages.bucket_edges`, within
:func:`~datamask_dask.dedup.stages.candidate_limit`. Where the embeddings are at hand (the plan
pass reads them again for the candidates' rows), a row's ``CANDIDATES`` best candidates (by
quality) are verified on the exact cosine of the two embeddings
(:func:`~datamask_dask.dedup.stages.confirm_edges`), and the signatures only find candidates;
without them, a candidate is verified on the signatures.

:func:`find_groups` applies it in one process, compiled with numba: it holds every row's signature,
quality and group (about 44 bytes a row) and, per band, a key and a few words a row; with
embeddings, each row's candidates (:func:`candidate_edges`, which the Dask graph runs as one task
while the exact check runs in vector blocks, so no task holds the table's embeddings). The sharded
stages of :mod:`datamask_dask.dedup.stages` find the same groups with no task holding more than a
shard; :func:`one_task` picks between them by the partitions (and the rows, where known), when the
graph is built.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..compiled import on_first_use
from .groups import DuplicateGroups
from .simhash import SIGNATURE_BYTES
from .stages import (
    ANCHORS,
    CANDIDATES,
    FULL_BUCKET,
    NEIGHBOURS,
    ROUNDS,
    _byte_tables,
    _split,
    band_plan,
    candidate_limit,
    deliver,
    find_groups_sharded,
    group_bits,
    is_exact,
    merge_edges,
    partition_groups,
    shard_of,
    sharded_candidates,
    similarities,
    unit_vectors,
)

# Tables of up to this many partitions find their groups in one task: it holds ~44 bytes a row
# (signature, quality, group) where the sharded graph moves ~2.2 KB a row of band records and
# schedules ~3.5 x partitions**2 tasks; above, no task should hold the table.
ONE_TASK_PARTITIONS = 32
# So do tables of up to this many rows in any number of partitions, where the rows are known when the
# graph is built (the package's readers list them): the one task's candidates then hold ~1.4 KB a row
# at most, and a table of many small files spares a cluster's scheduler the sharded graph's tasks.
ONE_TASK_ROWS = 1_000_000
# Smaller tables run the sharded stages in this process (numpy): the same groups, for less than it
# costs a fresh worker to import numba and load the compiled passes.
COMPILED_ROWS = 50_000
BAND_THREADS = 4  # threads of find_groups (bands run apart; numpy releases the GIL)
_PAIR_BATCH = 1 << 13  # candidate pairs whose embeddings find_groups gathers at once


def one_task(n_parts: int, rows: int | None = None) -> bool:
    """Whether a table of ``n_parts`` partitions (and ``rows`` rows, where known) finds its
    near-duplicate groups in one task: known when the graph is built, and the groups are the same
    either way."""
    return n_parts <= ONE_TASK_PARTITIONS or (rows is not None and rows <= ONE_TASK_ROWS)


def find_groups(parts: list[dict], cosine: float = 0.95) -> list[DuplicateGroups]:
    """The near-duplicate groups of the whole table, per partition, in one task.

    ``parts``: one dict per partition, in partition order: ``quality`` float64 (n,), ``codes`` int
    (n,) indexing ``labels`` (the group labels, ``[None]`` without ``by``), ``signatures`` uint8
    (n, SIGNATURE_BYTES) from :func:`~datamask_dask.dedup.simhash.signatures` and, optionally,
    ``embeddings`` (n, dim). Rows at least ``cosine`` similar are near-duplicates: on the exact
    cosine of their embeddings where the partitions carry them (candidates found on the
    signatures), else as the signatures estimate it. Deterministic: the groups depend only on the
    rows and their order.
    """
    n_rows = sum(int(np.asarray(p["quality"]).shape[0]) for p in parts)
    if n_rows < COMPILED_ROWS:  # the same groups, from the stages in this process
        return find_groups_sharded(parts, cosine, shards=1)[0]
    table = stack_parts(parts)
    if not is_exact(parts):
        return split_groups(table["offsets"], table_parents(table, cosine)["parent"])
    # each row's candidates tried best first, a row leaving once one passes: its parent is the first
    # that does, as the sharded check (all candidates, the best passing one) finds
    candidates = table_parents(table, cosine, keep=CANDIDATES)["candidates"]
    offsets, best = table["offsets"], np.full(n_rows, -1, dtype=np.int64)
    todo = np.flatnonzero(candidates[:, 0] >= 0)
    for slot in range(CANDIDATES):
        todo = todo[candidates[todo, slot] >= 0]
        passed = np.zeros(todo.size, dtype=bool)
        for start in range(0, todo.size, _PAIR_BATCH):  # the pairs' rows gathered a batch at a time
            child = todo[start:start + _PAIR_BATCH]
            parent = candidates[child, slot]
            passed[start:start + child.size] = similarities(_unit_rows(parts, offsets, child),
                                                            _unit_rows(parts, offsets, parent)) >= cosine
        best[todo[passed]] = candidates[todo[passed], slot]
        todo = todo[~passed]
    return split_groups(offsets, best)


def _unit_rows(parts: list[dict], offsets: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The unit embeddings of table rows ``rows`` (row by row, as the sharded stages make them)."""
    part = np.searchsorted(offsets, rows, side="right") - 1
    dim = next(np.asarray(p["embeddings"]).reshape(len(p["quality"]), -1).shape[1] for p in parts
               if len(p["quality"]))
    out = np.empty((rows.size, dim), dtype=np.float32)
    for number in np.unique(part):
        mine = part == number
        out[mine] = unit_vectors(np.asarray(parts[number]["embeddings"])[rows[mine] - offsets[number]])
    return out


def candidate_edges(parts: list[dict], cosine: float, shards: int, table: dict | None = None) -> list:
    """The one-task search's candidates for the exact check: each row's ``CANDIDATES`` best
    candidate parents, as :func:`~datamask_dask.dedup.stages.merge_edges` pieces ``(worse, better,
    quality of better)`` of row references, one per row shard of the worse row (the edges the
    sharded stages merge). Compiled where the table is large enough, else the stages in this
    process; the same edges either way."""
    n_rows = sum(int(np.asarray(p["quality"]).shape[0]) for p in parts)
    if n_rows < COMPILED_ROWS:
        edges = sharded_candidates(parts, cosine, 1, exact=True)[0][0]  # the one row shard's pieces
        worse, better, quality = merge_edges(edges, exact=True)
    else:
        table = stack_parts(parts) if table is None else table
        found = table_parents(table, cosine, keep=CANDIDATES)["candidates"]
        row, slot = np.nonzero(found >= 0)
        refs = _refs(table["offsets"])
        worse, better = refs[row], refs[found[row, slot]]
        quality = table["quality"][found[row, slot]]
    return _split(shard_of(worse, shards), shards, worse, better, quality)


def _refs(offsets: np.ndarray) -> np.ndarray:
    """Each row's reference ``partition << 32 | position``."""
    n = int(offsets[-1])
    part = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    return (part.astype(np.uint64) << np.uint64(32)) | (np.arange(n) - offsets[part]).astype(np.uint64)


def stack_parts(parts: list[dict]) -> dict:
    """The partitions' inputs as one table: quality, group index, signatures, partition offsets.

    A row's group index names its label's :func:`~datamask_dask.dedup.stages.group_bits`, so that
    rows share a bucket here exactly when they share a band key in the sharded stages.
    """
    sizes = [int(np.asarray(p["quality"]).shape[0]) for p in parts]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    hashed = [group_bits(p["labels"])[np.asarray(p["codes"], dtype=np.int64)]
              for p, size in zip(parts, sizes, strict=True) if size]
    group = np.concatenate([np.zeros(0, dtype=np.uint64)] + hashed)
    group = np.unique(group, return_inverse=True)[1].astype(np.int64).reshape(-1)
    quality = np.concatenate([np.zeros(0)] + [np.asarray(p["quality"], dtype=np.float64) for p in parts])
    sig = np.concatenate([np.zeros((0, SIGNATURE_BYTES), dtype=np.uint8)] + [
        np.asarray(p["signatures"], dtype=np.uint8).reshape(-1, SIGNATURE_BYTES)
        for p, size in zip(parts, sizes, strict=True) if size])
    return {"offsets": offsets, "group": group, "quality": quality, "signatures": np.ascontiguousarray(sig)}


def table_parents(table: dict, cosine: float = 0.95, keep: int = 1) -> dict:
    """``{"parent": each row's parent}``: its best verified better near-duplicate, a row number, or
    -1 for a kept row; with ``keep`` > 1, ``{"candidates": (n, keep)}``: each row's ``keep`` best
    candidate parents within the exact check's candidate limit, best first, -1 padded (int32 below
    2**31 rows). ``table``:
    :func:`stack_parts`. Needs numba."""
    quality = table["quality"]
    n = quality.shape[0]
    if n < 2:
        return {"parent": np.full(n, -1, dtype=np.int64)} if keep == 1 else {
            "candidates": np.full((n, keep), -1, dtype=np.int64)}
    keys, buckets, sort_keys, merge = _kernels()
    plan = band_plan(n)
    # rank: 0 for the best row (highest quality, then the lowest row); a lower rank is better
    by_rank = np.lexsort((np.arange(n), -quality))
    rank = np.empty(n, dtype=np.int64)
    rank[by_rank] = np.arange(n)
    sig = table["signatures"]
    words = np.ascontiguousarray(sig.view(np.uint64))  # (n, 4): a row's words side by side
    group = table["group"]
    n_groups = int(group.max(initial=0)) + 1
    # a key (value, group) and a row packed in one int64 where the key fits in 31 bits: one value
    # sort then orders the rows by key and, within a key, by row (the sharded stages' reference order)
    packed = (n_groups << plan["bits"]) <= 1 << 31 and n < 1 << 32
    key_bits = ((n_groups << plan["bits"]) - 1).bit_length()
    limit = candidate_limit(cosine, keep > 1)
    n_bands = plan["positions"].shape[0]
    # The bands on a few threads (the compiled passes and numpy's argsort release the GIL): an engine
    # that calls this on its driver (Spark) gets the parallelism Dask gets from tasks.
    threads = max(1, min(BAND_THREADS, os.cpu_count() or 1, n_bands))

    # with several candidates a row, ranks in 32 bits where they fit: the threads' lists are the
    # search's largest arrays
    slots = np.int32 if keep > 1 and n < 2**31 - 1 else np.int64

    def run(first: int) -> np.ndarray:
        best = np.full((n, keep), n, dtype=slots)
        key, scratch = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)  # each band's, in turn
        for band in range(first, n_bands, threads):
            tables = _byte_tables(plan["positions"][band])
            touched = np.array(sorted(tables), dtype=np.int64)  # the signature bytes the band reads
            keys(sig, np.stack([tables[int(b)] for b in touched]), touched, group, plan["bits"], packed, key)
            if packed:
                sort_keys(key, scratch, key_bits)
                sorted_key, order = key >> 32, key & 0xFFFFFFFF
            else:
                order = np.argsort(key, kind="stable")
                sorted_key = key[order]
            buckets(sorted_key, order, words, rank, best, limit, FULL_BUCKET, ANCHORS, NEIGHBOURS)
        return best

    with ThreadPoolExecutor(threads) as pool:
        found = list(pool.map(run, range(threads)))
    if keep == 1:
        best = np.minimum.reduce(found)[:, 0]
        return {"parent": np.where(best < n, by_rank[np.minimum(best, n - 1)], -1)}
    best = found.pop()
    while found:  # the threads' lists merged into one, a list at a time
        merge(best, found.pop(), n)
    candidates = by_rank.astype(slots)[np.minimum(best, n - 1)]  # row numbers, in the ranks' width
    candidates[best >= n] = -1
    return {"candidates": candidates}


@on_first_use
def _kernels():
    """The compiled passes (:func:`_keys`, :func:`_buckets`, :func:`_sort_keys`, :func:`_merge`)."""
    import numba

    global _insert  # _buckets calls the compiled one
    _insert = numba.njit(cache=True, nogil=True)(_insert)
    kernels = (_keys, _buckets, _sort_keys, _merge)
    return tuple(numba.njit(cache=True, nogil=True)(kernel) for kernel in kernels)


def _keys(sig, tables, touched, group, bits, packed, out):  # pragma: no cover (compiled)
    """One band's key of each row, ``value | group << bits``, into ``out`` (int64), shifted above
    the row's number where ``packed`` (row after row: the rows in ascending order, as
    :func:`_sort_keys` needs them); the value from the byte tables of the signature bytes
    ``touched`` (:func:`~datamask_dask.dedup.stages._byte_tables`)."""
    for row in range(sig.shape[0]):
        value = np.int64(0)
        for t in range(touched.shape[0]):
            value |= np.int64(tables[t, sig[row, touched[t]]])
        key = value | (group[row] << bits)
        out[row] = (key << 32) | row if packed else key


def _sort_keys(key, scratch, bits):  # pragma: no cover (compiled)
    """Packed keys (:func:`_keys`) sorted in place: a radix sort, 11 bits a pass, of the ``bits`` bits
    above each row's number, each pass stable, so the rows of a key stay in their ascending order: the
    order numpy's sort of the whole values gives, in a few linear passes instead of a comparison sort;
    ``scratch`` as large as ``key``."""
    source, target, passes, shift = key, scratch, 0, 32
    while shift < 32 + bits:
        width = min(11, 32 + bits - shift)
        mask = (1 << width) - 1
        start = np.zeros((1 << width) + 1, dtype=np.int64)
        for value in source:
            start[((value >> shift) & mask) + 1] += 1
        for digit in range(1 << width):
            start[digit + 1] += start[digit]
        for value in source:
            digit = (value >> shift) & mask
            target[start[digit]] = value
            start[digit] += 1
        source, target, passes, shift = target, source, passes + 1, shift + width
    if passes % 2:
        key[:] = scratch


def _merge(best, other, none):  # pragma: no cover (compiled)
    """Each row of ``best`` (its lowest distinct ranks, ascending, ``none`` after the last) made the
    lowest distinct of it and ``other``'s row, in place."""
    keep = best.shape[1]
    row = np.empty(keep, dtype=best.dtype)
    for r in range(best.shape[0]):
        i = j = 0
        for k in range(keep):
            mine = best[r, i] if i < keep else none
            theirs = other[r, j] if j < keep else none
            row[k] = min(mine, theirs)
            if mine <= theirs:
                i += 1
            if theirs <= mine:  # (both where they are equal: once in the merged row)
                j += 1
        best[r] = row


def _buckets(sorted_key, order, words, rank, best, limit, full, anchors, neighbours):  # pragma: no cover
    """One band's buckets (its rows sorted by key, ``sorted_key`` and ``order``), compiled: the pairs
    :func:`~datamask_dask.dedup.stages.bucket_edges` tries, verified within ``limit``, each verified
    pair's worse row taking the better's rank into ``best`` where lower."""
    n = sorted_key.shape[0]
    # the buckets of two rows or more: their places in sorted order
    start = np.empty(n // 2 + 1, dtype=np.int64)
    size = np.empty(n // 2 + 1, dtype=np.int64)
    buckets, members, low = 0, 0, 0
    while low < n:
        high = low + 1
        while high < n and sorted_key[high] == sorted_key[low]:
            high += 1
        if high - low > 1:
            start[buckets], size[buckets] = low, high - low
            buckets += 1
            members += high - low
        low = high
    # their rows' words and ranks side by side, gathered in one plain loop (the loads overlap; a
    # gather inside the pair loop waits on each)
    row = np.empty(members, dtype=np.int64)
    local = np.empty((members, 4), dtype=np.uint64)
    local_rank = np.empty(members, dtype=np.int64)
    at = 0
    for b in range(buckets):
        for k in range(start[b], start[b] + size[b]):
            row[at] = order[k]
            at += 1
    for k in range(members):
        for w in range(4):
            local[k, w] = words[row[k], w]
        local_rank[k] = rank[row[k]]
    m1, m2 = np.uint64(0x5555555555555555), np.uint64(0x3333333333333333)
    m4, h01 = np.uint64(0x0F0F0F0F0F0F0F0F), np.uint64(0x0101010101010101)
    one, two, four, top = np.uint64(1), np.uint64(2), np.uint64(4), np.uint64(56)
    pair = np.empty((256, 2), dtype=np.int64)  # a bucket's candidate pairs (places in local)
    low = 0
    for b in range(buckets):
        count_size = size[b]
        first = count_size if count_size <= full else min(count_size, anchors)
        count = first * count_size + (count_size * neighbours if count_size > full else 0)
        if count > pair.shape[0]:
            pair = np.empty((2 * count, 2), dtype=np.int64)
        count = 0
        for i in range(low, low + first):
            for j in range(i + 1, low + count_size):
                pair[count, 0], pair[count, 1] = i, j
                count += 1
        if count_size > full:  # and each row against its nearest places once sorted by first word
            places = np.argsort(local[low:low + count_size, 0].copy(), kind="mergesort")
            for k in range(count_size):
                for d in range(1, min(neighbours, count_size - 1 - k) + 1):
                    pair[count, 0], pair[count, 1] = low + places[k], low + places[k + d]
                    count += 1
        for c in range(count):
            i, j = pair[c, 0], pair[c, 1]
            distance = 0
            for w in range(4):
                v = local[i, w] ^ local[j, w]  # popcount, SWAR
                v = v - ((v >> one) & m1)
                v = (v & m2) + ((v >> two) & m2)
                v = (v + (v >> four)) & m4
                distance += int((v * h01) >> top)
            if distance <= limit:
                worse, better = (i, j) if local_rank[i] > local_rank[j] else (j, i)
                _insert(best, row[worse], local_rank[better])
        low += count_size


def _insert(slots, row, rank):  # pragma: no cover (compiled)
    """``rank`` into row ``row`` of ``slots`` (each row its lowest distinct ranks, ascending), where
    it is lower than the last and not there yet."""
    last = slots.shape[1] - 1
    if rank >= slots[row, last]:
        return
    place = last
    while place > 0 and slots[row, place - 1] > rank:
        place -= 1
    if place > 0 and slots[row, place - 1] == rank:
        return
    for q in range(last, place, -1):
        slots[row, q] = slots[row, q - 1]
    slots[row, place] = rank


def split_groups(offsets: np.ndarray, parent: np.ndarray) -> list[DuplicateGroups]:
    """Per partition, the shadowed rows and the kept rows' weights from each row's parent.

    Each shadowed row counts for the kept row its parents lead to within ``ROUNDS`` steps (as the
    sharded stages forward counts for ``ROUNDS`` rounds); a kept row that any count reaches stands
    for those rows and itself. The groups are routed to their partitions by the stages' last two
    steps, on row references ``partition << 32 | position``.
    """
    n = parent.shape[0]
    shadowed = np.flatnonzero(parent >= 0)
    count = np.zeros(n, dtype=np.int64)
    at = parent[shadowed]
    for _ in range(ROUNDS):
        arrived = parent[at] < 0
        np.add.at(count, at[arrived], 1)
        at = parent[at[~arrived]]
    kept = np.flatnonzero(count)
    ref = _refs(offsets)
    links = {"child": ref[shadowed], "parent": ref[parent[shadowed]]}
    delivered = deliver(links, [(ref[kept], count[kept])], [], len(offsets) - 1)
    return [partition_groups([piece]) for piece in delivered["pieces"]]
