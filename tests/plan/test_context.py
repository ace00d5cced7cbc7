"""The context's sums (pure numpy): a union's objective from its picks' sums is the yardstick's, and the
plan keeps the share of pieces in context whose expected union scores best."""

from __future__ import annotations

import numpy as np
import pytest

from datamask_dask.learn.metrics.disf import TableMoments
from datamask_dask.learn.metrics.evaluate import evaluate_selection
from datamask_dask.plan import context
from datamask_dask.plan.context import (
    Context,
    Picks,
    best_share,
    deal,
    dealt_quotas,
    dealt_rows,
    mixed,
    picked,
    piece_count,
    row_moments,
    table_moments,
)
from datamask_dask.plan.reduce import dealt_packs
from datamask_dask.plan.types import Cell, Plan

DIM = 8


def _table(rows=2000, seed=0):
    rng = np.random.default_rng(seed)
    emb = rng.standard_normal((rows, DIM)) + np.linspace(0, 1, DIM) * rng.standard_normal((rows, 1))
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    quality = rng.random(rows)
    return emb, quality, table_moments([row_moments([emb])], [rows])


@pytest.mark.parametrize("lamb", [0.0, 0.5])
def test_a_unions_objective_from_its_picks_sums_is_the_yardsticks(lamb):
    emb, quality, table = _table()
    mask = np.zeros(len(emb), dtype=bool)
    mask[np.random.default_rng(1).choice(len(emb), 300, replace=False)] = True
    first, second = np.flatnonzero(mask)[:120], np.flatnonzero(mask)[120:]  # two partitions' picks
    union = picked(emb[first], quality[first], table, 0.0) + picked(emb[second], quality[second], table, 0.0)
    expected = evaluate_selection(quality, emb.astype(np.float32), mask, algorithm="DiSF", lamb=lamb,
                                  quality_range=(0.0, 1.0))["objective"]
    assert union.count == 300
    assert union.objective(lamb) == pytest.approx(expected, abs=1e-5)


def test_the_share_in_context_is_the_better_round_and_the_fewest_pieces_moved_of_equals():
    emb, quality, table = _table()
    correlated = np.argsort(np.abs(emb @ np.linspace(0, 1, DIM)))[-300:]  # both tails of the shared direction
    spread = np.random.default_rng(2).choice(len(emb), 300, replace=False)
    worse, better = (picked(emb[rows], quality[rows], table, 0.0) for rows in (correlated, spread))
    assert better.objective(0.0) > worse.objective(0.0)
    assert best_share(worse, better, 0.0) > 0.5
    assert best_share(better, worse, 0.0) < 0.5
    assert best_share(better, better, 0.0) == 0.0
    half = mixed(worse, better, 0.5)
    np.testing.assert_allclose(half.moment, (worse.moment + better.moment) / 2)
    assert half.count == 300 and half.quality == pytest.approx((worse.quality + better.quality) / 2)


def test_each_round_learns_against_what_it_should():
    table = TableMoments(np.zeros(DIM), np.ones(DIM))
    first = Picks(100, np.zeros(DIM), np.eye(DIM) * 100, 50.0, 1.0)
    context = Context(table)
    assert context.pending and context.against(10, 0) is table  # the first round: apart
    context, stage = context.then(first, 0.0)
    rest = context.against(10, 0)  # the second: against the rest of the first picks
    assert stage == "plan first round" and rest.count == 90
    np.testing.assert_allclose(rest.moment, np.eye(DIM) * 90)
    context, stage = context.then(first, 0.0)  # rounds alike: none moved
    assert stage == "plan second round" and not context.pending and context.share == 0.0
    assert context.against(10, 0) is table
    split = Context(table, first, 0.5)  # the select pass: in context where the seed falls in the share
    assert split.against(10, 2**31 - 1).count == 90 and split.against(10, 2**31) is table
    with pytest.raises(RuntimeError, match="both rounds"):
        split.then(first, 0.0)


def test_the_rows_are_dealt_round_the_pieces_as_the_quota_is_shared():
    partitions = [7, 0, 12, 5]  # eligible rows, in table order: one strip
    pieces = piece_count(sum(partitions), chunk_rows=7)
    assert pieces == 4
    starts = np.cumsum([0, *partitions[:-1]])
    dealt = np.concatenate([deal(int(start), rows, pieces)
                            for start, rows in zip(starts, partitions, strict=True)])
    np.testing.assert_array_equal(dealt, np.arange(sum(partitions)) % pieces)  # one deal over the strip
    rows = dealt_rows(sum(partitions), pieces)
    quotas = dealt_quotas(rows, quota=5)
    np.testing.assert_array_equal(rows, np.bincount(dealt))
    assert rows.tolist() == [6, 6, 6, 6] and rows.max() <= 7
    assert quotas.sum() == 5 and quotas.max() - quotas.min() <= 1
    assert deal(3, 5, 4).tolist() == [3, 0, 1, 2, 3]  # a partition's rows go on from the rows before it


def test_a_table_of_many_partitions_is_dealt_in_strips(monkeypatch):
    monkeypatch.setattr(context, "STRIP_PIECES", 3)
    eligible = [5, 9, 0, 4, 8, 8, 3, 6]  # partition 2 has none
    cells = {p: (Cell("all", 0, n, n // 3, None),) for p, n in enumerate(eligible)}
    packs = dealt_packs(cells, chunk_rows=6)
    members = [p for p, n in enumerate(eligible) if n]
    # three strips, each of every third partition with rows, so that each spans the table
    assert [pack.partitions for pack in packs] == [(0, 4, 7)] * 4 + [(1, 5)] * 3 + [(3, 6)] * 2
    assert [pack.dealt for pack in packs] == list(range(9))
    quotas = [pack.quota for pack in packs]
    assert sum(quotas) == sum(n // 3 for n in eligible) and max(quotas) - min(quotas) <= 1
    plan = Plan(spec=None, cells=cells, rows=tuple(eligible), dim=None, ranges={}, packs=packs)  # type: ignore[arg-type]
    for partition in members:  # each partition's rows go round its own strip's pieces
        start, pieces = plan.dealt(partition)
        assert pieces == plan.packs_of(partition)
        assert all(partition in packs[j].partitions for j in pieces)
    assert plan.dealt(4) == (5, (0, 1, 2, 3)) and plan.dealt(6) == (4, (7, 8))
