"""Global quota planning: how many rows (or tokens) each partition selects, so the total is exact.

The plan, per group (the whole table when there is no ``by``)
--------------------------------------------------------------
Partitions are not assumed to be random samples (a table is often partitioned by date or
source), so a partition's share must follow where the good rows are, not its size:

1. **Sketch.** Each partition summarises its quality column as at most ``SKETCH_BINS`` bins of
   equal row count, sorted best first (bin mean quality, rows, tokens). A partition with fewer
   rows than that keeps one bin per row, so the plan below is then exact.
2. **Eligibility (``prune``).** The table-wide best ``E = N - floor(prune * N)`` rows are eligible:
   the merged sketches are walked best first (ties: lower partition first) and each partition's
   part of the top ``E`` is integerised by largest remainder (so the counts add up to ``E``
   exactly). Inside a partition the eligible rows are then its top ``e_p`` rows by quality: a
   global quality threshold, made exact in count.
3. **Quotas.** ``K = round(ratio * N)`` rows are shared out in proportion to each partition's
   part of the *candidate pool*, the table-wide quality top ``M = min(E, ceil(oversample * K))``
   rows. This is the partition's *quality mass*: with ``oversample = 1`` the quotas are exactly
   what a global quality top-K would take from each partition; as ``oversample`` grows they tend
   to the eligible counts (the right answer for random partitions). The default, 2, leaves the
   learner room to trade quality for diversity inside a partition while a partition of poor rows
   gets few or none. For partitions that are random samples every ``oversample`` gives quotas
   proportional to size, as it should. Quotas are integerised by largest remainder, capped by
   each partition's eligible count, and add up to ``K`` exactly.
4. **Token budgets.** With a budget ``B`` the same walk runs on token mass: the pool is the
   best rows holding ``min(eligible tokens, oversample * B)`` tokens, each partition's budget is
   ``B`` shared in proportion to its pool tokens (integer tokens, largest remainder, capped by its
   eligible tokens), and its row quota is that budget divided by the mean tokens of its pool rows.
   The operator then trims or fills inside the partition so that its tokens never exceed its
   budget (see :func:`fit_budget`); the table total therefore never exceeds ``B``.

Inside a partition the same rules split a cell into chunks of at most ``max_chunk_rows`` rows
(:func:`split_quota`, :func:`split_budget`), with exact per-row sketches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

SKETCH_BINS = 2048  # bins per partition sketch: rows beyond this are summarised, not listed


@dataclass(frozen=True)
class Sketch:
    """Quality summary of one cell (the rows of one group in one partition), best first."""

    value: np.ndarray  # float64 (b,): mean quality of each bin, non-increasing
    rows: np.ndarray  # int64 (b,): rows in each bin (all 1 when the cell has at most SKETCH_BINS rows)
    tokens: np.ndarray  # float64 (b,): tokens in each bin (``rows`` when no token column is used)

    @property
    def n_rows(self) -> int:
        return int(self.rows.sum())


def make_sketch(quality: np.ndarray, tokens: np.ndarray | None = None, bins: int = SKETCH_BINS) -> Sketch:
    """Summarise a cell's finite quality (and tokens: one a row when omitted) as at most ``bins``
    equal-count bins, best first; a cell of at most ``bins`` rows keeps one bin per row (exact)."""
    quality = np.asarray(quality, dtype=np.float64)
    tokens = np.ones_like(quality) if tokens is None else np.asarray(tokens, dtype=np.float64)
    order = np.argsort(-quality, kind="stable")  # ties keep row order, as in the partition
    q, t = quality[order], tokens[order]
    n = q.shape[0]
    if n <= bins:
        return Sketch(q, np.ones(n, dtype=np.int64), t)
    starts = np.linspace(0, n, bins + 1).round().astype(np.int64)[:-1]
    counts = np.diff(np.append(starts, n))
    return Sketch(np.add.reduceat(q, starts) / counts, counts, np.add.reduceat(t, starts))


def take_top(sketches: list[Sketch], amount: float, mass: str = "rows") -> tuple[np.ndarray, np.ndarray]:
    """Rows and tokens each cell contributes to the table-wide best ``amount`` of ``mass``.

    The cells' bins are merged best first (ties: earlier cell, then earlier bin) and taken until
    ``amount`` rows (``mass="rows"``) or tokens (``mass="tokens"``) are reached; the bin that
    crosses the line is taken in part, pro rata.

    Returns the fractional rows and tokens taken from each cell, float (n_cells,) each: the
    ``mass`` sums to ``amount``, or to all the cells hold where ``amount`` exceeds it.
    """
    n_cells = len(sketches)
    if n_cells == 0:
        return np.zeros(0), np.zeros(0)
    value = np.concatenate([s.value for s in sketches])
    rows = np.concatenate([s.rows for s in sketches]).astype(np.float64)
    tokens = np.concatenate([s.tokens for s in sketches])
    cell = np.concatenate([np.full(s.value.shape[0], i) for i, s in enumerate(sketches)])
    position = np.concatenate([np.arange(s.value.shape[0]) for s in sketches])
    order = np.lexsort((position, cell, -value))
    weight = (rows if mass == "rows" else tokens)[order]
    before = np.cumsum(weight) - weight
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(weight > 0, (amount - before) / weight, (before <= amount).astype(np.float64))
    share = np.clip(share, 0.0, 1.0)
    taken_rows = np.bincount(cell[order], weights=rows[order] * share, minlength=n_cells)
    taken_tokens = np.bincount(cell[order], weights=tokens[order] * share, minlength=n_cells)
    return taken_rows, taken_tokens


def allocate(total: int, weights, caps) -> np.ndarray:
    """Share ``total`` integer units in proportion to ``weights``, each at most its cap.

    Shares above a cap are clipped and the excess is shared again among the others
    (water-filling); the fractional shares are then integerised by largest remainder (ties: lower
    index first). The result sums to ``total`` exactly, and every entry is within one unit of its
    fractional share. Entries with zero weight get nothing unless every uncapped weight is zero,
    in which case the remaining units follow the room left under the caps. ``weights`` and
    ``caps`` (int) are non-negative; returns int64 (m,). Raises ``ValueError`` where ``total`` is
    negative or exceeds the sum of the caps.
    """
    weights = np.asarray(weights, dtype=np.float64)
    caps = np.asarray(caps, dtype=np.int64)
    total = int(total)
    if total < 0 or total > int(caps.sum()):
        raise ValueError(f"cannot share {total} units under caps summing to {int(caps.sum())}")
    shares = np.zeros(weights.shape[0])
    active = caps > 0
    w = np.where(active, np.clip(weights, 0.0, None), 0.0)
    left = float(total)
    while left > 0 and active.any():
        if w[active].sum() <= 0:  # nothing left to weigh by: fill the room that remains
            w = np.where(active, caps - shares, 0.0)
        proposal = np.where(active, left * w / w[active].sum(), 0.0)
        over = active & (proposal >= caps)
        if not over.any():
            shares[active] = proposal[active]
            break
        shares[over] = caps[over]
        left = total - shares.sum()
        active &= ~over
        w = np.where(active, w, 0.0)
    base = np.minimum(np.floor(shares + 1e-9).astype(np.int64), caps)
    deficit = total - int(base.sum())
    remainder = shares - base
    index = np.arange(shares.shape[0])
    if deficit > 0:
        room = np.flatnonzero(base < caps)
        room = room[np.lexsort((index[room], -remainder[room]))]
        base[room[:deficit]] += 1
    elif deficit < 0:  # float noise only: take back from the smallest remainders
        held = np.flatnonzero(base > 0)
        held = held[np.lexsort((-index[held], remainder[held]))]
        base[held[:-deficit]] -= 1
    return base


def eligible_rows(total_rows: int, prune: float) -> int:
    """Rows left eligible after pruning the worst ``prune`` share (``N - floor(prune * N)``)."""
    return total_rows - int(math.floor(prune * total_rows))


def pool_size(quota: int, eligible: int, oversample: float) -> int:
    """Size of the candidate pool, ``min(eligible, max(quota, ceil(oversample * quota)))``."""
    return min(eligible, max(quota, int(math.ceil(oversample * quota - 1e-9))))


@dataclass(frozen=True)
class RowPlan:
    """Quotas of the cells of one group, in the order of the sketches given."""

    eligible: np.ndarray  # int64 (m,), rows eligible in each cell (its best by quality)
    quota: np.ndarray  # int64 (m,), rows to select in each cell


@dataclass(frozen=True)
class TokenPlan:
    """Token budgets of the cells of one group, in the order of the sketches given."""

    eligible: np.ndarray  # int64 (m,), rows eligible in each cell
    budget: np.ndarray  # int64 (m,), tokens each cell may select
    quota: np.ndarray  # int64 (m,), row count expected to fill the budget (learner's k)


def plan_rows(sketches: list[Sketch], quota: int, prune: float, oversample: float) -> RowPlan:
    """Eligible rows and integer row quotas per cell (see the module notes); ``ValueError`` where
    ``quota`` exceeds the eligible rows."""
    n = np.array([s.n_rows for s in sketches], dtype=np.int64)
    n_eligible = eligible_rows(int(n.sum()), prune)
    if quota > n_eligible:
        raise ValueError(f"{quota} row(s) asked but only {n_eligible} of {int(n.sum())} are eligible")
    eligible = allocate(n_eligible, take_top(sketches, n_eligible)[0], n)
    pool = take_top(sketches, pool_size(quota, n_eligible, oversample))[0]
    return RowPlan(eligible, allocate(quota, pool, eligible))


def plan_tokens(sketches: list[Sketch], budget: int, prune: float, oversample: float) -> TokenPlan:
    """Eligible rows, integer token budgets and row quotas per cell (see the module notes);
    ``ValueError`` where ``budget`` exceeds the tokens of the eligible rows."""
    n = np.array([s.n_rows for s in sketches], dtype=np.int64)
    n_eligible = eligible_rows(int(n.sum()), prune)
    top_rows, top_tokens = take_top(sketches, n_eligible)
    eligible = allocate(n_eligible, top_rows, n)
    eligible_tokens = np.floor(top_tokens + 1e-6).astype(np.int64)
    if budget > eligible_tokens.sum():
        raise ValueError(f"a budget of {budget} token(s) exceeds the {int(eligible_tokens.sum())} "
                         f"token(s) of the {n_eligible} eligible row(s)")
    pool_rows, pool_tokens = take_top(sketches, min(float(eligible_tokens.sum()), oversample * budget),
                                      mass="tokens")
    budgets = allocate(budget, pool_tokens, eligible_tokens)
    return TokenPlan(eligible, budgets, rows_for_budget(budgets, pool_rows, pool_tokens, eligible))


def rows_for_budget(budgets, pool_rows, pool_tokens, eligible) -> np.ndarray:
    """Row quota expected to fill each budget: budget / mean tokens of the cell's pool rows."""
    with np.errstate(divide="ignore", invalid="ignore"):
        k = np.where(pool_tokens > 0, np.round(budgets * pool_rows / pool_tokens), 0.0)
    k = np.where((budgets > 0) & (k < 1), 1.0, k)
    return np.minimum(k, eligible).astype(np.int64)


def split_quota(quality: np.ndarray, chunk_of_row: np.ndarray, n_chunks: int, quota: int,
                oversample: float) -> np.ndarray:
    """Row quota of each chunk of a cell's eligible rows (exact version of :func:`plan_rows`), int64
    (n_chunks,): summing to ``quota``, each at most its chunk's size. ``chunk_of_row``: each row's
    chunk, in ``range(n_chunks)``."""
    sizes = np.bincount(chunk_of_row, minlength=n_chunks)
    order = np.argsort(-np.asarray(quality, dtype=np.float64), kind="stable")
    pool = order[:pool_size(quota, quality.shape[0], oversample)]
    return allocate(quota, np.bincount(chunk_of_row[pool], minlength=n_chunks), sizes)


def split_budget(quality: np.ndarray, tokens: np.ndarray, chunk_of_row: np.ndarray, n_chunks: int,
                 budget: int, oversample: float) -> tuple[np.ndarray, np.ndarray]:
    """Token budget and row quota of each chunk of a cell's eligible rows.

    The cell's budget may exceed its rows' tokens (the plan works from a sketch); it is then
    capped at what the rows hold. Returns ``(budgets, quotas)``, int64 (n_chunks,) each.
    """
    tokens = np.asarray(tokens, dtype=np.float64)
    caps = np.floor(np.bincount(chunk_of_row, weights=tokens, minlength=n_chunks) + 1e-6).astype(np.int64)
    budget = min(int(budget), int(caps.sum()))
    exact = max(1, tokens.shape[0])  # one bin per row: the split is exact
    sketches = [make_sketch(quality[chunk_of_row == c], tokens[chunk_of_row == c], bins=exact)
                for c in range(n_chunks)]
    pool_rows, pool_tokens = take_top(sketches, min(float(tokens.sum()), oversample * budget), mass="tokens")
    budgets = allocate(budget, pool_tokens, caps)
    sizes = np.bincount(chunk_of_row, minlength=n_chunks)
    return budgets, rows_for_budget(budgets, pool_rows, pool_tokens, sizes)


def fit_budget(selected: np.ndarray, tokens: np.ndarray, preference: np.ndarray, budget: float) -> np.ndarray:
    """Make a selection fit a token budget: trim the least preferred, then fill greedily.

    Selected rows are dropped, least preferred first, until the tokens fit; then unselected rows
    are added, most preferred first, whenever they still fit. On return the selection's tokens are
    at most ``budget`` and every unselected row has more tokens than the budget has left.
    ``preference``: higher is kept first (the learned scores, or quality). Returns a new array.
    """
    selected = np.asarray(selected, dtype=bool).copy()
    tokens = np.asarray(tokens, dtype=np.float64)
    preference = np.asarray(preference, dtype=np.float64)
    index = np.arange(selected.shape[0])
    used = float(tokens[selected].sum())
    if used > budget:
        inside = np.flatnonzero(selected)
        inside = inside[np.lexsort((-index[inside], preference[inside]))]  # worst first
        dropped = np.cumsum(tokens[inside])
        n_drop = int(np.searchsorted(dropped, used - budget - 1e-9, side="left")) + 1
        selected[inside[:n_drop]] = False
        used -= float(dropped[n_drop - 1])
    outside = np.flatnonzero(~selected)
    outside = outside[np.lexsort((index[outside], -preference[outside]))]  # best first
    left = budget - used
    while outside.shape[0]:
        t = tokens[outside]
        if t.min() > left + 1e-9:
            break
        # Take the longest run of best rows that fits, then skip the first that does not.
        run = int(np.searchsorted(np.cumsum(t), left + 1e-9, side="right"))
        selected[outside[:run]] = True
        left -= float(t[:run].sum())
        outside = outside[run + 1:]
    return selected
