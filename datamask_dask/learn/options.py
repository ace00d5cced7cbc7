"""Options of the mask learner, with the reference tool's names, validated once."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..errors import OptionError

UPDATES = ("credit", "paper", "plackett_luce")
INITS = ("quality", "same")
FINALS = ("best", "topk", "sample")
PRECISIONS = ("auto", "float32", "bfloat16")
LAMB_SCALES = ("paper", "gain")


# Each option's rule on its own value: (test, what is expected). DataMaskOptions checks them all; the
# command line checks the flags given with them before it loads torch.
RULES = {
    "n_epochs": (lambda v: v >= 1, "an integer >= 1"),
    "partial": (lambda v: 0 < v <= 1, "a share in (0, 1]"),
    "lamb": (lambda v: 0 <= v <= 1, "a weight in [0, 1]"),
    "n_rollout": (lambda v: v >= 2,
                  "an integer >= 2 (advantages are standardised within the group; the paper uses 128)"),
    "prune": (lambda v: 0 <= v < 1, "a share in [0, 1)"),
    "init": (lambda v: v in INITS, f"one of {INITS}"),
    "lamb_scale": (lambda v: v in LAMB_SCALES, f"one of {LAMB_SCALES}"),
    "update": (lambda v: v in UPDATES, f"one of {UPDATES}"),
    "final": (lambda v: v in FINALS, f"one of {FINALS}"),
    "refine": (lambda v: v == 0 or v >= 1, "0 (off) or a pool size of at least 1 x k"),
    "refine_epochs": (lambda v: v >= 0, "an integer >= 0"),
    "refine_lr": (lambda v: v > 0, "a learning rate > 0"),
    "refine_reference": (lambda v: v >= 1, "an integer >= 1"),
    "polish": (lambda v: v >= 0, "an integer >= 0 (0: off)"),
    "max_batch": (lambda v: v >= 2, "an integer >= 2"),
    "reference_size": (lambda v: v >= 1, "an integer >= 1"),
    "neighbours": (lambda v: v >= 1, "an integer >= 1"),
    "exact_neighbours": (lambda v: v >= 0, "an integer >= 0"),
    "probes": (lambda v: v >= 1, "an integer >= 1"),
    "precision": (lambda v: v in PRECISIONS, f"one of {PRECISIONS}"),
    "rollout_chunk": (lambda v: v >= 1, "an integer >= 1"),
}


def check_option(name: str, value) -> None:
    """Raise :class:`OptionError` where ``value`` breaks the rule of learner option ``name``."""
    test, expected = RULES[name]
    _check(test(value), name, value, expected)


@dataclass(frozen=True)
class DataMaskOptions:
    """Settings of one DATAMASK run (names follow the paper's reference command).

    Parameters
    ----------
    n_epochs : int
        Optimisation steps.
    partial : float
        Share of the chunk that takes part in each step, in (0, 1]. Rollouts and rewards are
        computed inside that batch and only its logits move.
    algorithm : str or mapping
        Diversity metric: ``"DiSF"``, ``"Facility"``, ``"Pair_simi"`` (case-insensitive), a
        registered user metric, or a mapping ``{name: weight}`` combining several.
    max_lr, min_lr : float
        Learning rate, decayed linearly from ``max_lr`` to ``min_lr`` over ``n_epochs`` steps.
    lamb : float
        Weight of quality in the reward, in [0, 1]: ``lamb * quality + (1 - lamb) * diversity``.
    lamb_scale : {"paper", "gain"}
        ``"paper"``: the terms as they are, whose spreads differ by an order of magnitude, so lamb
        weighs them unevenly. ``"gain"``: each term divided by what it can gain over a random pick on
        the chunk, so lamb 0.5 weighs a point of each term's gain alike; it costs an extra learn (at
        ``lamb = 0``) per chunk.
    n_rollout : int
        Masks sampled per step (G). At least 2: advantages are standardised within the group.
    init : {"quality", "same"}
        Initial logits: log of the normalised quality, or all zero.
    prune : float
        Share of the chunk, worst quality first, made ineligible before learning, in [0, 1).
    seed : int
        Seed of every random draw; the same seed gives the same selection.
    update : {"credit", "paper", "plackett_luce"}
        ``"paper"``: each logit moves by the mean group advantage of the rollouts that contained
        it (the published method). ``"plackett_luce"``: the exact score-function gradient of the
        ordered Plackett-Luce sample. ``"credit"`` (default): each selected row is credited with
        its own leave-one-out contribution to the reward, a far less noisy signal (see README).
    final : {"best", "topk", "sample"}
        ``"best"``: the best mask the policy drew in a stage where every row took part in every step,
        else the top-k of the learned logits; ``"topk"``: the top-k of the learned logits (the paper);
        ``"sample"``: one Gumbel-top-k draw from them. Independent logits cannot say "one of these two
        near-duplicates", so the policy's best draw beats the top-k of its logits.
    refine : float
        Size of the candidate pool refined after the first stage, as a multiple of k (0 turns the
        stage off, which is the published method). The pool is the top rows by learned logit; it
        is re-learned with every pool row in every step and the whole chunk as reference.
    refine_epochs : int
        Steps of the refinement stage.
    refine_lr : float
        Learning rate of the refinement stage, decayed linearly to a tenth of it.
    refine_reference : int
        Rows of the chunk (all, up to this many) that the refined pool must represent. Above
        it a fixed random sample; Facility then drops sampled rows' self-matches and shrinks
        the sampled gains by their noise, so a smaller sample costs accuracy, not quality bias;
        with ``final="best"`` the learned mask is then checked against quality top-k on rows held
        out of the sample and the better one returned.
    polish : int
        Rounds of the exact local search on the final mask (``final="best"`` only; 0 turns it
        off): members of smallest marginal loss are swapped for non-members of largest marginal
        gain while the reward rises. Skipped when ``Facility`` represents a reference *sample*,
        whose reward is only an estimate.
    max_batch : int
        Upper bound on the rows of one step's batch, so memory stays bounded for any chunk size.
    reference_size : int
        Rows of the batch used as the reference set of ``Facility`` in each step.
    neighbours : int
        Most similar rows each ``Facility`` reference row keeps (its sparse k-NN graph).
    exact_neighbours : int
        Up to this many rows in a step's batch, the ``Facility`` graph is exact; above it the
        neighbours are searched in the nearest clusters only (see :mod:`datamask_dask.learn.knn`).
    probes : int
        Clusters searched per row in that case (FAISS's ``nprobe``): more find more of the true
        neighbours and cost more.
    precision : {"auto", "float32", "bfloat16"}
        Precision of the similarity products while learning; "auto" takes bfloat16 on CUDA and on
        CPUs with AMX / AVX512-BF16. Objectives are always evaluated in float32.
    rollout_chunk : int
        Rollouts evaluated at once; bounds the memory of the reward computation.
    """

    n_epochs: int = 300
    partial: float = 0.1
    algorithm: str | Mapping[str, float] = "Pair_simi"
    max_lr: float = 10.0
    min_lr: float = 1.0
    lamb: float = 0.5
    lamb_scale: str = "paper"
    n_rollout: int = 2  # the per-row credit needs few draws a step; more cost time, not share
    init: str = "quality"
    prune: float = 0.0
    seed: int = 0
    update: str = "credit"
    final: str = "best"
    refine: float = 10.0
    refine_epochs: int = 20  # fewer leave a coarser mask than the swap search can mend
    refine_lr: float = 0.5
    refine_reference: int = 8192  # Facility's graph costs reference x chunk x d
    polish: int = 32
    max_batch: int = 8192
    reference_size: int = 1024
    neighbours: int = 32
    exact_neighbours: int = 32768
    probes: int = 2
    precision: str = "auto"
    rollout_chunk: int = 32
    metric_weights: tuple = field(default=(), repr=False, init=False)  # resolved from algorithm

    def __post_init__(self) -> None:
        from .metrics import resolve_metrics

        for name in RULES:
            check_option(name, getattr(self, name))
        _check(self.max_lr >= self.min_lr >= 0, "max_lr/min_lr", (self.max_lr, self.min_lr),
               "0 <= min_lr <= max_lr")
        # Resolve metric names now so a typo fails before any compute.
        object.__setattr__(self, "metric_weights", tuple(resolve_metrics(self.algorithm)))

    @classmethod
    def from_mapping(cls, values: Mapping) -> DataMaskOptions:
        """Build options from a mapping, rejecting unknown keys with the list of known ones."""
        known = {f.name for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(set(values) - known)
        if unknown:
            raise OptionError(f"unknown option(s) {unknown}; known options are {sorted(known)}")
        return cls(**dict(values))

    def replace(self, **changes) -> DataMaskOptions:
        """A copy with some options changed (validated again)."""
        return DataMaskOptions.from_mapping({**self.as_dict(), **changes})

    def as_dict(self) -> dict:
        """The options as plain data (for manifests and configs)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
        if isinstance(out["algorithm"], Mapping):
            out["algorithm"] = dict(out["algorithm"])
        return out


def _check(ok: bool, name: str, value, expected: str) -> None:
    if not ok:
        raise OptionError(f"option {name}={value!r} is invalid: expected {expected}")
