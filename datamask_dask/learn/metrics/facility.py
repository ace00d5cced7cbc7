"""Facility location: mean over a reference set V of the best similarity to U (clamped at 0),
weighted by the rows each row of V stands for, learned on a sparse k-NN graph."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import facility_cpu
from ..knn import aligned_rows, top_neighbours
from ..sums import add_at_columns
from .base import EVERY_ROW, DiversityMetric, MetricSettings, mean_one, weighted_mean

Tensor = torch.Tensor
EVAL_PRODUCTS = 1 << 24  # similarities held at once when evaluating (rows of the chunk x selected rows)


@dataclass(frozen=True)
class FacilityState:
    """One step's graph: each represented row's listed neighbours and what they would add."""

    values: Tensor  # (m, t): similarity of each listed neighbour above the row's floor, clamped at 0
    neighbours: Tensor  # (m, t): the listed neighbours' positions in the batch
    sampled: bool  # the represented rows are a fixed sample of the batch: gains are shrunk by their noise
    share: Tensor | None  # (m,): the represented rows' weights scaled to mean 1 (None: each counts once)
    floor: Tensor  # the (weighted) mean floor, added back to every reward


class Facility(DiversityMetric):
    """Facility location: mean over a reference set of the best clamped similarity to U.

    While learning, each reference row keeps only its ``neighbours`` most similar batch rows
    (a sparse k-NN graph, as large-scale facility location does): a row's best similarity to U
    almost always comes from one of them, and each step then costs O(G m t) instead of O(G m b).

    Represented rows may carry weights (:class:`~.base.Represented`): the
    number of table rows each stands for once its near-copies are set aside
    (``diversity_scope="table"``). The term is then the weighted mean, which is the facility
    location of the whole table with each copy represented where its kept row is.
    """

    name = "Facility"
    uses_reference = True

    def __init__(self, reference_size: int = 1024, neighbours: int = 32, precision: str = "float32",
                 exact_max: int = 32768, probes: int = 2):
        self.reference_size = reference_size
        self.neighbours = neighbours
        self.precision = precision
        self.exact_max = exact_max  # batches larger than this get an approximate graph (see knn)
        self.probes = probes

    @classmethod
    def from_settings(cls, settings: MetricSettings) -> Facility:
        return cls(settings.reference_size, settings.neighbours, settings.precision,
                   settings.exact_neighbours, settings.probes)

    def prepare(self, emb, generator, represented=EVERY_ROW) -> FacilityState:
        reference, reference_rows, weights = represented.rows, represented.positions, represented.weights
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
        share = None if weights is None else mean_one(weights.to(values.dtype))
        return FacilityState(values.clamp_(min=0), neighbours, reference_rows is not None, share,
                             weighted_mean(floor, share))

    def rewards(self, emb, idx, state):
        member = torch.zeros((idx.shape[0], emb.shape[0]), dtype=torch.bool, device=idx.device)
        member.scatter_(1, idx, True)
        if facility_cpu.available(state.values):
            best = facility_cpu.best_and_gains(state.values, state.neighbours, member, None,
                                               with_gains=False)[0]
            return weighted_mean(best, state.share) + state.floor
        return weighted_mean(self._held(state, member)[0].amax(-1), state.share) + state.floor

    @staticmethod
    def _held(state: FacilityState, member):
        """Each reference row's neighbours' similarities where the neighbour is in U, else 0 (G, m, t),
        and the flat (G, m * t) gather index of the neighbours."""
        values, neighbours = state.values, state.neighbours
        # A float mask and a flat gather: torch's CPU kernels are several times slower on bool
        # operands and on member[:, neighbours] indexing.
        flat = neighbours.view(1, -1).expand(member.shape[0], -1)
        return values * member.to(values.dtype).gather(1, flat).view(-1, *values.shape), flat

    def gains(self, emb, idx, state, member):
        return self.rewards_and_gains(emb, idx, state, member)[1]

    def rewards_and_gains(self, emb, idx, state, member):
        values, neighbours, share = state.values, state.neighbours, state.share
        # one compiled pass on CPU; a reference sample's gains also need their noise (torch, below)
        if facility_cpu.available(values) and not state.sampled:
            best, gain = facility_cpu.best_and_gains(values, neighbours, member, share)
            gain /= values.shape[0]
            return weighted_mean(best, share) + state.floor, gain
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
        if state.sampled:
            # Each row's sampling variance of its gain: a gain is a mean over the m sampled
            # reference rows of what the row adds to each, so its variance is sum(adds^2) / m^2.
            noise = torch.zeros_like(gain)
            add_at_columns(noise, flat, joining.pow_(2).view(g, -1))
            add_at_columns(noise, owner, leaving.pow(2))
            gain = _shrink(gain, noise / (m * m))
        return weighted_mean(best, share) + state.floor, gain

    def evaluate(self, emb, selected, represented=EVERY_ROW):
        """Mean over the represented rows (every row of ``emb`` by default) of their best clamped
        similarity to the selected rows of ``emb``: on a uniform sample drawn independently of the
        selection, an unbiased estimate of the whole chunk's term; weighted by their weights."""
        rows = emb if represented.rows is None else represented.rows
        return self._coverage(rows, emb, selected, [(0, selected.numel())], represented.weights)[0]

    def evaluate_both(self, emb, first, second, represented=EVERY_ROW) -> tuple[float, float]:
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
        rows = emb if represented.rows is None else represented.rows
        values = self._coverage(rows, emb, columns, spans, represented.weights)
        return values[0], values[1]

    @staticmethod
    def _coverage(rows, emb, columns, spans, weights=None) -> list[float]:
        """For each ``(low, high)`` of ``spans``: the (weighted) mean over ``rows`` of the best
        clamped similarity to the rows ``columns[low:high]`` of ``emb``. The product runs on a
        column count padded as :func:`~datamask_dask.learn.knn.top_neighbours` pads it (a count
        that is no multiple of 16 runs slower on CPU); the padding is in no span."""
        selected = aligned_rows(emb, columns)
        block = max(1, EVAL_PRODUCTS // selected.shape[0])
        totals = [0.0] * len(spans)
        for start in range(0, rows.shape[0], block):
            similarity = rows[start:start + block] @ selected.T
            for i, (low, high) in enumerate(spans):
                best = similarity[:, low:high].amax(1).clamp(min=0)
                if weights is not None:
                    best = best.double() * weights[start:start + block].double()
                totals[i] += float(best.sum())
        mass = rows.shape[0] if weights is None else float(weights.double().sum())
        return [total / mass for total in totals]


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
