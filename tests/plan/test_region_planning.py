"""Regions (``pieces="regions"``): centroids, routing, the gain curves and the quotas they share (pure)."""

from __future__ import annotations

import numpy as np
import pytest

from datamask_dask.plan import regions


def _unit(rows: int, dim: int, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((rows, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_samples_are_evenly_spaced_and_every_row_of_a_small_partition():
    assert regions.sample_positions(5, 8).tolist() == [0, 1, 2, 3, 4]
    assert regions.sample_positions(101, 5).tolist() == [0, 25, 50, 75, 100]
    assert regions.sample_count(1, 64) == regions.SAMPLE_ROWS
    assert regions.sample_count(1, 1024) == regions.SAMPLE_VALUES // 1024  # the driver gets few values
    assert regions.sample_count(10**6, 64) == regions.MIN_SAMPLE


def test_a_row_goes_to_its_most_similar_centroid_and_a_tie_to_the_lower_one():
    centroids = _unit(6, 8, seed=1)
    rows = _unit(500, 8, seed=2)
    assert regions.assign(rows, centroids).tolist() == (rows @ centroids.T).argmax(1).tolist()
    twins = np.vstack([centroids[3], centroids[1], centroids[3]])
    assert regions.assign(centroids[[3]], twins).tolist() == [0]


def test_centroids_are_unit_rows_found_the_same_way_twice():
    sample = _unit(2000, 8)
    first, second = (regions.find_centroids(sample, 12, seed=5) for _ in range(2))
    np.testing.assert_array_equal(first, second)
    np.testing.assert_allclose(np.linalg.norm(first, axis=1), 1, atol=1e-5)
    assert len(np.unique(regions.assign(sample, first))) == 12  # k-means++ seeds leave no region empty here


@pytest.mark.parametrize("rows, dim, runs", [(5_000, 1, 7), (5_000, 2, 7), (20_000, 64, 900),
                                             (3_000, 768, 2)])
def test_run_sums_have_reduceats_bits(rows, dim, runs):
    """The centroids' and Pair_simi's area sums: each run's rows added one after another, as
    ``np.add.reduceat`` adds them, so the areas and shares stay what they were."""
    x = np.random.default_rng(rows + dim).standard_normal((rows, dim)).astype(np.float32) * 1e3
    starts = np.concatenate([[0], np.sort(np.random.default_rng(runs).choice(np.arange(1, rows), runs - 1,
                                                                               replace=False))])
    order = np.random.default_rng(dim).permutation(rows)
    found = regions.run_sums(x, order, starts)
    assert found.dtype == np.float64
    np.testing.assert_array_equal(found, np.add.reduceat(x[order].astype(np.float64), starts, axis=0))


def _greedy_by_brute_force(quality, neighbours, similarities, weights, picks, quality_weight,
                           coverage_weight):
    n = len(quality)
    coverage = np.zeros((n, n))  # row i's coverage by a pick j among its neighbours
    for i in range(n):
        coverage[i, neighbours[i]] = np.maximum(similarities[i], 0)
    covered, taken, gains = np.zeros(n), np.zeros(n, dtype=bool), []
    for _ in range(picks):
        gain = quality_weight * quality + coverage_weight * (
            weights[:, None] * np.maximum(coverage - covered[:, None], 0)).sum(0)
        gain[taken] = -np.inf
        j = int(np.argmax(gain))
        gains.append(gain[j])
        taken[j] = True
        covered = np.maximum(covered, coverage[:, j])
    return np.array(gains)


def test_the_gain_curve_is_greedy_s_marginal_gains():
    rng = np.random.default_rng(3)
    emb = _unit(200, 8, seed=3)
    similarity = emb @ emb.T
    neighbours = np.argsort(-similarity, axis=1)[:, :10]
    similarities = np.take_along_axis(similarity, neighbours, 1)
    quality, weights = rng.random(200), rng.integers(1, 4, 200).astype(np.float64)
    got = regions.gain_curve(quality, neighbours, similarities, weights, 60, 0.02, 1 / 200)
    want = _greedy_by_brute_force(quality, neighbours, similarities, weights, 60, 0.02, 1 / 200)
    np.testing.assert_allclose(got, np.minimum.accumulate(want), rtol=1e-9)
    assert (np.diff(got) <= 0).all()


def test_quotas_go_to_the_largest_gains_and_add_up_exactly():
    curves = [np.array([9.0, 5, 1]), np.array([8.0, 5, 4, 3]), np.array([2.0])]
    assert regions.share_quotas(curves, 4).tolist() == [2, 2, 0]  # 9, 8, then the tie at 5: both
    assert regions.share_quotas(curves, 3).tolist() == [2, 1, 0]  # the tie at 5 goes to the lower region
    assert regions.share_quotas(curves, 8).sum() == 8
    with pytest.raises(RuntimeError, match="fewer than the quota"):
        regions.share_quotas(curves, 9)


def test_neighbouring_regions_pack_up_to_a_chunk():
    centroids = _unit(30, 8, seed=4)
    sizes = np.random.default_rng(4).integers(10, 60, 30)
    sizes[7] = 500  # larger than a chunk: alone
    runs = regions.pack_areas(centroids, sizes, chunk_rows=120)
    assert sorted(np.concatenate(runs).tolist()) == list(range(30))
    assert all(sizes[run].sum() <= 120 or len(run) == 1 for run in runs)
    assert [7] in [run.tolist() for run in runs]


def test_areas_cut_each_region_and_a_row_goes_to_its_nearest_area():
    sample = _unit(3000, 8, seed=6)
    centroids = regions.find_centroids(sample, 5, seed=1)
    areas, area_region = regions.find_areas(sample, centroids, rows=30_000, seed=1, area_rows=256)
    assert set(area_region.tolist()) == set(range(5))
    assert len(areas) > 5 * 10  # about one area per area_rows of the rows the sample stands for
    coarser, _ = regions.find_areas(sample, centroids, rows=30_000, seed=1, area_rows=1024)
    assert len(coarser) < len(areas) / 2
    rows = _unit(400, 8, seed=7)
    # with every region searched, a row's area is simply its most similar area
    found = regions.locate(rows, centroids, areas, area_region, searched=8)
    np.testing.assert_array_equal(found, (rows.astype(np.float64) @ areas.T.astype(np.float64)).argmax(1))


def test_a_row_equally_near_two_areas_goes_to_the_lower_one_on_any_region_order():
    """Routing compares in float32 and settles near-ties by an exact float64 sum: a row that is an
    area's copy, where the same area is also listed later in another region, goes to the lower area,
    and rows with a clear best area get the one an exhaustive float64 search finds."""
    sample = _unit(3000, 16, seed=8)
    centroids = regions.find_centroids(sample, 12, seed=2)
    areas, area_region = regions.find_areas(sample, centroids, rows=30_000, seed=2, area_rows=256)
    copied = 3
    twin = int(np.flatnonzero(area_region != area_region[copied])[-1])
    areas[twin] = areas[copied]  # the same centroid in another region, as a later area
    rows = np.concatenate([np.repeat(areas[[copied]], 4, axis=0), _unit(500, 16, seed=9)])
    found = regions.locate(rows, centroids, areas, area_region, searched=4)
    assert found[:4].tolist() == [copied] * 4
    with pytest.MonkeyPatch.context() as patch:  # routed a few rows at a time: the same areas
        patch.setattr(regions, "_PRODUCTS", 7 * int(np.bincount(area_region).max()))
        np.testing.assert_array_equal(regions.locate(rows, centroids, areas, area_region, searched=4), found)
    searched = np.argsort(-(rows[4:] @ centroids.T), axis=1)[:, :4]
    exact = rows[4:].astype(np.float64) @ areas.T.astype(np.float64)
    exact[~(area_region[None, None, :] == searched[:, :, None]).any(axis=1)] = -np.inf  # unsearched
    np.testing.assert_array_equal(found[4:], exact.argmax(axis=1))


def test_routing_holds_a_bounded_block_of_products_whatever_the_partition():
    """A partition's rows are routed a block at a time: 60,000 rows against one region of 2,000 areas
    would be 480 MB of products at once; the routing's peak stays near ``_PRODUCTS`` float32s."""
    import tracemalloc

    areas = _unit(2000, 16, seed=11)
    rows = _unit(60_000, 16, seed=12)
    tracemalloc.start()
    try:
        found = regions.locate(rows, areas[:1], areas, np.zeros(2000, dtype=np.int64), searched=1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * regions._PRODUCTS * 4 + rows.nbytes, peak
    exact = rows[:500].astype(np.float64) @ areas.T.astype(np.float64)
    np.testing.assert_array_equal(found[:500], exact.argmax(1))


def test_pair_simi_shares_cancel_the_picks_sum_at_lamb_0_and_follow_quality_at_lamb_1():
    """Two opposite topics of unequal size and one apart: Pair_simi's pairwise similarity is
    ``|sum of the picks|^2`` less a constant, so at lamb 0 the shares pull the sum towards zero, where a
    random pick's shares (by rows) leave the larger topic's pull; at lamb 1 they are quality top-k's."""
    rng = np.random.default_rng(0)
    directions, sizes, quality, sums = np.eye(8)[[0, 0, 1]] * [[1], [-1], [1]], (300, 100, 200), [], []
    for topic, (direction, rows) in enumerate(zip(directions, sizes, strict=True)):
        for _ in range(3):  # three areas a topic
            emb = direction + 0.3 * rng.standard_normal((rows, 8))
            emb /= np.linalg.norm(emb, axis=1, keepdims=True)
            sums.append(emb.sum(0))
            quality.append(-np.sort(-rng.random(rows) * (0.5 + 0.25 * topic)))
    sums, rows = np.array(sums), np.array([len(q) for q in quality])
    means = sums / rows[:, None]
    cancelled = regions.share_pairs(quality, sums, 120, 0.0)
    assert cancelled.sum() == 120 and (cancelled <= rows).all()
    by_rows = 120 * rows / rows.sum()
    assert np.linalg.norm(cancelled @ means) < 0.2 * np.linalg.norm(by_rows @ means)
    top = np.argsort(-np.concatenate(quality), kind="stable")[:120]
    wanted = np.bincount(np.repeat(np.arange(len(rows)), rows)[top], minlength=len(rows))
    assert np.abs(regions.share_pairs(quality, sums, 120, 1.0) - wanted).sum() <= 2  # rounding
    np.testing.assert_array_equal(regions.share_pairs(quality, sums, 120, 0.5),
                                  regions.share_pairs(quality, sums, 120, 0.5))


def test_a_row_equally_near_two_regions_searches_the_lower_one_whatever_the_order():
    """The regions a row searches are chosen in float32; a row whose last searched region and the next
    one are within the tie margin has them ranked again by exact float64 sums, so the lower of two equal
    centroids is searched on any worker (a threaded product's last bits would decide otherwise)."""
    centroids = _unit(6, 16, seed=12)
    centroids[4] = centroids[1]  # the same centroid twice: the row's first and second regions tie
    row = (centroids[1] + 0.3 * centroids[0]).astype(np.float32)
    row = (row / np.linalg.norm(row))[None, :]
    areas = np.concatenate([centroids, centroids[[1]]]).astype(np.float32)
    area_region = np.array([0, 1, 2, 3, 4, 5, 4])  # a last area in region 4, a copy of region 1's
    assert regions._nearest_regions(row, centroids, 1)[0].tolist() == [1]
    assert sorted(regions._nearest_regions(row, centroids, 2)[0].tolist()) == [1, 4]
    assert regions.locate(row, centroids, areas, area_region, searched=1)[0] == 1
