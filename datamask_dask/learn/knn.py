"""Nearest neighbours by cosine similarity: the sparse graph facility location learns on.

Exact search compares every reference row with every candidate: O(m n d) work and an m x n
top-k, which dominates facility location on large chunks. Above ``exact_max`` candidates the
search is approximate, as large-scale facility location does it (an inverted-file index, like
FAISS's IVF): spherical k-means, trained on a sample of the candidates, cuts them into clusters
of about ``cluster_rows`` rows, and each reference row is compared only with the members of its
``probes`` most similar clusters. Work per row is then O((c + probes * cluster_rows) d) for c
clusters instead of O(n d); a candidate's true nearest neighbours sit in the clusters nearest to
it, and the facility objective only needs the nearest few.
"""

from __future__ import annotations

import math

import torch

from .sums import add_at_rows

Tensor = torch.Tensor
_BLOCK_ROWS = 4096  # rows compared at once (bounds the similarity block's memory)
SEARCH_PRODUCTS = 1 << 24  # similarities held at once in the search (bounds their memory)
_TRAIN_ROWS = 64  # k-means sample rows per centroid (FAISS trains IVF on 39 to 256)
_TRAIN_MIN = 1 << 14  # and at least this many: small samples place few centroids worse
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
    probes = min(probes, n_clusters)
    if low_reference is low_candidates:  # a row's own cluster is its nearest probe: one pass
        probed = _nearest(low_candidates, centroids, probes)  # (m, p)
        membership = probed[:, 0]
    else:
        membership = _nearest(low_candidates, centroids, 1)[:, 0]  # (n,)
        probed = _nearest(low_reference, centroids, probes)
    m, p = probed.shape
    members_by_cluster = torch.argsort(membership, stable=True).split(
        torch.bincount(membership, minlength=n_clusters).tolist())
    # (row, slot) pairs in the order of the cluster they probe: each cluster fills one slice of the
    # buffers, reordered once at the end (scattered writes cluster by cluster cost more than that).
    asking = torch.argsort(probed.flatten(), stable=True)
    counts = torch.bincount(probed.flatten(), minlength=n_clusters).tolist()
    # (in the products' precision and int32 rows: half the memory of float32 and int64)
    values = torch.full((m * p, t), -math.inf, dtype=dtype, device=reference.device)
    indices = torch.zeros((m * p, t), dtype=torch.int32, device=reference.device)
    first = 0
    for members, count in zip(members_by_cluster, counts, strict=True):
        if members.numel() and count:
            found = min(t, members.numel())
            aligned = aligned_rows(low_candidates, members)
            step = max(_ALIGN, SEARCH_PRODUCTS // aligned.shape[0] // _ALIGN * _ALIGN)  # rows at once
            for block in range(first, first + count, step):
                rows = asking[block:min(block + step, first + count)]
                products = _similarities(aligned_rows(low_reference, rows // p), aligned, rows.numel(),
                                         members.numel())
                # With one probe these are the final neighbours (sorted); else the merge below sorts.
                top = products.topk(found, dim=1, sorted=p == 1)
                values[block:block + rows.numel(), :found] = top.values
                indices[block:block + rows.numel(), :found] = members[top.indices]
        first += count
    values = torch.empty_like(values).index_copy_(0, asking, values).view(m, p * t)  # back to row order
    indices = torch.empty_like(indices).index_copy_(0, asking, indices).view(m, p * t)
    if p > 1:
        best = values.topk(t, dim=1)
        values, indices = best.values, indices.gather(1, best.indices)
    return values.float(), indices.long()


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
        return x.index_select(0, torch.cat([rows, rows.new_zeros(missing)]) if missing else rows)
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
    """Indices of the ``k`` centroids most similar to each row of ``x``, (rows, k); equal similarities
    (frequent in bfloat16) rank the lower index first, as ``max`` does."""
    # For one centroid a max pass (faster on CPU than argmax, and than top-k, which sorts)
    return torch.cat([block.max(1, keepdim=True).indices if k == 1 else _ranked(block.topk(k, dim=1))
                      for block in _blocks(x, centroids)])


def _ranked(top) -> Tensor:
    """The indices of a ``topk`` result, best first and equal values in index order."""
    indices, by_index = top.indices.sort(dim=1)
    values = top.values.gather(1, by_index)
    return indices.gather(1, values.argsort(dim=1, descending=True, stable=True))


def _spherical_kmeans(x: Tensor, x_full: Tensor, k: int, iterations: int,
                      generator: torch.Generator | None) -> Tensor:
    """``k`` unit centroids of the unit rows ``x`` (``x_full``: the same rows in float32)."""
    # Trained on a random sample: centroids need a few dozen rows each, not every row.
    rows = max(k * _TRAIN_ROWS, _TRAIN_MIN)
    sample = torch.randperm(x.shape[0], generator=generator, device=x.device)[:rows]
    x, x_full = x.index_select(0, sample), x_full.index_select(0, sample).float()
    centroids = x_full[:k]  # the sample's first rows seed them
    for _ in range(iterations):
        nearest = _nearest(x, centroids.to(x.dtype), 1)[:, 0]
        sums = add_at_rows(torch.zeros_like(centroids), nearest, x_full)
        norms = sums.norm(dim=1, keepdim=True)
        # An empty cluster keeps its centroid: it is one of the rows, so it is never far from data.
        centroids = torch.where(norms > 0, sums / norms.clamp(min=1e-12), centroids)
    return centroids.to(x.dtype)
