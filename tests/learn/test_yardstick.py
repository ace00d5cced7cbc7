"""The yardstick: a selection's share of the baseline's gain over random."""

import numpy as np
import pytest

from datamask_dask.config import METRIC_DEFAULTS
from datamask_dask.learn.baselines import (
    graph_lazy_greedy,
    lazy_greedy,
    quality_topk,
    random_selection,
    stochastic_greedy,
)
from datamask_dask.learn.engine import learn_mask
from datamask_dask.learn.metrics import evaluate_selection
from datamask_dask.learn.yardstick import measure, term_shares
from datamask_dask.sample_data import make_embeddings


@pytest.fixture(scope="module")
def corpus():
    return make_embeddings(3000, 32, n_clusters=40, seed=3)


def _mask(n, rows):
    mask = np.zeros(n, dtype=bool)
    mask[rows] = True
    return mask


@pytest.mark.parametrize("algorithm", ["Pair_simi", "Facility"])
def test_the_baseline_scores_one_and_random_scores_near_zero(corpus, algorithm):
    q, e = corpus
    k = 300
    greedy = measure(q, e, _mask(len(q), lazy_greedy(q, e, k, algorithm=algorithm, lamb=0.0)),
                     algorithm=algorithm, lamb=0.0)
    assert greedy.baseline_name == "lazy greedy" and greedy.share == pytest.approx(1.0)
    drawn = measure(q, e, _mask(len(q), random_selection(q, e, k, seed=7)), algorithm=algorithm, lamb=0.0)
    assert abs(drawn.share) < 0.2 and drawn.random < drawn.baseline


def test_a_learned_selection_is_measured_against_quality_topk(corpus):
    q, e = corpus
    learned = learn_mask(q, e, 300, algorithm="Facility", lamb=0.5).mask
    score = measure(q, e, learned, algorithm="Facility", lamb=0.5)
    assert score.objective == pytest.approx(
        evaluate_selection(q, e, learned, algorithm="Facility", lamb=0.5)["objective"])
    top = evaluate_selection(q, e, quality_topk(q, e, 300), algorithm="Facility", lamb=0.5)["objective"]
    assert score.topk == pytest.approx(top) and score.over_topk == pytest.approx(score.objective - top)
    assert score.share > score.topk_share and score.share > 0.9


def test_above_the_greedy_size_the_baseline_is_stochastic_greedy(corpus):
    q, e = corpus
    pick = _mask(len(q), stochastic_greedy(q, e, 300, algorithm="Pair_simi", lamb=0.0))
    score = measure(q, e, pick, algorithm="Pair_simi", lamb=0.0, greedy_max_work=1e6)
    assert score.baseline_name == "stochastic greedy" and score.share == pytest.approx(1.0, abs=0.01)


@pytest.mark.parametrize("lamb", [0.0, 0.5])
def test_above_the_greedy_size_facility_is_measured_against_lazy_greedy_on_its_graph(corpus, lamb):
    """Stochastic greedy on a reference sample falls far below lazy greedy at k near the sample's
    size; lazy greedy on the k-NN graph does not, so it is Facility's baseline where the dense one
    does not run."""
    q, e = corpus
    k = 300
    dense = measure(q, e, _mask(len(q), lazy_greedy(q, e, k, algorithm="Facility", lamb=lamb)),
                    algorithm="Facility", lamb=lamb)
    graph_pick = _mask(len(q), graph_lazy_greedy(q, e, k, lamb=lamb))
    assert graph_pick.sum() == k
    graph = measure(q, e, graph_pick, algorithm="Facility", lamb=lamb)
    assert graph.share > 0.99  # against dense lazy greedy
    above = measure(q, e, graph_pick, algorithm="Facility", lamb=lamb, greedy_max_work=1e6)
    assert above.baseline_name == "lazy greedy (k-NN graph)" and above.share == pytest.approx(1.0)
    assert above.baseline > dense.baseline - 0.01 * (dense.baseline - dense.random)
    sampled = measure(q, e, _mask(len(q), stochastic_greedy(q, e, k, algorithm="Facility", lamb=lamb, seed=1,
                                                           max_memory_bytes=0, reference_size=k)),
                      algorithm="Facility", lamb=lamb)
    assert sampled.share < graph.share


def test_the_evaluation_sample_is_drawn_apart_from_the_random_picks(corpus):
    """Facility's reference sample and a random pick of its size, drawn from one stream, would be the
    same rows: that pick covers the sample perfectly and lifts random above greedy."""
    q, e = corpus
    k = 300
    pick = _mask(len(q), lazy_greedy(q, e, k, algorithm="Facility", lamb=0.0))
    score = measure(q, e, pick, algorithm="Facility", lamb=0.0, reference_rows=k)
    assert score.random < score.baseline and score.share > 0.9


def test_greedy_on_a_reference_sample_does_not_chase_the_sampled_rows(corpus):
    """A sampled reference row covering itself would be worth n / |V| times any other row."""
    q, e = corpus
    k, size = 300, 500
    pick = lazy_greedy(q, e, k, algorithm="Facility", lamb=0.0, reference_size=size, seed=0)
    import torch

    sampled = torch.randperm(len(q), generator=torch.Generator().manual_seed(0))[:size].numpy()
    share_sampled = np.isin(pick, sampled).mean()
    assert share_sampled < 3 * size / len(q)  # about the sample's share of the rows, not most of the pick


@pytest.mark.parametrize("algorithm", ["Pair_simi", "Facility"])
def test_a_gain_scaled_lamb_trades_quality_for_diversity_where_the_paper_scale_hardly_does(corpus, algorithm):
    """Quality's spread dwarfs diversity's, so at lamb 0.5 the paper's scale is mostly quality."""
    q, e = corpus
    masks = [learn_mask(q, e, 300, algorithm=algorithm, lamb=0.5, lamb_scale=scale).mask
             for scale in ("paper", "gain")]
    paper, gain = term_shares(q, e, masks, algorithm=algorithm)
    assert gain.diversity > paper.diversity + 0.1 and gain.quality < paper.quality
    assert 0.2 < gain.quality < 1 and 0.2 < gain.diversity < 1  # neither term left out


@pytest.mark.slow
def test_facility_on_an_approximate_graph_keeps_most_of_greedys_gain():
    """Each row's gain counts above the floor of its last listed neighbour: a single probe of the
    clustered k-NN search misses neighbours, and counting from 0 would overrate covering their rows."""
    q, e = make_embeddings(4000, 64, n_clusters=60, seed=3)
    operator = {k: v for k, v in METRIC_DEFAULTS["Facility"].items() if k in ("refine_epochs", "refine_lr")}
    mask = learn_mask(q, e, 400, algorithm="Facility", lamb=0.0, exact_neighbours=0, probes=1,
                      precision="float32", **operator).mask
    assert measure(q, e, mask, algorithm="Facility", lamb=0.0).share > 0.952  # counted from 0 it scores less
