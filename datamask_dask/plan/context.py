"""Context: DiSF's pieces learned against the rest of the table (``pieces="context"``).

DiSF scores the correlations between feature dimensions over the selection, each dimension
standardised by the selection's mean and std. A piece learned alone standardises by its own: where
the table's partitions each hold a few topics, it decorrelates what varies inside its topics, while
the union's correlations come mostly from the differences between the topics' means, which no piece
sees; its picks can then score below random ones. And a quota fixed per partition fixes how much of
each topic the union holds, the term DiSF weighs most. So:

1. **Pieces dealt from the table.** The eligible rows, in table order (partition by partition, each
   in position order), are dealt round the pieces like cards (:func:`deal`): every piece is a
   systematic sample of every partition, as large as the next within one row, and the quota is
   shared by the pieces' rows (:func:`dealt_quotas`), not by the partitions' quality. Each piece then
   holds every topic as the table does, and its picks can weigh them as the whole table's would. This
   is RandGreeDi's split (Barbosa et al., 2015), without its randomness: the same rows on any engine.
   Past :data:`STRIP_PIECES` pieces, each strip of every n-th partition (:func:`strips`) is dealt
   round pieces of its own: no partition sends rows to more than its strip's pieces, so the tasks
   that move rows to pieces grow with the table's partitions, not with its partitions times its
   pieces. A strip holds fewer topics than the table where partitions hold a few.
2. **The table's moments.** The plan pass adds up each partition's sums of its unit rows and of their
   squares (:func:`row_moments`), and every piece standardises by the table's mean and std
   (:func:`table_moments`).
3. **A first round.** Every piece learns its quota apart, and each partition returns its picks' sums
   ``sum z``, ``sum z z^T`` of their standardised rows and of their qualities (:class:`Picks`), added
   up one partition after another (:meth:`Context.then`).
4. **A second round.** Every piece learns again against the rest of the table's first picks: the
   whole first round's moment scaled to the rows the rest picks (:func:`rest_of`). A piece's own
   first picks are not subtracted: that would take a matrix per piece to every task.
5. **The share that learns in context** (:func:`best_share`). Every piece moves at once against the
   same correlations: where each piece can cancel nearly all of the first round's correlations, as
   pieces dealt from the whole table can, together they overshoot. Both rounds' sums give, for a
   share ``s`` of the pieces keeping their second picks and the others their first, the union's
   objective in expectation (the sums mix linearly), so the plan takes the best ``s`` and the select
   pass learns each piece as its round did: in context where the piece's seed falls in the share
   (:meth:`Context.against`).

Every step is a pure function of the plan and the rows, added up in partition order, so every engine
and scheduler gets the same sums, share and rows.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ..learn.metrics.disf import TableMoments
from .quotas import allocate

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


STRIP_PIECES = 128  # about the most pieces a partition's rows are dealt to: bounds the tasks moving them


def strips(eligible: list[int], chunk_rows: int) -> list[range]:
    """The strips of partitions (by index into ``eligible``, their eligible rows in table order) whose
    rows are dealt together: the table's pieces over :data:`STRIP_PIECES`, so that a strip is dealt
    round about that many pieces (its rows are its partitions'), and the tasks that move rows to
    pieces grow with the table's partitions, not with its partitions times its pieces. A strip takes
    every n-th partition, so that it spans the table as a whole deal would: where files hold topics
    in order, consecutive ones would not."""
    count = min(len(eligible), math.ceil(piece_count(sum(eligible), chunk_rows) / STRIP_PIECES))
    return [range(first, len(eligible), count) for first in range(count)]


def piece_count(eligible: int, chunk_rows: int) -> int:
    """The pieces ``eligible`` rows are dealt to: as few as keep each within ``chunk_rows`` rows."""
    return max(1, math.ceil(eligible / max(1, chunk_rows)))


def deal(start: int, rows: int, pieces: int) -> np.ndarray:
    """The piece of each of a partition's ``rows`` eligible rows (in position order), dealt on from the
    ``start``-th card (the eligible rows of its strip's partitions before it): int64 (rows,)."""
    return (start + np.arange(rows, dtype=np.int64)) % pieces


def dealt_rows(eligible: int, pieces: int) -> np.ndarray:
    """Each of a strip's pieces' rows when its ``eligible`` rows are dealt to ``pieces``: they differ by
    one row at most."""
    rows = np.full(pieces, eligible // pieces, dtype=np.int64)
    rows[:eligible % pieces] += 1
    return rows


def dealt_quotas(rows: np.ndarray, quota: int) -> np.ndarray:
    """Each dealt piece's share of ``quota`` by its ``rows`` (largest remainder: pieces whose rows differ
    by one at most get quotas that differ by one at most)."""
    return allocate(quota, rows, rows)


SHARES = np.linspace(0.0, 1.0, 21)  # the shares of pieces in context the plan weighs


@dataclass(frozen=True)
class Picks:
    """One round's picks of some partitions (:func:`datamask_dask.partition.select.context_round`): how
    many, the sums of their standardised rows ``sum z`` and of their outer products ``sum z z^T``, the
    sum of their qualities scaled as the learner sees them, and the seconds it took."""

    count: int
    sums: np.ndarray  # (d,) float64
    moment: np.ndarray  # (d, d) float64
    quality: float
    seconds: float

    def __add__(self, other: Picks) -> Picks:
        """Both partitions' picks: added up one partition after another, in partition order, on any engine,
        so that no task holds more than two moments."""
        return Picks(self.count + other.count, self.sums + other.sums, self.moment + other.moment,
                     self.quality + other.quality, self.seconds + other.seconds)

    def objective(self, lamb: float) -> float:
        """The union's objective, as the yardstick scores it: ``lamb`` times its mean quality plus
        ``1 - lamb`` times DiSF of its correlation matrix (standardised by its own mean and std)."""
        mean = self.sums / self.count
        covariance = self.moment / self.count - np.outer(mean, mean)
        variance = np.diagonal(covariance)
        # a dimension constant over the picks carries nothing (its variance is rounding)
        scale = np.where(variance > 1e-12 * variance.max(), np.sqrt(np.abs(variance)), np.inf)
        correlation = covariance / np.outer(scale, scale)
        d = correlation.shape[0]
        off = (correlation**2).sum() - (np.diagonal(correlation) ** 2).sum()
        return lamb * self.quality / self.count + (1 - lamb) * (1.0 - off / (d * (d - 1)))


def picked(rows: np.ndarray, quality: np.ndarray, table: TableMoments, seconds: float) -> Picks:
    """The :class:`Picks` of picked unit ``rows`` with their qualities (scaled as the learner sees them),
    standardised by the table's moments."""
    z = (np.asarray(rows, dtype=np.float64) - table.mean) / table.std
    return Picks(len(z), z.sum(axis=0), z.T @ z, float(np.sum(quality)), seconds)


def mixed(first: Picks, second: Picks, share: float) -> Picks:
    """The expected sums when a ``share`` of the pieces keep their second round's picks."""
    return Picks(first.count, (1 - share) * first.sums + share * second.sums,
                 (1 - share) * first.moment + share * second.moment,
                 (1 - share) * first.quality + share * second.quality, 0.0)


def best_share(first: Picks, second: Picks, lamb: float) -> float:
    """The share of pieces in context (one of :data:`SHARES`) whose expected union scores best; of
    equals, the smallest (the fewest pieces moved)."""
    scores = [mixed(first, second, share).objective(lamb) for share in SHARES]
    return float(SHARES[int(np.argmax(scores))])


@dataclass(frozen=True)
class Context:
    """What the pieces of a DiSF table learn against: the table's moments (``table``), the first round's
    picks once learned, and the share of pieces that learns in context once the second is (its picks
    decide nothing else, so the plan does not carry them)."""

    table: TableMoments
    first: Picks | None = None
    share: float | None = None

    @property
    def pending(self) -> bool:
        """Whether a round is still to be learned before the select pass."""
        return self.share is None

    def against(self, quota: int, seed: int) -> TableMoments:
        """What a piece that selects ``quota`` rows, learned with ``seed`` (uint32), learns against in the
        round to come: in the first, the table's moments alone; in the second, the rest of the
        first round's picks too (:func:`rest_of`); in the select pass, whichever its round chose, in
        context where its seed falls in the :attr:`share`."""
        if self.first is None or (self.share is not None and (seed + 0.5) / 2**32 >= self.share):
            return self.table
        return rest_of(self.table, self.first, quota)

    def then(self, picks: Picks, lamb: float) -> tuple[Context, str]:
        """This context after its next round (``picks``: every partition's :class:`Picks` added up): the
        first round's picks, or after the second, the share that learns in context (:func:`best_share`,
        for ``lamb``). And the round's stage name."""
        if not self.pending:
            raise RuntimeError("Context.then: both rounds are learned; please report this with the run "
                               "record")
        if self.first is None:
            return dataclasses.replace(self, first=picks), "plan first round"
        return dataclasses.replace(self, share=best_share(self.first, picks, lamb)), "plan second round"

    def identity(self) -> list:
        """What decides the rows selected, as plain data."""
        if self.first is None:
            return [None, None, self.share]
        return [self.first.count, hashlib.sha256(self.first.moment.tobytes()).hexdigest(), self.share]


def rest_of(table: TableMoments, first: Picks, quota: int) -> TableMoments:
    """What a piece that selects ``quota`` rows learns against: the first round's moment scaled to the
    rows the rest of the table picks."""
    rest = max(first.count - quota, 0)
    share = rest / first.count if first.count else 0.0
    return dataclasses.replace(table, moment=first.moment * share, count=rest)
