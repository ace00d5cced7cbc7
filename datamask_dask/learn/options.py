"""Options of the mask learner, with the reference tool's names, validated once.

Each option is a field made by :func:`option`: its default, its help text and the rule its value
obeys. The command line's flags, the docstrings' option lists and the checks come from them."""

from __future__ import annotations

import dataclasses
import numbers
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..errors import OptionError

UPDATES = ("credit", "paper", "plackett_luce")
INITS = ("quality", "same")
FINALS = ("best", "topk", "sample")
PRECISIONS = ("auto", "float32", "bfloat16")
LAMB_SCALES = ("paper", "gain")


def option(default, help: str, *, doc: str | None = None, rule=None, choices: tuple | None = None, **cli):
    """A setting's field: its default, ``help`` (one line for ``--help``), ``doc`` (the docstrings' text,
    by default ``help``), ``rule`` (``(test, what is expected)``, or a function of the value that raises
    :class:`OptionError`; by default, one of ``choices``) and the command line's ``flags`` or ``type``
    where the name and the default do not say them."""
    if rule is None and choices is not None:
        rule = (lambda v: v in choices, f"one of {choices}")
    return field(default=default,
                 metadata={"help": help, "doc": doc or help, "rule": rule, "choices": choices, **cli})


def options_of(cls) -> tuple:
    """The fields of ``cls`` that are options (made by :func:`option`)."""
    return tuple(f for f in dataclasses.fields(cls) if "help" in f.metadata)


def check_value(spec: dataclasses.Field, value) -> None:
    """Raise :class:`OptionError` where ``value`` breaks the rule of option ``spec``."""
    if str(spec.type) in ("int", "int | None") and value is not None and not _whole(value):
        raise OptionError(f"option {spec.name}={value!r} is invalid: expected a whole number")
    rule = spec.metadata["rule"]
    if callable(rule):
        rule(value)
    elif rule is not None:
        test, expected = rule
        try:
            ok = test(value)
        except TypeError:  # a value of another kind (a list from a config file, say) cannot be compared
            ok = False
        _check(ok, spec.name, value, expected)


def parameters(fields, indent: int = 4) -> str:
    """The numpy-style docstring entries of ``fields``: ``name : type, default value`` and the doc."""
    def kind(spec):
        if spec.metadata["choices"]:
            return "{" + ", ".join(f'"{c}"' for c in spec.metadata["choices"]) + "}"
        names = [{"Mapping[str, float]": "mapping", "dict": "mapping"}.get(t.strip(), t.strip())
                 for t in str(spec.type).split("|") if t.strip() != "None"]
        return " or ".join(dict.fromkeys(names))

    def default(value):
        return "optional" if value is None else f'default ``"{value}"``' if isinstance(value, str) \
            else f"default {value!r}"

    lines = []
    for spec in fields:
        alias = f" (alias {spec.metadata['alias']})" if spec.metadata.get("alias") else ""
        text = spec.metadata["doc"][0].upper() + spec.metadata["doc"][1:]
        text += "" if text.endswith(".") else "."
        lines.append(" " * indent + f"{spec.name}{alias} : {kind(spec)}, {default(spec.default)}")
        lines.append(textwrap.indent(textwrap.fill(text, 104 - indent), " " * (indent + 4)))
    return "\n".join(lines)


@dataclass(frozen=True)
class DataMaskOptions:
    """Settings of one DATAMASK run (names follow the paper's reference command)."""

    n_epochs: int = option(300, "optimisation steps", rule=(lambda v: v >= 1, "an integer >= 1"))
    partial: float = option(
        0.1, "share of a chunk taking part in each step", rule=(lambda v: 0 < v <= 1, "a share in (0, 1]"),
        doc="Share of the chunk that takes part in each step, in (0, 1]. Rollouts and rewards are computed "
        "inside that batch and only its logits move.")
    algorithm: str | Mapping[str, float] = option(
        "Pair_simi", "diversity metric: DiSF, Facility, Pair_simi, or e.g. Facility=0.7,DiSF=0.3",
        type="weights", doc='Diversity metric: ``"DiSF"``, ``"Facility"``, ``"Pair_simi"`` '
        "(case-insensitive), "
        "a registered user metric, or a mapping ``{name: weight}`` combining several.")
    max_lr: float = option(10.0, "learning rate of the first step, decayed linearly to min_lr over n_epochs")
    min_lr: float = option(1.0, "learning rate of the last step")
    lamb: float = option(
        0.5, "weight of quality in the reward, in [0, 1]", rule=(lambda v: 0 <= v <= 1, "a weight in [0, 1]"),
        doc="Weight of quality in the reward, in [0, 1]: ``lamb * quality + (1 - lamb) * diversity``.")
    lamb_scale: str = option(
        "paper", "paper: the terms as they are; gain: each divided by what it can gain over random on the "
        "chunk, so lamb weighs points of gain", choices=LAMB_SCALES,
        doc='``"paper"``: the terms as they are, whose spreads differ by an order of magnitude, so lamb '
        'weighs them unevenly. ``"gain"``: each term divided by what it can gain over a random pick on the '
        "chunk, so lamb 0.5 weighs a point of each term's gain alike; it costs an extra learn (at "
        "``lamb = 0``) per chunk.")
    n_rollout: int = option(  # the per-row credit needs few draws a step; more cost time, not share
        2, "masks sampled per step", rule=(
            lambda v: v >= 2, "an integer >= 2 (advantages are standardised within the group; the paper uses "
            "128)"),
        doc="Masks sampled per step (G). At least 2: advantages are standardised within the group.")
    init: str = option("quality", "initial logits: log of the normalised quality, or all zero", choices=INITS)
    prune: float = option(
        0.0, "share of worst-quality rows made ineligible", rule=(lambda v: 0 <= v < 1, "a share in [0, 1)"),
        doc="Share of the table, worst quality first, made ineligible before learning, in [0, 1) "
        "(table-wide, not per partition; per group with ``by``).")
    seed: int = option(0, "seed of every random draw; the same seed gives the same selection",
                       rule=(lambda v: v >= 0, "an integer >= 0"))
    update: str = option(
        "credit", "how the logits move: credit (each row's own contribution), paper or plackett_luce",
        choices=UPDATES,
        doc='``"paper"``: each logit moves by the mean group advantage of the rollouts that contained it '
        '(the published method). ``"plackett_luce"``: the exact score-function gradient of the ordered '
        'Plackett-Luce sample. ``"credit"``: each selected row is credited with its own leave-one-out '
        "contribution to the reward, a far less noisy signal (see README).")
    final: str = option(
        "best", "the mask returned: best (the best drawn), topk (of the logits, the paper) or sample",
        choices=FINALS,
        doc='``"best"``: the best mask the policy drew in a stage where every row took part in every step, '
        'else the top-k of the learned logits; ``"topk"``: the top-k of the learned logits (the paper); '
        '``"sample"``: one Gumbel-top-k draw from them. Independent logits cannot say "one of these two '
        'near-duplicates", so the policy\'s best draw beats the top-k of its logits.')
    refine: float = option(
        10.0, "candidate pool refined after the first stage, as a multiple of k (0: off)",
        rule=(lambda v: v == 0 or v >= 1, "0 (off) or a pool size of at least 1 x k"),
        doc="Size of the candidate pool refined after the first stage, as a multiple of k (0 turns the stage "
        "off, which is the published method). The pool is the top rows by learned logit; it is re-learned "
        "with every pool row in every step and the whole chunk as reference.")
    refine_epochs: int = option(  # fewer leave a coarser mask than the swap search can mend
        20, "steps of the refinement stage", rule=(lambda v: v >= 0, "an integer >= 0"))
    refine_lr: float = option(0.5, "learning rate of the refinement stage, decayed linearly to a tenth of it",
                              rule=(lambda v: v > 0, "a learning rate > 0"))
    refine_reference: int = option(  # Facility's graph costs reference x chunk x d
        8192, "rows of the chunk (all, up to this many) that the refined pool must represent",
        rule=(lambda v: v >= 1, "an integer >= 1"),
        doc="Rows of the chunk (all, up to this many) that the refined pool must represent. Above it a fixed "
        "random sample; Facility then drops sampled rows' self-matches and shrinks the sampled gains by "
        "their "
        'noise, so a smaller sample costs accuracy, not quality bias; with ``final="best"`` the learned mask '
        "is then checked against quality top-k on rows held out of the sample and the better one returned.")
    polish: int = option(
        32, "rounds of the exact swap search on the final mask (0: off)",
        rule=(lambda v: v >= 0, "an integer >= 0 (0: off)"),
        doc='Rounds of the exact local search on the final mask (``final="best"`` only; 0 turns it off): '
        "members of smallest marginal loss are swapped for non-members of largest marginal gain while the "
        "reward rises. Skipped when ``Facility`` represents a reference *sample*, whose reward is only an "
        "estimate.")
    max_batch: int = option(8192, "upper bound on the rows of one step's batch (bounds memory)",
                            rule=(lambda v: v >= 2, "an integer >= 2"))
    reference_size: int = option(1024, "rows of the batch used as Facility's reference set in each step",
                                 rule=(lambda v: v >= 1, "an integer >= 1"))
    neighbours: int = option(32, "most similar rows each Facility reference row keeps (its k-NN graph)",
                             rule=(lambda v: v >= 1, "an integer >= 1"))
    exact_neighbours: int = option(
        32768, "up to this many rows in a step's batch, Facility's graph is exact; above, clusters are "
        "searched",
        rule=(lambda v: v >= 0, "an integer >= 0"),
        doc="Up to this many rows in a step's batch, the ``Facility`` graph is exact; above it the "
        "neighbours "
        "are searched in the nearest clusters only (see :mod:`datamask_dask.learn.knn`).")
    probes: int = option(2, "clusters searched per row above exact_neighbours (FAISS's nprobe)",
                         rule=(lambda v: v >= 1, "an integer >= 1"))
    precision: str = option(
        "auto", "precision of the similarity products while learning", choices=PRECISIONS,
        doc='Precision of the similarity products while learning; "auto" takes bfloat16 on CUDA and on CPUs '
        "with AMX / AVX512-BF16. Objectives are always evaluated in float32.")
    rollout_chunk: int = option(32, "rollouts evaluated at once (bounds the reward's memory)",
                                rule=(lambda v: v >= 1, "an integer >= 1"))
    metric_weights: tuple = field(default=(), repr=False, init=False)  # resolved from algorithm

    def __post_init__(self) -> None:
        from .metrics import resolve_metrics

        for spec in options_of(self):
            check_value(spec, getattr(self, spec.name))
        if not self.max_lr >= self.min_lr >= 0:
            raise OptionError(f"options min_lr={self.min_lr!r} and max_lr={self.max_lr!r} are invalid: "
                              "expected 0 <= min_lr <= max_lr")
        # Resolve metric names now so a typo fails before any compute.
        object.__setattr__(self, "metric_weights", tuple(resolve_metrics(self.algorithm)))

    @property
    def metric(self) -> str | None:
        """The one metric learned, by its resolved name (``"facility"``, ``"pair_simi"``...), or None
        for a weighted mix of metrics."""
        return self.metric_weights[0][0] if len(self.metric_weights) == 1 else None

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


# __doc__ is None where docstrings are stripped (python -OO)
DataMaskOptions.__doc__ = ((DataMaskOptions.__doc__ or "") + "\n\n    Parameters\n    ----------\n"
                           + parameters(options_of(DataMaskOptions)))


def _whole(value) -> bool:
    """An integer, Python's or numpy's, and not a bool (the learner counts with it)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check(ok: bool, name: str, value, expected: str) -> None:
    if not ok:
        raise OptionError(f"option {name}={value!r} is invalid: expected {expected}")
