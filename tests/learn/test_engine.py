"""The mask learner on one chunk: exact size, determinism, known optima, bad input."""

import itertools
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

from datamask_dask.compiled import on_first_use
from datamask_dask.errors import DataMaskError, InputDataError, OptionError
from datamask_dask.learn.engine import learn_mask
from datamask_dask.learn.metrics import (
    DiversityMetric,
    Facility,
    Represented,
    evaluate_selection,
    register_metric,
)
from datamask_dask.learn.options import DataMaskOptions
from datamask_dask.sample_data import make_embeddings

FAST = dict(n_epochs=30, n_rollout=8, refine_epochs=30)
ALGORITHMS = ["Pair_simi", "Facility", "DiSF"]


@pytest.fixture(scope="module")
def chunk():
    return make_embeddings(1500, 32, seed=3)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("update", ["credit", "paper", "plackett_luce"])
@pytest.mark.parametrize("k", [1, 37, 1499])
def test_exact_count(chunk, algorithm, update, k):
    q, e = chunk
    result = learn_mask(q, e, k, algorithm=algorithm, update=update, **FAST)
    assert result.mask.dtype == bool and result.mask.shape == (1500,)
    assert result.mask.sum() == k
    assert result.scores.shape == (1500,)


def test_all_rows_selected_when_quota_is_n(chunk):
    q, e = chunk
    assert learn_mask(q, e, 1500, **FAST).mask.all()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_same_seed_same_result_other_seed_other_result(chunk, algorithm):
    q, e = chunk
    a = learn_mask(q, e, 300, algorithm=algorithm, seed=1, **FAST)
    b = learn_mask(q, e, 300, algorithm=algorithm, seed=1, **FAST)
    c = learn_mask(q, e, 300, algorithm=algorithm, seed=2, **FAST)
    np.testing.assert_array_equal(a.mask, b.mask)
    np.testing.assert_array_equal(a.scores, b.scores)
    assert (a.scores != c.scores).any()  # the seed drives the draws (masks may still agree)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_lamb_one_is_quality_topk(chunk, algorithm):
    q, e = chunk
    result = learn_mask(q, e, 250, algorithm=algorithm, lamb=1.0, **FAST)
    expected = np.zeros(len(q), bool)
    expected[np.argsort(-q, kind="stable")[:250]] = True
    np.testing.assert_array_equal(result.mask, expected)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_beats_random_and_quality_topk_at_lamb_half(chunk, algorithm):
    q, e = chunk
    k = 300
    ours = learn_mask(q, e, k, algorithm=algorithm, lamb=0.5)
    score = evaluate_selection(q, e, ours.mask, algorithm=algorithm, lamb=0.5)["objective"]
    rng = np.random.default_rng(0)
    randoms = [evaluate_selection(q, e, rng.choice(len(q), k, replace=False), algorithm=algorithm,
                                  lamb=0.5)["objective"] for _ in range(3)]
    top = evaluate_selection(q, e, np.argsort(-q)[:k], algorithm=algorithm, lamb=0.5)["objective"]
    assert score > max(randoms)
    assert score > top


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_matches_brute_force_on_tiny_chunks(algorithm):
    """n <= 20: the learner finds the exact optimum for most seeds."""
    hits = 0
    seeds = range(12)
    for seed in seeds:
        q, e = make_embeddings(12, 8, n_clusters=3, seed=seed)
        k, lamb = 4, 0.5

        def objective(sel, q=q, e=e, lamb=lamb):
            return evaluate_selection(q, e, np.array(sel), algorithm=algorithm, lamb=lamb)["objective"]

        best = max(objective(s) for s in itertools.combinations(range(12), k))
        found = learn_mask(q, e, k, algorithm=algorithm, lamb=lamb, seed=seed, n_rollout=8)
        hits += np.isclose(objective(np.flatnonzero(found.mask)), best, rtol=1e-5)
    assert hits > len(seeds) / 2, f"optimum found for {hits} of {len(seeds)} seeds"


def test_history_improves(chunk):
    q, e = chunk
    result = learn_mask(q, e, 300, algorithm="Pair_simi", lamb=0.5, n_epochs=80, refine=0)
    assert result.history.shape == (80,)
    assert result.history[-10:].mean() > result.history[:10].mean()


def test_pruning_never_selects_pruned_rows(chunk):
    q, e = chunk
    result = learn_mask(q, e, 200, prune=0.5, **FAST)
    threshold = np.sort(q)[len(q) // 2]
    assert (q[result.mask] >= threshold).all()
    assert np.isneginf(result.scores[q < threshold]).all()


class MeanNorm(DiversityMetric):
    """A user metric: how far the selection's mean vector is from the origin, inverted."""

    name = "mean_norm"

    def rewards(self, emb, idx, state):
        return 1.0 - emb[idx].mean(1).norm(dim=1)


def test_user_metric_and_weighted_combination(chunk):
    q, e = chunk
    register_metric("mean_norm", MeanNorm)
    single = learn_mask(q, e, 200, algorithm="mean_norm", lamb=0.0, **FAST)
    combined = learn_mask(q, e, 200, algorithm={"mean_norm": 1, "Pair_simi": 3}, lamb=0.0, **FAST)
    assert single.mask.sum() == combined.mask.sum() == 200
    rng = np.random.default_rng(0)
    value = evaluate_selection(q, e, single.mask, algorithm="mean_norm", lamb=0)["objective"]
    random_value = evaluate_selection(q, e, rng.choice(len(q), 200, replace=False),
                                      algorithm="mean_norm", lamb=0)["objective"]
    assert value > random_value
    both = evaluate_selection(q, e, combined.mask, algorithm={"mean_norm": 1, "Pair_simi": 3}, lamb=0)
    assert both["objective"] == pytest.approx(
        0.25 * both["metrics"]["mean_norm"] + 0.75 * both["metrics"]["Pair_simi"])


def test_aliases_are_case_insensitive():
    assert DataMaskOptions(algorithm="disf").metric_weights == (("disf", 1.0),)
    assert DataMaskOptions(algorithm="FACILITY").metric_weights == (("facility", 1.0),)


@pytest.mark.slow
def test_memory_does_not_grow_with_n_squared():
    """100k rows: an n x n float matrix would need 40 GB; the learner must stay far below 2 GB."""
    code = (
        "import numpy as np\n"
        "from datamask_dask.learn.engine import learn_mask\n"
        "rng = np.random.default_rng(0)\n"
        "e = rng.standard_normal((100_000, 16), dtype=np.float32); q = rng.random(100_000)\n"
        "for alg in ('Facility', 'Pair_simi', 'DiSF'):\n"
        "    assert learn_mask(q, e, 10_000, algorithm=alg, n_epochs=5, n_rollout=4,\n"
        "                      refine_epochs=5).mask.sum() == 10_000\n"
        # VmHWM: this process's own peak (ru_maxrss keeps the forking pytest's peak across exec)
        "print(open('/proc/self/status').read().split('VmHWM:')[1].split()[0])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    peak_kib = int(out.stdout.strip().splitlines()[-1])
    assert peak_kib < 2 * 1024 * 1024, f"peak RSS {peak_kib / 1024:.0f} MiB"


# ---- bad input: the project's own error, naming what is wrong and what to do ----

def _good(n=50, d=8):
    return make_embeddings(n, d, seed=0)


@pytest.mark.parametrize("make_bad, match", [
    (lambda q, e: (np.where(np.arange(len(q)) == 3, np.nan, q), e), r"quality .*NaN.* rows \[3\]"),
    (lambda q, e: (np.where(np.arange(len(q)) == 4, np.inf, q), e), r"quality .*infinite.* rows \[4\]"),
    (lambda q, e: (q, np.where(np.arange(len(q))[:, None] == 5, np.nan, e)), r"embeddings .*NaN.*\[5\]"),
    (lambda q, e: (q, np.where(np.arange(len(q))[:, None] == 6, 0.0, e)), r"all-zero .*\[6\]"),
    (lambda q, e: (q, e[:-1]), r"one row per quality score"),
    (lambda q, e: (q, e[:, 0]), r"2-d array"),
    (lambda q, e: (q[:, None], e), r"1-d numeric"),
    (lambda q, e: (q.astype(str), e), r"numeric"),
    (lambda q, e: (q[:0], e[:0]), r"empty"),
])
def test_bad_input(make_bad, match):
    q, e = make_bad(*_good())
    with pytest.raises(InputDataError, match=match):
        learn_mask(q, e, 5, **FAST)


@pytest.mark.parametrize("k", [0, -3, 51, 2.5, True])
def test_bad_quota(k):
    q, e = _good()
    with pytest.raises(OptionError, match="quota k="):
        learn_mask(q, e, k, **FAST)


def test_quota_above_rows_left_after_pruning():
    q, e = _good()
    with pytest.raises(OptionError, match="left after pruning"):
        learn_mask(q, e, 40, prune=0.5, **FAST)


@pytest.mark.parametrize("option, value, match", [
    ("n_rollout", 1, "n_rollout=1"),
    ("algorithm", "kmeans", "algorithm='kmeans' is unknown"),
    ("algorithm", {"Facility": -1}, "weight of 'Facility'"),
    ("partial", 0.0, "partial=0.0"),
    ("lamb", 1.5, "lamb=1.5"),
    ("init", "random", "init='random'"),
    ("update", "sgd", "update='sgd'"),
    ("prune", 1.0, "prune=1.0"),
    ("n_epochs", 0, "n_epochs=0"),
    ("refine", 0.5, "refine=0.5"),
])
def test_bad_option(option, value, match):
    q, e = _good()
    with pytest.raises(OptionError, match=match):
        learn_mask(q, e, 5, **{option: value})


def test_unknown_option_lists_known_ones():
    with pytest.raises(OptionError, match="unknown option.*'n_rollouts'.*known options"):
        DataMaskOptions.from_mapping({"n_rollouts": 4})


def test_errors_are_value_errors():
    assert issubclass(DataMaskError, ValueError)


def test_accepts_tensors_and_normalises_embeddings():
    q, e = _good()
    scaled = torch.tensor(e) * 7.0
    a = learn_mask(torch.tensor(q), scaled, 5, **FAST)
    b = learn_mask(q, e, 5, **FAST)
    np.testing.assert_array_equal(a.mask, b.mask)


def test_row_weights_of_one_change_nothing(chunk):
    q, e = chunk
    plain = learn_mask(q, e, 50, algorithm="Facility", seed=1, **FAST)
    ones = learn_mask(q, e, 50, algorithm="Facility", seed=1, weights=np.ones(len(q)), **FAST)
    assert np.array_equal(plain.mask, ones.mask) and np.array_equal(plain.scores, ones.scores)


@pytest.mark.parametrize("refine_reference", [1_000_000, 256])  # every row represented, or a sample
@pytest.mark.parametrize("refine", [10.0, 1000.0])  # a partial-batch stage then a pool, or the whole chunk
def test_weighted_rows_are_covered_as_the_rows_they_stand_for(refine_reference, refine):
    """Rows standing for many copies draw the Facility selection, so it covers the whole table better."""
    rng = np.random.default_rng(4)
    emb = rng.standard_normal((1200, 16)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    q = rng.random(1200)
    weights = np.where(rng.random(1200) < 0.05, 40.0, 1.0)
    options = dict(algorithm="Facility", lamb=0.0, seed=0, n_rollout=8, n_epochs=30, refine_epochs=30,
                   refine_reference=refine_reference, refine=refine)
    weighted = learn_mask(q, emb, 40, weights=weights, **options).mask
    plain = learn_mask(q, emb, 40, **options).mask
    score = [evaluate_selection(q, emb, m, algorithm="Facility", lamb=0.0, weights=weights)["objective"]
             for m in (weighted, plain)]
    assert weighted.sum() == 40 and score[0] > score[1]


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("sampled", [False, True])  # a reference sample, or every row
def test_facility_measures_two_selections_at_once_as_it_measures_each(weighted, sampled):
    """``evaluate_both`` (the learner's check of its mask against quality top-k) gives each selection
    exactly what ``evaluate`` gives it: disjoint, overlapping, equal and nested selections, sizes
    that are no multiple of the padding."""
    g = torch.Generator().manual_seed(3)
    emb = torch.nn.functional.normalize(torch.randn(3000, 48, generator=g), dim=1)
    rows = torch.randperm(3000, generator=g)
    reference = emb[rows[:700]] if sampled else None
    weights = (1 + 3 * torch.rand(700 if sampled else 3000, generator=g)).double() if weighted else None
    metric = Facility()
    first = rows[:517]
    for second in (rows[517:900], rows[200:701], first.flip(0), rows[3:8]):
        represented = Represented(rows=reference, weights=weights)
        both = metric.evaluate_both(emb, first, second, represented)
        each = tuple(metric.evaluate(emb, s, represented) for s in (first, second))
        assert both == each


@pytest.mark.parametrize("weights", [np.ones(10), np.full(1500, 0.5), np.full(1500, np.nan)])
def test_bad_row_weights(chunk, weights):
    q, e = chunk
    with pytest.raises(InputDataError, match="weights"):
        learn_mask(q, e, 5, weights=weights, **FAST)


def test_a_kernel_asked_for_by_threads_at_once_is_compiled_once():
    """A threaded scheduler's first tasks ask at the same moment; a compile that rebinds a module's
    name to its compiled helper must not run twice (numba refuses to jit a jitted function)."""
    made = []

    @on_first_use
    def kernel():
        made.append(1)
        time.sleep(0.05)  # a compile: long enough for every thread to arrive
        return object()

    start = threading.Barrier(8)
    got = []

    def ask():
        start.wait()
        got.append(kernel())

    workers = [threading.Thread(target=ask) for _ in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert len(made) == 1 and len({id(value) for value in got}) == 1 and len(got) == 8
