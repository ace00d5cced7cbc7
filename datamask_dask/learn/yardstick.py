"""The yardstick of a selection's quality: the share of a strong baseline's gain over random.

On these objectives a random pick already scores most of greedy's value (a ratio of objectives
near 1 says almost nothing), so a selection is measured by how much of what the baseline gains
over random it gains too::

    share = (f(selection) - f(random)) / (f(baseline) - f(random))

``f`` is the joint objective of :func:`~datamask_dask.learn.metrics.evaluate_selection` over
every row given; ``random`` is the mean of ``seeds`` random picks of the same size; the baseline is
the better of quality top-k and lazy greedy (plain greedy where no term is lazy; above
``greedy_max_work`` multiply-adds, or for Facility where its cache would not hold every row, the
fallback of :func:`greedy_pick`). Quality top-k's own share is reported beside the selection's, so a
selection at ``lamb > 0`` is checked against the trivial answer of the quality term. Above
``reference_rows`` rows, Facility's term is estimated on one fixed uniform sample of that many rows,
the same for every selection scored, so their differences carry little of the sample's noise.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..errors import OptionError
from .baselines import (
    DEFAULT_MAX_MEMORY,
    graph_lazy_greedy,
    lazy_greedy,
    quality_topk,
    random_selection,
    stochastic_greedy,
)
from .metrics import DiSF, Facility, build_metrics, evaluate_selection, resolve_metrics

#: Multiply-adds lazy greedy may cost (n x k candidate scores of d (Pair_simi) or d^2 (DiSF) each, or
#: Facility's n x |V| x d similarity cache); above it :func:`greedy_pick` falls back.
GREEDY_MAX_WORK = 1e12
RANDOM_SEEDS = 3
#: Rows Facility is evaluated on when the table has more (its exact value costs n x k products).
REFERENCE_ROWS = 20_000


@dataclass(frozen=True)
class Yardstick:
    """A selection's objective ``f`` beside those of the references it is measured against.

    ``random`` is the mean ``f`` of the random picks; ``share`` is the selection's share of the
    baseline's gain over random (1.0: as good as the baseline), ``topk_share`` quality top-k's.
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


def measure(quality, embeddings, selected, **options) -> Yardstick:
    """Measure one selection (a bool array) of the rows of ``embeddings``; see :func:`measure_all`."""
    return measure_all(quality, embeddings, [selected], **options)[0]


def measure_all(quality, embeddings, selections, *, algorithm="Pair_simi", lamb: float = 0.5,
                quality_range=None, seeds: int = RANDOM_SEEDS, greedy_max_work: float = GREEDY_MAX_WORK,
                reference_rows: int = REFERENCE_ROWS, device="cpu") -> list[Yardstick]:
    """Measure selections (bool arrays of one size ``k``, the size every reference picks) of the rows
    of ``embeddings`` with the yardstick (see the module), the references computed once for them all.

    ``algorithm``, ``lamb`` and ``quality_range`` give the objective, as for the learner (the table's
    quality range is what a job uses); ``seeds`` random picks are averaged; ``greedy_max_work``
    bounds the cost of lazy greedy (:func:`greedy_work`), above which :func:`greedy_pick` falls back.
    """
    quality, embeddings = _unit_inputs(quality, embeddings)
    selections = [np.asarray(selected, dtype=bool) for selected in selections]
    k = int(selections[0].sum())
    if any(int(selected.sum()) != k for selected in selections):
        raise OptionError("selections measured together must all hold the same number of rows")
    n = len(quality)
    common = {"algorithm": algorithm, "lamb": lamb, "quality_range": quality_range, "device": device}
    reference = None
    if n > reference_rows:
        # another stream than the random picks' (default_rng(seed)), so no pick is the sample itself
        reference = np.sort(np.random.default_rng([0, 1]).choice(n, reference_rows, replace=False))

    def score(rows) -> float:
        return evaluate_selection(quality, embeddings, rows, reference=reference, **common)["objective"]

    random = float(np.mean([score(random_selection(quality, embeddings, k, seed=seed, **common))
                            for seed in range(seeds)]))
    name, pick = greedy_pick(quality, embeddings, k, greedy_max_work, reference_rows, **common)
    baseline, topk = score(pick), score(quality_topk(quality, embeddings, k, **common))
    if topk > baseline:  # stochastic greedy can fall below the quality term's own optimum
        name, baseline = "quality top-k", topk
    span = baseline - random

    def share(value: float) -> float:
        return (value - random) / span if span else float("nan")

    return [Yardstick(objective=value, random=random, baseline=baseline, baseline_name=name, topk=topk,
                      share=share(value), topk_share=share(topk))
            for value in (score(selected) for selected in selections)]


def greedy_work(n: int, k: int, d: int, algorithm) -> float:
    """Multiply-adds of lazy greedy selecting ``k`` of ``n`` rows of dimension ``d`` (the order of it)."""
    work = 16.0 * n * k  # each step's bookkeeping over every row (bounds, quality), a dozen passes
    for metric, _ in build_metrics(resolve_metrics(algorithm)):
        if isinstance(metric, Facility):  # the similarity cache: |V| reference rows, as many as fit
            work += n * min(n, DEFAULT_MAX_MEMORY // (4 * n)) * d
        else:
            work += n * k * (8 * d * d if isinstance(metric, DiSF) else d)  # DiSF: several d x d passes
    return work


def greedy_pick(quality, embeddings, k: int, greedy_max_work: float = GREEDY_MAX_WORK,
                reference_rows: int = REFERENCE_ROWS, **common):
    """The greedy baseline's name and rows: lazy greedy where its cost allows; for Facility alone,
    lazy greedy on its k-NN graph where that is over ``greedy_max_work`` or its cache would not hold
    every row; else stochastic greedy.

    A sample of reference rows, for lazy greedy's cache or stochastic greedy's (``reference_rows``,
    drawn apart from the evaluation's), is covered long before ``k`` picks when ``k`` nears its size,
    and the picks after that are random: hence the graph, which covers every row."""
    algorithm = common.get("algorithm", "Pair_simi")
    n = len(quality)
    facility_only = [type(metric) for metric, _ in build_metrics(resolve_metrics(algorithm))] == [Facility]
    dense = not facility_only or 4 * n * n <= DEFAULT_MAX_MEMORY  # Facility: a cache of every row
    if dense and greedy_work(n, k, np.shape(embeddings)[1], algorithm) <= greedy_max_work:
        return "lazy greedy", lazy_greedy(quality, embeddings, k, **common)
    if facility_only:
        options = {key: common[key] for key in ("lamb", "quality_range", "device") if key in common}
        return "lazy greedy (k-NN graph)", graph_lazy_greedy(quality, embeddings, k, **options)
    return "stochastic greedy", stochastic_greedy(quality, embeddings, k, seed=1, max_memory_bytes=0,
                                                  reference_size=min(reference_rows, n), **common)


@dataclass(frozen=True)
class TermShares:
    """What a selection reaches of each term's own optimum: the share of quality top-k's quality gain
    over random, and of the diversity optimum's (greedy at lamb 0) diversity gain over random."""

    quality: float
    diversity: float


def term_shares(quality, embeddings, selections, *, algorithm="Pair_simi", quality_range=None,
                seeds: int = RANDOM_SEEDS, device="cpu") -> list[TermShares]:
    """:class:`TermShares` of each selection (bool arrays of one size) on the rows given."""
    quality, embeddings = _unit_inputs(quality, embeddings)
    k = int(np.asarray(selections[0]).sum())
    common = {"algorithm": algorithm, "quality_range": quality_range, "device": device}

    def terms(rows) -> np.ndarray:
        value = evaluate_selection(quality, embeddings, rows, lamb=0.5, **common)
        return np.array([value["quality"], value["diversity"]])

    random = np.mean([terms(random_selection(quality, embeddings, k, seed=seed)) for seed in range(seeds)], 0)
    best_quality = terms(quality_topk(quality, embeddings, k))[0]
    best_diversity = terms(greedy_pick(quality, embeddings, k, lamb=0.0, **common)[1])[1]
    spans = np.array([best_quality, best_diversity]) - random
    shares = [(terms(np.asarray(rows, dtype=bool)) - random) / spans for rows in selections]
    return [TermShares(float(q), float(d)) for q, d in shares]


def _unit_inputs(quality, embeddings) -> tuple[np.ndarray, np.ndarray]:
    """Quality and embeddings as float32 arrays, the embeddings' rows scaled to unit length."""
    embeddings = np.asarray(embeddings, dtype=np.float32)
    unit = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
    return np.asarray(quality, dtype=np.float32), unit
