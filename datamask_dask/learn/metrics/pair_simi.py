"""Pair_simi: 1 - mean pairwise cosine similarity of U, from w = sum of U's unit vectors
(sum_{i != j} s_ij = |w|^2 - k, so O(k d))."""

from __future__ import annotations

import torch

from .base import EVERY_ROW, DiversityMetric, MetricSettings

Tensor = torch.Tensor


class PairSimi(DiversityMetric):
    """1 - mean pairwise cosine similarity of the selected unit vectors.

    Per step it reads the k selected rows (to sum them, in float32) and the batch once (every
    row's dot product with that sum, in ``precision``): memory-bound, so bfloat16 halves it.
    """

    name = "Pair_simi"

    def __init__(self, precision: str = "float32"):
        self.precision = precision
        # A piece of a table learned apart: the sum of the unit rows and the count the rest of the
        # table is planned to select (``learn_mask``'s ``others``, scaled to the batch's picks), so that
        # the piece learns the table's pairwise similarity, not its own. None: the chunk is the table.
        self.others: tuple[Tensor, float] | None = None

    @classmethod
    def from_settings(cls, settings: MetricSettings) -> PairSimi:
        return cls(settings.precision)

    def prepare(self, emb, generator, represented=EVERY_ROW):
        return emb.to(torch.bfloat16) if self.precision == "bfloat16" else None  # the batch, for dots

    def rewards(self, emb, idx, state):
        k = idx.shape[1]
        w, others = self._sums(emb, idx)
        pair_sum = w.pow(2).sum(1) - (k + others)
        return 1.0 - pair_sum / max(k * (k + others - 1), 1)

    def _sums(self, emb, idx) -> tuple[Tensor, float]:
        """Each rollout's sum with the rest of the table's planned picks (:attr:`others`), and their
        count."""
        w = selection_sums(emb, idx)
        if self.others is None:
            return w, 0
        return w + self.others[0].to(w.dtype), self.others[1]

    def gains(self, emb, idx, state, member):
        return self.rewards_and_gains(emb, idx, state, member)[1]

    def rewards_and_gains(self, emb, idx, state, member):
        k = idx.shape[1]
        w, others = self._sums(emb, idx)
        pair_sum = ((w * w).sum(1) - (k + others))[:, None]
        # e_j . w, (G, b); the bfloat16 copy multiplies as (b, d) @ (d, G), which oneDNN runs
        # faster than (G, d) @ (d, b) (float32 is the other way round)
        dots = w @ emb.T if state is None else (state @ w.to(state.dtype).T).float().T
        mean_with = pair_sum / max(k * (k + others - 1), 1)
        # A member j leaves: its k - 1 similarities go, twice. A non-member joins: k new ones, twice.
        mean_without = (pair_sum - 2 * (dots - 1)) / max((k - 1) * (k + others - 2), 1)
        mean_plus = (pair_sum + 2 * dots) / ((k + 1) * (k + others))
        return 1.0 - mean_with[:, 0], torch.where(member, mean_without - mean_with, mean_with - mean_plus)


def selection_sums(emb: Tensor, idx: Tensor) -> Tensor:
    """Sum of each rollout's rows, (G, d): reads only the selected rows, no (G, k, d) copy."""
    return torch.nn.functional.embedding_bag(idx, emb, mode="sum")
