"""The k-NN graph facility location learns on: exact below the threshold, clustered above it."""

from __future__ import annotations

import pytest
import torch

from datamask_dask.learn.knn import top_neighbours
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
def test_clustered_search_finds_most_true_neighbours(probes, least_recall):
    x = _unit_rows(4000)
    t = 16
    generator = torch.Generator().manual_seed(0)
    values, indices = top_neighbours(x[:500], x, t, exact_max=100, cluster_rows=100, probes=probes,
                                     generator=generator)
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
