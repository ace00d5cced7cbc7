"""Nearest neighbours by cosine similarity: the sparse graph facility location learns on.

Exact search compares every reference row with every candidate: O(m n d) work and an m x n
top-k, which dominates facility location on large chunks. Above ``exact_max`` candidates the
search is approximate, as large-scale facility location does it (an inverted-file index, like
FAISS's IVF): spherical k-means cuts the candidates into clusters of about ``cluster_rows``
rows, and each reference row is compared only with the members of its ``probes`` most similar
clusters. Work per row is then O((c + probes * cluster_rows) d) for c clusters instead of
O(n d); a candidate's true nearest neighbours sit in the clusters nearest to it, and the
facility objective only needs the nearest few.
"""

from __future__ import annotations

import math

import torch

Tensor = torch.Tensor
_BLOCK_ROWS = 4096  # rows compared at once (bounds the similarity block's memory)
_ALIGN = 64  # matrix products run on row counts rounded up to a multiple of this (see _similarities)


def top_neighbours(reference: Tensor, candidates: Tensor, t: int, *, dtype: torch.dtype = torch.float32,
                   generator: torch.Generator | None = None, exact_max: int = 8192, cluster_rows: int = 256,
                   probes: int = 2, iterations: int = 3) -> tuple[Tensor, Tensor]:
    """The ``t`` of the ``candidates`` (n, d) most similar to each ``reference`` row (m, d), all unit
    vectors: their similarities (float32, best first; ``-inf`` where fewer than ``t`` candidates were
    searched) and candidate rows (0 where the value is ``-inf``), each (m, t).

    ``dtype`` is the precision of the similarity products (bfloat16 is plenty to rank neighbours).
    Above ``exact_max`` candidates the search is approximate: ``generator`` seeds its k-means of
    ``iterations`` iterations into clusters of about ``cluster_rows`` rows, of which ``probes`` are
    searched per reference row.
    """
    n = candidates.shape[0]
    t = min(t, n)
    low_candidates = candidates.to(dtype)
    low_reference = low_candidates if reference is candidates else reference.to(dtype)
    if n <= exact_max:
        return _exact(low_reference, low_candidates, t)
    n_clusters = math.ceil(n / cluster_rows)
    centroids = _spherical_kmeans(low_candidates, candidates, n_clusters, iterations, generator)
    membership = _nearest(low_candidates, centroids, 1)[:, 0]  # (n,)
    if low_reference is low_candidates and probes == 1:  # each row probes its own cluster
        probed = membership[:, None]
    else:
        probed = _nearest(low_reference, centroids, min(probes, n_clusters))  # (m, p)
    m, p = probed.shape
    values = torch.full((m, p, t), -math.inf, device=reference.device)
    indices = torch.zeros((m, p, t), dtype=torch.long, device=reference.device)
    # each cluster's members, and the flat (row, slot) positions that probe it
    members_by_cluster = torch.argsort(membership).split(
        torch.bincount(membership, minlength=n_clusters).tolist())
    asking_by_cluster = torch.argsort(probed.flatten()).split(
        torch.bincount(probed.flatten(), minlength=n_clusters).tolist())
    for members, asking in zip(members_by_cluster, asking_by_cluster, strict=True):
        if members.numel() == 0 or asking.numel() == 0:
            continue
        rows, slots = asking // p, asking % p
        found = min(t, members.numel())
        # With one probe these are the final neighbours (sorted); else the merge below sorts.
        products = _similarities(aligned_rows(low_reference, rows), aligned_rows(low_candidates, members),
                                 rows.numel(), members.numel())
        top = products.topk(found, dim=1, sorted=p == 1)
        values[rows, slots, :found] = top.values.float()
        indices[rows, slots, :found] = members[top.indices]
    if p == 1:
        return values[:, 0], indices[:, 0]
    best = values.view(m, p * t).topk(t, dim=1)
    return best.values, indices.view(m, p * t).gather(1, best.indices)


def _similarities(left: Tensor, right: Tensor, n_rows: int, n_columns: int) -> Tensor:
    """``left @ right.T`` for operands padded by :func:`aligned_rows`: the first ``n_rows`` rows,
    with the padded columns (from ``n_columns`` on) at ``-inf`` so they never rank.

    CPU matrix kernels (oneDNN's bfloat16 ones above all) are generated and cached per shape,
    and run several times faster on aligned ones; padding also keeps the shapes few (odd shapes
    are far slower, and their cached kernels grow the worker's memory with every chunk).
    """
    products = left @ right.T
    products[:, n_columns:] = -math.inf
    return products[:n_rows]


def aligned_rows(x: Tensor, rows: Tensor | None = None) -> Tensor:
    """``x[rows]`` (all rows where None) with the row count rounded up to a multiple of ``_ALIGN``."""
    missing = -(x.shape[0] if rows is None else rows.numel()) % _ALIGN
    if rows is not None:  # pad the index (with any row), so the gather is the only copy
        return x[torch.cat([rows, rows.new_zeros(missing)]) if missing else rows]
    return torch.nn.functional.pad(x, (0, 0, 0, missing)) if missing else x


def _blocks(x: Tensor, right: Tensor):
    """``x @ right.T`` block by block (``_BLOCK_ROWS`` rows of ``x`` at a time), on aligned shapes."""
    aligned = aligned_rows(right)  # once for every block
    for start in range(0, x.shape[0], _BLOCK_ROWS):
        block = x[start:start + _BLOCK_ROWS]
        yield _similarities(aligned_rows(block), aligned, block.shape[0], right.shape[0])


def _exact(reference: Tensor, candidates: Tensor, t: int) -> tuple[Tensor, Tensor]:
    values, indices = [], []
    for products in _blocks(reference, candidates):
        top = products.topk(t, dim=1)
        values.append(top.values.float())
        indices.append(top.indices)
    return torch.cat(values), torch.cat(indices)


def _nearest(x: Tensor, centroids: Tensor, k: int) -> Tensor:
    """Indices of the ``k`` centroids most similar to each row of ``x``, (rows, k)."""
    # For one centroid a max pass (faster on CPU than argmax, and than top-k, which sorts)
    return torch.cat([block.max(1, keepdim=True).indices if k == 1 else block.topk(k, dim=1).indices
                      for block in _blocks(x, centroids)])


def _spherical_kmeans(x: Tensor, x_full: Tensor, k: int, iterations: int,
                      generator: torch.Generator | None) -> Tensor:
    """``k`` unit centroids of the unit rows ``x`` (``x_full``: the same rows in float32)."""
    start = torch.randperm(x.shape[0], generator=generator, device=x.device)[:k]
    centroids = x_full[start].float()
    for _ in range(iterations):
        nearest = _nearest(x, centroids.to(x.dtype), 1)[:, 0]
        sums = torch.zeros_like(centroids).index_add_(0, nearest, x_full.float())
        norms = sums.norm(dim=1, keepdim=True)
        # An empty cluster keeps its centroid: it is one of the rows, so it is never far from data.
        centroids = torch.where(norms > 0, sums / norms.clamp(min=1e-12), centroids)
    return centroids.to(x.dtype)
