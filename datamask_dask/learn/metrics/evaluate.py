"""The objective of a selection: quality normalised to [0, 1], plus the weighted diversity metrics.

Every term lies in [0, 1] so that ``lamb`` means what it says:

- quality(U)  = mean over U of the min-max normalised quality score (range of the chunk, or of
  the whole table when the Dask operator passes it);
- diversity(U) = the weighted sum of the metrics (:mod:`.pair_simi`, :mod:`.facility`, :mod:`.disf`
  or a user's).
"""

from __future__ import annotations

import numpy as np
import torch

from ...errors import OptionError
from .base import EVERY_ROW, Represented
from .registry import build_metrics, resolve_metrics

Tensor = torch.Tensor


def normalise_quality(quality: Tensor, quality_range: tuple[float, float] | None = None) -> Tensor:
    """Min-max scale quality to [0, 1] (by the chunk's range unless ``quality_range`` is given)."""
    lo, hi = (float(quality.min()), float(quality.max())) if quality_range is None else quality_range
    if hi <= lo:
        return torch.full_like(quality, 0.5)
    return ((quality - lo) / (hi - lo)).clamp_(0, 1)


def weighted_diversity(metrics, emb: Tensor, selected: Tensor, reference: Tensor | None = None,
                       weights: Tensor | None = None) -> tuple[float, dict[str, float]]:
    """The diversity term of one selection: the weighted sum over ``metrics`` (pairs as
    :func:`build_metrics` gives them) and each metric's value by name. Metrics that use a
    reference represent the rows ``reference`` (m x d) when it is given, else every row of ``emb``,
    each weighted by ``weights`` (one per represented row) when given."""
    represented = Represented(rows=reference, weights=weights)
    values, total = {}, 0.0
    for metric, weight in metrics:
        told = represented if metric.uses_reference else EVERY_ROW
        values[metric.name] = metric.evaluate(emb, selected, told)
        total += weight * values[metric.name]
    return total, values


def weighted_diversity_both(metrics, emb: Tensor, first: Tensor, second: Tensor,
                            reference: Tensor | None = None,
                            weights: Tensor | None = None) -> tuple[float, float]:
    """:func:`weighted_diversity`'s total for two selections; metrics with an ``evaluate_both``
    (:meth:`Facility.evaluate_both`) measure both at once."""
    totals = [0.0, 0.0]
    for metric, weight in metrics:
        if hasattr(metric, "evaluate_both"):
            values = metric.evaluate_both(emb, first, second, Represented(rows=reference, weights=weights))
        else:
            values = [weighted_diversity([(metric, 1.0)], emb, rows, reference, weights)[0]
                      for rows in (first, second)]
        totals = [total + weight * value for total, value in zip(totals, values, strict=True)]
    return totals[0], totals[1]


def evaluate_selection(quality, embeddings, selected, *, algorithm="Pair_simi", lamb: float = 0.5,
                       quality_range=None, device="cpu", reference=None, weights=None) -> dict:
    """Objective of any selection, on the whole chunk (for Facility the reference set is every row,
    or the ``reference`` rows).

    Parameters
    ----------
    quality : array-like (n,)
    embeddings : array-like (n, d), rows L2-normalised
    selected : array-like of bool (n,) or of int indices
    algorithm, lamb, quality_range
        As for the learner.
    reference : array-like of int, optional
        Rows of ``embeddings`` that Facility represents instead of every row: on a uniform sample
        drawn independently of the selection, an unbiased estimate of the whole chunk's term at
        a fraction of its cost.
    weights : array-like (n,) of float > 0, optional
        How many rows each row stands for (one per row of ``embeddings``): Facility's mean over the
        represented rows is then weighted (the objective of a table whose near-copies were set
        aside, on its kept rows). Quality and the other metrics are unchanged.

    Returns
    -------
    dict
        ``objective`` (lamb * quality + (1 - lamb) * diversity), ``quality``, ``diversity`` and
        each metric's value under ``metrics``.
    """
    q = torch.as_tensor(np.asarray(quality), dtype=torch.float32, device=device)
    emb = torch.as_tensor(np.asarray(embeddings), dtype=torch.float32, device=device)
    sel = torch.as_tensor(np.asarray(selected), device=device)
    if sel.dtype == torch.bool:
        sel = sel.nonzero().flatten()
    sel = sel.long()
    if sel.numel() == 0:
        raise OptionError("selected is empty: evaluate a selection of at least one row")
    rows, row_weights = None, None
    if weights is not None:
        row_weights = torch.as_tensor(np.asarray(weights, dtype=np.float64), device=device)
        if row_weights.shape != q.shape or not bool((row_weights > 0).all()):
            raise OptionError(f"weights must hold one number > 0 per row ({q.shape[0]}), got shape "
                              f"{tuple(row_weights.shape)}")
    if reference is not None:
        reference = torch.as_tensor(np.asarray(reference), device=device).long()
        rows = emb[reference]
        row_weights = None if row_weights is None else row_weights[reference]
    diversity, metrics = weighted_diversity(build_metrics(resolve_metrics(algorithm)), emb, sel, rows,
                                            row_weights)
    qual = float(normalise_quality(q, quality_range)[sel].mean())
    return {"objective": lamb * qual + (1 - lamb) * diversity, "quality": qual,
            "diversity": diversity, "metrics": metrics}
