"""DiSF (Fan et al., ICLR 2025): 1 - mean squared off-diagonal entry of the d x d correlation matrix
of U's standardised features."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .base import EVERY_ROW, DiversityMetric, MetricSettings

Tensor = torch.Tensor


@dataclass(frozen=True)
class TableMoments:
    """Where a DiSF chunk is one piece of a table learned apart (``pieces="context"``): the table's
    per-dimension ``mean`` and ``std`` of its unit rows, by which every piece standardises its
    features (a piece's own would hide what sets it apart from the rest), and the second moment
    ``sum z z^T`` of the standardised rows the rest of the table picks, with their ``count`` (none
    before the first round)."""

    mean: np.ndarray  # (d,) float64
    std: np.ndarray  # (d,) float64, zeros replaced by 1
    moment: np.ndarray | None = None  # (d, d) float64
    count: float = 0.0

    def on(self, device, scale: float) -> tuple[Tensor, Tensor, Tensor | None, float]:
        """As float32 tensors on ``device``, the rest's moment and count times ``scale`` (a batch's
        share of the chunk's picks)."""
        def tensor(values):
            return torch.as_tensor(np.asarray(values, dtype=np.float32), device=device)

        outside = None if self.moment is None or not self.count else tensor(self.moment * scale)
        return tensor(self.mean), tensor(self.std), outside, float(self.count) * scale


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
        # A piece of a table learned apart (learn_mask's ``moments``, the rest's moment and count scaled
        # to the batch's picks): rewards and gains are then the union's with the rest, standardised by
        # the table's moments. None: the chunk is the table, standardised by U's own.
        self.table: tuple[Tensor, Tensor, Tensor | None, float] | None = None

    @classmethod
    def from_settings(cls, settings: MetricSettings) -> DiSF:
        return cls(settings.precision)

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
        if self.table is not None:
            return self._in_table(emb, idx)[0]
        z = self._standardise(emb[idx])
        return self._reward(z, self._second_moment(z))

    def gains(self, emb, idx, state, member):
        return self.rewards_and_gains(emb, idx, state, member)[1]

    def rewards_and_gains(self, emb, idx, state, member):
        if self.table is not None:
            return self._in_table(emb, idx, member)
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

    def _in_table(self, emb, idx, member=None) -> tuple[Tensor, Tensor | None]:
        """Rewards (and, given ``member``, exact gains) of DiSF over the union of each rollout with the rest's
        picks, features standardised by the table's moments, scaled by the union's rows over the piece's:
        unscaled, a piece's diversity term would shrink against its quality term as the table grows."""
        mean, std, outside, count = self.table
        k, d = idx.shape[1], emb.shape[1]
        z = (emb[idx] - mean) / std  # (G, k, d)
        moment = z.transpose(1, 2) @ z  # (G, d, d): the union's, once the rest's is added
        if outside is not None:
            moment = moment + outside
        diagonal = torch.diagonal(moment, dim1=1, dim2=2)
        off = moment.pow(2).sum((1, 2)) - diagonal.pow(2).sum(1)  # squared off-diagonal mass
        union = k + count
        norm = d * (d - 1) * union * k
        reward = 1.0 - off / norm
        if member is None:
            return reward, None
        rows = (emb - mean) / std  # (b, d)
        if d <= self.rank:  # z_j^T M z_j, exactly
            cross = torch.einsum("bd,gde,be->gb", rows, moment, rows)
        else:  # |F z_j|^2 with F^T F the top eigenpairs of M
            factor = self._top_eigen_factor(moment)  # (G, s, d)
            low = torch.bfloat16 if self.precision == "bfloat16" else rows.dtype
            cross = (rows.to(low) @ factor.to(low).transpose(1, 2)).float().pow(2).sum(-1)
        cross = cross - (rows.pow(2)[None] * diagonal[:, None]).sum(-1)  # (G, b)
        own = (rows.pow(2).sum(1).pow(2) - rows.pow(4).sum(1))[None]  # the row's own off-diagonal mass
        joined = (off[:, None] + 2 * cross + own) * union / (union + 1) ** 2
        left = (off[:, None] - 2 * cross + own) * union / max(union - 1, 1) ** 2
        gains = torch.where(member, left - off[:, None] / union, off[:, None] / union - joined)
        return reward, gains * union / norm

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

    def evaluate(self, emb, selected, represented=EVERY_ROW):
        z = self._standardise(emb[selected].double())
        k, d = z.shape
        corr = (z.T @ z) / k
        off = corr.pow(2).sum() - torch.diagonal(corr).pow(2).sum()
        return float(1.0 - off / (d * (d - 1)))
