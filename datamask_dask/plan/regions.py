"""Regions: the table cut into pieces by where its rows lie in the embedding space (``pieces="regions"``).

A piece learned alone covers its own rows. Where the pieces are a table's files or partitions, each
holds rows spread over the same ground, and their picks, each a good cover of their own piece, pile
up on one another: Facility, a coverage objective, then loses to learning the table whole however
well each piece is learned. A *region* holds one part of the space instead, so that its picks cover
its own part and the parts meet only at their borders:

1. **Centroids.** Each partition sends evenly spaced rows of its embeddings with its plan summary
   (:func:`sample_positions`, :func:`sample_count`); spherical k-means of those rows
   (:func:`find_centroids`) places the metric's ``Grain.regions_per_chunk`` regions per chunk's worth
   of eligible rows, and k-means of each region's sample rows cuts it into *areas* of about its
   ``Grain.area_rows`` rows (:func:`find_areas`, :func:`grain`).
2. **Routing.** Each eligible row belongs to its nearest area among those of its ``Grain.searched``
   nearest regions (:func:`locate`), whatever its partition: a pack's rows reach the task that learns it as
   packed partitions' rows do (its members are the partitions with eligible rows). Only routing
   to the true nearest area keeps a row with its neighbours: a row near a region's border often has
   its nearest area across it.
3. **Quotas that follow the objective.** Each area is summarised first. Facility: the area's
   marginal-gain curve (:func:`gain_curve`: lazy greedy on its rows' nearest-neighbour graph, the
   run's lamb weighing quality against coverage), in one task per region, which gathers its rows; the
   group's quota then goes to the largest gains across every area (:func:`share_quotas`), so the
   areas' last picks gain about equally. Pair_simi: the area's qualities and the sum of its unit rows,
   which add up across partitions, so each partition summarises its own rows; the shares then
   maximise the objective of picks that spread like their areas' rows (:func:`share_pairs`): its
   pairwise similarity is the square of the picks' sum, so areas that pull apart balance.
4. **Learning.** Neighbouring areas are packed up to a chunk's worth of rows (:func:`pack_areas`),
   and the learner selects each pack's summed quota. Packs of areas, not of whole regions: a region
   can hold more rows than a chunk, and a chunk cut from it would be a random split again. A
   Pair_simi pack learns against the sum the other packs are planned to pick (``learn_mask``'s
   ``others``): alone, it would cancel its own sum and undo the balance the shares struck. The
   plan's own residual sum is partly bought with quality (a part that grows with lamb), partly what
   the areas' means cannot cancel and their rows can: a pack is told the others cancel their shares
   of that part, since one that cancelled all of it, as every other would, would overshoot.

Every step is a pure function of the plan and the rows, so every engine and scheduler gets the same
regions, quotas and rows.
"""

from __future__ import annotations

import dataclasses
import math
import os
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np

from ..compiled import on_first_use

AREA_SAMPLE = 8  # sample rows an area's centroid is placed by, at least
SAMPLE_ROWS = 1 << 16  # rows of the table the k-means sees at most (spread over its partitions)
SAMPLE_VALUES = 1 << 24  # and embedding values: what reaches the driver stays small at any dimension
MIN_SAMPLE = 64  # rows each partition sends at least
KMEANS_ITERATIONS = 20
THREADS = 4  # threads of the plan's k-means (its task runs alone, its worker's other cores idle)
CURVE_SPAN = 4  # a region's curve reaches this many times its share of the quota (by its rows)
PAIR_ITERATIONS = 200  # Frank-Wolfe steps of the Pair_simi shares (share_pairs)
STEP_SEARCH, GOLDEN = 40, (5 ** 0.5 - 1) / 2  # golden-section steps of each Frank-Wolfe step's length
_TIE = 1e-5  # products this close to the best centroid's are compared again in float64
_BLOCK = 8192  # rows whose products with the centroids are held at once
_PRODUCTS = 1 << 19  # products of rows with a region's areas held at once: within a core's cache


@dataclasses.dataclass(frozen=True)
class Grain:
    """How finely a metric's regions are cut: regions per chunk's worth of rows, the rows of an area,
    and how many of a row's nearest regions have their areas compared with it."""

    regions_per_chunk: int
    area_rows: int
    searched: int


# A Facility area is what one gain curve covers, so its quotas are only as fine as its areas, and a row
# learned away from its nearest area is covered twice: small areas in few regions, each row searching
# most of them at a chunk's size. A Pair_simi area only adds up its rows for the shares (share_pairs),
# so coarser areas, each row comparing fewer, route the table for less. (Chosen by measurement:
# docs/benchmarks.md.)
GRAINS = {"facility": Grain(regions_per_chunk=1, area_rows=128, searched=8),
          "pair_simi": Grain(regions_per_chunk=4, area_rows=1024, searched=4)}


def grain(metric: str | None) -> Grain:
    """The grain of ``metric``'s regions (``"facility"`` or ``"pair_simi"``)."""
    if metric not in GRAINS:
        raise RuntimeError(f"regions serve Facility and Pair_simi, not {metric!r}; please report this with "
                           "the run record")
    return GRAINS[metric]


def sample_count(partitions: int, dim: int) -> int:
    """Rows each of ``partitions`` partitions sends for the centroids, at embedding dimension ``dim``."""
    return max(MIN_SAMPLE, min(SAMPLE_ROWS, SAMPLE_VALUES // max(1, dim)) // max(1, partitions))


def sample_positions(rows: int, count: int) -> np.ndarray:
    """``count`` evenly spaced positions of a partition of ``rows`` rows (every row where it has fewer)."""
    if rows <= count:
        return np.arange(rows, dtype=np.int64)
    return np.unique(np.linspace(0, rows - 1, count).round().astype(np.int64))


def region_count(rows: int, chunk_rows: int, sample_rows: int, per_chunk: int) -> int:
    """Regions for ``rows`` eligible rows: ``per_chunk`` per chunk, at most one per 16 sample rows."""
    wanted = math.ceil(rows * per_chunk / max(1, chunk_rows))
    return max(1, min(wanted, sample_rows // 16))


def find_centroids(sample: np.ndarray, count: int, seed: int | list[int], threads: int = 1) -> np.ndarray:
    """``count`` unit centroids of the unit rows ``sample`` (float32): spherical k-means, seeded by
    k-means++ from ``seed``, each row's nearest centroid found on ``threads`` threads; an empty region
    keeps its centroid (one of the rows).

    The same on any machine's threads (the plan may be made in the driver or in a worker): the seeds'
    distances are einsum's sums, in one order, and each row's nearest centroid is :func:`assign`'s."""
    rows = np.ascontiguousarray(sample, dtype=np.float32)
    count = min(count, len(rows))
    rng = np.random.default_rng(seed)
    picks = [int(rng.integers(len(rows)))]
    distance = np.maximum(1.0 - np.einsum("ij,j->i", rows, rows[picks[0]]), 0).astype(np.float64)
    for _ in range(count - 1):  # each next seed drawn in proportion to its distance from the nearest
        total = distance.sum()
        pick = int(rng.choice(len(rows), p=distance / total)) if total > 0 else int(rng.integers(len(rows)))
        picks.append(pick)
        distance = np.minimum(distance, np.maximum(1.0 - np.einsum("ij,j->i", rows, rows[pick]), 0))
    centroids = rows[picks].copy()
    nearest = None
    for _ in range(KMEANS_ITERATIONS):
        previous, nearest = nearest, assign(rows, centroids, threads)
        if previous is not None and np.array_equal(previous, nearest):
            break  # the same rows give the same centroids: every later step would too
        order = np.argsort(nearest, kind="stable")
        present, starts = np.unique(nearest[order], return_index=True)
        sums = run_sums(rows, order, starts)
        norms = np.linalg.norm(sums, axis=1, keepdims=True)
        moved = norms[:, 0] > 0
        centroids[present[moved]] = (sums[moved] / norms[moved]).astype(np.float32)
    return centroids


def run_sums(rows: np.ndarray, order: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The float64 sums of the 2-d ``rows[order]`` from each of ``starts`` (ascending and distinct, the
    first 0) to the next, each one row after another: ``np.add.reduceat(rows[order], starts, axis=0)``'s
    bits, compiled (no gathered copy of the rows, no pass per run)."""
    rows, order = np.ascontiguousarray(rows), np.asarray(order, dtype=np.int64)
    return _kernels().run_sums(rows, order, np.asarray(starts, dtype=np.int64))


@on_first_use
def _kernels() -> SimpleNamespace:
    """The module's compiled passes (numba is imported on first use: a run without regions never pays)."""
    import numba

    global _sift_down  # _lazy_greedy calls the compiled one
    _sift_down = numba.njit(cache=True, nogil=True)(_sift_down)
    compiled = numba.njit(cache=True, nogil=True)
    return SimpleNamespace(run_sums=compiled(_run_sums), lazy_greedy=compiled(_lazy_greedy),
                           covered_by=compiled(_covered_by), chain=compiled(_chain))


def _run_sums(rows, order, starts):  # pragma: no cover (compiled)
    """:func:`run_sums`: each run's first row, then each next one added, in float64."""
    out = np.empty((starts.shape[0], rows.shape[1]))
    for run in range(starts.shape[0]):
        end = starts[run + 1] if run + 1 < starts.shape[0] else order.shape[0]
        out[run] = rows[order[starts[run]]]
        for at in range(starts[run] + 1, end):
            row = order[at]
            for column in range(rows.shape[1]):
                out[run, column] += rows[row, column]
    return out


def find_areas(sample: np.ndarray, centroids: np.ndarray, rows: int, seed: int,
               area_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Each region's areas: centroids placed by k-means of the region's sample rows, about one per
    ``area_rows`` of the ``rows`` the sample stands for (at least ``AREA_SAMPLE`` sample rows each);
    returns the areas' centroids and each area's region."""
    region = assign(sample, centroids)

    def areas_of(r: int) -> np.ndarray:
        mine = sample[region == r]
        wanted = round(len(mine) * rows / (len(sample) * area_rows))  # the rows its sample rows stand for
        return find_centroids(mine, min(max(1, wanted), max(1, len(mine) // AREA_SAMPLE)), [seed, r])

    present = np.unique(region)
    # the regions apart on a few threads (their k-means each seeded apart; numpy releases the GIL):
    # the plan's task runs alone, its worker's other cores idle
    with ThreadPoolExecutor(max(1, min(THREADS, os.cpu_count() or 1, present.size))) as pool:
        found = list(pool.map(areas_of, present.tolist()))
    return np.concatenate(found), np.repeat(present, [len(f) for f in found]).astype(np.int64)


def locate(embeddings: np.ndarray, centroids: np.ndarray, areas: np.ndarray, area_region: np.ndarray,
           searched: int) -> np.ndarray:
    """Each unit row's area: the most similar of the areas of its ``searched`` most similar regions
    (a row near a region's border often has its nearest area across it). Compared in float32; areas
    within ``_TIE`` of a row's best are compared again by an exact float64 sum, so that every worker
    routes a row alike (ties: the lower area). Rows are routed a block at a time, and a block's rows
    meet a region's areas a few at a time: at most ``_PRODUCTS`` products are held (with all of a
    partition's rows at once, they would be gigabytes)."""
    return np.concatenate([np.zeros(0, dtype=np.int64)] + [
        _locate_block(np.asarray(embeddings[start:start + _BLOCK], dtype=np.float32), centroids, areas,
                      area_region, searched) for start in range(0, len(embeddings), _BLOCK)])


def _locate_block(rows: np.ndarray, centroids: np.ndarray, areas: np.ndarray, area_region: np.ndarray,
                  searched: int) -> np.ndarray:
    """:func:`locate` of float32 unit ``rows``."""
    n, count = len(rows), len(centroids)
    searched = min(searched, count)
    nearest = _nearest_regions(rows, centroids, searched) if searched < count \
        else np.broadcast_to(np.arange(count), (n, count))
    # each region's askers and areas by one sort each, not a scan per region
    order = np.argsort(nearest.ravel(), kind="stable")
    askers = order // searched
    asked = np.searchsorted(nearest.ravel()[order], np.arange(count + 1))
    by_region = np.argsort(area_region, kind="stable")
    owned = np.searchsorted(area_region[by_region], np.arange(count + 1))
    best = np.full(n, -np.inf, dtype=np.float32)
    out = np.zeros(n, dtype=np.int64)
    tied = np.zeros(n, dtype=bool)  # another area may be within _TIE of the row's best: settled below
    # a few askers' products at a time, in one buffer: each pass over them reads the cache, not memory
    buffer = np.empty(_PRODUCTS, dtype=np.float32)
    for r in range(count):
        mine = by_region[owned[r]:owned[r + 1]]
        if not mine.size:
            continue
        step, columns = max(1, _PRODUCTS // mine.size), np.ascontiguousarray(areas[mine].T)
        for start in range(asked[r], asked[r + 1], step):
            asking = askers[start:min(start + step, asked[r + 1])]
            products = buffer[:asking.size * mine.size].reshape(asking.size, mine.size)
            np.matmul(rows[asking], columns, out=products)
            top = products.argmax(axis=1)
            value = products[np.arange(asking.size), top]
            products[np.arange(asking.size), top] = -np.inf  # the runner-up: one more pass, not a count
            held = best[asking]
            tied[asking] |= (np.abs(value - held) <= _TIE) | (products.max(axis=1) >= value - _TIE)
            better = (value > held) | ((value == held) & (mine[top] < out[asking]))
            best[asking[better]], out[asking[better]] = value[better], mine[top][better]
    exact_best = np.full(n, -np.inf)
    for r in range(count):  # the tied rows again, over every area they searched, by exact float64 sums
        asking = askers[asked[r]:asked[r + 1]]
        asking, mine = asking[tied[asking]], by_region[owned[r]:owned[r + 1]]
        if not asking.size or not mine.size:
            continue
        exact = np.einsum("ik,jk->ij", rows[asking].astype(np.float64), areas[mine].astype(np.float64))
        top = exact.argmax(axis=1)
        value = exact[np.arange(asking.size), top]
        held = exact_best[asking]
        better = (value > held) | ((value == held) & (mine[top] < out[asking]))
        exact_best[asking[better]], out[asking[better]] = value[better], mine[top][better]
    return out


def _nearest_regions(rows: np.ndarray, centroids: np.ndarray, searched: int) -> np.ndarray:
    """Each float32 unit row's ``searched`` most similar centroids (fewer than all), in no order.

    As in :func:`assign`: rows whose ``searched``-th and next centroid are within ``_TIE`` are ranked
    again by exact float64 sums (ties: the lower centroid), so that every worker searches a row's same
    regions whatever its BLAS threads."""
    products = rows @ centroids.T
    # the best searched + 1, one argmax pass each: a few passes cost far less than a partition of every row
    nearest = np.empty((len(rows), searched + 1), dtype=np.int64)
    edge = np.empty((len(rows), searched + 1), dtype=np.float32)
    every = np.arange(len(rows))
    for rank in range(searched + 1):
        nearest[:, rank] = products.argmax(axis=1)
        edge[:, rank] = products[every, nearest[:, rank]]
        products[every, nearest[:, rank]] = -np.inf
    nearest = np.ascontiguousarray(nearest[:, :searched])
    close = np.flatnonzero(edge[:, searched - 1] - edge[:, searched] <= _TIE)
    if close.size:
        exact = np.einsum("ik,jk->ij", rows[close].astype(np.float64), centroids.astype(np.float64))
        nearest[close] = np.argsort(-exact, axis=1, kind="stable")[:, :searched]
    return nearest


def assign(embeddings: np.ndarray, centroids: np.ndarray, threads: int = 1) -> np.ndarray:
    """Each unit row's region: its most similar centroid (ties: the lower one), a block of rows at a
    time on ``threads`` threads.

    A float32 product's last bits depend on the BLAS threads; rows whose best two centroids are
    within ``_TIE`` are compared again by an exact float64 sum, so every worker routes a row alike.
    """
    out = np.empty(len(embeddings), dtype=np.int64)

    def block_of(start: int) -> None:
        block = np.asarray(embeddings[start:start + _BLOCK], dtype=np.float32)
        products = block @ centroids.T
        best = products.argmax(axis=1)
        if centroids.shape[0] > 1:
            value = products[np.arange(len(block)), best]
            products[np.arange(len(block)), best] = -np.inf  # the runner-up: one more pass, not a sort
            close = np.flatnonzero(value - products.max(axis=1) <= _TIE)
            products[np.arange(len(block)), best] = value
            for row in close:
                near = np.flatnonzero(products[row] >= value[row] - _TIE)
                exact = np.einsum("ij,j->i", centroids[near].astype(np.float64),
                                  block[row].astype(np.float64))
                best[row] = near[np.argmax(exact)]
        out[start:start + len(block)] = best

    starts = range(0, len(embeddings), _BLOCK)
    threads = min(threads, os.cpu_count() or 1, len(starts))
    if threads > 1:  # the blocks apart: numpy releases the GIL in the products
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(block_of, starts))
    else:
        for start in starts:
            block_of(start)
    return out


def gain_curve(quality: np.ndarray, neighbours: np.ndarray, similarities: np.ndarray, weights: np.ndarray,
               limit: int, quality_weight: float, coverage_weight: float) -> np.ndarray:
    """The marginal gains of lazy greedy's first ``limit`` picks among a region's rows, non-increasing.

    A pick's gain is ``quality_weight * quality[j]`` plus ``coverage_weight`` times the coverage it
    adds: each row ``i`` is covered by its best similarity (clamped at 0) to a pick among its
    nearest ``neighbours[i]`` (``similarities[i]``), counted ``weights[i]`` times.
    """
    kernels = _kernels()
    starts, covered_rows, values = kernels.covered_by(np.ascontiguousarray(neighbours, dtype=np.int64),
                                                      np.ascontiguousarray(similarities))
    gains = kernels.lazy_greedy(starts, covered_rows, values, np.asarray(weights, dtype=np.float64),
                                quality_weight * np.asarray(quality, dtype=np.float64), coverage_weight,
                                min(limit, len(neighbours)))
    return np.minimum.accumulate(gains)  # greedy's gains only fall; rounding aside


def _covered_by(neighbours, similarities):  # pragma: no cover (compiled)
    """The k-NN graph turned around: for each row ``j``, from ``starts[j]`` to ``starts[j + 1]``, the
    rows it is a neighbour of (ascending) and their similarity to it, clamped at 0, in float64 (a
    counting pass: sorting the edges would cost more than the greedy itself on an area's small graph)."""
    n, t = neighbours.shape
    starts = np.zeros(n + 1, dtype=np.int64)
    for i in range(n):
        for k in range(t):
            starts[neighbours[i, k] + 1] += 1
    for j in range(n):
        starts[j + 1] += starts[j]
    filled = starts[:-1].copy()
    covered_rows = np.empty(n * t, dtype=np.int64)
    values = np.empty(n * t)
    for i in range(n):
        for k in range(t):
            j, value = neighbours[i, k], similarities[i, k]
            covered_rows[filled[j]] = i
            values[filled[j]] = value if value > 0 else 0.0
            filled[j] += 1
    return starts, covered_rows, values


def _lazy_greedy(starts, covered_rows, values, weights, bonus, coverage_weight, limit):  # pragma: no cover
    n = bonus.shape[0]
    cover = np.zeros(n)
    # a binary max-heap of (upper bound of the gain, row), the lower row first among equal bounds
    heap_value = np.empty(n)
    heap_row = np.empty(n, dtype=np.int64)
    for j in range(n):
        total = 0.0
        for e in range(starts[j], starts[j + 1]):
            total += weights[covered_rows[e]] * values[e]
        heap_value[j] = bonus[j] + coverage_weight * total
        heap_row[j] = j
    size = n
    for root in range(n // 2 - 1, -1, -1):
        _sift_down(heap_value, heap_row, root, size)
    gains = np.empty(limit)
    for step in range(limit):
        while True:
            j = heap_row[0]
            total = 0.0
            for e in range(starts[j], starts[j + 1]):
                i = covered_rows[e]
                if values[e] > cover[i]:
                    total += weights[i] * (values[e] - cover[i])
            exact = bonus[j] + coverage_weight * total
            heap_value[0] = exact
            _sift_down(heap_value, heap_row, 0, size)
            if heap_row[0] == j:  # still on top once its gain is fresh: greedy's pick
                break
        gains[step] = exact
        size -= 1  # the pick leaves the heap
        heap_value[0], heap_row[0] = heap_value[size], heap_row[size]
        _sift_down(heap_value, heap_row, 0, size)
        for e in range(starts[j], starts[j + 1]):
            i = covered_rows[e]
            if values[e] > cover[i]:
                cover[i] = values[e]
    return gains


def _sift_down(value, row, at, size):  # pragma: no cover (compiled)
    while True:
        best, left = at, 2 * at + 1
        for child in (left, left + 1):
            if child < size and (value[child] > value[best]
                                 or (value[child] == value[best] and row[child] < row[best])):
                best = child
        if best == at:
            return
        value[at], value[best] = value[best], value[at]
        row[at], row[best] = row[best], row[at]
        at = best


def curve_limit(rows: int, total_rows: int, quota: int) -> int:
    """How far a region of ``rows`` of the group's ``total_rows`` eligible rows runs its curve."""
    return min(rows, math.ceil(CURVE_SPAN * quota * rows / max(1, total_rows)) + 1)


def pack_areas(centroids: np.ndarray, sizes: np.ndarray, chunk_rows: int) -> list[np.ndarray]:
    """Areas (or any places with ``centroids`` and ``sizes`` in rows) learned together: a chain that
    steps from each to the most similar one not yet visited, cut into runs of at most ``chunk_rows``
    rows (one larger than that alone), so that neighbours share a learner and the learner runs on
    pieces about a chunk large."""
    similarity = centroids.astype(np.float64) @ centroids.T.astype(np.float64)
    chain = _kernels().chain(similarity) if len(sizes) else np.zeros(0, dtype=np.int64)
    runs: list[np.ndarray] = []
    run: list[int] = []
    rows = 0
    for region in chain:
        if run and rows + sizes[region] > chunk_rows:
            runs.append(np.array(run, dtype=np.int64))
            run, rows = [], 0
        run.append(region)
        rows += int(sizes[region])
    if run:
        runs.append(np.array(run, dtype=np.int64))
    return [np.sort(r) for r in runs]


def _chain(similarity):  # pragma: no cover (compiled)
    """From place 0, each step to the most similar place not yet visited (ties: the lower place)."""
    count = similarity.shape[0]
    visited = np.zeros(count, dtype=np.bool_)
    chain = np.zeros(count, dtype=np.int64)
    visited[0] = True
    for step in range(1, count):
        last, best, best_value = chain[step - 1], -1, -np.inf
        for place in range(count):
            if not visited[place] and (best < 0 or similarity[last, place] > best_value):
                best, best_value = place, similarity[last, place]
        chain[step] = best
        visited[best] = True
    return chain


def share_quotas(curves: list[np.ndarray], quota: int) -> np.ndarray:
    """Each curve's share of ``quota`` (a curve an area's): the ``quota`` largest gains of all the
    curves (ties: the lower curve, then the earlier pick), counted per curve."""
    region = np.concatenate([np.full(len(c), r, dtype=np.int64) for r, c in enumerate(curves)])
    step = np.concatenate([np.arange(len(c), dtype=np.int64) for c in curves])
    gains = np.concatenate(curves) if curves else np.zeros(0)
    if quota > gains.size:
        raise RuntimeError(f"the regions' curves hold {gains.size} picks, fewer than the quota {quota}; "
                           "please report this with the run record")
    taken = np.lexsort((step, region, -gains))[:quota]
    return np.bincount(region[taken], minlength=len(curves))


def share_pairs(quality: list[np.ndarray], sums: np.ndarray, quota: int, lamb: float,
                iterations: int = PAIR_ITERATIONS) -> np.ndarray:
    """Each area's share of ``quota`` for Pair_simi: the share that maximises the objective of a
    selection that takes each area's best rows by quality and spreads like the area's rows.

    ``quality[a]``: area ``a``'s normalised quality, best first; ``sums[a]``: the sum of its unit
    rows. Pair_simi's sum of pairwise similarities is ``|w|^2 - k``, ``w`` the sum of the picks, so a
    share ``x`` (``x_a`` rows of area ``a``) scores ``lamb / k * sum_a Q_a(x_a) - (1 - lamb) / (k (k -
    1)) * |sum_a x_a m_a|^2`` (``Q_a`` the area's best ``x_a`` qualities, ``m_a`` its mean unit row):
    concave, and maximised over ``0 <= x_a <= rows``, ``sum x = quota`` by Frank-Wolfe from the
    rows' own shares (a random pick's), then rounded by largest remainder (ties: the lower area).
    """
    rows = np.array([len(q) for q in quality], dtype=np.int64)
    if quota > rows.sum():
        raise RuntimeError(f"the areas hold {rows.sum()} rows, fewer than the quota {quota}; please report "
                           "this with the run record")
    means = np.asarray(sums, dtype=np.float64) / np.maximum(rows, 1)[:, None]
    # each area's qualities and a zero past its last row, end to end (a matrix padded to the largest
    # area would hold areas x its rows), and beside them Q_a(0..rows_a)
    first = np.concatenate([[0], np.cumsum(rows + 1)[:-1]]).astype(np.int64)
    padded, best = np.zeros(int((rows + 1).sum())), np.zeros(int((rows + 1).sum()))
    for area, values in enumerate(quality):
        padded[first[area]:first[area] + len(values)] = values
        best[first[area] + 1:first[area] + 1 + len(values)] = np.cumsum(values)
    scale = (1 - lamb) / max(1, quota * (quota - 1))

    def quality_of(x):  # sum_a Q_a(x_a), linear between whole rows
        at = first + np.minimum(np.floor(x).astype(np.int64), rows)
        return float(np.sum(best[at] + (x - (at - first)) * padded[at]))

    def objective(x, w):
        return lamb / max(1, quota) * quality_of(x) - scale * float(np.einsum("d,d->", w, w))

    # einsum, not BLAS: one order of every sum on any machine, so that every driver shares alike
    x = quota * rows / max(1, rows.sum())
    for _ in range(iterations):
        w = np.einsum("ad,a->d", means, x)
        at = first + np.minimum(np.floor(x).astype(np.int64), rows)
        gradient = lamb / max(1, quota) * padded[at] - 2 * scale * np.einsum("ad,d->a", means, w)
        direction = _fill(gradient, rows, quota) - x
        if float(np.einsum("a,a->", gradient, direction)) <= 1e-15:  # no vertex is better: the best share
            break
        moved = np.einsum("ad,a->d", means, direction)  # how w moves
        # the objective is concave along the step: a golden-section search, one new point a step
        low, high = 0.0, 1.0
        left, right = high - GOLDEN * (high - low), low + GOLDEN * (high - low)
        at_left = objective(x + left * direction, w + left * moved)
        at_right = objective(x + right * direction, w + right * moved)
        for _ in range(STEP_SEARCH):
            if at_left < at_right:
                low, left, at_left = left, right, at_right
                right = low + GOLDEN * (high - low)
                at_right = objective(x + right * direction, w + right * moved)
            else:
                high, right, at_right = right, left, at_left
                left = high - GOLDEN * (high - low)
                at_left = objective(x + left * direction, w + left * moved)
        x = x + (low + high) / 2 * direction
    return _round_shares(x, rows, quota)


def _fill(gradient: np.ndarray, rows: np.ndarray, quota: int) -> np.ndarray:
    """The vertex of ``{0 <= x <= rows, sum x = quota}`` furthest along ``gradient``: areas filled in
    descending order (ties: the lower area)."""
    order = np.lexsort((np.arange(len(rows)), -gradient))
    before = np.concatenate([[0], np.cumsum(rows[order])[:-1]])  # rows of the areas filled before each
    filled = np.minimum(rows[order], np.maximum(0, quota - before))
    out = np.zeros(len(rows))
    out[order] = filled
    return out


def _round_shares(x: np.ndarray, rows: np.ndarray, quota: int) -> np.ndarray:
    """``x`` in whole rows adding up to ``quota``: floors, then the largest remainders (ties: the lower
    area), capped by each area's rows."""
    whole = np.minimum(np.floor(x + 1e-9).astype(np.int64), rows)
    left = quota - int(whole.sum())
    room = whole < rows
    order = np.lexsort((np.arange(len(rows)), -(x - whole)))
    order = order[room[order]][:left]
    if len(order) < left:
        raise RuntimeError(f"the areas' shares add up to {int(whole.sum()) + len(order)}, not {quota}; "
                           "please report this with the run record")
    whole[order] += 1
    return whole
