"""The near-duplicate rule of :mod:`datamask_dask.dedup.search` in map-shuffle-reduce form: each
task holds a shard, not the table.

Engine-agnostic (numpy, and numba for long edge lists): each function below is one task of a
hash-bucket shuffle graph, and its output is a list of *pieces*, one per shard (or partition) that
receives it. Dask wires them in :mod:`datamask_dask.dedup.dask_graph`, Spark in
:mod:`datamask_spark.shards`; :func:`find_groups_sharded` calls them in a loop. The inputs and
outputs are those of :func:`~datamask_dask.dedup.search.find_groups`.

1. :func:`band_records` (per partition): for each of ``BANDS`` bands, a 64-bit key hashed
   (bijectively, :func:`band_key`) from the band's number, the row's group label and ``bits``
   signature bits chosen at random (fixed seed), with a row reference ``partition << 32 |
   position``, the row's quality and its signature (56 bytes a record), sent to shard ``key %
   shards``. ``bits`` grows with the table (:func:`band_plan`), so that pairs colliding by chance
   stay about ``BANDS / 2**(bits - log2 N + 1)`` per row at any size.
2. :func:`bucket_edges` (per shard): rows sharing a key are candidates, tried where they are
   found on the records' signatures (within :func:`candidate_limit`); each worse row's best edge
   (with embeddings: its ``CANDIDATES`` best) goes to the shard of the worse row. Candidate pairs
   are never shuffled, and a row has at most that many edges per bucket task however many bands
   and buckets found it.
3. :func:`merge_edges` (per shard of the worse row, every few rounds) keeps each worse row's best
   edges. With embeddings (:func:`is_exact`), the exact check: :func:`request_vectors` sends each
   row's candidates to the vector block (``PARTITIONS_PER_SHARD`` consecutive partitions) of their
   better rows, whose task reads its partitions again, one at a time, for those rows' embeddings
   alone (:func:`attach_block`: the scans keep none), and sends each edge with its better row's unit
   vector to the block of its worse row, whose task reads its partitions for the worse rows
   (:func:`confirm_block`) and keeps the edges at exact cosine ``>= cosine``, each worse row's
   best, sent to its row shard. No task holds more than a block's candidate rows' embeddings.
   :func:`best_parents` makes each worse row's best (confirmed) edge its parent.
4. :func:`forward_weights` (``ROUNDS`` rounds): every shadowed row's count climbs its parents to
   a kept row, which then stands for itself and all rows that reached it.
5. :func:`deliver` (per shard) and :func:`partition_groups` (per partition): the results routed
   back to their partitions, each receiving only its own rows.

Deterministic: every task sorts what it receives, and a bucket is exactly the rows of one key, so
the groups depend only on the rows and their order, not on the partitions or shards.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np

from ..compiled import on_first_use
from ..errors import InputDataError
from .groups import DuplicateGroups
from .simhash import (
    CANDIDATE_MARGIN,
    SIGNATURE_BITS,
    SIGNATURE_BYTES,
    distance,
    hamming_threshold,
    verified_pairs,
)

PARTITIONS_PER_SHARD = 4  # the sharded graph has one key shard (stages 1-2) per this many partitions
# ... and one row shard (stages 3-5: edges, parents and counts, ~50 bytes a row) per this many: every
# round sends edges from each key shard to each row shard, so fewer row shards mean fewer picks
PARTITIONS_PER_ROW_SHARD = 16
# bands of random bits (at most 64: a key holds the band number in 6 bits): recall of pairs at
# cosine 0.98 >= 99% up to 26 bits (simulated)
BANDS = 40
# Bands whose records are shuffled (or held) at once: a worker holds about twice its share of a
# round's records, so one band a round keeps its peak lowest (bench_table_scale.py measures it).
ROUND_BANDS = 1
# Rounds whose edges a row shard holds before it merges them into each row's best: each merge sorts all
# it holds, so merging every round sorted the shard's edges once a band.
MERGE_ROUNDS = 4
MIN_BITS, MAX_BITS = 20, 26
SLACK_BITS = 2  # bits = ceil(log2 rows) + SLACK_BITS: a random partner per row per band 1 / 2**(SLACK + 1)
FULL_BUCKET = 12  # buckets up to this size verify all their pairs
ANCHORS = 4  # larger buckets verify each row against this many anchors ...
NEIGHBOURS = 16  # ... and against this many neighbours in the bucket sorted by signature
ROUNDS = 4  # weight-forwarding rounds: parent chains up to this long are counted exactly
# Candidate parents each row keeps for the exact check (its best by quality): a row whose best
# candidates all fail it is kept, so enough that a true better neighbour is rarely crowded out.
CANDIDATES = 16
# Edge lists this long keep each row's best by a compiled pass, which outruns a sort on three keys;
# shorter ones sort in numpy, the same edges, for less than numba's import costs a fresh worker.
COMPILED_EDGES = 1 << 16
BIT_SEED = 0xBA2D5
_VALUE_BLOCK = 1 << 14  # rows whose band values are made at once (their bytes stay in cache)
_READ_ROWS = 1 << 13  # rows of a partition the exact check converts to float32 at once
_PAIR_ROWS = 1 << 10  # candidate pairs whose two vectors the exact check gathers at once (8 MiB at d 1024)


def band_plan(n_rows: int) -> dict:
    """Bands for a table of ``n_rows``: ``bits`` per band and each band's bit positions (bands, bits)."""
    bits = int(min(MAX_BITS, max(MIN_BITS, math.ceil(math.log2(max(n_rows, 2))) + SLACK_BITS)))
    # Bits dealt from shuffled decks of all 256, so that every bit is in as many bands as any other
    # (give or take one): a close pair's few differing bits then spoil as few bands as they can.
    rng = np.random.default_rng(BIT_SEED)
    deck: list[int] = []
    positions = []
    for _ in range(BANDS):
        band: list[int] = []
        while len(band) < bits:
            if not deck:
                deck = rng.permutation(SIGNATURE_BITS).tolist()
            bit = deck.pop()
            if bit in band:  # a repeat goes back under the deck
                deck.insert(0, bit)
            else:
                band.append(bit)
        positions.append(np.sort(band))
    return {"bits": bits, "positions": np.stack(positions)}


def merges_before(round_index: int) -> bool:
    """Whether each row shard merges its earlier rounds' edges into each row's best before it takes
    round ``round_index``'s: every :data:`MERGE_ROUNDS` rounds (best_parents merges the rest)."""
    return round_index > 0 and round_index % MERGE_ROUNDS == 0


def band_rounds(n_bands: int = BANDS, rounds_of: int = ROUND_BANDS) -> list[range]:
    """The bands of each round of stages 1-2, in order: ``rounds_of`` at a time."""
    return [range(first, min(n_bands, first + rounds_of)) for first in range(0, n_bands, rounds_of)]


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijective, well-spread hash of uint64 values."""
    x = x.astype(np.uint64, copy=True)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def shard_of(refs: np.ndarray, shards: int) -> np.ndarray:
    """The shard of each row reference (uint64): where its signature and its results live."""
    return (_mix(refs) % np.uint64(shards)).astype(np.int64)


def _split(order_key: np.ndarray, shards: int, *columns) -> list:
    """Rows grouped by ``order_key`` (their shard), one tuple of columns per shard (stable order)."""
    if shards == 1:
        return [columns]
    if shards <= 2**16:  # numpy's stable sort of 16-bit keys is a radix sort, far faster than int64's
        order_key = order_key.astype(np.uint16)
    order = np.argsort(order_key, kind="stable")
    bounds = np.searchsorted(order_key[order], np.arange(shards + 1))
    return [tuple(c[order[bounds[s]:bounds[s + 1]]] for c in columns) for s in range(shards)]


def _columns(pieces: list, *dtypes) -> list[np.ndarray]:
    """Each column of ``pieces`` (tuples of 1D arrays) concatenated; empty, of its dtype, without pieces."""
    return [np.concatenate([np.zeros(0, dtype=dtype)] + [p[i] for p in pieces])
            for i, dtype in enumerate(dtypes)]


def _ranges(start: np.ndarray, size: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + c) for s, c in zip(start, size)])``, vectorised."""
    return np.repeat(start - (np.cumsum(size) - size), size) + np.arange(int(size.sum()))


# --------------------------------------------------------------------------- 1. band keys


def _byte_tables(positions: np.ndarray) -> dict:
    """For one band's bit positions: ``{byte: table}``, where ``table[v]`` holds the chosen bits of a
    signature byte of value ``v`` at their places in the band's value (the chosen bits packed in
    order, the first lowest). The value of a band is the OR of its bytes' tables: one lookup per
    byte it touches, where unpacking every bit would write 256 bytes a row."""
    tables: dict[int, np.ndarray] = {}
    values = np.arange(256, dtype=np.uint32)
    for place, position in enumerate(int(p) for p in positions):
        byte, bit = divmod(position, 8)  # bits counted from each byte's highest (np.unpackbits' order)
        table = tables.setdefault(byte, np.zeros(256, dtype=np.uint32))
        table |= ((values >> np.uint32(7 - bit)) & np.uint32(1)) << np.uint32(place)
    return tables


def group_bits(labels: list) -> np.ndarray:
    """Each ``by`` label's part of a band key, uint64: the high 32 bits, above the band value
    (``MAX_BITS``) and the band number, so that two rows share a key exactly when they share band,
    value and group, in any task (the one-task search buckets by the same triple)."""
    digests = [hashlib.blake2b(repr((type(label).__name__, label)).encode(), digest_size=8).digest()
               for label in labels]
    hashes = np.array([int.from_bytes(digest, "little") for digest in digests], dtype=np.uint64)
    return (hashes & np.uint64(0xFFFFFFFF)) << np.uint64(32)


def band_key(value: np.ndarray, band: int, group: np.ndarray) -> np.ndarray:
    """The 64-bit key of band ``band`` of rows with band values ``value`` and :func:`group_bits`
    ``group``: a bijective hash of the three packed, so keys spread over shards and never collide."""
    return _mix(value.astype(np.uint64) | np.uint64(band << MAX_BITS) | group)


def band_values(columns: np.ndarray, plan: dict, bands) -> np.ndarray:
    """Each band's value of each row: the band's chosen bits packed, uint32 (len(bands), rows).

    ``columns``: the signatures' bytes as columns (SIGNATURE_BYTES, rows). Rows go in blocks that
    stay in cache while every band reads their bytes.
    """
    bands = list(bands)
    tables = [_byte_tables(plan["positions"][band]) for band in bands]
    by_byte = [[(i, t[byte]) for i, t in enumerate(tables) if byte in t] for byte in range(SIGNATURE_BYTES)]
    n = columns.shape[1]
    value = np.zeros((len(bands), n), dtype=np.uint32)
    for start in range(0, n, _VALUE_BLOCK):
        stop = min(n, start + _VALUE_BLOCK)
        for byte, users in enumerate(by_byte):
            index = columns[byte, start:stop].astype(np.intp)  # one conversion per byte and block
            for i, table in users:
                value[i, start:stop] |= table.take(index)
    return value


def band_records(part: dict, number: int, plan: dict, shards: int, bands) -> list:
    """Partition ``number``'s records of ``bands``, one ``(key, ref, quality, words)`` piece per
    shard: each carries its row's quality and signature (four uint64 words), so that a bucket's
    task verifies its candidates itself. ``part``: as for
    :func:`~datamask_dask.dedup.search.find_groups`; ``plan``: :func:`band_plan`."""
    sig = np.ascontiguousarray(np.asarray(part["signatures"], dtype=np.uint8).reshape(-1, SIGNATURE_BYTES))
    n = sig.shape[0]
    bands = list(bands)
    if n == 0:
        empty = np.zeros(0, dtype=np.uint64)
        return [(empty, empty, np.zeros(0), np.zeros((0, 4), dtype=np.uint64)) for _ in range(shards)]
    group = group_bits(part["labels"])[np.asarray(part["codes"], dtype=np.int64)]
    value = band_values(np.ascontiguousarray(sig.T), plan, bands)
    keys = [band_key(row, band, group) for row, band in zip(value, bands, strict=True)]
    key = np.concatenate(keys)
    rows = np.tile(np.arange(n), len(keys))
    quality = np.asarray(part["quality"], dtype=np.float64)
    words = sig.view(np.uint64).reshape(-1, 4)
    refs = (np.uint64(number) << np.uint64(32)) | np.arange(n, dtype=np.uint64)  # partition << 32 | position
    pieces = _split((key % np.uint64(shards)).astype(np.int64), shards, key, rows)
    return [(k, refs[r], quality[r], np.take(words, r, axis=0)) for k, r in pieces]


# --------------------------------------------------------------------------- 2. candidates


def _neighbour_edges(start: np.ndarray, size: np.ndarray, columns: np.ndarray,
                     limit: int) -> tuple[np.ndarray, np.ndarray]:
    """The verified pairs ``(a, b)``, ``a < b``, of each large bucket's rows (more than
    ``FULL_BUCKET``) that are within ``NEIGHBOURS`` places of each other once the bucket is sorted by
    its first signature word: near-copies share a long prefix, so they sit side by side where the
    bucket's anchors would miss them. ``columns``: the rows' signature words (4, rows). The
    signatures are gathered once in that order and compared with themselves shifted by 1 to
    ``NEIGHBOURS`` places, so a pair costs no gather (few of them verify)."""
    large = size > FULL_BUCKET
    start, size = start[large], size[large]
    empty = np.zeros(0, dtype=np.int64)
    if not start.size:
        return empty, empty
    members = _ranges(start, size)
    bucket = np.repeat(np.arange(start.size), size)
    # lexsort is stable: rows of one bucket with the same first word stay in reference order
    members = members[np.lexsort((columns[0][members], bucket))]  # buckets stay in place
    words = columns[:, members]
    found = []
    for d in range(1, NEIGHBOURS + 1):
        near = (bucket[:-d] == bucket[d:]) & (distance(words[:, :-d], words[:, d:]) <= limit)
        x, y = members[:-d][near], members[d:][near]
        found.append((np.minimum(x, y), np.maximum(x, y)))
    return (np.concatenate([empty] + [f[0] for f in found]),
            np.concatenate([empty] + [f[1] for f in found]))


def candidate_limit(cosine: float, exact: bool) -> int:
    """The Hamming distance within which a bucket's pair is a candidate: ``VERIFY_MARGIN`` where
    the signatures are all it is verified on, ``CANDIDATE_MARGIN`` where exact cosine confirms it."""
    return hamming_threshold(cosine, CANDIDATE_MARGIN) if exact else hamming_threshold(cosine)


def bucket_edges(pieces: list, shards: int, cosine: float, exact: bool = False) -> dict:
    """The verified near-duplicate pairs of one shard's buckets (within :func:`candidate_limit`),
    as each worse row's best edge, or with ``exact`` its ``CANDIDATES`` best (for
    :func:`confirm_edges`).

    A bucket of up to ``FULL_BUCKET`` rows tries all its pairs; a larger one (clustered data) each
    row against its ``ANCHORS`` first rows and its ``NEIGHBOURS`` nearest places once sorted by
    signature (:func:`_neighbour_edges`), so the work stays O(rows x (anchors + neighbours)).
    Returns ``{"pieces": [(worse, better, quality of better)] per shard of the worse row, "pairs":
    the full and anchor pairs tried}``.
    """
    key, ref, quality = _columns(pieces, np.uint64, np.uint64, np.float64)
    empty = np.zeros(0, dtype=np.uint64)
    if key.size < 2:
        return {"pieces": [(empty, empty, np.zeros(0)) for _ in range(shards)], "pairs": 0}
    # A key belongs to one band, whose records arrive in reference order (pieces in partition
    # order, rows in order): sorted by key, then by arrival, each bucket is sorted by reference.
    order, key = _sort_by_key(key)
    start = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    size = np.diff(np.r_[start, key.size])
    keep = size > 1
    start, size = start[keep], size[keep]
    # only the rows of buckets of two or more, in bucket order: a bucket's rows then sit side by side
    rows = order[_ranges(start, size)]
    ref = ref[rows]
    quality = quality[rows]
    # np.take gathers rows faster than fancy indexing; one contiguous column per word, since the
    # verification gathers single words
    words = np.concatenate([np.zeros((0, 4), dtype=np.uint64)] + [p[3] for p in pieces])
    columns = np.ascontiguousarray(np.take(words, rows, axis=0).T)
    start, limit = np.cumsum(size) - size, candidate_limit(cosine, exact)
    # position p of a bucket pairs with every later position when the bucket is small, or when p is
    # one of its first ANCHORS positions
    first = np.where(size <= FULL_BUCKET, size, np.minimum(size, ANCHORS))
    a, b, n_pairs = verified_pairs(start, size, first, columns, limit)
    near_a, near_b = _neighbour_edges(start, size, columns, limit)
    a, b = np.concatenate([near_a, a]), np.concatenate([near_b, b])
    # better: higher quality, then the lower reference (partition, then row); ref[a] < ref[b]
    a_better = quality[a] >= quality[b]
    worse = np.where(a_better, ref[b], ref[a])
    better = np.where(a_better, ref[a], ref[b])
    better_quality = np.where(a_better, quality[a], quality[b])
    # only each worse row's best edges leave: the best of the tasks' bests is best_parents' choice
    worse, better, better_quality = _best_edges(worse, better, better_quality, CANDIDATES if exact else 1)
    pieces = _split(shard_of(worse, shards), shards, worse, better, better_quality)
    return {"pieces": pieces, "pairs": n_pairs}


def _sort_by_key(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The stable order of 64-bit hash keys and the sorted keys. One value sort of each key with its
    lowest bits given to its index runs faster than a stable argsort; keys that differ only in
    those bits (64 - log2(len) bits stay: rare) come out interleaved, and only their runs are sorted
    again, so that a bucket is exactly the rows of one key whatever the shard holds beside them."""
    index_bits = max(1, int(key.size).bit_length())
    low = np.uint64((1 << index_bits) - 1)
    packed = np.sort((key & ~low) | np.arange(key.size, dtype=np.uint64))
    order = (packed & low).astype(np.intp)
    high, exact = packed & ~low, key[order]
    mixed = (high[1:] == high[:-1]) & (exact[1:] != exact[:-1])
    if mixed.any():
        run = np.cumsum(np.r_[True, high[1:] != high[:-1]])
        places = np.flatnonzero(np.isin(run, run[1:][mixed]))
        again = places[np.lexsort((order[places], exact[places]))]
        order[places], exact[places] = order[again], exact[again]
    return order, exact


def _best_edges(worse: np.ndarray, better: np.ndarray, quality: np.ndarray, keep: int = 1) -> tuple:
    """Each worse row's best edge (its better row of highest quality, then lowest reference), or its
    ``keep`` best distinct edges, sorted by worse row (then best first)."""
    if not worse.size:
        return worse, better, quality
    if keep > 1 and worse.size >= COMPILED_EDGES:  # one key sorted, each row's few edges ranked compiled
        kept = _top_kernel()(np.argsort(worse, kind="stable"), worse, better, quality, keep)
        return worse[kept], better[kept], quality[kept]
    if keep > 1:
        order = np.lexsort((better, -quality, worse))
        worse, better, quality = worse[order], better[order], quality[order]
        # a pair found by several bands or rounds once (its better row's quality is the same each time)
        new = np.r_[True, (worse[1:] != worse[:-1]) | (better[1:] != better[:-1])]
        worse, better, quality = worse[new], better[new], quality[new]
        start = np.flatnonzero(np.r_[True, worse[1:] != worse[:-1]])
        place = np.arange(worse.size) - np.repeat(start, np.diff(np.r_[start, worse.size]))
        top = place < keep
        return worse[top], better[top], quality[top]
    order = np.argsort(worse, kind="stable")  # one key, then per-row maxima: no 3-key lexsort
    worse, better, quality = worse[order], better[order], quality[order]
    start = np.flatnonzero(np.r_[True, worse[1:] != worse[:-1]])
    best = np.maximum.reduceat(quality, start)
    row = np.cumsum(np.r_[False, worse[1:] != worse[:-1]])
    tied = np.where(quality == best[row], better, np.uint64(2**64 - 1))
    return worse[start], np.minimum.reduceat(tied, start), best


@on_first_use
def _top_kernel():
    """:func:`_top_edges` compiled (numba is imported on first use)."""
    import numba

    return numba.njit(cache=True, nogil=True)(_top_edges)


def _top_edges(order, worse, better, quality, keep):  # pragma: no cover (compiled)
    """:func:`_best_edges`' edges (indices), from ``order``, the edges stably sorted by worse row: each
    worse row's ``keep`` best distinct edges (higher quality, then the lower better row), best first."""
    n = order.shape[0]
    out = np.empty(n, dtype=np.int64)
    held = np.empty(keep, dtype=np.int64)  # the row's best edges so far, best first
    count, i = 0, 0
    while i < n:
        row, filled, j = worse[order[i]], 0, i
        while j < n and worse[order[j]] == row:
            edge = order[j]
            j += 1
            again = False  # a pair several bands or rounds found, with the same quality each time
            for s in range(filled):
                if better[held[s]] == better[edge]:
                    again = True
                    break
            if again:
                continue
            place = filled
            while place > 0 and (quality[held[place - 1]] < quality[edge] or (
                    quality[held[place - 1]] == quality[edge] and better[held[place - 1]] > better[edge])):
                place -= 1
            if place < keep:
                for s in range(min(filled, keep - 1), place, -1):
                    held[s] = held[s - 1]
                held[place] = edge
                filled = min(filled + 1, keep)
        for s in range(filled):
            out[count] = held[s]
            count += 1
        i = j
    return out[:count]


# --------------------------------------------------------------------------- 3. edges


def merge_edges(edges: list, exact: bool = False) -> tuple:
    """Edge pieces ``(worse, better, quality of better)`` of one row shard merged into each worse
    row's best edge (``exact``: its ``CANDIDATES`` best): after each round, so that a row shard holds
    at most that many edges a row however many rounds and buckets found them (the best of bests is
    the best)."""
    worse, better, quality = _columns(edges, np.uint64, np.uint64, np.float64)
    return _best_edges(worse, better, quality, CANDIDATES if exact else 1)


# --------------------------------------------------------------------------- 3a. exact cosine


def vector_block(refs: np.ndarray, per: int = PARTITIONS_PER_SHARD) -> np.ndarray:
    """The vector block of each row reference: its partition's block of ``per`` consecutive
    partitions. A block's task reads only its own partitions, one at a time, so no task holds more
    than a block's requested rows (a hashed shard would need every partition read at once)."""
    return ((refs >> np.uint64(32)) // np.uint64(per)).astype(np.int64)


def read_rows(part, number: int, positions: np.ndarray) -> tuple:
    """Partition ``number``'s unit embeddings of the rows at sorted ``positions``, ``(refs,
    vectors)`` float32. ``part``: the partition as read, a dict with ``"embeddings"`` (n, dim), or
    an embedding source whose ``rows(positions)`` converts rows of its column
    (:func:`datamask_dask.partition.adapters.embedding_rows`, which the engines wrap their reads in)."""
    refs = (np.uint64(number) << np.uint64(32)) | positions.astype(np.uint64)
    if isinstance(part, dict):
        return refs, unit_vectors(np.asarray(part["embeddings"])[positions])
    source = part
    blocks = []
    for start in range(0, positions.size, _READ_ROWS):  # a batch of rows converted at a time
        block = source.rows(positions[start:start + _READ_ROWS])
        blocks.append(unit_vectors(block if isinstance(block, np.ndarray) else block.float().cpu().numpy()))
    return refs, np.concatenate(blocks) if blocks else np.zeros((0, 0), dtype=np.float32)


def wanted_rows(pieces: list, number: int, side: int) -> np.ndarray:
    """Sorted distinct positions of partition ``number``'s rows in column ``side`` of edge pieces
    (0: worse rows, 1: better rows): the rows whose embeddings the exact check reads."""
    refs = np.concatenate([np.zeros(0, dtype=np.uint64)] + [np.asarray(p[side], dtype=np.uint64)
                                                            for p in pieces])
    refs = refs[(refs >> np.uint64(32)) == np.uint64(number)]
    return np.unique(refs & np.uint64(0xFFFFFFFF)).astype(np.int64)


def block_vectors(pieces: list, reads: list, first: int, side: int) -> list:
    """One vector block's ``(ref, vectors)`` pieces for the rows that edge ``pieces`` name in
    column ``side``: partition ``first + k`` read by ``reads[k]`` (a callable that reads it, or the
    partition itself), one at a time, only its wanted rows kept."""
    found = []
    for k, read in enumerate(reads):
        positions = wanted_rows(pieces, first + k, side)
        if positions.size:  # a partition no edge names is not read
            part = read() if callable(read) else read
            found.append(read_rows(part, first + k, positions))
            del part
    return found


def unit_vectors(embeddings) -> np.ndarray:
    """Rows scaled to length one, float32 (n, dim). Row by row: a row's result does not depend on
    the rows beside it (numpy's float32 sums along a contiguous row take a fixed order)."""
    block = np.ascontiguousarray(embeddings, dtype=np.float32)
    block = block.reshape(block.shape[0], -1) if block.size else np.zeros((len(block), 0), dtype=np.float32)
    norms = np.sqrt((block * block).sum(axis=1))
    return block / np.where(norms > 0, norms, np.float32(1))[:, None]


def similarities(child: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """The cosine of each pair of unit rows (float32, (n, dim) each): a float32 sum per pair, the
    same whatever else is computed beside it."""
    return (child * parent).sum(axis=1)


def _vectors(pieces: list) -> tuple[np.ndarray, np.ndarray]:
    """One shard's ``(ref, vectors)`` pieces as sorted references and their vectors."""
    pieces = [p for p in pieces if p[0].size]
    if not pieces:
        return np.zeros(0, dtype=np.uint64), np.zeros((0, 0), dtype=np.float32)
    for p in pieces[1:]:  # the plan's own check may not have run yet: say what is wrong, not numpy's error
        if p[1].shape[1] != pieces[0][1].shape[1]:
            raise InputDataError(f"partition {int(p[0][0] >> np.uint64(32))}: the embedding column has "
                                 f"{p[1].shape[1]} dimensions but {pieces[0][1].shape[1]} elsewhere; every "
                                 "row needs the same dimension")
    ref = np.concatenate([p[0] for p in pieces])
    vectors = np.concatenate([p[1] for p in pieces])
    order = np.argsort(ref)
    return ref[order], vectors[order]


def _lookup(ref: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Places in sorted ``ref`` of ``wanted`` (every one present)."""
    at = np.searchsorted(ref, wanted)
    if wanted.size and (at.max() >= ref.size or np.any(ref[at] != wanted)):
        raise ValueError("a near-duplicate candidate's row has no embedding in its shard")
    return at


def request_vectors(edges: list, blocks: int, per: int = PARTITIONS_PER_SHARD) -> list:
    """One row shard's merged candidate edges (:func:`merge_edges` with ``exact``), one piece per
    vector block of the better rows, whose task reads their vectors (:func:`attach_vectors`)."""
    worse, better, quality = merge_edges(edges, exact=True)
    return _split(vector_block(better, per), blocks, worse, better, quality)


def attach_vectors(requests: list, vectors: list, blocks: int, per: int = PARTITIONS_PER_SHARD) -> list:
    """The candidate edges whose better rows live in this block with those rows' unit vectors,
    one ``(worse, better, quality, refs, vectors)`` piece per vector block of the worse rows: each
    better row's vector once per piece, however many of the piece's edges name it.
    ``vectors``: the block's :func:`block_vectors` of the requests' better rows."""
    worse, better, quality = _columns(requests, np.uint64, np.uint64, np.float64)
    ref, unit = _vectors(vectors)
    pieces = []
    for w, b, q in _split(vector_block(worse, per), blocks, worse, better, quality):
        named = np.unique(b)
        picked = unit[_lookup(ref, named)] if named.size else np.zeros((0, unit.shape[1]), dtype=np.float32)
        pieces.append((w, b, q, named, picked))
    return pieces


def confirm_edges(attached: list, vectors: list, cosine: float, row_shards: int) -> list:
    """The candidate edges of this block's worse rows confirmed on the exact cosine of their unit
    embeddings (``>= cosine``), as each worse row's best confirmed edge ``(worse, better, quality)``,
    one piece per row shard of the worse row (what :func:`best_parents` takes). ``vectors``: the
    block's :func:`block_vectors` of its worse rows. Each pair's cosine is a float32 sum over its
    own two rows, so it does not depend on what else the task holds."""
    worse, better, quality = _columns(attached, np.uint64, np.uint64, np.float64)
    if worse.size:
        parent_ref, parent_unit = _vectors([(p[3], p[4]) for p in attached])
        ref, unit = _vectors(vectors)
        similar = np.empty(worse.size, dtype=bool)
        for start in range(0, worse.size, _PAIR_ROWS):  # a batch of pairs' rows gathered at a time
            stop = start + _PAIR_ROWS
            similar[start:stop] = similarities(unit[_lookup(ref, worse[start:stop])],
                                               parent_unit[_lookup(parent_ref, better[start:stop])]) >= cosine
        worse, better, quality = _best_edges(worse[similar], better[similar], quality[similar])
    return _split(shard_of(worse, row_shards), row_shards, worse, better, quality)


def attach_block(requests: list, reads: list, first: int, blocks: int,
                 per: int = PARTITIONS_PER_SHARD) -> list:
    """One vector block's task of the exact check's first step: its partitions (``reads``, from
    partition ``first``) read for the requests' better rows, then :func:`attach_vectors`."""
    return attach_vectors(requests, block_vectors(requests, reads, first, 1), blocks, per)


def confirm_block(attached: list, reads: list, first: int, cosine: float, row_shards: int) -> list:
    """One vector block's task of the exact check's second step: its partitions read again for the
    worse rows of the edges attached to it, then :func:`confirm_edges`."""
    return confirm_edges(attached, block_vectors(attached, reads, first, 0), cosine, row_shards)


# --------------------------------------------------------------------------- 4-5. groups


def best_parents(edges: list, shards: int) -> dict:
    """Each shadowed row of one shard and its best verified better neighbour (its parent):
    ``{"child": sorted refs, "parent": their parents, "pending": [(target, count)] per shard}``,
    each shadowed row's count of one sent to its parent's shard."""
    child, parent, _ = merge_edges(edges)
    ones = np.ones(child.size, dtype=np.int64)
    return {"child": child, "parent": parent,
            "pending": _split(shard_of(parent, shards), shards, parent, ones)}


def forward_weights(parents: dict, pending: list, shards: int) -> dict:
    """One round: counts that reached a shadowed row move on to its parent; those at a kept row stay.

    Returns ``{"roots": (ref, count) kept here this round, "pending": [(target, count)] per shard}``.
    """
    target, count = _sum_by(*_columns(pending, np.uint64, np.int64))
    child, parent = parents["child"], parents["parent"]
    shadowed = np.isin(target, child)
    moving = parent[np.searchsorted(child, target[shadowed])]
    return {"roots": (target[~shadowed], count[~shadowed]),
            "pending": _split(shard_of(moving, shards), shards, moving, count[shadowed])}


def _sum_by(refs: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    unique, inverse = np.unique(refs, return_inverse=True)
    return unique, np.bincount(inverse, weights=counts, minlength=unique.size).astype(np.int64)


def deliver(parents: dict, roots: list, leftover: list, n_parts: int) -> dict:
    """One shard's results routed to their partitions: ``{"pieces": [(shadowed refs, kept refs,
    weights, the shadowed rows' parent refs, refs of the partition's rows that are a parent)] per
    partition, "unresolved": counts still climbing after the last round}``."""
    ref, count = _sum_by(*_columns(roots, np.uint64, np.int64))
    child, parent = parents["child"], parents["parent"]
    unresolved = int(sum(int(p[1].sum()) for p in leftover))
    child_split = _split(_partition_of(child), n_parts, child, parent)
    ref_split = _split(_partition_of(ref), n_parts, ref, count + 1)  # a kept row also stands for itself
    # the rows that are some row's parent go to their own partition (its explain step names them)
    parent = np.unique(parent)
    parent_split = _split(_partition_of(parent), n_parts, parent)
    pieces = [(child_split[p][0], ref_split[p][0], ref_split[p][1], child_split[p][1], parent_split[p][0])
              for p in range(n_parts)]
    return {"pieces": pieces, "unresolved": unresolved}


def _partition_of(refs: np.ndarray) -> np.ndarray:
    return (refs >> np.uint64(32)).astype(np.int64)


def partition_groups(pieces: list) -> DuplicateGroups:
    """One partition's entry of :func:`~datamask_dask.dedup.search.find_groups` from its pieces."""
    mask = np.uint64(0xFFFFFFFF)
    shadowed, kept, weights, parent, parents = _columns(pieces, np.uint64, np.uint64, np.int64, np.uint64,
                                                        np.uint64)
    order = np.argsort(kept)
    by_child = np.argsort(shadowed)
    return DuplicateGroups(shadowed=(shadowed[by_child] & mask).astype(np.int64),
                           kept=(kept[order] & mask).astype(np.int64), weights=weights[order],
                           parent=parent[by_child].astype(np.int64),
                           parents=np.unique((parents & mask).astype(np.int64)))


def shard_count(n: int, per_shard: int) -> int:
    """Shards for ``n`` partitions (or partitions x bands): about ``per_shard`` each."""
    return max(1, math.ceil(n / per_shard))


def is_exact(parts: list[dict]) -> bool:
    """Whether the partitions carry their embeddings (then candidates are confirmed on exact
    cosine): all of them or none."""
    carry = {p.get("embeddings") is not None for p in parts}
    if len(carry) > 1:
        raise ValueError("near-duplicate search: some partitions carry 'embeddings' and some do not")
    return carry == {True}


def confirmed_edges(parts: list[dict], edges: list, cosine: float, run, shards: int = 1) -> list:
    """Stage 3a in this process: each row shard's candidate edges (``edges``, lists of pieces)
    confirmed on exact cosine in about ``shards`` vector blocks of consecutive partitions, as each
    row shard's list of pieces for :func:`best_parents`."""
    row_shards, n_parts = len(edges), len(parts)
    per = max(1, math.ceil(n_parts / max(1, shards)))
    blocks = shard_count(n_parts, per)
    firsts = list(range(0, n_parts, per))
    requests = [run("request_vectors", request_vectors, edges[s], blocks, per) for s in range(row_shards)]
    attached = [run("attach_vectors", attach_block, [r[t] for r in requests], parts[first:first + per], first,
                    blocks, per) for t, first in enumerate(firsts)]
    confirmed = [run("confirm_edges", confirm_block, [a[t] for a in attached], parts[first:first + per],
                     first, cosine, row_shards) for t, first in enumerate(firsts)]
    return [[c[s] for c in confirmed] for s in range(row_shards)]


def sharded_candidates(parts: list[dict], cosine: float, shards: int, exact: bool,
                       row_shards: int | None = None, rounds_of: int = ROUND_BANDS, run=None,
                       spill=None) -> tuple[list, int, dict]:
    """Stages 1-2 in this process: each row shard's edge pieces (each worse row's best edge, or its
    ``CANDIDATES`` best with ``exact``), the candidate pairs tried and the band plan."""
    run = run or (lambda name, fn, *args: fn(*args))
    row_shards = shards if row_shards is None else row_shards
    n_rows = sum(int(np.asarray(p["quality"]).shape[0]) for p in parts)
    plan = band_plan(n_rows)
    n_bands = plan["positions"].shape[0]
    edges: list[list] = [[] for _ in range(row_shards)]
    n_pairs = 0
    for r, bands in enumerate(band_rounds(n_bands, rounds_of)):
        if merges_before(r):  # so that the edges do not pile up
            edges = [[run("merge_edges", merge_edges, shard_edges, exact)] if shard_edges else []
                     for shard_edges in edges]
        records = [run("band_records", band_records, p, i, plan, shards, bands) for i, p in enumerate(parts)]
        for s in range(shards):
            out = run("bucket_edges", bucket_edges, [r[s] for r in records], row_shards, cosine, exact)
            n_pairs += out["pairs"]
            pieces = out["pieces"] if spill is None else spill(out["pieces"])
            for t in range(row_shards):
                edges[t].append(pieces[t])
        del records
    return edges, n_pairs, plan


def find_groups_sharded(parts: list[dict], cosine: float = 0.95, shards: int = 4,
                        rounds_of: int = ROUND_BANDS, on_task=None, spill=None,
                        row_shards: int | None = None) -> tuple[list[DuplicateGroups], dict]:
    """Every stage in one process, in order.

    ``shards``: key shards of stages 1-2; ``row_shards``: row shards of stages 3-5 (default
    ``shards``); ``rounds_of``: bands per round of stages 1-2 (one round's records are held at a
    time); the groups depend on none of them. ``on_task(name, fn, *args)`` runs each task (default:
    calls it), so a caller can time or measure them; ``spill(pieces)`` may move each task's edge
    pieces out of memory until they are used (as a shuffle spills to disk). Returns the
    per-partition groups and statistics: candidate pairs, unresolved counts, band bits and count,
    and each shard's :func:`best_parents`.
    """
    run = on_task or (lambda name, fn, *args: fn(*args))
    row_shards = shards if row_shards is None else row_shards
    exact = is_exact(parts)
    edges, n_pairs, plan = sharded_candidates(parts, cosine, shards, exact, row_shards, rounds_of, run, spill)
    if exact:
        edges = confirmed_edges(parts, edges, cosine, run, shards)
    parents = [run("best_parents", best_parents, edges[s], row_shards) for s in range(row_shards)]
    del edges
    pending, roots = [p["pending"] for p in parents], []
    for _ in range(ROUNDS):
        moved = [run("forward_weights", forward_weights, parents[s], [p[s] for p in pending], row_shards)
                 for s in range(row_shards)]
        roots.append([m["roots"] for m in moved])
        pending = [m["pending"] for m in moved]
    delivered = [run("deliver", deliver, parents[s], [r[s] for r in roots], [p[s] for p in pending],
                     len(parts)) for s in range(row_shards)]
    groups = [run("partition_groups", partition_groups, [d["pieces"][i] for d in delivered])
              for i in range(len(parts))]
    return groups, {"pairs": n_pairs, "unresolved": sum(d["unresolved"] for d in delivered),
                    "bits": plan["bits"], "bands": plan["positions"].shape[0], "parents": parents}
