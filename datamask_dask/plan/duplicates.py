"""Near-duplicates across the whole table, found from compact signatures (``diversity_scope="table"``).

Engine-agnostic (numpy, and torch for the signing product): the Dask operator (and the Spark
integration) compute one small signature array per partition in the plan pass (:func:`signatures`),
find the near-duplicate groups of the whole table from them -- with the sharded graph of
:mod:`datamask_dask.plan.shards`, whose tasks each hold a shard; :func:`find_groups` here is the
same search in one task, the reference it is tested against -- and hand each partition the
positions of its rows that are *shadowed*: near-copies of a better row elsewhere in the table (or
in the partition).
Shadowed rows are left out of the quality sketches, so the quotas stay exact over the rows that
remain, and the select pass treats them as ineligible. Each partition's learner then sees at most
one member of every near-duplicate group in the table, so the selection cannot pick the same
document twice from two partitions.

Method
------
1. **Signature** (per partition): a SimHash of each unit embedding, the signs of its projections on
   ``SIGNATURE_BITS`` = 256 fixed random hyperplanes (seed ``PLANE_SEED``, so every partition and
   every run uses the same ones), packed to 32 bytes per row. For two rows at angle ``theta`` each
   bit differs with probability ``theta / pi``, so ``cos(pi * hamming / 256)`` estimates their
   cosine.
2. **Candidates**: LSH banding, ``BANDS`` = 24 bands of ``BAND_BITS`` = 20 bits, each band a fixed
   window of the 256 bits (:func:`band_keys`); rows that agree on a whole band (and are in the same ``by``
   group) are candidate pairs. A pair at cosine 0.975 (hamming ~18) shares at least one band with
   probability about 0.998, one at cosine 0.95 with probability about 0.95 (bands overlap, so
   these are estimates; 16 disjoint bands of 16 bits recall as much but let 10x more pairs collide
   by chance on clustered data).
3. **Verification**: a candidate pair is a near-duplicate when its Hamming distance is at most
   :func:`hamming_threshold` (the expected distance at ``cosine`` plus ``SEARCH_MARGIN`` = 0.75
   standard deviations of the estimate: at 0.95, pairs at 0.98 are found 99% of the time, at
   0.96 88%, at 0.95 74%; pairs at 0.92 are merged by mistake 25% of the time, at 0.90 8%).
4. **Groups**: connected components of the verified pairs. In each group the best-quality member
   is kept (ties: lowest partition, then lowest row) and every other member is shadowed. The kept
   member *stands for* its group: its weight is the group's size (:func:`find_groups`), and
   Facility weighs it so (:mod:`datamask_dask.learn.objectives`), so setting the copies aside does
   not change which rows the objective asks to cover.

Cost and limits
---------------
Signing costs one float32 product of each row with the 256 hyperplanes, in the plan pass's
embedding checks (:mod:`datamask_dask.partition.checks`, which read each block once for the checks
and the signatures), on blocks that are views of the Arrow column where possible. The reduction holds every
row's signature, quality and group code: about 44 bytes per row on one task (440 MB for 10
million rows), plus, per band, the rows that share their band key with another row (on clustered
data about half of them) and their candidate pairs (batched). Pairs that collide by chance grow
as ``N**2 / 2**21`` per band (several times more on clustered data); each pair found by several
bands is kept once. ``benchmarks/bench_duplicates.py`` measures the reduction alone (seconds,
peak memory, candidates per band) at a given size; ``--sharded`` the sharded step, whose bands
widen with the table (:func:`datamask_dask.plan.shards.band_plan`) so chance collisions stay
linear in the rows.

The run summary (:mod:`datamask_dask.io.summary`) uses the same signatures and bands to count
near-duplicate pairs among the selected rows (:func:`count_pairs`).
"""

from __future__ import annotations

import math
import os
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np

SIGNATURE_BITS = 256
SIGNATURE_BYTES = SIGNATURE_BITS // 8
BANDS = 24  # LSH bands ...
BAND_BITS = 20  # ... of 20 bits each, overlapping windows of the 256
PLANE_SEED = 0x5EED_D0C5
# Standard deviations of the Hamming estimate added to the expected distance at ``cosine`` when
# searching. Share of pairs found at 0.95 (test_global, d = 64) by true cosine 0.98 / 0.96 / 0.95 /
# 0.94 / 0.92 / 0.90: 0.75 -> 99% / 88% / 74% / 57% / 25% / 8%; 1.5 -> 99% / 93% / 87% / 74% / 44% /
# 25%. 1.5 set aside ~10% more rows than the planted copies and cost twice the objective
# (benchmarks/results-global-seeds*.md) for pairs mostly below the threshold.
SEARCH_MARGIN = 0.75
_PAIR_BATCH = 1 << 22  # candidate pairs verified at once
BAND_THREADS = 4  # threads of find_duplicates (at most one per core)


def hyperplanes(dim: int) -> np.ndarray:
    """The fixed random hyperplanes, float32 (dim, SIGNATURE_BITS): the same for every partition and run."""
    rng = np.random.default_rng([PLANE_SEED, int(dim)])
    return rng.standard_normal((int(dim), SIGNATURE_BITS), dtype=np.float32)


def signatures(block, planes) -> np.ndarray:
    """SimHash signatures of a block of rows (numpy array or torch tensor), uint8 (n, SIGNATURE_BYTES).

    ``planes`` is :func:`hyperplanes` of the block's dimension (a numpy array). Rows need not be
    normalised (only the signs of the projections count).
    """
    import torch

    if isinstance(block, np.ndarray):
        # torch's product, not numpy's: on the CPUs measured it runs 2.7x faster (MKL vs OpenBLAS,
        # 32 vs 12 GFLOPS on one core) and signing is most of the plan pass's scan. Blocks are
        # often read-only views of Arrow memory, which torch only reads here.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            block = torch.from_numpy(np.asarray(block, dtype=np.float32))
    signs = ((block.float() @ torch.as_tensor(planes, device=block.device)) >= 0).cpu().numpy()
    return np.packbits(signs, axis=1)


def hamming_threshold(cosine: float, bits: int = SIGNATURE_BITS, margin: float = SEARCH_MARGIN) -> int:
    """Largest Hamming distance counted as a near-duplicate of cosine ``cosine``.

    ``margin``: standard deviations of the estimate added to the expected distance
    (``SEARCH_MARGIN`` for the search, which should miss few pairs; 0 for counting pairs).
    """
    p = math.acos(min(1.0, max(-1.0, cosine))) / math.pi
    return int(math.floor(bits * p + margin * math.sqrt(bits * p * (1 - p))))


def find_duplicates(parts: list[dict], cosine: float = 0.95) -> list[np.ndarray]:
    """Shadowed rows of each partition: near-duplicates of a better row anywhere in the table.

    The ``"shadowed"`` entries of :func:`find_groups`; see there.

    Parameters
    ----------
    parts : list of dict, one per partition, in partition order
        ``quality`` float64 (n,), ``codes`` int (n,) (group code of each row, indexing
        ``labels``), ``labels`` (group labels, ``[None]`` without ``by``) and ``signatures``
        uint8 (n, SIGNATURE_BYTES) from :func:`signatures`.
    cosine : float
        Rows at least this similar are near-duplicates (estimated from the signatures).

    Returns
    -------
    list of int64 arrays
        For each partition, the sorted positions of its shadowed rows. Deterministic: it depends
        only on the rows' content and partition order, not on where or when anything ran.
    """
    return [found["shadowed"] for found in find_groups(parts, cosine)]


def find_groups(parts: list[dict], cosine: float = 0.95) -> list[dict]:
    """Near-duplicate groups of the whole table, per partition: shadowed rows and kept rows' weights.

    Parameters are those of :func:`find_duplicates`. Returns, for each partition, a dict of
    ``shadowed`` (sorted int64 positions of its rows that are near-copies of a better row),
    ``kept`` (sorted int64 positions of its rows kept for a group of two or more) and ``weights``
    (int64, the size of each of those groups: the rows the kept row stands for, itself included).
    """
    table = stack_parts(parts)
    # The bands on a few threads (sorting and comparing in numpy, which releases the GIL): an
    # engine that calls this on its driver (Spark) gets the parallelism Dask gets from tasks.
    threads = max(1, min(BAND_THREADS, os.cpu_count() or 1))
    with ThreadPoolExecutor(threads) as pool:
        edges = list(pool.map(lambda first: band_edges(table, range(first, BANDS, threads), cosine),
                              range(threads)))
    return resolve_groups(table, edges)


def count_pairs(blocks: list[np.ndarray], cosine: float = 0.95) -> tuple[int, int]:
    """Near-duplicate pairs among rows given by their signatures, one block per partition.

    Returns ``(within, across)``: pairs of rows in the same block, and in two different blocks.
    An estimate: a pair counts when its Hamming distance is at most the one expected at
    ``cosine`` (no margin), found through the same LSH bands as :func:`find_duplicates` (which
    miss about 5% of the pairs right at ``cosine`` and almost none of the closer ones).
    """
    blocks = [np.asarray(b, dtype=np.uint8).reshape(-1, SIGNATURE_BYTES) for b in blocks]
    sizes = np.array([b.shape[0] for b in blocks], dtype=np.int64)
    if sizes.sum() < 2:
        return 0, 0
    sig = np.ascontiguousarray(np.concatenate(blocks))
    table = {"signatures": sig, "group": np.zeros(sig.shape[0], dtype=np.int64)}
    left, right = band_edges(table, range(BANDS), cosine, margin=0.0)
    block = np.repeat(np.arange(sizes.size), sizes)
    within = int(np.count_nonzero(block[left] == block[right]))
    return within, int(left.size) - within


def stack_parts(parts: list[dict]) -> dict:
    """The partitions' inputs as one table: quality, global group index, signatures, offsets."""
    sizes = [int(p["quality"].shape[0]) for p in parts]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    labels = sorted({label for p in parts for label in p["labels"]}, key=lambda x: (type(x).__name__, x))
    index_of = {label: i for i, label in enumerate(labels)}
    group = np.concatenate([np.zeros(0, dtype=np.int64)] + [
        np.asarray([index_of[lab] for lab in p["labels"]], dtype=np.int64)[np.asarray(p["codes"])]
        for p in parts if len(p["quality"])])
    quality = np.concatenate([np.zeros(0)] + [np.asarray(p["quality"], dtype=np.float64) for p in parts])
    sig = np.concatenate([np.zeros((0, SIGNATURE_BYTES), dtype=np.uint8)] + [
        np.asarray(p["signatures"], dtype=np.uint8).reshape(-1, SIGNATURE_BYTES) for p in parts if
        len(p["quality"])])
    return {"offsets": offsets, "group": group, "quality": quality, "signatures": np.ascontiguousarray(sig)}


def band_edges(table: dict, bands, cosine: float = 0.95,
               margin: float = SEARCH_MARGIN) -> tuple[np.ndarray, np.ndarray]:
    """Verified near-duplicate pairs ``(left, right)``, each once, found by one band (an int) or several.

    Bands are independent: an engine may run them as separate tasks (the Dask operator does) and
    hand every result to :func:`shadowed_rows`. ``margin``: see :func:`hamming_threshold`.
    """
    bands = [bands] if isinstance(bands, int | np.integer) else list(bands)
    sig = table["signatures"]
    limit = hamming_threshold(cosine, margin=margin)
    # Column-major copies (64 bytes a row): band keys and XOR-popcounts then read contiguous columns.
    columns = np.ascontiguousarray(sig.T)
    words = np.ascontiguousarray(sig.view(np.uint64).T)
    edges = [_band_pairs(columns, words, table["group"], int(band), limit) for band in bands]
    return _unique_pairs(np.concatenate([np.zeros(0, dtype=np.int64)] + [e[0] for e in edges]),
                         np.concatenate([np.zeros(0, dtype=np.int64)] + [e[1] for e in edges]), sig.shape[0])


def shadowed_rows(table: dict, edges: list) -> list[np.ndarray]:
    """Union the verified pairs into groups; every member but the best of each is shadowed, per partition."""
    return [found["shadowed"] for found in resolve_groups(table, edges)]


def resolve_groups(table: dict, edges: list) -> list[dict]:
    """Union the verified pairs into groups: per partition, the shadowed rows and the kept rows' weights.

    Every member of a group but the best is shadowed; the best is kept and stands for the group
    (its weight is the group's size). The dicts are those of :func:`find_groups`.
    """
    offsets, quality = table["offsets"], table["quality"]
    n = int(offsets[-1])
    left = np.concatenate([np.zeros(0, dtype=np.int64)] + [e[0] for e in edges])
    right = np.concatenate([np.zeros(0, dtype=np.int64)] + [e[1] for e in edges])
    root = _components(n, *_unique_pairs(left, right, max(n, 1)))
    # keeper of each group: best quality, then lowest global row (= lowest partition, then row)
    rank = np.empty(n, dtype=np.int64)
    rank[np.lexsort((np.arange(n), -quality))] = np.arange(n)
    best = np.full(n, n, dtype=np.int64)
    np.minimum.at(best, root, rank)
    shadowed = np.flatnonzero(rank != best[root])
    size = np.bincount(root, minlength=n)
    kept = np.flatnonzero((rank == best[root]) & (size[root] > 1))
    weights = size[root[kept]]
    out = []
    for i in range(len(offsets) - 1):
        low, high = offsets[i], offsets[i + 1]
        mine = (kept >= low) & (kept < high)
        out.append({"shadowed": shadowed[(shadowed >= low) & (shadowed < high)] - low,
                    "kept": kept[mine] - low, "weights": weights[mine]})
    return out


def _band_pairs(columns: np.ndarray, words: np.ndarray, group: np.ndarray, band: int,
                limit: int) -> tuple[np.ndarray, np.ndarray]:
    """Verified pairs (i < j) of rows that share band ``band`` and their group.

    ``columns``: the signatures' bytes, (SIGNATURE_BYTES, n); ``words``: as uint64, (4, n).
    """
    key = _column_band_keys(columns, band)
    # Most rows share their band key with no other row: drop them before sorting (counting the
    # 2**BAND_BITS keys is far cheaper than sorting every row).
    rows = np.flatnonzero(np.bincount(key, minlength=1 << BAND_BITS)[key] > 1)
    empty = np.zeros(0, dtype=np.int64)
    if rows.size < 2:
        return empty, empty
    key = key[rows].astype(np.int64) | (group[rows] << BAND_BITS)
    # Any order within a bucket will do (every pair of it is taken). Where the key fits in 31 bits,
    # one sort of (key, position) packed in an int64 replaces argsort and two gathers (1.3x faster).
    if int(key.max()) < 1 << 31 and rows.size < 1 << 32:
        packed = np.sort((key << 32) | np.arange(rows.size, dtype=np.int64))
        sorted_key, order = packed >> 32, rows[packed & 0xFFFFFFFF]
    else:
        order = np.argsort(key)
        sorted_key, order = key[order], rows[order]
    # The signatures in bucket order: a bucket's rows then sit side by side, so verifying its pairs
    # reads nearby memory instead of gathering both rows of every pair from anywhere in the table.
    # (np.take along the axis: 3x faster than the equivalent fancy index words[:, order].)
    near_words = np.take(words, order, axis=1)
    start = np.flatnonzero(np.r_[True, sorted_key[1:] != sorted_key[:-1]])
    size = np.diff(np.r_[start, sorted_key.shape[0]])
    keep = size > 1
    start, size = start[keep], size[keep]
    if not start.size:
        return empty, empty
    # every position p of a bucket pairs with the later positions of that bucket
    position = _ranges(start, size)
    later = np.repeat(start + size, size) - position - 1
    out_left, out_right = [], []
    cumulative = np.cumsum(later)
    first = 0
    while first < position.shape[0]:  # batches of about _PAIR_BATCH pairs
        done = cumulative[first - 1] if first else 0
        stop = int(np.searchsorted(cumulative, done + _PAIR_BATCH, side="right"))
        stop = max(stop, first + 1)
        pos, count = position[first:stop], later[first:stop]
        a = np.repeat(pos, count)
        b = a + 1 + (np.arange(a.shape[0]) - np.repeat(np.cumsum(count) - count, count))
        distance = np.bitwise_count(near_words[0][a] ^ near_words[0][b]).astype(np.int16)
        for word in near_words[1:]:
            distance += np.bitwise_count(word[a] ^ word[b])
        near = distance <= limit
        i, j = order[a[near]], order[b[near]]
        out_left.append(np.minimum(i, j))
        out_right.append(np.maximum(i, j))
        first = stop
    return np.concatenate(out_left), np.concatenate(out_right)


def _unique_pairs(left: np.ndarray, right: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Each pair once: a pair found by several bands is verified by each (n * n < 2**63 up to 3e9 rows)."""
    # sorted, repeats dropped: what np.unique returns, 15x faster here than its hashing path
    pairs = np.sort(left * np.int64(n) + right)
    pairs = pairs[np.r_[True, pairs[1:] != pairs[:-1]]] if pairs.size else pairs
    return pairs // n, pairs % n


def band_keys(sig: np.ndarray, band: int) -> np.ndarray:
    """The ``BAND_BITS``-bit key of band ``band`` of each signature (rows of ``sig``), uint32 (n,).

    Band ``b`` is the window of ``BAND_BITS`` bits starting at bit ``b * SIGNATURE_BITS // BANDS``
    (wrapping around): the hyperplanes are independent, so any fixed bits will do.
    """
    return _column_band_keys(np.ascontiguousarray(sig.T), band)


def _column_band_keys(columns: np.ndarray, band: int) -> np.ndarray:
    """:func:`band_keys` from the signature bytes as columns (SIGNATURE_BYTES, n): shifts, no unpacking."""
    start = band * SIGNATURE_BITS // BANDS
    first = start // 8
    key = np.zeros(columns.shape[1], dtype=np.uint32)
    for i in range(4):  # the 4 bytes that hold the window (20 bits from any bit offset fit in 4)
        key = (key << 8) | columns[(first + i) % SIGNATURE_BYTES]
    return (key >> (32 - BAND_BITS - (start % 8))) & ((1 << BAND_BITS) - 1)


def _ranges(start: np.ndarray, size: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + c) for s, c in zip(start, size)])``, vectorised."""
    total = int(size.sum())
    return np.repeat(start - (np.cumsum(size) - size), size) + np.arange(total)


def _components(n: int, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Connected components on ``n`` nodes: each node's smallest member (min-label propagation)."""
    root = np.arange(n, dtype=np.int64)
    if not left.size:
        return root
    while True:
        low = np.minimum(root[left], root[right])
        before = root.copy()
        np.minimum.at(root, left, low)
        np.minimum.at(root, right, low)
        root = root[root]  # pointer jumping
        while True:
            jumped = root[root]
            if np.array_equal(jumped, root):
                break
            root = jumped
        if np.array_equal(root, before):
            return root
