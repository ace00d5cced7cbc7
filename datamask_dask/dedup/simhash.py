"""SimHash signatures of rows, and near-duplicate pairs counted from them.

Engine-agnostic (numpy, and torch for the signing product). The plan pass of ``diversity_scope=
"table"`` signs every row (in :mod:`datamask_dask.partition.checks`); :mod:`datamask_dask.dedup.search`
finds the table's near-duplicate candidates from the signatures (and confirms them on the exact
cosine of the embeddings where it has them).

1. **Signature** (per partition): a SimHash of each unit embedding, the signs of its projections on
   ``SIGNATURE_BITS`` = 256 fixed random hyperplanes (seed ``PLANE_SEED``, so every partition and
   every run uses the same ones), packed to 32 bytes per row. For two rows at angle ``theta`` each
   bit differs with probability ``theta / pi``, so ``cos(pi * hamming / 256)`` estimates their
   cosine, and :func:`hamming_threshold` turns a cosine into the largest distance that counts.
2. **Counting pairs** (:func:`count_pairs`, the run summary's near-duplicate pairs among the
   selected rows, :mod:`datamask_dask.run.summary`): LSH banding, ``BANDS`` = 24 bands of
   ``BAND_BITS`` = 20 bits, each band a fixed window of the 256 bits (:func:`band_keys`); rows
   that agree on a whole band are candidates. A pair at cosine 0.975 shares a band with probability
   about 0.998, one at 0.95 about 0.95. A candidate counts where the rows' cosine reaches the
   threshold: exactly, where their vectors are given, else as the Hamming distance estimates it,
   which also counts pairs just below the threshold (a 256-bit estimate's standard deviation is
   about 0.02 there, and clustered rows have many more such neighbours than copies).
"""

from __future__ import annotations

import math
import warnings

import numpy as np

SIGNATURE_BITS = 256
SIGNATURE_BYTES = SIGNATURE_BITS // 8
BANDS = 24  # LSH bands of count_pairs ...
BAND_BITS = 20  # ... of 20 bits each, overlapping windows of the 256
PLANE_SEED = 0x5EED_D0C5
# Standard deviations of the Hamming estimate above the distance expected at ``cosine`` that still
# verify a pair where signatures are all it is verified on: clustered rows have far more neighbours
# just below the threshold than copies above it, so a wider margin sets many aside.
VERIFY_MARGIN = 0.1
# ... and where exact cosine confirms each candidate (the plan pass, which has the embeddings): a
# wide margin, so that pairs the estimate puts too far apart are still tried; the exact check then
# drops the rest.
CANDIDATE_MARGIN = 2.0
_PAIR_BATCH = 1 << 22  # candidate pairs verified at once


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

    from ..threads import one_cpu_thread

    if isinstance(block, np.ndarray):
        # torch's product, not numpy's: MKL outruns the OpenBLAS numpy ships with, and signing is
        # most of the plan pass's scan. Blocks are often read-only views of Arrow memory, which
        # torch only reads here.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            block = torch.from_numpy(np.asarray(block, dtype=np.float32))
    planes = torch.as_tensor(planes, device=block.device)
    with one_cpu_thread(block.device):
        signs = ((block.float() @ planes) >= 0).cpu().numpy()
    return np.packbits(signs, axis=1)


def hamming_threshold(cosine: float, margin: float = VERIFY_MARGIN) -> int:
    """Largest Hamming distance counted as a near-duplicate of cosine ``cosine``.

    ``margin``: standard deviations of the estimate added to the expected distance
    (``VERIFY_MARGIN`` for the search at every size; 0 for counting pairs).
    """
    p = math.acos(min(1.0, max(-1.0, cosine))) / math.pi
    return int(math.floor(SIGNATURE_BITS * p + margin * math.sqrt(SIGNATURE_BITS * p * (1 - p))))


def count_pairs(blocks: list[np.ndarray], cosine: float = 0.95,
                vectors: list[np.ndarray] | None = None) -> tuple[int, int]:
    """Near-duplicate pairs among rows given by their signatures, one block per partition:
    ``(within, across)``, pairs of rows in the same block and in two different blocks.

    With ``vectors`` (each block's rows' unit embeddings, in its order), a candidate within the wide
    ``CANDIDATE_MARGIN`` counts where its exact cosine reaches ``cosine``, as the plan pass confirms
    them. Without, one within the distance expected at ``cosine`` counts: an estimate that also
    counts many of the pairs just below ``cosine`` where rows are clustered (see the module notes).
    """
    blocks = [np.asarray(b, dtype=np.uint8).reshape(-1, SIGNATURE_BYTES) for b in blocks]
    sizes = np.array([b.shape[0] for b in blocks], dtype=np.int64)
    if sizes.sum() < 2:
        return 0, 0
    sig = np.ascontiguousarray(np.concatenate(blocks))
    table = {"signatures": sig, "group": np.zeros(sig.shape[0], dtype=np.int64)}
    margin = 0.0 if vectors is None else CANDIDATE_MARGIN
    left, right = band_edges(table, range(BANDS), cosine, margin)
    if vectors is not None:
        unit = np.concatenate([np.asarray(v, dtype=np.float32).reshape(size, -1)
                               for v, size in zip(vectors, sizes, strict=True) if size])
        near = np.zeros(left.size, dtype=bool)
        for start in range(0, left.size, _PAIR_BATCH):
            a, b = left[start:start + _PAIR_BATCH], right[start:start + _PAIR_BATCH]
            near[start:start + a.size] = (unit[a] * unit[b]).sum(axis=1) >= cosine
        left, right = left[near], right[near]
    block = np.repeat(np.arange(sizes.size), sizes)
    within = int(np.count_nonzero(block[left] == block[right]))
    return within, int(left.size) - within


def band_edges(table: dict, bands, cosine: float = 0.95,
               margin: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Pairs ``(left, right)``, sorted, within :func:`hamming_threshold` (``margin``) that share one
    of ``bands`` and a group, each once; ``table``: ``signatures`` (n, SIGNATURE_BYTES) and
    ``group`` (n,) int."""
    sig = table["signatures"]
    n = sig.shape[0]
    limit = hamming_threshold(cosine, margin)
    # Column-major copies (64 bytes a row): band keys and XOR-popcounts then read contiguous columns.
    columns = np.ascontiguousarray(sig.T)
    words = np.ascontiguousarray(sig.view(np.uint64).T)
    edges = [_band_pairs(columns, words, table["group"], int(band), limit) for band in bands]
    # A pair found by several bands once: sorted, repeats dropped (what np.unique returns, without
    # its hashing path); n * n < 2**63 up to 3e9 rows.
    pairs = np.sort(np.concatenate([np.zeros(0, dtype=np.int64)] + [i * np.int64(n) + j for i, j in edges]))
    pairs = pairs[np.r_[True, pairs[1:] != pairs[:-1]]] if pairs.size else pairs
    return pairs // n, pairs % n


def _band_pairs(columns: np.ndarray, words: np.ndarray, group: np.ndarray, band: int,
                limit: int) -> tuple[np.ndarray, np.ndarray]:
    """Verified pairs (i < j) of rows that share band ``band`` and their group; ``columns``: the
    signatures' bytes (SIGNATURE_BYTES, n), ``words``: as uint64 (4, n)."""
    key = band_keys(columns, band)
    # Most rows share their band key with no other row: drop them before sorting (counting the
    # 2**BAND_BITS keys is far cheaper than sorting every row).
    rows = np.flatnonzero(np.bincount(key, minlength=1 << BAND_BITS)[key] > 1)
    if rows.size < 2:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    key = key[rows].astype(np.int64) | (group[rows] << BAND_BITS)
    # Any order within a bucket will do (every pair of it is taken). Where the key fits in 31 bits,
    # one sort of (key, position) packed in an int64 replaces argsort and two gathers.
    if int(key.max()) < 1 << 31 and rows.size < 1 << 32:
        packed = np.sort((key << 32) | np.arange(rows.size, dtype=np.int64))
        sorted_key, order = packed >> 32, rows[packed & 0xFFFFFFFF]
    else:
        order = np.argsort(key)
        sorted_key, order = key[order], rows[order]
    # The signatures in bucket order: a bucket's rows then sit side by side, so verifying its pairs
    # reads nearby memory instead of gathering both rows of every pair from anywhere in the table.
    # (np.take along the axis: faster than the equivalent fancy index words[:, order].)
    near_words = np.take(words, order, axis=1)
    start = np.flatnonzero(np.r_[True, sorted_key[1:] != sorted_key[:-1]])
    size = np.diff(np.r_[start, sorted_key.shape[0]])
    keep = size > 1
    start, size = start[keep], size[keep]
    a, b, _ = verified_pairs(start, size, size, near_words, limit)  # every pair of a bucket
    i, j = order[a], order[b]
    return np.minimum(i, j), np.maximum(i, j)


def distance(x, y) -> np.ndarray:
    """Hamming distances between signatures given as two iterables of their 4 words (arrays), uint16.
    Pass generators of per-word gathers: 1D gathers run faster than one 2D fancy index."""
    words = zip(x, y, strict=True)
    a, b = next(words)
    total = np.bitwise_count(a ^ b).astype(np.uint16)
    for a, b in words:
        np.add(total, np.bitwise_count(a ^ b), out=total)
    return total


def verified_pairs(start: np.ndarray, size: np.ndarray, first: np.ndarray, words: np.ndarray,
                   limit: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The pairs ``(a, b)``, ``a < b``, within ``limit`` of buckets laid side by side (bucket ``i``
    at places ``start[i]`` to ``start[i] + size[i]``), each of a bucket's first ``first[i]`` places
    paired with every later place of the bucket, and the count of pairs tried. ``words``: the
    rows' signature words in that order (4, rows). Verified in batches of about ``_PAIR_BATCH``."""
    offset = np.arange(int(first.sum())) - np.repeat(np.cumsum(first) - first, first)
    position = np.repeat(start, first) + offset
    later = np.repeat(start + size, first) - position - 1
    empty = np.zeros(0, dtype=np.int64)
    found, cumulative, done = [(empty, empty)], np.cumsum(later), 0
    while done < position.size:
        before = cumulative[done - 1] if done else 0
        stop = max(done + 1, int(np.searchsorted(cumulative, before + _PAIR_BATCH, side="right")))
        count = later[done:stop]
        a = np.repeat(position[done:stop], count)
        b = a + 1 + (np.arange(a.size) - np.repeat(np.cumsum(count) - count, count))
        near = distance((w[a] for w in words), (w[b] for w in words)) <= limit
        found.append((a[near], b[near]))
        done = stop
    tried = int(cumulative[-1]) if cumulative.size else 0
    return np.concatenate([f[0] for f in found]), np.concatenate([f[1] for f in found]), tried


def band_keys(columns: np.ndarray, band: int) -> np.ndarray:
    """The ``BAND_BITS``-bit key of band ``band`` of each signature, uint32 (n,), from the signature
    bytes as columns (SIGNATURE_BYTES, n): shifts, no unpacking.

    Band ``b`` is the window of ``BAND_BITS`` bits starting at bit ``b * SIGNATURE_BITS // BANDS``
    (wrapping around): the hyperplanes are independent, so any fixed bits will do.
    """
    start = band * SIGNATURE_BITS // BANDS
    first = start // 8
    key = np.zeros(columns.shape[1], dtype=np.uint32)
    for i in range(4):  # the 4 bytes that hold the window (20 bits from any bit offset fit in 4)
        key = (key << 8) | columns[(first + i) % SIGNATURE_BYTES]
    return (key >> (32 - BAND_BITS - (start % 8))) & ((1 << BAND_BITS) - 1)

