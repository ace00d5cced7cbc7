"""The yardstick of a selection's quality: the share of a strong baseline's gain over random.

On these objectives a random pick already scores most of greedy's value (a ratio of objectives
near 1 says almost nothing), so a selection is measured by how much of what the baseline gains
over random it gains too::

    share = (f(selection) - f(random)) / (f(baseline) - f(random))

``f`` is the joint objective of :func:`~datamask_dask.learn.objectives.evaluate_selection` over
every row given; ``random`` is the mean of ``seeds`` random picks of the same size; the baseline is
lazy greedy (plain greedy where no term is lazy) up to ``greedy_max_rows`` rows and stochastic
greedy above. Quality top-k is scored beside it, so a selection at ``lamb > 0`` can be checked
against the trivial answer of the quality term. Above ``reference_rows`` rows, Facility's term is
estimated on one fixed uniform sample of that many rows, the same for every selection scored, so
their differences carry little of the sample's noise.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .baselines import lazy_greedy, quality_topk, random_selection, stochastic_greedy
from .objectives import evaluate_selection

#: Above this many rows the baseline is stochastic greedy (lazy greedy's cost grows as n x k).
GREEDY_MAX_ROWS = 50_000
RANDOM_SEEDS = 3
#: Rows Facility is evaluated on when the table has more (its exact value costs n x k products).
REFERENCE_ROWS = 20_000


@dataclass(frozen=True)
class Yardstick:
    """A selection's objective beside the references it is measured against.

    Attributes
    ----------
    objective : float
        ``f`` of the selection.
    random : float
        Mean ``f`` of ``RANDOM_SEEDS`` uniform random picks of the same size.
    baseline : float
        ``f`` of the baseline's pick, named by ``baseline_name``.
    topk : float
        ``f`` of quality top-k.
    share : float
        The selection's share of the baseline's gain over random (1.0: as good as the baseline).
    topk_share : float
        Quality top-k's share of the same gain.
    """

    objective: float
    random: float
    baseline: float
    baseline_name: str
    topk: float
    share: float
    topk_share: float

    @property
    def over_topk(self) -> float:
        """How far the selection's objective is above quality top-k's (negative: below it)."""
        return self.objective - self.topk

    def as_dict(self) -> dict:
        return {**asdict(self), "over_topk": self.over_topk}


def measure(quality, embeddings, selected, *, algorithm="Pair_simi", lamb: float = 0.5, quality_range=None,
            seeds: int = RANDOM_SEEDS, greedy_max_rows: int = GREEDY_MAX_ROWS,
            reference_rows: int = REFERENCE_ROWS, device="cpu") -> Yardstick:
    """Measure a selection of the rows of ``embeddings`` with the yardstick (see the module).

    Parameters
    ----------
    quality : array-like (n,)
    embeddings : array-like (n, d)
    selected : array-like of bool (n,)
        The selection to measure; its size is the ``k`` every reference picks.
    algorithm, lamb, quality_range
        The objective, as for the learner (the table's quality range is what a job uses).
    seeds : int
        Random picks averaged (at least 3).
    greedy_max_rows : int
        Up to this many rows the baseline is lazy greedy, above it stochastic greedy.
    reference_rows : int
        Above this many rows, Facility is evaluated on a fixed uniform sample of them.
    """
    quality = np.asarray(quality, dtype=np.float32)
    embeddings = np.asarray(embeddings, dtype=np.float32)
    embeddings = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
    selected = np.asarray(selected, dtype=bool)
    k = int(selected.sum())
    n = len(quality)
    common = {"algorithm": algorithm, "lamb": lamb, "quality_range": quality_range, "device": device}
    reference = None
    if n > reference_rows:
        reference = np.sort(np.random.default_rng(0).choice(n, reference_rows, replace=False))

    def score(rows) -> float:
        return evaluate_selection(quality, embeddings, rows, reference=reference, **common)["objective"]

    randoms = [score(random_selection(quality, embeddings, k, seed=seed, **common)) for seed in range(seeds)]
    if n <= greedy_max_rows:
        name, pick = "lazy greedy", lazy_greedy(quality, embeddings, k, **common)
    else:
        name = "stochastic greedy"
        pick = stochastic_greedy(quality, embeddings, k, **common)
    objective, random, baseline = score(selected), float(np.mean(randoms)), score(pick)
    topk = score(quality_topk(quality, embeddings, k, **common))
    span = baseline - random
    return Yardstick(objective=objective, random=random, baseline=baseline, baseline_name=name, topk=topk,
                     share=(objective - random) / span if span else float("nan"),
                     topk_share=(topk - random) / span if span else float("nan"))
