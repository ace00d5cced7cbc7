"""Baselines on the joint objective, and the objective itself against slow direct formulas."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from datamask_dask.errors import OptionError
from datamask_dask.learn.baselines import (
    _Objective,
    greedy,
    lazy_greedy,
    quality_topk,
    random_selection,
    stochastic_greedy,
)
from datamask_dask.learn.metrics import (
    DiversityMetric,
    evaluate_selection,
    normalise_quality,
    register_metric,
)
from datamask_dask.sample_data import make_embeddings

ALGORITHMS = ["Pair_simi", "Facility", "DiSF"]
BASELINES = [random_selection, quality_topk, greedy, lazy_greedy, stochastic_greedy]


def _unit_rows(rng, n, d):
    x = rng.standard_normal((n, d))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


# --------------------------------------------------------------------------- slow reference formulas


def _slow_quality(quality, sel, quality_range=None):
    q = np.asarray(quality, dtype=np.float64)
    lo, hi = (q.min(), q.max()) if quality_range is None else quality_range
    return float(np.mean([min(max((q[i] - lo) / (hi - lo), 0.0), 1.0) for i in sel]))


def _slow_pair_simi(emb, sel):
    e = np.asarray(emb, dtype=np.float64)
    sims = [float(e[i] @ e[j]) for i in sel for j in sel if i != j]
    return 1.0 - (np.mean(sims) if sims else 0.0)


def _slow_facility(emb, sel):
    e = np.asarray(emb, dtype=np.float64)
    return float(np.mean([max(0.0, max(float(e[v] @ e[j]) for j in sel)) for v in range(len(e))]))


def _slow_disf(emb, sel):
    x = np.asarray(emb, dtype=np.float64)[list(sel)]
    k, d = x.shape
    corr = np.corrcoef(x, rowvar=False)  # d x d; the ddof cancels in a correlation
    off = sum(corr[a, b] ** 2 for a in range(d) for b in range(d) if a != b)
    return 1.0 - off / (d * (d - 1))


_SLOW = {"Pair_simi": _slow_pair_simi, "Facility": _slow_facility, "DiSF": _slow_disf}


def _slow_objective(quality, emb, sel, algorithm, lamb, quality_range=None):
    weights = algorithm if isinstance(algorithm, dict) else {algorithm: 1.0}
    total = sum(weights.values())
    diversity = sum(w / total * _SLOW[name](emb, sel) for name, w in weights.items())
    return lamb * _slow_quality(quality, sel, quality_range) + (1 - lamb) * diversity


# --------------------------------------------------------------------------- the objective


@pytest.mark.parametrize("algorithm", [*ALGORITHMS, {"Facility": 0.7, "DiSF": 0.3}])
@pytest.mark.parametrize("lamb", [0.0, 0.3, 1.0])
def test_evaluate_selection_matches_slow_formula(algorithm, lamb):
    rng = np.random.default_rng(7)
    n, d, k = 40, 6, 9
    emb = _unit_rows(rng, n, d)
    quality = rng.lognormal(size=n)
    sel = rng.choice(n, k, replace=False)
    got = evaluate_selection(quality, emb, sel, algorithm=algorithm, lamb=lamb)
    assert got["objective"] == pytest.approx(_slow_objective(quality, emb, sel, algorithm, lamb), abs=1e-5)
    mask = np.zeros(n, dtype=bool)
    mask[sel] = True  # a boolean mask is the same selection
    assert evaluate_selection(quality, emb, mask, algorithm=algorithm, lamb=lamb)["objective"] == \
        pytest.approx(got["objective"], abs=1e-6)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_each_metric_matches_slow_formula(algorithm):
    rng = np.random.default_rng(11)
    emb = _unit_rows(rng, 30, 5)
    for k in (2, 3, 12):
        sel = rng.choice(30, k, replace=False)
        got = evaluate_selection(np.ones(30), emb, sel, algorithm=algorithm, lamb=0.0)["metrics"]
        assert list(got.values())[0] == pytest.approx(_SLOW[algorithm](emb, sel), abs=1e-5)


def test_quality_range_is_used_and_clamped():
    rng = np.random.default_rng(3)
    emb = _unit_rows(rng, 20, 4)
    quality = rng.uniform(0, 10, 20)
    sel = np.arange(5)
    got = evaluate_selection(quality, emb, sel, lamb=1.0, quality_range=(2.0, 6.0))
    assert got["quality"] == pytest.approx(_slow_quality(quality, sel, (2.0, 6.0)), abs=1e-6)


@pytest.mark.parametrize("algorithm", [*ALGORITHMS, {"Pair_simi": 0.5, "Facility": 0.25, "DiSF": 0.25}])
def test_incremental_objective_matches_evaluate_selection(algorithm):
    # The baselines score f(U + j) incrementally (closed forms, Welford for DiSF); it must be the
    # very value evaluate_selection reports, both while |U| < d and after.
    rng = np.random.default_rng(5)
    n, d, lamb = 80, 8, 0.4
    emb, quality = _unit_rows(rng, n, d), rng.lognormal(size=n).astype(np.float32)
    obj = _Objective(normalise_quality(torch.tensor(quality)), torch.tensor(emb), algorithm, lamb, seed=0,
                     max_memory_bytes=2**30, reference_size=None)
    order = rng.permutation(n)[:20]
    for m, j in enumerate(order):
        if m in (0, 1, 2, 5, 7, 8, 12, 19):
            cand = torch.tensor(rng.choice(np.setdiff1d(np.arange(n), order[:m]), 4, replace=False))
            got = obj.values_with(cand).double().numpy()
            want = [evaluate_selection(quality, emb, np.r_[order[:m], c], algorithm=algorithm,
                                       lamb=lamb)["objective"] for c in cand.tolist()]
            np.testing.assert_allclose(got, want, atol=2e-5)
        obj.add(int(j))


# --------------------------------------------------------------------------- every baseline


@pytest.mark.slow
@pytest.mark.parametrize("fn", BASELINES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_returns_k_distinct_indices(fn, algorithm):
    quality, emb = make_embeddings(300, 16, seed=2)
    for k in (1, 37, 300):
        sel = fn(quality, emb, k, algorithm=algorithm, lamb=0.5, seed=1)
        assert sel.dtype == np.int64 and sel.shape == (k,)
        assert len(np.unique(sel)) == k and sel.min() >= 0 and sel.max() < 300


@pytest.mark.parametrize("fn", BASELINES, ids=lambda f: f.__name__)
def test_same_seed_same_selection(fn):
    quality, emb = make_embeddings(200, 8, seed=4)
    a = fn(quality, emb, 20, algorithm="Facility", lamb=0.5, seed=3)
    b = fn(quality, emb, 20, algorithm="Facility", lamb=0.5, seed=3)
    np.testing.assert_array_equal(a, b)


def test_bad_arguments_raise_option_errors():
    quality, emb = make_embeddings(50, 4, seed=0)
    for k in (0, 51, 2.5, True):
        with pytest.raises(OptionError, match="quota k="):
            lazy_greedy(quality, emb, k)
    with pytest.raises(OptionError, match="lamb"):
        greedy(quality, emb, 5, lamb=1.5)
    with pytest.raises(OptionError, match="eps"):
        stochastic_greedy(quality, emb, 5, eps=0.0)
    register_metric("test_baselines_user_metric", _UserMetric)
    with pytest.raises(OptionError, match="built-in metrics"):
        greedy(quality, emb, 5, algorithm="test_baselines_user_metric")


class _UserMetric(DiversityMetric):
    """A user metric: the baselines have no closed-form gain for it and must say so."""

    name = "user"

    def rewards(self, emb, idx, state):
        return emb[idx].std(1).mean(-1)


# --------------------------------------------------------------------------- greedy variants


@pytest.mark.parametrize("algorithm", [*ALGORITHMS, {"Facility": 0.5, "Pair_simi": 0.5}])
@pytest.mark.parametrize("lamb", [0.0, 0.5])
@pytest.mark.parametrize("memory", ["cache", "subset", "on_demand"])
def test_lazy_greedy_equals_plain_greedy(algorithm, lamb, memory):
    quality, emb = make_embeddings(60, 12, seed=9)
    kwargs = {"cache": {}, "subset": {"max_memory_bytes": 60 * 25 * 4},
              "on_demand": {"max_memory_bytes": 1024, "reference_size": 60}}[memory]
    plain = greedy(quality, emb, 15, algorithm=algorithm, lamb=lamb, **kwargs)
    lazy = lazy_greedy(quality, emb, 15, algorithm=algorithm, lamb=lamb, **kwargs)
    np.testing.assert_array_equal(lazy, plain)


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("lamb", [0.0, 0.5])
def test_greedy_beats_random_and_quality_topk(algorithm, lamb):
    quality, emb = make_embeddings(1500, 32, seed=0)
    k = 150

    def score(sel):
        return evaluate_selection(quality, emb, sel, algorithm=algorithm, lamb=lamb)["objective"]

    best = score(lazy_greedy(quality, emb, k, algorithm=algorithm, lamb=lamb))
    assert best >= score(random_selection(quality, emb, k, seed=0))
    assert best >= score(quality_topk(quality, emb, k))
    # The cheaper stochastic greedy lands close to it, and above random.
    got = score(stochastic_greedy(quality, emb, k, algorithm=algorithm, lamb=lamb))
    assert got >= score(random_selection(quality, emb, k, seed=0))
    assert got >= 0.95 * best


def test_greedy_within_one_minus_inverse_e_of_brute_force_facility():
    rng = np.random.default_rng(1)
    for trial in range(3):
        n, k = 12, 4
        emb = _unit_rows(rng, n, 5)
        quality = rng.uniform(size=n)
        sims = np.clip(emb.astype(np.float64) @ emb.T.astype(np.float64), 0, None)
        best = max(sims[:, list(s)].max(1).mean() for s in itertools.combinations(range(n), k))
        for fn in (greedy, lazy_greedy):
            sel = fn(quality, emb, k, algorithm="Facility", lamb=0.0)
            got = evaluate_selection(quality, emb, sel, algorithm="Facility", lamb=0.0)["objective"]
            assert got >= (1 - 1 / math.e) * best - 1e-6, (trial, fn.__name__)
            assert got <= best + 1e-6


def test_quality_topk_and_lamb_one_greedy_agree():
    quality, emb = make_embeddings(100, 8, seed=6)
    top = quality_topk(quality, emb, 10)
    assert np.all(quality[top][:-1] >= quality[top][1:])
    np.testing.assert_array_equal(np.sort(greedy(quality, emb, 10, lamb=1.0)), np.sort(top))


def test_facility_reference_subset_when_matrix_does_not_fit():
    quality, emb = make_embeddings(400, 16, seed=8)
    tight = lazy_greedy(quality, emb, 40, algorithm="Facility", lamb=0.0, max_memory_bytes=400 * 100 * 4)
    full = lazy_greedy(quality, emb, 40, algorithm="Facility", lamb=0.0)
    value = [evaluate_selection(quality, emb, s, algorithm="Facility", lamb=0.0)["objective"]
             for s in (tight, full, random_selection(quality, emb, 40))]
    assert len(np.unique(tight)) == 40
    assert value[2] < value[0] <= value[1] + 1e-6  # a 100-row reference set still does well


# --------------------------------------------------------------------------- DiSF batched greedy


def _reference_cal_corre(feat):
    """The DiSF repository's criterion (select_disf.py, cal_corre), in float64."""
    feat = feat - feat.mean(0, keepdims=True)
    feat = feat / np.sqrt(1e-8 + feat.var(0, ddof=1, keepdims=True))
    corr = feat.T @ feat / (feat.shape[0] - 1)
    return (corr ** 2).sum() - (np.diagonal(corr) ** 2).sum()


def test_disf_criterion_ranks_candidates_as_the_reference():
    rng = np.random.default_rng(2)
    n, d = 64, 10
    emb = _unit_rows(rng, n, d)
    obj = _Objective(torch.zeros(n), torch.tensor(emb), "DiSF", 0.0, seed=0, max_memory_bytes=2**30,
                     reference_size=None)
    chosen = list(rng.choice(n, 6, replace=False))
    for j in chosen:
        obj.add(int(j))
    cand = np.setdiff1d(np.arange(n), chosen)
    ours = obj.values_with(torch.tensor(cand)).numpy()
    theirs = np.array([_reference_cal_corre(emb[chosen + [c]].astype(np.float64)) for c in cand])
    assert cand[np.argmax(ours)] == cand[np.argmin(theirs)]
    # Same criterion up to an affine map: 1 - off / (d (d - 1)).
    np.testing.assert_allclose(ours, 1 - theirs / (d * (d - 1)), atol=1e-6)


def test_random_selection_draws_from_every_row():
    quality, emb = make_embeddings(1000, 4, seed=0)
    draws = [random_selection(quality, emb, 100, seed=seed) for seed in range(3)]
    assert all(len(np.unique(rows)) == 100 for rows in draws)
    assert max(rows.max() for rows in draws) >= 500  # not only the first k rows
    assert not np.array_equal(np.sort(draws[0]), np.sort(draws[1]))  # each seed its own draw


# --------------------------------------------------------------------------- row weights


def _replicated(emb, weights):
    """Each row repeated ``weights[i]`` times: the table that weighted rows stand for."""
    return np.repeat(emb, np.asarray(weights, dtype=np.int64), axis=0)


def test_weighted_facility_is_facility_of_the_replicated_rows():
    rng = np.random.default_rng(5)
    emb = _unit_rows(rng, 60, 8)
    quality = rng.random(60)
    weights = rng.integers(1, 5, 60)
    sel = [3, 17, 40, 41]
    weighted = evaluate_selection(quality, emb, sel, algorithm="Facility", lamb=0.0, weights=weights)
    whole = _replicated(emb, weights)
    first = np.concatenate([[0], np.cumsum(weights)[:-1]])  # each row's first copy
    plain = evaluate_selection(np.repeat(quality, weights), whole, first[sel], algorithm="Facility", lamb=0.0)
    assert weighted["objective"] == pytest.approx(plain["objective"], rel=1e-6)
    # quality and the other metrics ignore the weights
    for algorithm in ("Pair_simi", "DiSF"):
        assert evaluate_selection(quality, emb, sel, algorithm=algorithm, weights=weights)["objective"] == \
            pytest.approx(evaluate_selection(quality, emb, sel, algorithm=algorithm)["objective"])


@pytest.mark.parametrize("memory", [{}, {"max_memory_bytes": 1024, "reference_size": 80}])  # cache, on demand
def test_weighted_lazy_greedy_is_greedy_on_the_replicated_rows(memory):
    rng = np.random.default_rng(6)
    emb = _unit_rows(rng, 80, 8)
    quality = rng.random(80)
    weights = np.where(rng.random(80) < 0.2, 6, 1)
    k = 10
    pick = lazy_greedy(quality, emb, k, algorithm="Facility", lamb=0.0, weights=weights, **memory)
    assert np.array_equal(pick, greedy(quality, emb, k, algorithm="Facility", lamb=0.0, weights=weights,
                                       **memory))
    whole = _replicated(emb, weights)
    copies = np.repeat(np.arange(80), weights)
    on_copies = lazy_greedy(np.repeat(quality, weights), whole, k, algorithm="Facility", lamb=0.0)
    assert set(copies[on_copies]) == set(pick)  # the same rows, whichever copy greedy took
    unweighted = lazy_greedy(quality, emb, k, algorithm="Facility", lamb=0.0)
    score = [evaluate_selection(quality, emb, p, algorithm="Facility", lamb=0.0, weights=weights)["objective"]
             for p in (pick, unweighted)]
    assert score[0] > score[1]


def test_bad_weights_raise():
    rng = np.random.default_rng(7)
    emb = _unit_rows(rng, 20, 4)
    with pytest.raises(OptionError, match="weights"):
        evaluate_selection(np.ones(20), emb, [0, 1], algorithm="Facility", weights=np.ones(19))
    with pytest.raises(ValueError, match="weights"):
        lazy_greedy(np.ones(20), emb, 3, algorithm="Facility", weights=np.zeros(20))
