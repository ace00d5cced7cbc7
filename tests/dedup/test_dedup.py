"""One near-duplicate rule at every size: the one-task search and the sharded stages find the same groups."""

from __future__ import annotations

import numpy as np
import pytest

from datamask_dask.dedup.groups import DuplicateGroups
from datamask_dask.dedup.search import ONE_TASK_PARTITIONS, ONE_TASK_ROWS, find_groups, one_task
from datamask_dask.dedup.simhash import SIGNATURE_BITS, hamming_threshold, hyperplanes, signatures
from datamask_dask.dedup.stages import (
    CANDIDATES,
    FULL_BUCKET,
    ROUNDS,
    band_plan,
    candidate_limit,
    find_groups_sharded,
)

KEYS = ("shadowed", "kept", "weights", "parent", "parents")


def _flip(rng, bits: np.ndarray, count: int, avoid=()) -> np.ndarray:
    """``bits`` (unpacked, 256) with ``count`` bits flipped, none of those in ``avoid``."""
    choices = np.setdiff1d(np.arange(SIGNATURE_BITS), np.asarray(avoid, dtype=np.int64))
    flipped = rng.choice(choices, count, replace=False)
    out = bits.copy()
    out[flipped] ^= 1
    return out, flipped


def _random_table(rng, large_buckets: bool = True) -> list[dict]:
    """A small table of random signatures with planted near-duplicates: copies of one row, chains
    ``a ~ b ~ c`` whose ends are apart, long chains of rising quality (deeper than ``ROUNDS``), and
    (``large_buckets``) clusters of more than ``FULL_BUCKET`` near-identical rows; quality with ties,
    partitions of random sizes (some empty), and sometimes a ``by`` column."""
    rows = [rng.integers(0, 2, SIGNATURE_BITS).astype(np.uint8) for _ in range(int(rng.integers(20, 120)))]
    quality = list(rng.integers(0, 6, len(rows)) / 4)
    for _ in range(int(rng.integers(0, 6))):  # copies of one row
        source = rows[int(rng.integers(len(rows)))]
        for _ in range(int(rng.integers(1, 4))):
            rows.append(_flip(rng, source, int(rng.integers(0, 12)))[0])
            quality.append(rng.integers(0, 6) / 4)
    for _ in range(int(rng.integers(0, 5))):  # a ~ b ~ c, a and c apart
        a = rng.integers(0, 2, SIGNATURE_BITS).astype(np.uint8)
        b, first = _flip(rng, a, 16)
        c, _ = _flip(rng, b, 16, avoid=first)
        rows += [a, b, c]
        quality += list(rng.integers(0, 6, 3) / 4)
    for _ in range(int(rng.integers(0, 3))):  # a long chain, each link better than the last
        link = rng.integers(0, 2, SIGNATURE_BITS).astype(np.uint8)
        for step in range(int(rng.integers(4, 9))):
            rows.append(link)
            quality.append(1.0 + step)
            link = _flip(rng, link, 16)[0]
    if large_buckets:
        for _ in range(int(rng.integers(0, 3))):
            centre = rng.integers(0, 2, SIGNATURE_BITS).astype(np.uint8)
            for _ in range(int(rng.integers(FULL_BUCKET + 1, 40))):
                rows.append(_flip(rng, centre, int(rng.integers(0, 24)))[0])
                quality.append(rng.integers(0, 6) / 4)
    order = rng.permutation(len(rows))
    sig = np.packbits(np.stack(rows)[order], axis=1)
    quality = np.asarray(quality)[order]
    labels = [None] if rng.random() < 0.6 else ["x", "y", 7]
    codes = rng.integers(0, len(labels), len(rows))
    cuts = np.sort(rng.integers(0, len(rows) + 1, int(rng.integers(0, 7))))
    bounds = np.r_[0, cuts, len(rows)]
    return [{"quality": quality[lo:hi], "codes": codes[lo:hi], "labels": labels, "signatures": sig[lo:hi]}
            for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]


def _assert_same(expected: list, got: list) -> None:
    assert len(expected) == len(got)
    for one, other in zip(expected, got, strict=True):
        for key in KEYS:
            np.testing.assert_array_equal(getattr(one, key), getattr(other, key), err_msg=key)


@pytest.fixture(autouse=True)
def compiled(monkeypatch):
    """find_groups' compiled passes at any size (small tables otherwise run the stages in one process)."""
    from datamask_dask.dedup import search

    monkeypatch.setattr(search, "COMPILED_ROWS", 0)


@pytest.mark.slow
def test_one_task_and_many_shards_find_the_same_groups():
    """The groups (shadowed rows, kept rows and their weights) of random small tables with planted
    copies, chains and large buckets are the same in one task as in the sharded stages, whatever
    the shards, row shards and bands per round."""
    rng = np.random.default_rng(40)
    shadowed = deep = 0
    for _ in range(30):
        parts = _random_table(rng)
        single = find_groups(parts)
        for shards, row_shards, rounds_of in [(1, 1, 40), (3, 2, 7), (8, 5, 13), (9, 3, 1)]:
            sharded, stats = find_groups_sharded(parts, shards=shards, row_shards=row_shards,
                                                 rounds_of=rounds_of)
            _assert_same(single, sharded)
        deep += stats["unresolved"]
        shadowed += sum(len(g.shadowed) for g in single)
    assert shadowed > 500 and deep > 0  # chains deeper than ROUNDS took part


def _rule(parts: list[dict], cosine: float = 0.95) -> list[dict]:
    """The rule from its statement, pair by pair, for tables whose buckets all take every pair:
    candidates share a band's bits and a group, within the Hamming limit; without embeddings a
    candidate is verified, with them a row's ``CANDIDATES`` best better candidates are tried and
    those at exact cosine >= ``cosine`` verified; a row with a verified better one is shadowed and
    points to its best; a kept row stands for itself and the rows whose pointers reach it within
    ``ROUNDS`` steps."""
    exact = "embeddings" in parts[0]
    quality = np.concatenate([p["quality"] for p in parts])
    group = np.concatenate([np.asarray(p["labels"], dtype=object)[p["codes"]] for p in parts])
    bits = np.unpackbits(np.concatenate([p["signatures"] for p in parts]), axis=1)
    n = len(quality)
    positions = band_plan(n)["positions"]
    values = np.stack([bits[:, band] @ (1 << np.arange(band.size)) for band in positions])
    candidate = (values[:, :, None] == values[:, None, :]).any(axis=0)
    candidate &= np.array([[g == h for h in group] for g in group])
    for band in values:  # every bucket small enough to take all its pairs
        assert np.unique(band, return_counts=True)[1].max() <= FULL_BUCKET
    distance = (bits[:, None, :] != bits[None, :, :]).sum(axis=2)
    near = candidate & (distance <= candidate_limit(cosine, exact)) & ~np.eye(n, dtype=bool)
    rank = np.empty(n, dtype=np.int64)
    rank[np.lexsort((np.arange(n), -quality))] = np.arange(n)
    if exact:
        unit = np.concatenate([p["embeddings"] for p in parts]).astype(np.float64)
        unit /= np.linalg.norm(unit, axis=1, keepdims=True)
        similar = unit @ unit.T >= cosine
    parent = np.full(n, -1)
    for row in range(n):
        better = np.flatnonzero(near[row] & (rank < rank[row]))
        better = better[np.argsort(rank[better])]
        if exact:
            better = better[:CANDIDATES]
            better = better[similar[row, better]]
        if better.size:
            parent[row] = better[0]
    weight = np.ones(n, dtype=np.int64)
    for row in np.flatnonzero(parent >= 0):
        at, steps = parent[row], 1
        while parent[at] >= 0 and steps < ROUNDS:
            at, steps = parent[at], steps + 1
        if parent[at] < 0:
            weight[at] += 1
    offsets = np.cumsum([0] + [len(p["quality"]) for p in parts])
    part_of = np.searchsorted(offsets, np.arange(n), side="right") - 1
    ref = (part_of << 32) | (np.arange(n) - offsets[part_of])  # partition << 32 | position
    out = []
    for low, high in zip(offsets[:-1], offsets[1:], strict=True):
        kept = np.flatnonzero(weight[low:high] > 1)
        shadowed = np.flatnonzero(parent[low:high] >= 0)
        parents = np.unique(parent[parent >= 0])
        out.append(DuplicateGroups(shadowed=shadowed, kept=kept, weights=weight[low:high][kept],
                                   parent=ref[parent[low + shadowed]],
                                   parents=parents[(parents >= low) & (parents < high)] - low))
    return out


def test_the_groups_follow_the_rule_pair_by_pair():
    rng = np.random.default_rng(41)
    shadowed = 0
    for _ in range(25):
        parts = _random_table(rng, large_buckets=False)
        expected = _rule(parts)
        _assert_same(expected, find_groups(parts))
        _assert_same(expected, find_groups_sharded(parts, shards=3)[0])
        shadowed += sum(len(g.shadowed) for g in expected)
    assert shadowed > 100


def _embedded_table(rng, dim: int = 48) -> list[dict]:
    """A small table of random unit embeddings with planted near-copies at cosines around 0.95
    (0.90 to 1.0: many pairs just below it, and close pairs beside them), copies of copies, ties in
    quality, partitions of random sizes (some empty) and sometimes a ``by`` column; its
    signatures, and the embeddings."""
    emb = rng.standard_normal((int(rng.integers(30, 100)), dim))
    copies = []
    for _ in range(int(rng.integers(10, 40))):
        source = emb[int(rng.integers(len(emb)))] if not copies or rng.random() < 0.7 else copies[-1]
        u = source / np.linalg.norm(source)
        w = rng.standard_normal(dim)
        w -= (w @ u) * u
        cosine = rng.uniform(0.90, 1.0)
        copies.append(cosine * u + np.sqrt(1 - cosine**2) * w / np.linalg.norm(w))
    emb = np.concatenate([emb, np.stack(copies)])[rng.permutation(len(emb) + len(copies))].astype(np.float32)
    quality = rng.integers(0, 6, len(emb)) / 4
    sig = signatures(emb, hyperplanes(dim))
    labels = [None] if rng.random() < 0.6 else ["x", "y"]
    codes = rng.integers(0, len(labels), len(emb))
    bounds = np.r_[0, np.sort(rng.integers(0, len(emb) + 1, int(rng.integers(0, 5)))), len(emb)]
    return [{"quality": quality[lo:hi], "codes": codes[lo:hi], "labels": labels, "signatures": sig[lo:hi],
             "embeddings": emb[lo:hi]} for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]


def test_with_embeddings_the_groups_follow_the_exact_rule_pair_by_pair():
    """Candidates found on the signatures, each row's best confirmed on exact cosine: the one-task
    search (compiled) and the sharded stages, whatever their shards, give the rule's groups."""
    rng = np.random.default_rng(43)
    shadowed = 0
    for _ in range(20):
        parts = _embedded_table(rng)
        expected = _rule(parts)
        _assert_same(expected, find_groups(parts))
        for shards, row_shards in [(1, 1), (3, 2), (5, 4)]:
            _assert_same(expected, find_groups_sharded(parts, shards=shards, row_shards=row_shards)[0])
        shadowed += sum(len(g.shadowed) for g in expected)
    assert shadowed > 100


def _pair(rng, cosine: float, planes: np.ndarray, accept) -> np.ndarray:
    """Two unit rows at exact ``cosine`` whose signatures' Hamming distance ``accept`` takes, and
    that share one of the bands of a small table (so that the search tries them)."""
    positions = band_plan(100)["positions"]
    while True:
        u = rng.standard_normal(planes.shape[0])
        u /= np.linalg.norm(u)
        w = rng.standard_normal(planes.shape[0])
        w -= (w @ u) * u
        pair = np.stack([u, cosine * u + np.sqrt(1 - cosine**2) * w / np.linalg.norm(w)]).astype(np.float32)
        bits = np.unpackbits(signatures(pair, planes), axis=1)
        shared = any((bits[0, band] == bits[1, band]).all() for band in positions)
        if shared and accept(int((bits[0] != bits[1]).sum())):
            return pair


def test_a_pair_just_below_the_threshold_whose_signatures_collide_stays(monkeypatch):
    """Rows at exact cosine 0.94 whose signatures are within the Hamming limit of 0.95: on signatures
    alone the worse is set aside; with the embeddings both stay. Rows at 0.96 whose signatures put
    them beyond that limit (but within the candidates' wider one): with the embeddings the worse is
    set aside. The one-task search (compiled and not) and the sharded stages agree."""
    from datamask_dask.dedup import search

    rng = np.random.default_rng(11)
    dim = 32
    planes = hyperplanes(dim)
    limit = hamming_threshold(0.95)
    below = _pair(rng, 0.94, planes, lambda d: d <= limit)
    above = _pair(rng, 0.96, planes, lambda d: limit < d <= candidate_limit(0.95, True))
    emb = np.concatenate([below, above, rng.standard_normal((36, dim))]).astype(np.float32)
    quality = np.r_[1.0, 0.5, 1.0, 0.5, np.zeros(36)]  # rows 1 and 3 the worse of their pairs
    sig = signatures(emb, planes)
    parts = [{"quality": quality[lo:hi], "codes": np.zeros(hi - lo, dtype=np.int64), "labels": [None],
              "signatures": sig[lo:hi], "embeddings": emb[lo:hi]} for lo, hi in ((0, 1), (1, 40))]
    signed = [{k: v for k, v in p.items() if k != "embeddings"} for p in parts]

    def shadowed(groups):
        return sorted(int(i) + (1 if p else 0) for p, g in enumerate(groups) for i in g.shadowed)

    assert shadowed(find_groups(signed)) == [1]
    for compiled_rows in (0, 10**9):
        monkeypatch.setattr(search, "COMPILED_ROWS", compiled_rows)
        assert shadowed(find_groups(parts)) == [3]
    for shards in (1, 2, 3):
        assert shadowed(find_groups_sharded(parts, shards=shards)[0]) == [3]


@pytest.mark.parametrize(("quality", "shadowed", "kept"), [
    ((2.0, 1.0, 3.0), ["b"], {"c": 2}),  # b the worst: its better neighbours both stay
    ((1.0, 3.0, 2.0), ["a", "c"], {"b": 3}),  # b the best: it stands for both
    ((3.0, 2.0, 1.0), ["b", "c"], {"a": 3}),  # falling along the chain: c points to b, b to a
])
def test_a_chain_whose_ends_are_apart(quality, shadowed, kept):
    """a ~ b ~ c with a and c apart: a row is set aside only for a better near-duplicate of its own."""
    rng = np.random.default_rng(7)
    a = rng.integers(0, 2, SIGNATURE_BITS).astype(np.uint8)
    b, first = _flip(rng, a, 16)
    c, _ = _flip(rng, b, 16, avoid=first)
    assert 16 <= hamming_threshold(0.95) < 32  # a ~ b, b ~ c, a and c apart
    noise = rng.integers(0, 2, (30, SIGNATURE_BITS)).astype(np.uint8)
    names = {"a": (0, 0), "b": (1, 5), "c": (2, 10)}  # (partition, position): one in each partition
    parts = []
    for number, row in enumerate((a, b, c)):
        sig = np.insert(noise[10 * number:10 * (number + 1)], 5 * number, row, axis=0)
        q = np.zeros(11)
        q[5 * number] = quality[number]
        parts.append({"quality": q, "codes": np.zeros(11, dtype=np.int64), "labels": [None],
                      "signatures": np.packbits(sig, axis=1)})
    for groups in (find_groups(parts), find_groups_sharded(parts, shards=2)[0]):
        got_shadowed = sorted(name for name, (p, i) in names.items() if i in groups[p].shadowed)
        got_kept = {name: int(groups[p].weights[list(groups[p].kept).index(i)])
                    for name, (p, i) in names.items() if i in groups[p].kept}
        assert got_shadowed == shadowed and got_kept == kept
        assert sum(len(g.shadowed) for g in groups) == len(shadowed)  # the noise rows stay


def test_the_wiring_follows_the_partitions_and_the_rows_where_known():
    assert one_task(1) and one_task(ONE_TASK_PARTITIONS) and not one_task(ONE_TASK_PARTITIONS + 1)
    assert one_task(10**4, ONE_TASK_ROWS) and not one_task(10**4, ONE_TASK_ROWS + 1)
    assert one_task(ONE_TASK_PARTITIONS, 10**12)  # few partitions: one task at any rows


def test_small_tables_take_the_stages_in_one_process(monkeypatch):
    """Below COMPILED_ROWS find_groups runs the sharded stages in its own process: the same groups
    as the compiled passes."""
    from datamask_dask.dedup import search

    parts = _random_table(np.random.default_rng(42))
    compiled = find_groups(parts)
    monkeypatch.setattr(search, "COMPILED_ROWS", 10**9)
    monkeypatch.setattr(search, "table_parents", None)  # not called
    _assert_same(compiled, find_groups(parts))


def test_long_edge_lists_keep_each_rows_best_edges_as_the_sort_does(monkeypatch):
    """Each worse row's CANDIDATES best distinct edges (higher quality, then the lower better row), best
    first: the compiled pass of long lists keeps what numpy's three-key sort keeps, ties, repeated
    pairs and rows with fewer edges included."""
    from datamask_dask.dedup import stages

    rng = np.random.default_rng(7)
    n, rows = 20_000, 300
    partition = rng.integers(0, 3, n).astype(np.uint64) << np.uint64(32)
    worse = rng.integers(0, rows, n).astype(np.uint64) | partition
    better = rng.integers(0, 400, n).astype(np.uint64)
    quality = np.round(rng.random(400), 1)[better.astype(np.int64)]  # a better row's quality, many tied
    again = rng.integers(0, n, n // 4)  # pairs found again by other bands
    edges = [np.concatenate([column, column[again]]) for column in (worse, better, quality)]
    monkeypatch.setattr(stages, "COMPILED_EDGES", 10**9)
    expected = stages._best_edges(*edges, keep=CANDIDATES)
    monkeypatch.setattr(stages, "COMPILED_EDGES", 0)
    found = stages._best_edges(*edges, keep=CANDIDATES)
    kept = np.unique(expected[0], return_counts=True)[1]
    assert kept.max() == CANDIDATES and kept.min() < CANDIDATES  # rows over the cap, and under it
    for column, wanted in zip(found, expected, strict=True):
        np.testing.assert_array_equal(column, wanted)
