"""The k-NN graph facility location learns on: exact below the threshold, clustered above it."""

from __future__ import annotations

import pytest
import torch

from datamask_dask.learn import knn
from datamask_dask.learn.knn import _nearest, top_neighbours
from datamask_dask.sample_data import make_embeddings


def _unit_rows(n, seed=0):
    _, emb = make_embeddings(n, 32, n_clusters=40, seed=seed)
    return torch.as_tensor(emb, dtype=torch.float32)


def test_exact_search_is_the_brute_force_top_k():
    x = _unit_rows(600)
    values, indices = top_neighbours(x[:100], x, 8, exact_max=10_000)
    brute = (x[:100] @ x.T).topk(8, dim=1)
    torch.testing.assert_close(values, brute.values)
    torch.testing.assert_close(torch.gather(x[:100] @ x.T, 1, indices), brute.values)


@pytest.mark.parametrize("probes, least_recall", [(1, 0.75), (4, 0.9)])
@pytest.mark.parametrize("itself", [False, True], ids=["sample", "itself"])
def test_clustered_search_finds_most_true_neighbours(probes, least_recall, itself):
    x = _unit_rows(4000)
    t = 16
    generator = torch.Generator().manual_seed(0)
    values, indices = top_neighbours(x if itself else x[:500], x, t, exact_max=100, cluster_rows=100,
                                     probes=probes, generator=generator)
    values, indices = values[:500], indices[:500]
    truth = (x[:500] @ x.T).topk(t, dim=1).indices
    shared = sum(len(set(a.tolist()) & set(b.tolist())) for a, b in zip(indices, truth, strict=True))
    recall = shared / truth.numel()
    assert recall > least_recall, recall
    # the values are the true similarities of the rows returned, best first, no row twice
    found = values > -torch.inf
    torch.testing.assert_close(values[found], torch.gather(x[:500] @ x.T, 1, indices)[found])
    assert (values[:, :-1] >= values[:, 1:]).all()
    for row, mask in zip(indices, found, strict=True):
        assert len(set(row[mask].tolist())) == int(mask.sum())


def test_clustered_search_is_deterministic_for_a_seed():
    x = _unit_rows(3000, seed=1)
    runs = [top_neighbours(x[:200], x, 8, exact_max=100, generator=torch.Generator().manual_seed(7))
            for _ in range(2)]
    assert torch.equal(runs[0][1], runs[1][1])


def test_clustered_search_of_a_table_with_itself_trains_on_a_sample_and_keeps_its_recall(monkeypatch):
    """Enough clusters that k-means trains on a sample of the rows: it finds about as many true
    neighbours as k-means on every row, and every row is still searched (each finds itself)."""
    x = _unit_rows(30_000)
    truth = (x[:500] @ x.T).topk(16, dim=1).indices

    def search():
        values, indices = top_neighbours(x, x, 16, exact_max=100, cluster_rows=200,
                                         generator=torch.Generator().manual_seed(3))
        assert (indices[:, 0] == torch.arange(30_000)).all() and (values[:, 0] > 0.99).all()
        found = zip(indices[:500].tolist(), truth.tolist(), strict=True)
        return indices, sum(len(set(a) & set(b)) for a, b in found) / truth.numel()

    sampled, recall = search()
    assert torch.equal(sampled, search()[0])  # deterministic for a seed
    monkeypatch.setattr(knn, "_TRAIN_ROWS", 10**9)  # every row
    assert recall > search()[1] - 0.02 and recall > 0.7, recall


def test_equal_similarities_probe_the_lower_centroid_first():
    """bfloat16 similarities tie often: a row's own cluster is the one ``max`` would pick."""
    x = _unit_rows(300)
    centroids = torch.cat([x[:2], x[:2]])  # centroids 2 and 3 repeat 0 and 1
    nearest = _nearest(x, centroids, 3)
    assert torch.equal(nearest[:, 0], _nearest(x, centroids, 1)[:, 0])
    assert (nearest[:, 0] < 2).all() and torch.equal(nearest[:, 1], nearest[:, 0] + 2)
    assert nearest[0].tolist() == [0, 2, 1]
