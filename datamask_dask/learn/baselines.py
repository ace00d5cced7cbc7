"""Selection baselines on the very objective DATAMASK optimises, for comparison.

Every function here scores sets with the joint objective of :mod:`datamask_dask.learn.metrics`,
``f(U) = lamb * Q(U) + (1 - lamb) * D(U)``, so a baseline's selection and a learned mask are
compared with :func:`~datamask_dask.learn.metrics.evaluate_selection` on equal terms. Every
function is ``fn(quality, embeddings, k, *, algorithm=..., lamb=..., seed=..., device=...)`` and
returns ``k`` distinct int64 row indices in the order they were chosen (:func:`graph_lazy_greedy`
is Facility's only, without ``algorithm``). Embeddings are
L2-normalised on the way in; nothing n x n is built unless it fits ``max_memory_bytes``.
``D(U + j)`` is scored for many candidates ``j`` at once, incrementally (see each ``_*State``).
"""

from __future__ import annotations

import heapq
import math

import numpy as np
import torch

from ..compiled import on_first_use
from ..errors import OptionError
from .engine import _as_inputs, _check_quota, row_weights
from .knn import top_neighbours
from .metrics import DiSF, Facility, PairSimi, build_metrics, normalise_quality, resolve_metrics
from .metrics.base import mean_one

__all__ = ["DEFAULT_MAX_MEMORY", "graph_lazy_greedy", "greedy", "lazy_greedy", "quality_topk",
           "random_selection", "stochastic_greedy"]

Tensor = torch.Tensor
DEFAULT_MAX_MEMORY = 4 * 2**30  # bytes the Facility similarity cache may take (float32)
_BLOCK_BYTES = 2**27  # scratch memory of one block of candidate evaluations (~128 MiB)
_LAZY_BLOCK = 32  # candidates whose exact gain lazy greedy refreshes at once


# --------------------------------------------------------------------------- public baselines


def random_selection(quality, embeddings, k: int, *, algorithm="Pair_simi", lamb: float = 0.5,
                     seed: int = 0, device="cpu", quality_range=None) -> np.ndarray:
    """``k`` rows drawn uniformly without replacement, seeded by ``seed``.

    The other keywords are accepted so every baseline has the same signature; they do not change
    the draw.
    """
    n = len(np.asarray(quality))
    k = _check_quota(k, n)
    return np.random.default_rng(seed).choice(n, size=k, replace=False).astype(np.int64)


def quality_topk(quality, embeddings, k: int, *, algorithm="Pair_simi", lamb: float = 0.5,
                 seed: int = 0, device="cpu", quality_range=None) -> np.ndarray:
    """The ``k`` rows of highest quality (ties broken by position), best first.

    Ignores diversity altogether: the reference for what diversity adds. Other keywords are
    accepted for a uniform signature.
    """
    q = torch.as_tensor(np.asarray(quality), dtype=torch.float32)
    _check_quota(k, q.shape[0])
    return torch.argsort(q, descending=True, stable=True)[:k].numpy().astype(np.int64)


def greedy(quality, embeddings, k: int, *, algorithm="Pair_simi", lamb: float = 0.5, seed: int = 0,
           device="cpu", quality_range=None, max_memory_bytes: int = DEFAULT_MAX_MEMORY,
           reference_size: int | None = None, weights=None) -> np.ndarray:
    """Plain greedy: each step adds the row that maximises ``f(U + j)``, all rows scored exactly.

    ``Q`` is a mean, so ``f`` is not monotone submodular and the (1 - 1/e) guarantee only holds for
    ``lamb = 0`` with Facility; greedy is still the standard strong baseline for every metric.

    Parameters
    ----------
    seed : int
        Seed of the Facility reference subset (used only when the similarity matrix does not fit).
    max_memory_bytes : int
        Budget of the Facility similarity cache, default 4 GiB. The ``|V| x n`` float32 matrix of
        clamped similarities between the reference rows ``V`` and all rows is precomputed when it
        fits; with ``reference_size=None``, ``V`` is every row if ``n * n * 4`` bytes fit, else the
        largest uniform random subset that fits (the selection then optimises an unbiased estimate
        of the Facility term; evaluate it on every row with ``evaluate_selection``). An explicit
        ``reference_size`` that does not fit is served by computing similarity columns on demand.
    reference_size : int, optional
        Size of the Facility reference set ``V`` (see ``max_memory_bytes``).
    weights : array-like (n,) of float >= 1, optional
        How many rows each row stands for (as for :func:`~datamask_dask.learn.engine.learn_mask`):
        Facility's mean over ``V`` is weighted by them. Default: 1 each.

    Notes
    -----
    Time per step: Pair_simi O(n d); Facility O(n |V|) (plus O(n |V| d) once for the cache);
    DiSF O(n d^2). Memory: O(n d) for the inputs, plus the Facility cache (<= ``max_memory_bytes``)
    or two d x d float64 matrices for DiSF.
    """
    obj, k = _objective(quality, embeddings, k, device, quality_range, algorithm, lamb, seed,
                        max_memory_bytes, reference_size, weights)
    return _greedy_loop(obj, k).cpu().numpy()


def lazy_greedy(quality, embeddings, k: int, *, algorithm="Pair_simi", lamb: float = 0.5, seed: int = 0,
                device="cpu", quality_range=None, max_memory_bytes: int = DEFAULT_MAX_MEMORY,
                reference_size: int | None = None, weights=None) -> np.ndarray:
    """Minoux's lazy greedy: the same selection as :func:`greedy`, far fewer gain evaluations.

    Laziness is only valid for a submodular term, here Facility: a row's Facility gain can only
    shrink as ``U`` grows, so a stale gain is an upper bound. The quality term
    ``lamb * (q_j - Q(U)) / (m + 1)`` is not (``Q`` is a mean, its gains change sign and scale), so
    it and any Pair_simi / DiSF term are computed exactly for all rows each step (cheap, closed
    form), and only the Facility gain is lazy. Rows are refreshed in descending order of bound
    (exact part plus stale Facility gain), a block at a time, until the best bound belongs to a
    refreshed row, which is then exactly the row plain greedy picks (ties aside). The bounds live
    in a vector rather than a heap because the exact part changes for every row at every step.

    Without a Facility term (or with ``lamb = 1``) nothing is lazy and this is :func:`greedy`.
    Parameters and returns are those of :func:`greedy`.
    """
    obj, k = _objective(quality, embeddings, k, device, quality_range, algorithm, lamb, seed,
                        max_memory_bytes, reference_size, weights)
    if obj.facility is None:
        return _greedy_loop(obj, k).cpu().numpy()
    n, dev = obj.emb.shape[0], obj.emb.device
    fac, fac_weight = obj.facility
    stale = fac.gains(None)  # exact at the first step, upper bounds afterwards
    taken = torch.zeros(n, dtype=torch.bool, device=dev)
    chosen = torch.empty(k, dtype=torch.long, device=dev)
    for step in range(k):
        base = obj.values_with(None, skip_facility=True)
        fac_now = fac.value()
        bound = obj.combine(base, fac_weight * (fac_now + stale))
        bound[taken] = -math.inf
        fresh = torch.zeros(n, dtype=torch.bool, device=dev)
        while True:
            j = int(torch.argmax(bound))
            if fresh[j]:
                break
            top = torch.topk(bound, min(_LAZY_BLOCK, n - step)).indices
            # j itself too: among more tied rows than a block, topk may leave out argmax's pick
            top = torch.cat([top[top != j], top.new_tensor([j])])
            top = top[~fresh[top]]
            gain = fac.gains(top)
            stale[top] = gain
            bound[top] = obj.combine(base[top], fac_weight * (fac_now + gain))
            fresh[top] = True
        chosen[step] = j
        taken[j] = True
        obj.add(j)
    return chosen.cpu().numpy()


def stochastic_greedy(quality, embeddings, k: int, *, algorithm="Pair_simi", lamb: float = 0.5,
                      seed: int = 0, device="cpu", quality_range=None, eps: float = 0.1,
                      max_memory_bytes: int = DEFAULT_MAX_MEMORY,
                      reference_size: int | None = None, weights=None) -> np.ndarray:
    """Stochastic greedy (Mirzasoleiman et al., AAAI 2015, "Lazier than lazy greedy").

    Each step scores only ``s = ceil((n / k) * log(1 / eps))`` rows drawn uniformly from those not
    yet selected, and adds the best of them. For monotone submodular ``f`` it reaches
    ``(1 - 1/e - eps)`` of the optimum in expectation with O(n log(1/eps)) evaluations in all.
    ``eps`` is in (0, 1): smaller means larger samples; ``seed`` seeds the samples (and the
    Facility reference subset); the other parameters are those of :func:`greedy`.
    """
    if not 0 < eps < 1:
        raise OptionError(f"option eps={eps!r} is invalid: expected a number in (0, 1)")
    obj, k = _objective(quality, embeddings, k, device, quality_range, algorithm, lamb, seed,
                        max_memory_bytes, reference_size, weights)
    n = obj.emb.shape[0]
    sample = min(n, math.ceil(n / k * math.log(1 / eps)))
    rng = np.random.default_rng(seed)
    remaining = np.arange(n)  # rows not selected; the chosen one is swapped with the last live one
    chosen = np.empty(k, dtype=np.int64)
    for step in range(k):
        live = n - step
        pos = rng.choice(live, size=min(sample, live), replace=False)
        cand = torch.as_tensor(remaining[pos], device=obj.emb.device)
        best = int(torch.argmax(obj.values_with(cand)))
        j = int(remaining[pos[best]])
        remaining[pos[best]] = remaining[live - 1]
        chosen[step] = j
        obj.add(j)
    return chosen


def graph_lazy_greedy(quality, embeddings, k: int, *, lamb: float = 0.5, seed: int = 0, device="cpu",
                      quality_range=None, neighbours: int = 128) -> np.ndarray:
    """Lazy greedy on Facility with every row as reference, each row covered only through its
    ``neighbours`` most similar rows (:func:`~datamask_dask.learn.knn.top_neighbours`, approximate
    above a few thousand rows): the sparse facility location of large-scale summarisation, which
    runs where the dense similarity cache of :func:`lazy_greedy` would not fit.

    A row's best similarity to a tenth of the table almost always comes from its nearest rows, so
    the graph loses little of the objective. With ``q >= 0`` a candidate's key
    ``lamb * q_j / (m + 1) + (1 - lamb) * gain_j`` can only fall as ``U`` grows, so a stale key is
    an upper bound and a heap of them is exact lazy greedy on the sparse objective.
    """
    qn, emb, k = _inputs(quality, embeddings, k, device, quality_range)
    n = emb.shape[0]
    generator = torch.Generator(device=emb.device).manual_seed(seed)
    values, columns = top_neighbours(emb, emb, neighbours, generator=generator)
    values, columns = values.clamp(min=0).flatten().cpu().numpy(), columns.flatten().cpu().numpy()
    covered = np.repeat(np.arange(n), values.size // n)
    keep = values > 0
    values, columns, covered = values[keep], columns[keep], covered[keep]
    order = np.argsort(columns, kind="stable")  # each candidate's edges, contiguous
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(columns, minlength=n), out=starts[1:])
    return _graph_greedy_kernel()(qn.double().cpu().numpy(), float(lamb), starts, covered[order],
                                  values[order].astype(np.float64), k)


@on_first_use
def _graph_greedy_kernel():
    import numba  # compiled on first use, as the learner's Facility step (facility_cpu)

    @numba.njit
    def run(qn, lamb, starts, covered, values, k):
        n = qn.size
        best = np.zeros(n)

        def key(j, m):
            gain = 0.0
            for edge in range(starts[j], starts[j + 1]):
                gain += max(values[edge] - best[covered[edge]], 0.0)
            return lamb * qn[j] / (m + 1) + (1 - lamb) * gain / n

        heap = [(-key(j, 0), j, 0) for j in range(n)]
        heapq.heapify(heap)
        chosen = np.empty(k, dtype=np.int64)
        for m in range(k):
            _, j, fresh_at = heapq.heappop(heap)
            while fresh_at != m:  # a stale key: refresh it and look again
                heapq.heappush(heap, (-key(j, m), j, m))
                _, j, fresh_at = heapq.heappop(heap)
            chosen[m] = j
            for edge in range(starts[j], starts[j + 1]):
                best[covered[edge]] = max(best[covered[edge]], values[edge])
        return chosen

    return run


# --------------------------------------------------------------------------- the objective


class _Objective:
    """Incremental ``f(U) = lamb * Q(U) + (1 - lamb) * sum_m w_m D_m(U)`` with batched ``f(U + j)``."""

    def __init__(self, qn: Tensor, emb: Tensor, algorithm, lamb: float, *, seed: int,
                 max_memory_bytes: int, reference_size: int | None, weights: Tensor | None = None):
        if not 0 <= lamb <= 1:
            raise OptionError(f"option lamb={lamb!r} is invalid: expected a weight in [0, 1]")
        self.qn, self.emb, self.lamb = qn, emb, float(lamb)
        self.q_sum, self.m = 0.0, 0
        self.terms: list[tuple[object, float]] = []
        self.facility: tuple[_FacilityState, float] | None = None
        for metric, weight in build_metrics(resolve_metrics(algorithm)):
            if isinstance(metric, PairSimi):
                state = _PairState(emb)
            elif isinstance(metric, Facility):
                state = _FacilityState(emb, seed=seed, max_memory_bytes=max_memory_bytes,
                                       reference_size=reference_size, weights=weights)
            elif isinstance(metric, DiSF):
                state = _DisfState(emb)
            else:
                raise OptionError(
                    f"algorithm {metric.name!r}: the baselines implement the built-in metrics "
                    "(Pair_simi, Facility, DiSF) only; a user metric has no closed-form marginal gain")
            if lamb == 1:
                continue  # diversity has no weight: skip its (possibly costly) bookkeeping
            if isinstance(state, _FacilityState):
                self.facility = (state, weight)
            else:
                self.terms.append((state, weight))

    def values_with(self, cand: Tensor | None, *, skip_facility: bool = False) -> Tensor:
        """``f(U + j)`` for each candidate ``j``, every row if ``cand`` is None (no gather).

        Facility is left out if ``skip_facility``.
        """
        quality = (self.q_sum + _take(self.qn, cand)) / (self.m + 1)
        diversity = torch.zeros_like(quality)
        for state, weight in self.terms:
            diversity += weight * state.values_with(cand).to(quality.dtype)
        base = self.lamb * quality + (1 - self.lamb) * diversity
        if skip_facility or self.facility is None:
            return base
        fac, weight = self.facility
        return self.combine(base, weight * (fac.value() + fac.gains(cand)))

    def combine(self, base: Tensor, weighted_facility: Tensor) -> Tensor:
        # One function for plain and lazy greedy so both round the same way and pick the same row.
        return base + (1 - self.lamb) * weighted_facility

    def add(self, j: int) -> None:
        self.q_sum += float(self.qn[j])
        self.m += 1
        for state, _ in self.terms:
            state.add(j)
        if self.facility is not None:
            self.facility[0].add(j)


class _PairState:
    """Pair_simi of ``U + j`` from ``w`` = sum of ``U``'s unit vectors: ``sum_{i != l} s_il`` grows by
    ``2 e_j . w``, so one mat-vec ``E w`` scores every candidate, O(d) each."""

    def __init__(self, emb: Tensor):
        self.emb = emb
        self.w = torch.zeros(emb.shape[1], dtype=torch.float64, device=emb.device)
        self.pair_sum, self.m = 0.0, 0  # sum over ordered pairs i != l of s_il

    def values_with(self, cand: Tensor) -> Tensor:
        m1 = self.m + 1
        pair = self.pair_sum + 2 * (_take(self.emb, cand) @ self.w.to(self.emb.dtype)).double()
        return 1.0 - pair / max(m1 * (m1 - 1), 1)

    def add(self, j: int) -> None:
        e = self.emb[j].double()
        self.pair_sum += 2 * float(e @ self.w)
        self.w += e
        self.m += 1


class _FacilityState:
    """Facility: each reference row's best clamped similarity ``best_v`` to ``U``; the value with ``j``
    is ``mean_v max(best_v, s_vj)``, O(|V|) per candidate given its column (cached when they fit).

    With ``weights`` (one per row of ``emb``) the mean over the reference rows is weighted.
    """

    def __init__(self, emb: Tensor, *, seed: int, max_memory_bytes: int, reference_size: int | None,
                 weights: Tensor | None = None):
        n = emb.shape[0]
        per_row = n * 4  # bytes of one reference row of the float32 cache
        if reference_size is None:
            size = n if n * per_row <= max_memory_bytes else max(1, max_memory_bytes // per_row)
        else:
            if isinstance(reference_size, bool) or not isinstance(reference_size, int) or reference_size < 1:
                raise OptionError(f"option reference_size={reference_size!r} is invalid: "
                                  "expected an integer >= 1 or None")
            size = min(reference_size, n)
        self.position = None  # each row's position among the reference rows (-1: not one), when sampled
        if size < n:
            gen = torch.Generator(device="cpu").manual_seed(seed)
            ref = torch.randperm(n, generator=gen)[:size].sort().values.to(emb.device)
            self.ref_emb = emb[ref]
            weights = None if weights is None else weights[ref]
            self.position = torch.full((n,), -1, dtype=torch.long, device=emb.device)
            self.position[ref] = torch.arange(size, device=emb.device)
        else:
            self.ref_emb = emb
        # mean-1 weights of the reference rows (None: each counts once)
        self.share = None if weights is None else mean_one(weights).to(emb.dtype)
        self.emb = emb
        self.best = torch.zeros(size, dtype=emb.dtype, device=emb.device)
        self.block = max(1, _BLOCK_BYTES // (4 * size))  # candidates per block of size x block floats
        self.cache = None
        if size * per_row <= max_memory_bytes:
            # Stored candidate-major (n x |V|) so a column is a contiguous row.
            cache = torch.empty((n, size), dtype=emb.dtype, device=emb.device)
            for start in range(0, n, self.block):
                cache[start:start + self.block] = self.columns(None, start, start + self.block)
            self.cache = cache

    def columns(self, cand: Tensor | None, start: int = 0, stop: int | None = None) -> Tensor:
        """Clamped similarities of candidates ``start:stop`` to the reference rows, (rows, |V|)."""
        if self.cache is not None:
            return _take(self.cache, cand, start, stop)
        cols = (_take(self.emb, cand, start, stop) @ self.ref_emb.T).clamp_(min=0)
        if self.position is not None:
            # A sampled reference row does not count itself as covered, as in the learner
            # (Facility.prepare): else every sampled row would be worth n / |V| times the others.
            rows = cand[start:stop] if cand is not None else torch.arange(
                start, start + cols.shape[0], device=cols.device)
            where = self.position[rows]
            hit = (where >= 0).nonzero().flatten()
            cols[hit, where[hit]] = 0.0
        return cols

    def gains(self, cand: Tensor | None) -> Tensor:
        """``D(U + j) - D(U)`` for each candidate, in blocks so scratch memory stays bounded."""
        count = self.emb.shape[0] if cand is None else cand.numel()
        out = torch.empty(count, dtype=self.best.dtype, device=self.best.device)
        for start in range(0, count, self.block):
            cols = self.columns(cand, start, start + self.block)
            raised = (cols - self.best).clamp_(min=0)
            out[start:start + self.block] = raised.sum(1) if self.share is None else raised @ self.share
        return out / self.best.numel()

    def value(self) -> float:
        return float(self.best.mean() if self.share is None else (self.best @ self.share) / self.best.numel())

    def add(self, j: int) -> None:
        torch.maximum(self.best, self.columns(None, j, j + 1)[0], out=self.best)


class _DisfState:
    """DiSF of ``U + j`` from ``U``'s mean and covariance, float64, O(d^2) per candidate.

    ``U``'s population covariance ``S`` and mean ``mu`` are kept (``m = |U|``); adding ``x``
    (``y = x - mu``) gives ``S' = a S + b y y^T`` with ``a = m/(m+1)``, ``b = m/(m+1)^2`` (Welford).
    With ``w_c = 1 / S'_cc`` the sum of squared correlations is
    ``a^2 w^T (S o S) w + 2ab (w o y)^T S (w o y) + b^2 (y^T (w o y))^2`` (the middle term O(m d)
    while ``m < d``) instead of re-standardising ``U + j``, O(m d^2).
    """

    def __init__(self, emb: Tensor):
        self.emb = emb
        d = emb.shape[1]
        dev = emb.device
        self.d, self.m = d, 0
        self.mean = torch.zeros(d, dtype=torch.float64, device=dev)
        self.cov = torch.zeros((d, d), dtype=torch.float64, device=dev)
        self.cov_sq = torch.zeros_like(self.cov)  # cov o cov, kept to score candidates
        self.rows: list[Tensor] = []  # U's rows while m < d (cheaper middle term)
        self.block = max(1, _BLOCK_BYTES // (8 * 4 * d))

    def values_with(self, cand: Tensor | None) -> Tensor:
        m, d = self.m, self.d
        count = self.emb.shape[0] if cand is None else cand.numel()
        if m == 0:  # one row: every standardised feature is 0, no correlation at all
            return torch.ones(count, dtype=torch.float64, device=self.emb.device)
        a, b = m / (m + 1), m / (m + 1) ** 2
        diag = torch.diagonal(self.cov)
        rows = torch.stack(self.rows) - self.mean if m < d else None
        out = []
        for start in range(0, count, self.block):
            y = _take(self.emb, cand, start, start + self.block).double() - self.mean
            var = a * diag + b * y * y
            # A dimension constant over the set has no correlation (metrics.DiSF leaves it at 0).
            inv = torch.where(var > 1e-12, 1.0 / var.clamp(min=1e-12), torch.zeros_like(var))
            t = inv * y
            first = ((inv @ self.cov_sq) * inv).sum(1)
            # t^T cov t: through U's centred rows while they are fewer than the dimensions.
            middle = (t @ rows.T).pow(2).sum(1) / m if rows is not None else ((t @ self.cov) * t).sum(1)
            last = (y * t).sum(1).pow(2)
            total = a * a * first + 2 * a * b * middle + b * b * last
            off = total - (inv > 0).sum(1)  # each kept dimension's own correlation is 1
            out.append(1.0 - off / (d * (d - 1)))
        return torch.cat(out)

    def add(self, j: int) -> None:
        m = self.m
        x = self.emb[j].double()
        y = x - self.mean
        self.cov.mul_(m / (m + 1)).add_(torch.outer(y, y), alpha=m / (m + 1) ** 2)
        self.mean += y / (m + 1)
        torch.mul(self.cov, self.cov, out=self.cov_sq)
        self.m += 1
        if self.m < self.d:
            self.rows.append(x)
        else:
            self.rows = []


# --------------------------------------------------------------------------- helpers


def _greedy_loop(obj: _Objective, k: int) -> Tensor:
    """Plain greedy over every row of ``obj``; returns the chosen rows in order."""
    dev = obj.emb.device
    taken = torch.zeros(obj.emb.shape[0], dtype=torch.bool, device=dev)
    chosen = torch.empty(k, dtype=torch.long, device=dev)
    for step in range(k):
        values = obj.values_with(None)
        values[taken] = -math.inf
        j = int(torch.argmax(values))  # first maximum: ties go to the earliest row
        taken[j] = True
        chosen[step] = j
        obj.add(j)
    return chosen


def _take(x: Tensor, cand: Tensor | None, start: int = 0, stop: int | None = None) -> Tensor:
    """Rows ``cand[start:stop]`` of ``x``; with ``cand`` None a view of rows ``start:stop``, no copy."""
    return x[start:stop] if cand is None else x[cand[start:stop]]


def _inputs(quality, embeddings, k, device, quality_range):
    q, emb = _as_inputs(quality, embeddings, torch.device(device))
    k = _check_quota(k, q.shape[0])
    return normalise_quality(q, quality_range), emb, k


def _objective(quality, embeddings, k, device, quality_range, algorithm, lamb, seed, max_memory_bytes,
               reference_size, weights) -> tuple[_Objective, int]:
    """The checked inputs' :class:`_Objective` and the checked quota (the greedy baselines' start)."""
    qn, emb, k = _inputs(quality, embeddings, k, device, quality_range)
    obj = _Objective(qn, emb, algorithm, lamb, seed=seed, max_memory_bytes=max_memory_bytes,
                     reference_size=reference_size, weights=row_weights(weights, emb.shape[0], emb.device))
    return obj, k
