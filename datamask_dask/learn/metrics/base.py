"""The interface of a diversity metric, what it is built from and what it represents.

A metric is an object with four methods (:class:`DiversityMetric`); the learner builds the
registered ones from :class:`MetricSettings` (the learner's options for them) and tells each which
rows a selection should represent (:class:`Represented`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

Tensor = torch.Tensor


@dataclass(frozen=True)
class MetricSettings:
    """The learner's options a built-in metric is made with (:meth:`DiversityMetric.from_settings`)."""

    precision: str  # "float32", or "bfloat16" for the big products
    reference_size: int  # rows a batch is represented by when it represents itself (Facility)
    neighbours: int  # each represented row's listed neighbours (Facility's k-NN graph)
    exact_neighbours: int  # batches above this many rows get an approximate graph (knn.py)
    probes: int  # clusters the approximate graph searches


@dataclass(frozen=True)
class Represented:
    """The rows a selection should represent, for a metric whose ``uses_reference`` is True. The default
    is every row of the batch, each counting once."""

    # (m, d): rows other than the batch's own (the whole chunk, a sample of it, held-out rows)
    rows: Tensor | None = None
    # (m,): where ``rows`` is a sample of the batch, each row's position in it (-1: not in the batch),
    # so that a sampled row does not represent itself (see Facility)
    positions: Tensor | None = None
    # how many table rows each represented row stands for (one per row of ``rows``, or of the batch)
    weights: Tensor | None = None


EVERY_ROW = Represented()


class DiversityMetric:
    """Interface of a diversity metric; higher values mean a more diverse set, ideally in [0, 1].

    Subclasses implement :meth:`rewards`. Overriding :meth:`gains` with the exact marginal gain of
    each row makes the default ``update="credit"`` learner much more sample-efficient; the default
    estimates it from the rewards alone (mean reward of the rollouts with the row minus without).
    """

    name = "metric"
    uses_reference = False  # True: prepare() and evaluate() are told the rows to represent

    @classmethod
    def from_settings(cls, settings: MetricSettings) -> DiversityMetric:
        """The metric the learner uses, made with its options (a user metric: its own defaults)."""
        return cls()

    def prepare(self, emb: Tensor, generator: torch.Generator,
                represented: Represented = EVERY_ROW) -> object:
        """Per-step precomputation on the batch embeddings ``emb`` (b x d); returned as ``state``.

        ``represented`` holds the rows the selection should represent when they are not the batch
        itself, their positions when they are a sample of it, and their weights; the learner passes
        them only to metrics whose ``uses_reference`` is True. Metrics where coverage counts rows
        should weigh each represented row by its weight.
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

    def evaluate(self, emb: Tensor, selected: Tensor, represented: Represented = EVERY_ROW) -> float:
        """Diversity of one selection (indices into ``emb``) measured on the whole chunk (or, for a
        metric that uses a reference, on the ``represented`` rows)."""
        state = self.prepare(emb, torch.Generator(device=emb.device).manual_seed(0))
        return float(self.rewards(emb, selected[None], state)[0])


def mean_one(weights: Tensor) -> Tensor:
    """Weights scaled to mean 1, so a weighted mean is ``(x * w).mean()``."""
    return weights * (weights.numel() / weights.sum())


def weighted_mean(values: Tensor, share: Tensor | None) -> Tensor:
    """Mean over the last axis, each column weighted by ``share`` (mean-1 weights) when given."""
    return values.mean(-1) if share is None else (values * share).mean(-1)
