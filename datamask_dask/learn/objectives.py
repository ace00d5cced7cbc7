"""The joint objective: quality plus diversity metrics, batched over rollouts, never n x n.

Every term lies in [0, 1] so that ``lamb`` means what it says:

- quality(U)  = mean over U of the min-max normalised quality score (range of the chunk, or of
  the whole table when the Dask operator passes it);
- Pair_simi   = 1 - mean pairwise cosine similarity of U (from w = sum of U's unit vectors:
  sum_{i != j} s_ij = |w|^2 - k, so O(k d));
- Facility    = mean over a reference set V of max over U of the cosine similarity clamped at 0,
  weighted by the rows each row of V stands for;
- DiSF        = 1 - mean squared off-diagonal entry of the d x d correlation matrix of U's
  standardised features (DiSF, Fan et al., ICLR 2025).

A metric is an object with four methods (see :class:`DiversityMetric`); users register their own
with :func:`register_metric`, and ``algorithm={"Facility": 0.7, "DiSF": 0.3}`` combines several.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping

import numpy as np
import torch

from ..errors import OptionError
from . import facility_cpu
from .knn import aligned_rows, top_neighbours
from .sums import add_at_columns

Tensor = torch.Tensor
_EVAL_BLOCK = 4096  # rows of the chunk compared with the selection at once when evaluating


class DiversityMetric:
    """Interface of a diversity metric; higher values mean a more diverse set, ideally in [0, 1].

    Subclasses implement :meth:`rewards`. Overriding :meth:`gains` with the exact marginal gain of
    each row makes the default ``update="credit"`` learner much more sample-efficient; the default
    estimates it from the rewards alone (mean reward of the rollouts with the row minus without).
    """

    name = "metric"
    uses_reference = False  # True: prepare() wants the rows to represent (the learner then builds them)

    def prepare(self, emb: Tensor, generator: torch.Generator, reference: Tensor | None = None,
                reference_rows: Tensor | None = None) -> object:
        """Per-step precomputation on the batch embeddings ``emb`` (b x d); returned as ``state``.

        ``reference`` holds rows the selection should represent when they are not the batch itself
        (the whole chunk, while refining a candidate pool); the learner passes it only to metrics
        whose ``uses_reference`` is True. When ``reference`` is a *sample* of the chunk,
        ``reference_rows`` (m,) gives each reference row's position in ``emb`` (-1 if it is not a
        candidate): a sampled row must not represent itself (see :class:`Facility`).

        A metric whose ``prepare`` also takes ``weights`` receives, when rows carry weights, how many
        rows of the table each row to represent stands for (a tensor: one weight per row of
        ``reference``, or of ``emb`` when ``reference`` is None); metrics where coverage counts rows
        should weigh each represented row by it. Without that parameter every row counts once.
        """
        return None

    def rewards(self, emb: Tensor, idx: Tensor, state: object) -> Tensor:
        """Diversity of each rollout: ``idx`` (G x k) indexes rows of ``emb``; returns (G,)."""
        raise NotImplementedError(f"{type(self).__name__} must implement rewards()")

    def gains(self, emb: Tensor, idx: Tensor, state: object, member: Tensor) -> Tensor:
        """Marginal gain of each batch row for each rollout, f(U + j) - f(U - j); (G x b) or (1 x b).

        ``member`` (G x b, bool) tells which rows each rollout holds.
        """
        reward = self.rewards(emb, idx, state)
        centred = (reward - reward.mean())[:, None]
        inside = member.to(reward.dtype)
        n_in = inside.sum(0).clamp(min=1)
        n_out = (1 - inside).sum(0).clamp(min=1)
        return ((centred * inside).sum(0) / n_in - (centred * (1 - inside)).sum(0) / n_out)[None]

    def rewards_and_gains(self, emb: Tensor, idx: Tensor, state: object, member: Tensor):
        """Both at once; override when they share work."""
        return self.rewards(emb, idx, state), self.gains(emb, idx, state, member)

    def evaluate(self, emb: Tensor, selected: Tensor) -> float:
        """Diversity of one selection (indices into ``emb``) measured on the whole chunk."""
        state = self.prepare(emb, torch.Generator(device=emb.device).manual_seed(0))
        return float(self.rewards(emb, selected[None], state)[0])


class PairSimi(DiversityMetric):
    """1 - mean pairwise cosine similarity of the selected unit vectors.

    Per step it reads the k selected rows (to sum them, in float32) and the batch once (every
    row's dot product with that sum, in ``precision``): memory-bound, so bfloat16 halves it.
    """

    name = "Pair_simi"

    def __init__(self, precision: str = "float32"):
        self.precision = precision

    def prepare(self, emb, generator, reference=None):
        return emb.to(torch.bfloat16) if self.precision == "bfloat16" else None  # the batch, for dots

    def rewards(self, emb, idx, state):
        k = idx.shape[1]
        pair_sum = _selection_sums(emb, idx).pow(2).sum(1) - k
        return 1.0 - pair_sum / max(k * (k - 1), 1)

    def gains(self, emb, idx, state, member):
        return self.rewards_and_gains(emb, idx, state, member)[1]

    def rewards_and_gains(self, emb, idx, state, member):
        k = idx.shape[1]
        w = _selection_sums(emb, idx)
        pair_sum = ((w * w).sum(1) - k)[:, None]
        # e_j . w, (G, b); the bfloat16 copy multiplies as (b, d) @ (d, G), which oneDNN runs
        # faster than (G, d) @ (d, b) (float32 is the other way round)
        dots = w @ emb.T if state is None else (state @ w.to(state.dtype).T).float().T
        mean_with = pair_sum / max(k * (k - 1), 1)
        # A member j leaves: its k - 1 similarities go, twice. A non-member joins: k new ones, twice.
        mean_without = (pair_sum - 2 * (dots - 1)) / max((k - 1) * (k - 2), 1)
        mean_plus = (pair_sum + 2 * dots) / ((k + 1) * k)
        return 1.0 - mean_with[:, 0], torch.where(member, mean_without - mean_with, mean_with - mean_plus)


class Facility(DiversityMetric):
    """Facility location: mean over a reference set of the best clamped similarity to U.

    While learning, each reference row keeps only its ``neighbours`` most similar batch rows
    (a sparse k-NN graph, as large-scale facility location does): a row's best similarity to U
    almost always comes from one of them, and each step then costs O(G m t) instead of O(G m b).

    Reference rows may carry weights (``weights`` of :meth:`prepare` and :meth:`evaluate`): the
    number of table rows each stands for once its near-copies are set aside
    (``diversity_scope="table"``). The term is then the weighted mean, which is the facility
    location of the whole table with each copy represented where its kept row is.
    """

    name = "Facility"
    uses_reference = True

    def __init__(self, reference_size: int = 1024, neighbours: int = 64, precision: str = "float32",
                 exact_max: int = 32768, probes: int = 2):
        self.reference_size = reference_size
        self.neighbours = neighbours
        self.precision = precision
        self.exact_max = exact_max  # batches larger than this get an approximate graph (see knn)
        self.probes = probes

    def prepare(self, emb, generator, reference=None, reference_rows=None, weights=None):
        if reference is None:  # represent the batch itself, through a sample of its rows
            rows = torch.randperm(emb.shape[0], generator=generator, device=generator.device)
            reference = emb[rows[:self.reference_size]]
            if weights is not None:
                weights = weights[rows[:self.reference_size]]
        # bfloat16 similarities (3 significant digits) are plenty to rank neighbours and cost
        # a quarter of float32 on GPUs and on CPUs with AMX / AVX512-BF16.
        dtype = torch.bfloat16 if self.precision == "bfloat16" else emb.dtype
        values, neighbours = top_neighbours(reference, emb, self.neighbours, dtype=dtype, generator=generator,
                                            exact_max=self.exact_max, probes=self.probes)
        # A row none of whose listed neighbours is in U is still covered by some row of U, at most
        # as well as by its last listed neighbour: that similarity is its floor. Gains count only
        # what a row adds above its floor, where counting from 0 would overrate covering rows. A
        # single neighbour is its own floor, so it gets none; nor does a reference sample, whose gains
        # are shrunk by their noise as counted from 0 (with a floor it selected worse there).
        floor = values[:, -1].clamp(min=0) if values.shape[1] > 1 and reference_rows is None else \
            values.new_zeros(values.shape[0])
        values = values.sub_(floor[:, None])
        if reference_rows is not None:
            # A fixed sample of m reference rows, learned against for many steps: a sampled row is
            # its own best neighbour (similarity 1), so selecting it earns 1/m, while the chunk's
            # objective gives every selected row only 1/n for covering itself, and unsampled rows
            # nothing. The selection then drifts to the sample, whatever its quality. Without
            # self-matches the sample estimates only how well U covers *other* rows, which is
            # unbiased for every candidate alike.
            values.masked_fill_(neighbours == reference_rows[:, None], 0.0)
        # (m, t) each, whether the reference is a fixed sample (its gains are then shrunk), the
        # reference rows' weights scaled to mean 1 (None: every row counts once) and the mean floor
        share = None if weights is None else _mean_one(weights.to(values.dtype))
        sampled = reference_rows is not None
        return values.clamp_(min=0), neighbours, sampled, share, _weighted_mean(floor, share)

    def rewards(self, emb, idx, state):
        member = torch.zeros((idx.shape[0], emb.shape[0]), dtype=torch.bool, device=idx.device)
        member.scatter_(1, idx, True)
        if facility_cpu.available(state[0]):
            best = facility_cpu.best_and_gains(state[0], state[1], member, None, with_gains=False)[0]
            return _weighted_mean(best, state[3]) + state[4]
        return _weighted_mean(self._held(state, member)[0].amax(-1), state[3]) + state[4]

    @staticmethod
    def _held(state, member):
        """Each reference row's neighbours' similarities where the neighbour is in U, else 0 (G, m, t),
        and the flat (G, m * t) gather index of the neighbours."""
        values, neighbours = state[:2]
        # A float mask and a flat gather: torch's CPU kernels are several times slower on bool
        # operands and on member[:, neighbours] indexing.
        flat = neighbours.view(1, -1).expand(member.shape[0], -1)
        return values * member.to(values.dtype).gather(1, flat).view(-1, *values.shape), flat

    def gains(self, emb, idx, state, member):
        return self.rewards_and_gains(emb, idx, state, member)[1]

    def rewards_and_gains(self, emb, idx, state, member):
        values, neighbours = state[:2]
        share = state[3]
        # one compiled pass on CPU; a reference sample's gains also need their noise (torch, below)
        if facility_cpu.available(values) and not state[2]:
            best, gain = facility_cpu.best_and_gains(values, neighbours, member, share)
            gain /= values.shape[0]
            return _weighted_mean(best, share) + state[4], gain
        held, flat = self._held(state, member)
        best, arg = held.max(-1)  # (G, m): each reference row's best similarity to U, and where
        second = held.scatter_(-1, arg[..., None], 0.0).amax(-1)  # held is not needed any more
        owner = neighbours.gather(1, arg.T).T  # (G, m) batch row that is best for each reference row
        g, m = best.shape
        # Joining: how much j raises each reference row's best similarity (0 for members).
        joining = (values[None] - best[..., None]).clamp_(min=0)
        # Leaving: a member loses what it alone provides (best - second where it is the best).
        leaving = best - second
        if share is not None:  # a reference row standing for w rows counts w times
            joining *= share[None, :, None]
            leaving *= share[None]
        gain = torch.zeros_like(member, dtype=values.dtype)
        add_at_columns(gain, flat, joining.view(g, -1))
        add_at_columns(gain, owner, leaving)
        gain /= m
        if state[2]:
            # Each row's sampling variance of its gain: a gain is a mean over the m sampled
            # reference rows of what the row adds to each, so its variance is sum(adds^2) / m^2.
            noise = torch.zeros_like(gain)
            add_at_columns(noise, flat, joining.pow_(2).view(g, -1))
            add_at_columns(noise, owner, leaving.pow(2))
            gain = _shrink(gain, noise / (m * m))
        return _weighted_mean(best, share) + state[4], gain

    def evaluate(self, emb, selected, reference=None, weights=None):
        """Mean over ``reference`` (m, d; every row of ``emb`` by default) of its best clamped
        similarity to the selected rows of ``emb``: on a uniform sample drawn independently of the
        selection, an unbiased estimate of the whole chunk's term. ``weights``: one per reference row."""
        return self._coverage(emb if reference is None else reference, emb, selected, [(0, selected.numel())],
                              weights)[0]

    def evaluate_both(self, emb, first, second, reference=None, weights=None) -> tuple[float, float]:
        """:meth:`evaluate` of two selections, each similarity computed once: the reference rows meet
        the rows of either selection in one product, columns ordered (first only, both, second
        only) so that each selection's columns are one slice. Where the selections share most rows
        that is less work than two evaluations, with the same values (each entry is the same dot
        product)."""
        n = emb.shape[0]
        in_first = torch.zeros(n, dtype=torch.bool, device=emb.device).index_fill_(0, first, True)
        in_second = torch.zeros(n, dtype=torch.bool, device=emb.device).index_fill_(0, second, True)
        shared = in_second[first]
        columns = torch.cat([first[~shared], first[shared], second[~in_first[second]]])
        spans = [(0, first.numel()), (int((~shared).sum()), columns.numel())]
        values = self._coverage(emb if reference is None else reference, emb, columns, spans, weights)
        return values[0], values[1]

    @staticmethod
    def _coverage(rows, emb, columns, spans, weights=None) -> list[float]:
        """For each ``(low, high)`` of ``spans``: the (weighted) mean over ``rows`` of the best
        clamped similarity to the rows ``columns[low:high]`` of ``emb``. The product runs on a
        column count padded as :func:`~datamask_dask.learn.knn.top_neighbours` pads it (a count
        that is no multiple of 16 runs slower on CPU); the padding is in no span."""
        selected = aligned_rows(emb, columns)
        totals = [0.0] * len(spans)
        for start in range(0, rows.shape[0], _EVAL_BLOCK):
            similarity = rows[start:start + _EVAL_BLOCK] @ selected.T
            for i, (low, high) in enumerate(spans):
                best = similarity[:, low:high].amax(1).clamp(min=0)
                if weights is not None:
                    best = best.double() * weights[start:start + _EVAL_BLOCK].double()
                totals[i] += float(best.sum())
        mass = rows.shape[0] if weights is None else float(weights.double().sum())
        return [total / mass for total in totals]


class DiSF(DiversityMetric):
    """1 - mean squared off-diagonal correlation between feature dimensions over U.

    Gains are first order: row j joining (or, as a member, leaving) U adds (removes) its row and
    column of the Gram matrix of standardised features, sum_i (z_j . z_i)^2 = z_j^T M z_j with
    M = Z^T Z, and moves U's per-dimension variances (to first order, sum_a R_a z_ja^2 with R_a the
    a-th row sum of the squared correlations); the shift of U's mean is ignored. When k exceeds
    ``rank``, M is replaced by its top ``rank`` eigenpairs (randomised subspace iteration): the large
    eigenvalues are the correlated directions DiSF penalises, and each step then costs
    O(G b d rank) instead of O(G b d^2).
    """

    name = "DiSF"

    def __init__(self, precision: str = "float32", rank: int = 64):
        self.precision = precision
        self.rank = rank
        self._basis = None  # leading eigenvectors of the last step (see _top_eigen_factor)

    @staticmethod
    def _moments(x: Tensor):
        """Per-rollout mean and std (zeros replaced by 1: a constant dimension carries nothing)."""
        mean = x.mean(-2, keepdim=True)
        std = (x - mean).pow(2).mean(-2, keepdim=True).sqrt()
        return mean, torch.where(std > 0, std, torch.ones_like(std))

    @classmethod
    def _standardise(cls, x: Tensor) -> Tensor:
        mean, std = cls._moments(x)
        return (x - mean) / std

    @staticmethod
    def _second_moment(z: Tensor) -> Tensor:
        """Z^T Z (G, d, d) or Z Z^T (G, k, k), whichever is smaller: both have the same |.|_F^2."""
        return z.transpose(-1, -2) @ z if z.shape[-2] > z.shape[-1] else z @ z.transpose(-1, -2)

    @staticmethod
    def _reward(z: Tensor, moment: Tensor) -> Tensor:
        k, d = z.shape[-2], z.shape[-1]
        total = moment.pow(2).sum((-1, -2)) / k**2  # sum_ab C_ab^2
        diag = (z.pow(2).sum(-2) / k).pow(2).sum(-1)  # sum_a C_aa^2
        return 1.0 - (total - diag) / (d * (d - 1))

    def rewards(self, emb, idx, state):
        z = self._standardise(emb[idx])
        return self._reward(z, self._second_moment(z))

    def gains(self, emb, idx, state, member):
        return self.rewards_and_gains(emb, idx, state, member)[1]

    def rewards_and_gains(self, emb, idx, state, member):
        k, d = idx.shape[1], emb.shape[1]
        mean, std = self._moments(emb[idx])
        z = (emb[idx] - mean) / std  # (G, k, d)
        moment = self._second_moment(z)
        # A factor F with F^T F ~= M (rows of Z, or the top eigenpairs of M when k > rank), so that
        # z_j^T M z_j = |F z_j|^2 and F z_j = (F / std) e_j - (F / std) mean: no (G, b, d) tensor.
        gram = moment if k > d else z.transpose(1, 2) @ z  # Z^T Z (G, d, d)
        factor = z if k <= self.rank else self._top_eigen_factor(gram)
        scaled = factor / std  # (G, s, d)
        low = torch.bfloat16 if self.precision == "bfloat16" else emb.dtype
        proj = (emb.to(low) @ scaled.to(low).transpose(1, 2)).float()  # (G, b, s)
        row = (proj - mean @ scaled.transpose(1, 2)).pow(2).sum(-1)  # (G, b)
        inv_var = std.pow(-2)[:, 0]  # (G, d)
        self_sq = (emb.pow(2) @ inv_var.T - 2 * emb @ (mean[:, 0] * inv_var).T).T
        self_sq = (self_sq + (mean[:, 0].pow(2) * inv_var).sum(-1, keepdim=True)).pow(2)
        # The row also moves U's variances: to first order sum_a R_a z_ja^2 with R_a = sum_b C_ab^2
        # (C the correlation matrix), a row far out along strongly correlated dimensions dilutes
        # their correlations. Without it the gains miss what greedy exploits.
        corr = gram / k  # (G, d, d)
        weight = corr.pow(2).sum(-1) * inv_var  # R_a / std_a^2, (G, d)
        spread = (emb.pow(2) @ weight.T - 2 * emb @ (mean[:, 0] * weight).T).T
        spread = spread + (mean[:, 0].pow(2) * weight).sum(-1, keepdim=True)  # sum_a R_a z_ja^2
        row = row - k * spread
        change = torch.where(member, 2 * row - self_sq, 2 * row + self_sq) / (k * k * d * (d - 1))
        # Both a member's stay and a newcomer's arrival add correlation mass.
        return self._reward(z, moment), -change

    def _top_eigen_factor(self, m: Tensor) -> Tensor:
        """sqrt(lambda) V^T for the top ``rank`` eigenpairs of the PSD matrices ``m`` (G, d, d).

        Subspace iteration, warm-started from the previous step's basis: U changes little from
        one step to the next, so one iteration a step tracks the leading eigenvectors.
        """
        q = self._basis
        if q is None or q.shape[0] != m.shape[0] or q.shape[1] != m.shape[-1]:
            gen = torch.Generator(device=m.device).manual_seed(0)  # fixed: same input, same factor
            q = torch.randn(m.shape[-1], self.rank, generator=gen, device=m.device, dtype=m.dtype)
            q = torch.linalg.qr(m @ q).Q
        q = torch.linalg.qr(m @ q).Q
        self._basis = q
        values, vectors = torch.linalg.eigh(q.transpose(1, 2) @ m @ q)
        return (q @ vectors * values.clamp(min=0).sqrt()[:, None, :]).transpose(1, 2)

    def evaluate(self, emb, selected):
        z = self._standardise(emb[selected].double())
        k, d = z.shape
        corr = (z.T @ z) / k
        off = corr.pow(2).sum() - torch.diagonal(corr).pow(2).sum()
        return float(1.0 - off / (d * (d - 1)))


_REGISTRY: dict[str, type[DiversityMetric] | DiversityMetric] = {}


def register_metric(name: str, metric: type[DiversityMetric] | DiversityMetric) -> None:
    """Make ``algorithm=name`` (case-insensitive) use ``metric`` (a class or an instance)."""
    _REGISTRY[name.lower()] = metric


for _cls, _aliases in ((PairSimi, ("pair_simi", "pairsimi", "pair", "pairwise")),
                       (Facility, ("facility", "facility_location", "fl")),
                       (DiSF, ("disf",))):
    for _alias in _aliases:
        register_metric(_alias, _cls)


def registered_metric(name: str) -> type[DiversityMetric] | DiversityMetric:
    """What ``algorithm=name`` uses (the same object for every alias of a metric)."""
    key = resolve_metrics(name)[0][0]
    return _REGISTRY[key] if isinstance(key, str) else key


def _metric_names() -> list[str]:
    """The registered metrics under their own names (aliases left out)."""
    return sorted({getattr(m, "name", None) or key for key, m in _REGISTRY.items()}, key=str.lower)


def _suggest(name) -> str:
    import difflib

    close = difflib.get_close_matches(str(name).lower(), list(_REGISTRY), n=1, cutoff=0.6)
    if not close:
        return ""
    metric = _REGISTRY[close[0]]
    return f"did you mean {getattr(metric, 'name', None) or close[0]!r}? "


def resolve_metrics(algorithm) -> list[tuple[str | DiversityMetric, float]]:
    """Normalise ``algorithm`` to a list of (metric, weight), weights summing to 1.

    A metric is a registered name (case-insensitive) or a :class:`DiversityMetric` instance or
    subclass; pass objects rather than names for metrics defined in a notebook, so they travel
    to Dask workers with the options.
    """
    items = algorithm.items() if isinstance(algorithm, Mapping) else [(algorithm, 1.0)]
    out = []
    for name, weight in items:
        if isinstance(name, DiversityMetric) or isinstance(name, type) and issubclass(name, DiversityMetric):
            key = name
        elif isinstance(name, str) and name.lower() in _REGISTRY:
            key = name.lower()
        else:
            raise OptionError(f"option algorithm={name!r} is unknown: {_suggest(name)}use one of "
                              f"{_metric_names()}, a DiversityMetric, or a mapping {{metric: weight}}")
        if isinstance(weight, bool) or not (isinstance(weight, int | float) and weight > 0):
            raise OptionError(f"option algorithm: weight of {name!r} must be > 0, got {weight!r}")
        out.append((key, float(weight)))
    if not out:
        raise OptionError("option algorithm is empty: name at least one metric")
    total = sum(w for _, w in out)
    return [(n, w / total) for n, w in out]


def build_metrics(metric_weights, reference_size: int = 1024, neighbours: int = 64,
                  precision: str = "float32", exact_neighbours: int = 32768, probes: int = 2,
                  ) -> list[tuple[DiversityMetric, float]]:
    """Instantiate the resolved metrics (``precision``: "float32" or "bfloat16" for their big products)."""
    out = []
    for key, weight in metric_weights:
        metric = _REGISTRY[key] if isinstance(key, str) else key
        if isinstance(metric, type):
            if issubclass(metric, Facility):
                metric = metric(reference_size, neighbours, precision, exact_neighbours, probes)
            else:
                metric = metric(precision) if issubclass(metric, DiSF | PairSimi) else metric()
        out.append((metric, weight))
    return out


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
    reference represent the rows ``reference`` (m x d) when it is given, else every row of ``emb``;
    ``weights`` (one per represented row) go to those whose ``evaluate`` takes them."""
    values, total = {}, 0.0
    for metric, weight in metrics:
        extra = {}
        if reference is not None and metric.uses_reference:
            extra["reference"] = reference
        if weights is not None and metric.uses_reference and accepts(metric.evaluate, "weights"):
            extra["weights"] = weights
        values[metric.name] = metric.evaluate(emb, selected, **extra)
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
            extra = {} if reference is None else {"reference": reference}
            values = metric.evaluate_both(emb, first, second, **extra, weights=weights)
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


def _shrink(gain: Tensor, noise: Tensor) -> Tensor:
    """Empirical-Bayes shrinkage of noisy per-row gains (G, b) towards each rollout's mean gain.

    With a fixed reference sample, a row's gain rests on the few sampled rows it covers (about
    m / k per selected row), so gains spread far more than the true ones and, learned against for
    every step, they outvote the (exact) quality gains: the selection chases sampling noise and its
    quality falls below quality top-k's. Scaling the deviations by signal / (signal + noise)
    variance (James-Stein) keeps what the sample does know.
    """
    mean = gain.mean(1, keepdim=True)
    spread = (gain - mean).pow(2).mean(1, keepdim=True)
    keep = (1 - noise.mean(1, keepdim=True) / spread.clamp(min=1e-30)).clamp_(0, 1)
    return mean + keep * (gain - mean)


def _mean_one(weights: Tensor) -> Tensor:
    """Weights scaled to mean 1, so a weighted mean is ``(x * w).mean()``."""
    return weights * (weights.numel() / weights.sum())


def _weighted_mean(values: Tensor, share: Tensor | None) -> Tensor:
    """Mean over the last axis, each column weighted by ``share`` (mean-1 weights) when given."""
    return values.mean(-1) if share is None else (values * share).mean(-1)


def accepts(function, name: str) -> bool:
    """Whether ``function`` takes a parameter ``name`` (user metrics may predate an argument)."""
    return name in inspect.signature(function).parameters


def _selection_sums(emb: Tensor, idx: Tensor) -> Tensor:
    """Sum of each rollout's rows, (G, d): reads only the selected rows, no (G, k, d) copy."""
    return torch.nn.functional.embedding_bag(idx, emb, mode="sum")
