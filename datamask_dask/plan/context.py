"""Context: DiSF's pieces learned against the rest of the table (``pieces="context"``).

DiSF scores the correlations between feature dimensions over the selection, each dimension
standardised by the selection's mean and std. A piece learned alone standardises by its own: where
the table's partitions each hold a few topics, it decorrelates what varies inside its topics, while
the union's correlations come mostly from the differences between the topics' means, which no piece
sees; its picks can then score below random ones. So:

1. **The table's moments.** The plan pass adds up each partition's sums of its unit rows and of their
   squares (:func:`row_moments`), and every piece standardises by the table's mean and std
   (:func:`table_moments`).
2. **A first round.** Every piece learns its quota apart, as with ``pieces="partitions"``, and each
   partition returns the second moment ``sum z z^T`` of its picks' standardised rows
   (:func:`picks_moment`), added up one partition after another (:class:`FirstPicks`,
   :func:`with_first_round`).
3. **The second round** is the select pass: each piece learns again against the rest of the table's
   first picks, the whole first round's moment scaled to the rows the rest picks (the table's picks
   less its own quota, :func:`rest_of`). A piece's own first picks are not subtracted: that would
   take a matrix per piece to every task, and the scaled sum comes close to it in the benchmarks.

Every step is a pure function of the plan and the rows, added up in partition order, so every engine
and scheduler gets the same moments and rows.

It pays where the partitions hold a few topics each. On a table split at random into many pieces the
first round's union is decorrelated but for small random correlations, which every piece then
pushes against at once: together they overshoot. ``pieces="auto"`` therefore keeps DiSF's partitions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ..learn.metrics.disf import TableMoments
from .types import Plan

BLOCK = 8192  # rows whose moments are taken at once


def row_moments(blocks: Iterable[np.ndarray]) -> np.ndarray:
    """The sums of a partition's unit rows and of their squares, ``(2, d)`` float64, from its embedding
    rows in ``blocks`` of at most :data:`BLOCK` rows, in order."""
    out = None
    for rows in blocks:
        block = np.asarray(rows, dtype=np.float64)
        block /= np.linalg.norm(block, axis=1, keepdims=True)
        sums = np.stack([block.sum(axis=0), (block * block).sum(axis=0)])
        out = sums if out is None else out + sums
    if out is None:
        raise RuntimeError("row_moments: no rows; please report this with the run record")
    return out


def table_moments(moments: list[np.ndarray | None], rows: list[int]) -> TableMoments:
    """The table's mean and std from its partitions' :func:`row_moments` (in partition order; None: a
    partition without rows). A constant dimension's std is 1: it carries nothing."""
    found = [(m, n) for m, n in zip(moments, rows, strict=True) if m is not None and n]
    total = sum(n for _, n in found)
    sums = np.sum([m for m, _ in found], axis=0)
    mean = sums[0] / total
    std = np.sqrt(np.maximum(sums[1] / total - mean * mean, 0.0))
    return TableMoments(mean, np.where(std > 1e-12, std, 1.0))


def picks_moment(embeddings: np.ndarray, context: TableMoments) -> np.ndarray:
    """``sum z z^T`` (float64, ``(d, d)``) of picked unit rows, standardised by the table's moments."""
    z = (np.asarray(embeddings, dtype=np.float64) - context.mean) / context.std
    return z.T @ z


@dataclass(frozen=True)
class FirstPicks:
    """The first round's picks of some partitions (:func:`datamask_dask.partition.select.first_round`):
    how many, the second moment ``sum z z^T`` of their standardised rows, and the seconds it took."""

    count: int
    moment: np.ndarray  # (d, d) float64
    seconds: float

    def __add__(self, other: FirstPicks) -> FirstPicks:
        """Both partitions' picks: added up one partition after another, in partition order, on any engine,
        so that no task holds more than two moments."""
        return FirstPicks(self.count + other.count, self.moment + other.moment, self.seconds + other.seconds)


def with_first_round(plan: Plan, picks: FirstPicks) -> Plan:
    """``plan`` with its context's first round: every partition's :class:`FirstPicks` added up."""
    if plan.context is None:
        raise RuntimeError("with_first_round: the plan has no context; please report this with the run "
                           "record")
    stages = {**plan.stages, "plan first round": plan.stages.get("plan first round", 0.0) + picks.seconds}
    return dataclasses.replace(plan, context=dataclasses.replace(plan.context, moment=picks.moment,
                                                                 count=picks.count), stages=stages)


def rest_of(context: TableMoments, quota: int) -> TableMoments:
    """What a piece that selects ``quota`` rows learns against: the first round's moment scaled to the
    rows the rest of the table picks."""
    rest = max(context.count - quota, 0)
    share = rest / context.count if context.count else 0.0
    return dataclasses.replace(context, moment=None if context.moment is None else context.moment * share,
                               count=rest)
