"""Quota planning (pure numpy): exact totals, caps, quality-following shares, token budgets."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datamask_dask.plan.quotas import (
    allocate,
    fit_budget,
    make_sketch,
    plan_rows,
    plan_tokens,
    pool_size,
    split_budget,
    split_quota,
    take_top,
)


def test_allocate_largest_remainder():
    # shares 3.5, 2.5, 4.0 of 10: floors 3, 2, 4 and one unit left for the larger remainder (tie: first)
    assert allocate(10, [3.5, 2.5, 4.0], [10, 10, 10]).tolist() == [4, 2, 4]
    assert allocate(7, [1, 1, 1], [10, 10, 10]).tolist() == [3, 2, 2]


def test_allocate_respects_caps_and_redistributes():
    out = allocate(10, [8, 1, 1], [3, 10, 10])
    assert out.tolist() == [3, 4, 3] or out.tolist() == [3, 3, 4]
    assert out.sum() == 10


def test_allocate_zero_weights_fill_remaining_room():
    assert allocate(4, [0, 0, 0], [1, 2, 3]).sum() == 4
    assert allocate(3, [1, 0, 0], [1, 5, 5]).tolist()[0] == 1


def test_allocate_rejects_impossible_totals():
    with pytest.raises(ValueError):
        allocate(11, [1, 1], [5, 5])
    with pytest.raises(ValueError):
        allocate(-1, [1], [5])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 100), st.integers(0, 50)), min_size=1, max_size=12), st.data())
def test_allocate_properties(cells, data):
    weights = np.array([w for w, _ in cells])
    caps = np.array([c for _, c in cells])
    total = data.draw(st.integers(0, int(caps.sum())))
    out = allocate(total, weights, caps)
    assert out.sum() == total
    assert (out >= 0).all() and (out <= caps).all()
    if weights.sum() > 0 and total <= caps.min() and (caps > 0).all():
        # no cap binds: every entry is within one unit of its proportional share
        share = total * weights / weights.sum()
        assert (np.abs(out - share) < 1 + 1e-9).all()


def test_sketch_is_exact_for_small_cells_and_bins_large_ones():
    q = np.array([0.3, 0.9, 0.1, 0.9])
    small = make_sketch(q, bins=8)
    assert small.value.tolist() == [0.9, 0.9, 0.3, 0.1] and small.rows.tolist() == [1, 1, 1, 1]
    big = make_sketch(np.random.default_rng(0).random(10_000), bins=100)
    assert big.value.shape == (100,) and big.n_rows == 10_000
    assert (np.diff(big.value) <= 0).all()


def test_take_top_is_a_global_quality_threshold():
    a, b = make_sketch(np.array([0.9, 0.8, 0.1])), make_sketch(np.array([0.7, 0.2, 0.05]))
    rows, _ = take_top([a, b], 3)
    assert rows.tolist() == [2.0, 1.0]  # 0.9, 0.8 from a; 0.7 from b


def test_take_top_splits_the_crossing_bin_pro_rata():
    big = make_sketch(np.linspace(1, 0, 1000), bins=10)
    rows, _ = take_top([big], 250)
    assert rows[0] == pytest.approx(250)


def test_plan_rows_gives_low_quality_partitions_less():
    rng = np.random.default_rng(0)
    high, low = rng.random(500) + 1.0, rng.random(500)
    plan = plan_rows([make_sketch(low), make_sketch(high)], quota=100, prune=0.0, oversample=2.0)
    assert plan.quota.sum() == 100
    assert plan.quota[0] == 0 and plan.quota[1] == 100  # the best 200 rows are all in `high`
    assert plan.eligible.tolist() == [500, 500]


def test_plan_rows_random_partitions_get_shares_by_size():
    rng = np.random.default_rng(1)
    sketches = [make_sketch(rng.random(n)) for n in (300, 600, 900)]
    plan = plan_rows(sketches, quota=180, prune=0.0, oversample=3.0)
    assert plan.quota.sum() == 180
    assert np.allclose(plan.quota, [30, 60, 90], atol=12)


def test_plan_rows_prune_is_table_wide():
    low, high = np.arange(100) / 1000, 1 + np.arange(100) / 1000
    plan = plan_rows([make_sketch(low), make_sketch(high)], quota=20, prune=0.5, oversample=10)
    assert plan.eligible.tolist() == [0, 100]
    assert plan.quota.tolist() == [0, 20]
    with pytest.raises(ValueError, match="eligible"):
        plan_rows([make_sketch(low), make_sketch(high)], quota=150, prune=0.5, oversample=2)


def test_plan_rows_oversample_one_is_a_global_top_k():
    rng = np.random.default_rng(2)
    parts = [rng.random(n) * s for n, s in ((400, 1.0), (300, 2.0), (500, 0.5))]
    plan = plan_rows([make_sketch(p) for p in parts], quota=120, prune=0.0, oversample=1.0)
    everything = np.concatenate(parts)
    threshold = np.sort(everything)[::-1][119]
    assert plan.quota.tolist() == [int((p >= threshold).sum()) for p in parts]


def test_pool_size():
    assert pool_size(10, 100, 2.0) == 20
    assert pool_size(10, 15, 2.0) == 15
    assert pool_size(0, 100, 2.0) == 0


def test_plan_tokens_budget_is_shared_exactly():
    rng = np.random.default_rng(3)
    q = [rng.random(400), rng.random(400) + 0.5]
    t = [rng.integers(10, 100, 400).astype(float) for _ in q]
    plan = plan_tokens([make_sketch(a, b) for a, b in zip(q, t, strict=True)], budget=5000, prune=0.0,
                       oversample=2.0)
    assert plan.budget.sum() == 5000
    assert plan.budget.tolist() == [0, 5000]  # the best 10 000 tokens all lie in the second cell
    assert plan.quota[0] == 0 and 5000 / 100 < plan.quota[1] < 5000 / 10
    with pytest.raises(ValueError, match="exceeds"):
        plan_tokens([make_sketch(q[0], t[0])], budget=int(t[0].sum()) + 1, prune=0.0, oversample=2.0)


def test_split_quota_and_budget_inside_a_partition():
    rng = np.random.default_rng(4)
    q = rng.random(1000)
    chunk = np.arange(1000) * 4 // 1000
    quotas = split_quota(q, chunk, 4, 100, 2.0)
    assert quotas.sum() == 100 and (quotas <= 250).all()
    tokens = rng.integers(1, 50, 1000).astype(float)
    budgets, k = split_budget(q, tokens, chunk, 4, 3000, 2.0)
    assert budgets.sum() == 3000 and (k >= 1).all()


def test_fit_budget_trims_then_fills():
    tokens = np.array([50, 40, 30, 20, 10], dtype=float)
    preference = np.array([5, 4, 3, 2, 1], dtype=float)
    over = fit_budget(np.array([True, True, True, False, False]), tokens, preference, 100)
    assert tokens[over].sum() <= 100
    assert over.tolist() == [True, True, False, False, True]  # drop 30, then 10 still fits
    under = fit_budget(np.zeros(5, dtype=bool), tokens, preference, 65)
    assert under.tolist() == [True, False, False, False, True]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 100), min_size=1, max_size=40), st.integers(0, 2000), st.data())
def test_fit_budget_properties(tokens, budget, data):
    tokens = np.array(tokens, dtype=float)
    start = np.array(data.draw(st.lists(st.booleans(), min_size=tokens.size, max_size=tokens.size)))
    out = fit_budget(start, tokens, np.arange(tokens.size, dtype=float), budget)
    left = budget - tokens[out].sum()
    assert left >= 0
    assert (tokens[~out] > left).all()  # nothing unselected would still fit
