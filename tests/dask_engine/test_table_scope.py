"""Table-wide diversity (``diversity_scope="table"``): near-duplicates planted across partitions."""

from __future__ import annotations

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from conftest import FAST, unlisted

from datamask_dask import datamask_select
from datamask_dask.dedup.search import find_groups
from datamask_dask.dedup.simhash import (
    BANDS,
    band_edges,
    band_keys,
    count_pairs,
    hamming_threshold,
    hyperplanes,
    signatures,
)
from datamask_dask.errors import OptionError
from datamask_dask.run.selection import write_selection
from datamask_dask.sample_data import make_embeddings

PARTS, ROWS, DIM = 4, 500, 32


def _planted(seed: int = 0):
    """4 x 500 rows; 30% of rows are near-copies (cosine >= 0.95) of a row in another partition."""
    n = PARTS * ROWS
    quality, emb = make_embeddings(n, DIM, duplicate_share=0.0, seed=seed)
    rng = np.random.default_rng(seed + 1)
    part = np.arange(n) // ROWS
    copy = rng.choice(n, int(0.3 * n), replace=False)
    is_copy = np.zeros(n, dtype=bool)
    is_copy[copy] = True
    originals = np.flatnonzero(~is_copy)
    source = np.array([rng.choice(originals[part[originals] != part[row]]) for row in copy])
    emb[copy] = emb[source] + 0.02 * rng.standard_normal((copy.size, DIM), dtype=np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    assert np.einsum("ij,ij->i", emb[copy], emb[source]).min() >= 0.95
    features = pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), DIM)
    frame = pd.DataFrame({"chunk_id": np.arange(n, dtype=np.int64),
                          "quality_score": quality.astype(np.float64),
                          "topic": np.where(np.arange(n) % 3 == 0, "a", "b"),
                          "feature_arr": pd.Series(pd.arrays.ArrowExtensionArray(features))})
    return frame, emb, part


@pytest.fixture(scope="module")
def planted():
    return _planted()


def _pairs(emb, selected) -> int:
    rows = np.flatnonzero(selected)
    sims = emb[rows] @ emb[rows].T
    return int(np.triu(sims >= 0.95, 1).sum())


def _split_pairs(emb, part, selected) -> tuple[int, int]:
    """Exact near-duplicate pairs among the selected rows: (within a partition, across partitions)."""
    rows = np.flatnonzero(selected)
    i, j = np.nonzero(np.triu(emb[rows] @ emb[rows].T >= 0.95, 1))
    same = part[rows][i] == part[rows][j]
    return int(same.sum()), int((~same).sum())


def _ddf(frame):
    return dd.from_pandas(frame, npartitions=PARTS, sort=False)


def test_find_groups_keeps_the_best_member_of_each_group():
    rng = np.random.default_rng(0)
    base = rng.standard_normal((6, 16)).astype(np.float32)
    emb = np.concatenate([base, base[:3] + 0.01 * rng.standard_normal((3, 16)).astype(np.float32)])
    sig = signatures(emb, hyperplanes(16))
    quality = np.array([1.0, 5.0, 2.0, 0, 0, 0, 3.0, 1.0, 2.0])
    parts = [{"quality": quality[:6], "codes": np.zeros(6, dtype=np.int64), "labels": [None],
              "signatures": sig[:6]},
             {"quality": quality[6:], "codes": np.zeros(3, dtype=np.int64), "labels": [None],
              "signatures": sig[6:]}]
    groups = find_groups(parts)
    # row 0 loses to its copy (quality 3); row 1 beats its copy; rows 2 and 8 tie: partition 0 wins
    assert groups[0].shadowed.tolist() == [0] and groups[1].shadowed.tolist() == [1, 2]
    # each kept row stands for its pair
    assert groups[0].kept.tolist() == [1, 2] and groups[0].weights.tolist() == [2, 2]
    assert groups[1].kept.tolist() == [0] and groups[1].weights.tolist() == [2]


def test_plan_weights_count_every_shadowed_row_once(planted):
    from datamask_dask.dask_engine.operator import plan_selection

    spec, plan = plan_selection(_ddf(planted[0]), 0.1, seed=0, **FAST)
    plan = plan.compute(scheduler="sync")
    shadowed = sum(len(rows) for rows in plan.shadowed.values())
    extra = sum(int((weights - 1).sum()) for _, weights in plan.weights.values())
    assert shadowed > 400 and extra == shadowed
    for number, (kept, weights) in plan.weights.items():
        assert not np.isin(kept, plan.shadowed.get(number, [])).any() and (weights >= 2).all()


def _pairs_at(cosine: float, n: int, dim: int, rng) -> np.ndarray:
    """``n`` pairs of unit rows at exactly ``cosine`` (rows 2i and 2i + 1), in random directions."""
    u = rng.standard_normal((n, dim))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    w = rng.standard_normal((n, dim))
    w -= np.einsum("ij,ij->i", w, u)[:, None] * u
    w /= np.linalg.norm(w, axis=1, keepdims=True)
    v = cosine * u + np.sqrt(1 - cosine**2) * w
    return np.stack([u, v], axis=1).reshape(2 * n, dim).astype(np.float32)


@pytest.mark.parametrize(("cosine", "low", "high"), [(0.98, 0.97, 1.0), (0.96, 0.7, 1.0), (0.9, 0.0, 0.06)])
def test_search_sets_aside_pairs_above_the_threshold_only(cosine, low, high):
    rng = np.random.default_rng(2)
    emb = _pairs_at(cosine, 400, 64, rng)
    parts = [{"quality": rng.random(len(emb)), "codes": np.zeros(len(emb), dtype=np.int64), "labels": [None],
              "signatures": signatures(emb, hyperplanes(64))}]
    share = find_groups(parts, 0.95)[0].shadowed.size / 400  # one row of each pair found is shadowed
    assert low <= share <= high


def test_band_pairs_are_the_brute_force_pairs_whatever_the_group_codes():
    """count_pairs' candidates: every pair sharing a band and group within the Hamming limit, once,
    on both sort paths (keys packed with positions for small group codes, argsort beyond 2**11
    groups)."""
    rng = np.random.default_rng(3)
    base = rng.standard_normal((300, 32)).astype(np.float32)
    noise = rng.uniform(0.05, 0.6, (150, 1)).astype(np.float32)  # cosine ~0.999 down to ~0.85
    emb = np.concatenate([base, base[:150] + noise * rng.standard_normal((150, 32)).astype(np.float32)])
    sig = signatures(emb, hyperplanes(32))
    group = rng.integers(0, 2, len(emb))
    limit = hamming_threshold(0.95, margin=0.0)
    keys = np.stack([band_keys(sig.T, band) for band in range(BANDS)])
    bits = np.unpackbits(sig, axis=1)
    distance = (bits[:, None, :] != bits[None, :, :]).sum(axis=2)
    share = (keys[:, :, None] == keys[:, None, :]).any(axis=0) & (group[:, None] == group[None, :])
    left, right = np.nonzero(np.triu(share & (distance <= limit), k=1))
    assert left.size > 30 and np.count_nonzero(np.triu(share & (distance > limit), k=1)) > 10
    for offset in (0, 5000):  # 5000: band keys above 2**31 take the argsort path
        found = band_edges({"signatures": sig, "group": group + offset}, range(BANDS))
        assert np.array_equal(found[0], left) and np.array_equal(found[1], right)


def test_count_pairs_within_and_across_blocks():
    rng = np.random.default_rng(1)
    base = rng.standard_normal((400, 64)).astype(np.float32)
    copies = base[:30] + 0.01 * rng.standard_normal((30, 64)).astype(np.float32)  # cosine ~0.99
    sig = signatures(np.concatenate([base, copies]), hyperplanes(64))
    # rows 0-9 copied inside block 0; rows 10-29 copied into block 1
    blocks = [np.concatenate([sig[:200], sig[400:410]]), np.concatenate([sig[200:400], sig[410:]])]
    assert count_pairs(blocks) == (10, 20)
    assert count_pairs([sig[:400]]) == (0, 0) and count_pairs([]) == (0, 0)


def test_pairs_just_below_the_cosine_count_only_where_their_vectors_say_so():
    """Clustered rows have many neighbours just below the threshold: the signatures' estimate counts
    a share of them, the candidates confirmed on their vectors do not."""
    rng = np.random.default_rng(2)
    centres = rng.standard_normal((200, 64)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    noise = rng.standard_normal((200, 64)).astype(np.float32)
    noise -= (noise * centres).sum(axis=1, keepdims=True) * centres  # orthogonal to each centre
    noise /= np.linalg.norm(noise, axis=1, keepdims=True)
    cosines = np.where(np.arange(200) < 20, 0.99, 0.93).astype(np.float32)[:, None]  # 20 copies, 180 near
    others = cosines * centres + np.sqrt(1 - cosines ** 2) * noise
    unit = np.concatenate([centres, others])
    exact = np.triu(unit @ unit.T >= 0.95, 1)
    part = np.r_[np.zeros(200, dtype=int), np.arange(200) % 2]  # centres in block 0, the others in both
    left, right = np.nonzero(exact)
    within = int((part[left] == part[right]).sum())
    assert (within, left.size - within) == (10, 10)
    sig = signatures(unit, hyperplanes(64))
    blocks = [sig[part == b] for b in (0, 1)]
    vectors = [unit[part == b].astype(np.float16) for b in (0, 1)]
    assert count_pairs(blocks, vectors=vectors) == (10, 10)
    estimated = count_pairs(blocks)
    assert sum(estimated) >= 30, estimated  # the 20 copies and more than a tenth of the 180 at 0.93


@pytest.mark.parametrize("scope", ["partition", "table"])
def test_run_summary_counts_selected_pairs_within_and_across(client, planted, tmp_path, scope):
    frame, emb, part = planted
    report = write_selection(_ddf(frame), tmp_path / "out", 0.3, seed=0, lamb=0.0, diversity_scope=scope,
                             scheduler=client, progress=False, **FAST)
    out = pd.read_parquet(tmp_path / "out").sort_values("chunk_id")
    selected = out["selected"].to_numpy()
    within, across = _split_pairs(emb, part, selected)
    pairs = report.summary.summary["selected_pairs"]
    assert pairs["rows"] == selected.sum() == round(0.3 * len(frame))
    # candidates from signatures confirmed on the rows' vectors: at most the exact counts of every
    # selected row, short only of the pairs no band found
    assert pairs["method"] == "SimHash LSH candidates confirmed on their cosine over every selected row"
    assert within - max(1, 0.05 * within) <= pairs["within"] <= within
    assert across - max(1, 0.05 * across) <= pairs["across"] <= across
    if scope == "partition":  # the copies live in other partitions: the summary shows them
        assert pairs["across"] >= 20 and pairs["across"] > 5 * pairs["within"]
    else:
        assert pairs["across"] + pairs["within"] <= 4
    overview = report.summary.to_pandas().set_index("field")["value"]
    assert overview["selected.near_duplicate_pairs_across"] == pairs["across"]


def test_table_scope_keeps_a_tenth_of_randoms_duplicates(client, planted):
    frame, emb, part = planted
    n, k = len(frame), round(0.3 * len(frame))
    ddf = _ddf(frame)
    out = ddf.pipe(datamask_select, ratio=0.3, seed=0, lamb=0.0, **FAST).compute(scheduler=client)
    selected = out["selected"].to_numpy()
    assert selected.sum() == k
    # rows, order and columns unchanged
    pd.testing.assert_frame_equal(out.drop(columns="selected"), ddf.compute(scheduler="sync"))
    random = np.zeros(n, dtype=bool)
    random[np.random.default_rng(0).choice(n, k, replace=False)] = True
    assert _pairs(emb, random) >= 10
    assert _pairs(emb, selected) <= _pairs(emb, random) / 10
    per_partition = ddf.pipe(datamask_select, ratio=0.3, seed=0, lamb=0.0, diversity_scope="partition",
                             **FAST).compute(scheduler=client)
    assert _pairs(emb, per_partition["selected"].to_numpy()) > _pairs(emb, selected)


def test_per_group_quotas_stay_exact(client, planted):
    frame, emb, _ = planted
    ratios = {"a": 0.2, "b": 0.05}
    ddf = _ddf(frame)
    out = ddf.pipe(datamask_select, ratio=ratios, by="topic", seed=0, **FAST).compute(scheduler=client)
    for topic, ratio in ratios.items():
        rows = (frame["topic"] == topic).to_numpy()
        assert out["selected"].to_numpy()[rows].sum() == round(ratio * rows.sum())
    # groups are deduplicated apart (a copy in another group is no duplicate there): none within a group
    for topic in ratios:
        assert _pairs(emb, out["selected"].to_numpy() & (frame["topic"] == topic).to_numpy()) <= 1


def test_same_selection_on_one_and_two_workers(client, planted):
    frame, _, _ = planted
    ddf = _ddf(frame)
    threaded = ddf.pipe(datamask_select, ratio=0.1, seed=0, score_column="score", **FAST)
    one = threaded.compute(scheduler="threads")
    two = threaded.compute(scheduler=client)
    pd.testing.assert_frame_equal(one, two)
    assert np.isneginf(one["score"]).sum() > 0.2 * len(frame)  # the shadowed rows are marked ineligible


def test_ratio_above_the_distinct_rows_falls_back_to_every_row(planted):
    frame, _, _ = planted
    out = _ddf(frame).pipe(datamask_select, ratio=0.9, seed=0, **FAST).compute(scheduler="threads")
    assert out["selected"].sum() == round(0.9 * len(frame))


def test_bad_scope_options(planted):
    ddf = _ddf(planted[0])
    with pytest.raises(OptionError, match="diversity_scope"):
        datamask_select(ddf, diversity_scope="global")
    with pytest.raises(OptionError, match="duplicate_cosine"):
        datamask_select(ddf, duplicate_cosine=1.5)


def _copy_groups(n_parts=5, rows=300, dim=64, seed=4, embeddings=False):
    """Random directions (pairwise cosine ~0 at d = 64), 25% of rows in groups of 2-4 near-copies
    (pairwise cosine >= 0.97) spread over the partitions; returns find_groups-style inputs. With
    ``embeddings`` the copies spread from cosine ~0.99 to ~0.93 (many around 0.95) and the inputs
    carry the embeddings."""
    rng = np.random.default_rng(seed)
    n = n_parts * rows
    emb = rng.standard_normal((n, dim)).astype(np.float32)
    order = rng.permutation(n)
    at, groups = 0, []
    while at < n // 4:
        size = int(rng.integers(2, 5))
        members = order[at:at + size]
        scale = rng.uniform(0.1, 0.4, (size - 1, 1)) if embeddings else 0.1
        emb[members[1:]] = emb[members[0]] + scale * rng.standard_normal((size - 1, dim)).astype(np.float32)
        groups.append(members)
        at += size
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    quality = rng.random(n)
    quality[order[:8]] = quality[order[8]]  # ties: broken by partition, then row
    sig = signatures(emb, hyperplanes(dim))
    codes = (np.arange(n) % 2).astype(np.int64)  # two groups of the `by` column
    return [{"quality": quality[i * rows:(i + 1) * rows], "codes": codes[i * rows:(i + 1) * rows],
             "labels": ["x", "y"], "signatures": sig[i * rows:(i + 1) * rows],
             **({"embeddings": emb[i * rows:(i + 1) * rows]} if embeddings else {})} for i in range(n_parts)]


@pytest.mark.parametrize(("shards", "row_shards"), [(1, 1), (3, 2), (8, 3)])
def test_sharded_groups_equal_the_single_task_groups(shards, row_shards):
    from datamask_dask.dedup.stages import find_groups_sharded

    parts = _copy_groups()
    single = find_groups(parts)
    sharded, stats = find_groups_sharded(parts, shards=shards, rounds_of=7, row_shards=row_shards)
    assert sum(len(g.shadowed) for g in single) > 100 and stats["unresolved"] == 0
    for one, other in zip(single, sharded, strict=True):
        for key in ("shadowed", "kept", "weights", "parent", "parents"):
            np.testing.assert_array_equal(getattr(one, key), getattr(other, key))


def test_band_values_from_byte_tables_are_the_chosen_bits_packed():
    from datamask_dask.dedup.stages import _byte_tables, band_plan

    sig = np.random.default_rng(3).integers(0, 256, (1000, 32), dtype=np.uint8)
    bits = np.unpackbits(sig, axis=1)
    for positions in band_plan(10**7)["positions"][:5]:
        value = np.zeros(len(sig), dtype=np.uint32)
        for byte, table in _byte_tables(positions).items():
            value |= table[sig[:, byte]]
        expected = (bits[:, positions].astype(np.uint64) << np.arange(len(positions), dtype=np.uint64)).sum(1)
        np.testing.assert_array_equal(value, expected)


def test_best_edges_and_key_order_match_their_sorts():
    from datamask_dask.dedup.stages import _best_edges, _sort_by_key

    rng = np.random.default_rng(4)
    worse = rng.integers(0, 300, 5000).astype(np.uint64)
    better = rng.integers(0, 300, 5000).astype(np.uint64)
    quality = rng.integers(0, 4, 5000) / 4  # many ties: broken by the lower better row
    order = np.lexsort((better, -quality, worse))
    first = np.r_[True, worse[order][1:] != worse[order][:-1]]
    for got, want in zip(_best_edges(worse, better, quality), (worse, better, quality), strict=True):
        np.testing.assert_array_equal(got, want[order][first])
    high = rng.integers(0, 50, 5000).astype(np.uint64) << np.uint64(40)  # repeated keys
    # ... and keys that differ only in the bits the sort lends to positions: still apart
    for key in (high, high | rng.integers(0, 4, 5000).astype(np.uint64)):
        order, sorted_key = _sort_by_key(key)
        np.testing.assert_array_equal(order, np.argsort(key, kind="stable"))
        np.testing.assert_array_equal(sorted_key, np.sort(key))


@pytest.mark.parametrize(("wiring", "method"), [("task_groups", None), ("shuffled_groups", "tasks"),
                                               ("shuffled_groups", "p2p"), ("table_groups", None)])
@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.slow
def test_sharded_graph_on_dask_gives_the_same_groups(client, wiring, method, exact):
    """Every wiring of the search (one task: its candidates, with ``exact``) gives the in-process
    stages' groups, whatever order a shuffle delivers rows in (the DataFrame shuffles: in memory on
    the synchronous scheduler, p2p on a cluster); with the embeddings, checked on exact cosine in
    vector blocks whose tasks read their partitions again (the Delayed reads run inside them)."""
    import dask

    from datamask_dask.dedup import dask_graph as search
    from datamask_dask.dedup.stages import find_groups_sharded

    parts = _copy_groups(n_parts=9, rows=120, embeddings=exact)
    signed = [dask.delayed({k: v for k, v in p.items() if k != "embeddings"}) for p in parts]
    vectors = [dask.delayed({"embeddings": p["embeddings"]}) for p in parts] if exact else None
    with dask.config.set({"dataframe.shuffle.method": method}):
        if wiring == "table_groups":
            graph = search.table_groups(signed, 0.95, vectors)
        else:
            graph = getattr(search, wiring)(signed, 0.95, dask.delayed(9 * 120), vectors)
    expected = find_groups_sharded(parts)[0]
    if exact:  # the exact check decided: some pairs the signatures pass are not set aside, or the reverse
        estimated = find_groups_sharded(dask.compute(*signed))[0]
        assert any(not np.array_equal(a.shadowed, b.shadowed)
                   for a, b in zip(expected, estimated, strict=True))
    assert sum(len(g.shadowed) for g in expected) > (50 if exact else 100)  # exact: fewer copies above 0.95
    for scheduler in ("sync", client) if method != "p2p" else (client,):
        got = dask.compute(*graph, scheduler=scheduler)
        for one, other in zip(expected, got, strict=True):
            for key in ("shadowed", "kept", "weights", "parent", "parents"):
                np.testing.assert_array_equal(getattr(one, key), getattr(other, key))


def test_the_shuffles_are_p2p_on_a_cluster_and_in_memory_without_one(client):
    import subprocess
    import sys

    import dask

    from datamask_dask.dedup.dask_graph import shuffle_method

    with client.as_current():  # as Dask's default shuffle method: p2p with a current Client
        assert shuffle_method() == "p2p"
        with dask.config.set({"dataframe.shuffle.method": "disk"}):
            assert shuffle_method() == "disk"  # the user's choice wins
    alone = subprocess.run([sys.executable, "-c", "from datamask_dask.dedup.dask_graph import "
                            "shuffle_method; print(shuffle_method())"], capture_output=True, text=True,
                           check=True)
    assert alone.stdout.strip() == "tasks"  # no client: in memory, not partd's disk shuffle


def _plan_tasks(n_parts: int) -> int:
    from datamask_dask.dask_engine.operator import plan_selection
    from datamask_dask.sample_data import make_corpus

    ddf = unlisted(dd.from_pandas(make_corpus(n_parts * 20, 8, seed=1), npartitions=n_parts, sort=False))
    return len(dict(plan_selection(ddf, 0.1)[1].__dask_graph__()))


@pytest.mark.slow
def test_above_shuffle_partitions_the_plan_graph_grows_linearly(monkeypatch):
    """Above ``SHUFFLE_PARTITIONS`` every all-to-all step of the search is a DataFrame shuffle: with
    p2p (a cluster's), four times the partitions give about four times the plan's tasks. Wired task
    to task the search grows as the partitions squared."""
    import dask

    from datamask_dask.dedup import dask_graph as search
    from datamask_dask.dedup import search as one

    monkeypatch.setattr(one, "ONE_TASK_PARTITIONS", 0)
    monkeypatch.setattr(search, "LOCAL_ONE_TASK", False)  # the graphs a cluster runs
    monkeypatch.setattr(search, "SHUFFLE_PARTITIONS", 8)
    with dask.config.set({"dataframe.shuffle.method": "p2p"}):
        shuffled = {n: _plan_tasks(n) for n in (16, 64)}
    assert shuffled[64] < 4.5 * shuffled[16], shuffled
    monkeypatch.setattr(search, "SHUFFLE_PARTITIONS", 64)
    wired = {n: _plan_tasks(n) for n in (16, 64)}
    assert wired[64] > 8 * wired[16], wired
    assert shuffled[64] < wired[64] / 2, (shuffled, wired)


@pytest.mark.parametrize("one_task", [True, False])
def test_the_plan_graph_runs_the_search_its_partitions_pick(one_task, monkeypatch):
    """Up to ONE_TASK_PARTITIONS partitions the groups come from one find_groups task, above from the
    sharded stages alone (chosen when the graph is built); the same groups either way."""
    import dask

    from datamask_dask.dedup import dask_graph, search

    parts = _copy_groups(n_parts=9, rows=120)
    monkeypatch.setattr(search, "ONE_TASK_PARTITIONS", 9 if one_task else 8)
    monkeypatch.setattr(dask_graph, "LOCAL_ONE_TASK", False)  # the graph a cluster runs
    seen = []

    def recording(inputs, cosine):
        seen.append(sum(len(p["quality"]) for p in inputs))
        return find_groups(inputs, cosine)

    monkeypatch.setattr(dask_graph, "find_groups", recording)
    graph = dask_graph.table_groups([dask.delayed(p) for p in parts], 0.95)
    keys = {str(key) for key in dict(graph[0].__dask_graph__())}
    assert any("datamask-plan-duplicates-records" in key for key in keys) is not one_task
    got = dask.compute(*graph, scheduler="sync")
    assert seen == ([9 * 120] if one_task else [])
    expected = find_groups(parts)
    assert sum(len(g.shadowed) for g in got) > 100
    for one, other in zip(expected, got, strict=True):
        for key in ("shadowed", "kept", "weights", "parent", "parents"):
            np.testing.assert_array_equal(getattr(one, key), getattr(other, key))


def test_a_graph_for_a_local_scheduler_searches_in_one_task_at_any_partitions(client, monkeypatch):
    """Above ONE_TASK_PARTITIONS a plan built for the threaded scheduler still finds its candidates in
    one task (the sharded graph's tasks cost a local scheduler more than the search); built for a
    cluster's Client, it takes the sharded stages. The same plan either way."""
    from datamask_dask.dask_engine import operator
    from datamask_dask.dedup import search
    from datamask_dask.sample_data import make_corpus

    monkeypatch.setattr(search, "ONE_TASK_PARTITIONS", 4)
    ddf = unlisted(dd.from_pandas(make_corpus(12 * 60, 8, seed=3), npartitions=12, sort=False))
    local = operator.plan_selection(ddf, 0.1)[1]
    on_cluster = operator.plan_selection(ddf, 0.1, scheduler=client)[1]  # not Dask's default Client

    def stages(plan) -> set:
        return {stage for key in dict(plan.__dask_graph__()) for stage in ("candidates", "records")
                if f"datamask-plan-duplicates-{stage}" in str(key)}

    assert (stages(local), stages(on_cluster)) == ({"candidates"}, {"records"})
    held = operator.plan_selection(client.persist(ddf), 0.1)[1]  # the Client holding its partitions
    assert stages(held) == {"records"}
    plan = local.compute(scheduler="threads")
    assert _plan_digest(plan) == _plan_digest(on_cluster.compute(scheduler=client))
    assert sum(len(v) for v in plan.shadowed.values()) > 0


@pytest.mark.parametrize("door", ["select_table", "datamask_select"])
def test_a_table_of_listed_rows_searches_in_one_task_on_a_cluster(door, client, parquet_dir, tmp_path,
                                                                   monkeypatch):
    """A table whose reader lists its rows (parquet footers: the package's reader, or Dask's
    ``dd.read_parquet`` handed to ``datamask_select``) finds its candidates in one task on a cluster
    at any partitions up to ONE_TASK_ROWS rows: the sharded graph's ~3.5 x partitions**2 tasks cost
    the scheduler far more than the search of a table of many small files. Above it the partitions
    decide. The same rows either way."""
    from distributed import get_task_stream

    import datamask_dask
    from datamask_dask.dedup import search

    monkeypatch.setattr(search, "ONE_TASK_PARTITIONS", 2)  # the 4 files are "many"
    found = {}
    for limit in (1600, 1599):  # the table's rows, and one fewer
        monkeypatch.setattr(search, "ONE_TASK_ROWS", limit)
        with get_task_stream(client) as stream:
            if door == "select_table":
                out = tmp_path / f"out{limit}"
                datamask_dask.select_table(parquet_dir, out, 0.1, scheduler=client, **FAST)
                written = pd.read_parquet(out, columns=["chunk_id", "selected"])
            else:
                ddf = dd.read_parquet(parquet_dir)
                written = client.compute(datamask_dask.datamask_select(ddf, 0.1, scheduler=client, **FAST)
                                         ).result()
        stages = {stage for task in stream.data for stage in ("candidates", "records")
                  if f"datamask-plan-duplicates-{stage}" in str(task["key"])}
        found[limit] = stages, sorted(written.loc[written["selected"], "chunk_id"])
    assert found[1600][0] == {"candidates"} and found[1599][0] == {"records"}
    assert found[1600][1] == found[1599][1] and len(found[1600][1]) == 160


def test_shards_of_known_rows_take_as_many_small_partitions_as_a_shard_holds(client, monkeypatch):
    """With the table's rows known, the sharded graph's shards and vector blocks take consecutive
    partitions up to SHARD_ROWS rows (at least PARTITIONS_PER_SHARD): a table of many small partitions
    gets few shards, so far fewer tasks, and the same plan."""
    from datamask_dask.config import resolve_options
    from datamask_dask.dask_engine import operator
    from datamask_dask.dedup import dask_graph, search
    from datamask_dask.sample_data import make_corpus

    monkeypatch.setattr(search, "ONE_TASK_PARTITIONS", 4)
    monkeypatch.setattr(search, "ONE_TASK_ROWS", 0)  # the sharded stages at any rows
    monkeypatch.setattr(dask_graph, "SHARD_ROWS", 360)  # 6 of the 12 partitions of 60 rows
    assert dask_graph.shard_partitions(12, None) == 4 and dask_graph.shard_partitions(12, 720) == 6
    assert dask_graph.shard_partitions(12, 10**6) == 4  # large partitions: 4 a shard, as without rows
    listed = dd.from_pandas(make_corpus(12 * 60, 8, seed=3), npartitions=12, sort=False)
    ddf = unlisted(listed)
    assert operator.listed_rows(ddf) is None and operator.listed_rows(listed) == 720
    spec = operator.make_spec(ddf, resolve_options(ratio=0.1))
    plans, tasks = {}, {}
    for known in (None, 720):
        with client.as_current():
            graph = dict(operator.plan_graph(ddf, spec, known).__dask_graph__())
        tasks[known] = sum("datamask-plan-duplicates" in str(key) for key in graph)
        plans[known] = operator.compute_plan(ddf, spec, scheduler=client, progress=False, known_rows=known)[0]
    assert tasks[720] < 0.7 * tasks[None], tasks  # 2 shards, not 3: the picks grow as shards squared
    assert _plan_digest(plans[720]) == _plan_digest(plans[None])
    assert sum(len(v) for v in plans[720].shadowed.values()) > 0


def _plan_digest(plan) -> str:
    return repr([getattr(plan, k) for k in ("rows", "cells", "ranges", "dim", "digests")] +
                [sorted((k, v.tolist()) for k, v in plan.shadowed.items())])


@pytest.mark.parametrize("one_task", [True, False])
def test_a_plan_computed_now_is_the_lazy_plan(one_task, monkeypatch):
    """The writers compute the plan at once, with the search wired as the lazy graph wires it."""
    from datamask_dask.dask_engine import operator
    from datamask_dask.dedup import dask_graph, search
    from datamask_dask.sample_data import make_corpus

    monkeypatch.setattr(search, "ONE_TASK_PARTITIONS", 32 if one_task else 4)
    monkeypatch.setattr(dask_graph, "LOCAL_ONE_TASK", False)  # the graphs a cluster runs
    ddf = unlisted(dd.from_pandas(make_corpus(12 * 60, 8, seed=3), npartitions=12, sort=False))
    spec, lazy = operator.plan_selection(ddf, 0.1)
    lazy = lazy.compute(scheduler="sync")
    now, _ = operator.compute_plan(ddf, spec, scheduler="threads", progress=False)
    assert _plan_digest(now) == _plan_digest(lazy)
    assert sum(len(v) for v in now.shadowed.values()) > 0


def test_a_plan_computed_now_on_a_cluster_keeps_the_scans_on_the_workers(client):
    from datamask_dask.dask_engine import operator
    from datamask_dask.sample_data import make_corpus

    ddf = dd.from_pandas(make_corpus(12 * 60, 8, seed=3), npartitions=12, sort=False)
    spec, lazy = operator.plan_selection(ddf, 0.1)
    now, _ = operator.compute_plan(ddf, spec, scheduler=client, progress=True)
    assert _plan_digest(now) == _plan_digest(lazy.compute(scheduler=client))


@pytest.mark.slow
def test_the_writers_plan_is_the_same_with_any_wiring_of_the_search(client, monkeypatch):
    """compute_plan on a cluster: the DataFrame shuffles give the plan the task-to-task wiring and
    the one task give, and they are p2p on the client it is given, though that client is not
    Dask's default."""
    from datamask_dask.config import resolve_options
    from datamask_dask.dask_engine import operator
    from datamask_dask.dedup import dask_graph as search
    from datamask_dask.dedup import search as one
    from datamask_dask.sample_data import make_corpus

    monkeypatch.setattr(one, "ONE_TASK_PARTITIONS", 4)
    ddf = unlisted(dd.from_pandas(make_corpus(12 * 60, 8, seed=3), npartitions=12, sort=False))
    spec = operator.make_spec(ddf, resolve_options(ratio=0.1))
    methods, choose = [], search.shuffle_method
    monkeypatch.setattr(search, "shuffle_method", lambda: methods.append(choose()) or methods[-1])
    plans = {}
    for limit in (10**9, 4):  # task to task; DataFrame shuffles
        monkeypatch.setattr(search, "SHUFFLE_PARTITIONS", limit)
        plans[limit] = operator.compute_plan(ddf, spec, scheduler=client, progress=False)[0]
    assert methods == ["p2p"]
    monkeypatch.setattr(one, "ONE_TASK_PARTITIONS", 32)
    plans["one task"] = operator.compute_plan(ddf, spec, scheduler=client, progress=False)[0]
    assert _plan_digest(plans[4]) == _plan_digest(plans[10**9]) == _plan_digest(plans["one task"])
    assert sum(len(v) for v in plans[4].shadowed.values()) > 0


@pytest.mark.slow
def test_the_lazy_plan_is_the_same_with_either_sharded_wiring(client, monkeypatch):
    """With the DataFrame shuffles (p2p) the lazy plan is what the task-to-task wiring plans."""
    from datamask_dask.dask_engine import operator
    from datamask_dask.dedup import dask_graph as search
    from datamask_dask.dedup import search as one
    from datamask_dask.sample_data import make_corpus

    monkeypatch.setattr(one, "ONE_TASK_PARTITIONS", 4)
    ddf = unlisted(dd.from_pandas(make_corpus(12 * 60, 8, seed=3), npartitions=12, sort=False))
    digests = []
    for limit in (10**9, 4):  # task to task; DataFrame shuffles (p2p: the client is current)
        monkeypatch.setattr(search, "SHUFFLE_PARTITIONS", limit)
        with client.as_current():
            plan = operator.plan_selection(ddf, 0.1)[1].compute(scheduler=client)
        assert sum(len(v) for v in plan.shadowed.values()) > 0
        digests.append(_plan_digest(plan))
    assert digests[0] == digests[1]


def test_the_plan_graph_holds_each_task_once(monkeypatch):
    """Every partition's summary depends on the table-wide search: the plan graph must hold that
    search once, not once per partition (dask copies a Delayed's whole graph into a layer of its own
    when it is passed inside a list), or graphs of a few hundred partitions take minutes to cull."""
    from datamask_dask.dask_engine.operator import plan_selection
    from datamask_dask.dedup import dask_graph, search
    from datamask_dask.sample_data import make_corpus

    monkeypatch.setattr(search, "ONE_TASK_PARTITIONS", 4)
    monkeypatch.setattr(dask_graph, "LOCAL_ONE_TASK", False)  # the graph a cluster runs

    ddf = unlisted(dd.from_pandas(make_corpus(12 * 50, 8, seed=1), npartitions=12, sort=False))
    graph = plan_selection(ddf, 0.1)[1].__dask_graph__()
    layers = [set(layer.keys()) for layer in graph.layers.values()]
    unique = set().union(*layers)
    assert any("datamask-plan-duplicates-records" in str(key) for key in unique)  # the sharded search
    assert sum(len(keys) for keys in layers) == len(unique)
