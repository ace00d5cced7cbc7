"""The options of one selection: :class:`SelectOptions`, frozen and checked, made once per run by
:func:`datamask_dask.config.resolve_options` from the profile, the config, ``dask.config`` and the keywords.

Each option is one field (:func:`~datamask_dask.learn.options.option`): its default, its help text
and the rule its value obeys. The config keys, the command line's flags and their help, the
docstring of :func:`~datamask_dask.datamask_select` and the checks are made from the fields, so an
option is added by adding its field. Imports neither torch, Dask, pandas nor pyarrow.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field

from .errors import OptionError
from .learn.options import DataMaskOptions, check_value, option, options_of

TEXT_COLUMN = "text"  # the documents' text column the text steps, explain and the report read by default

MIN_BUDGET = 2**20  # bytes of memory_budget below which nothing useful fits


def is_number(value) -> bool:
    """A real number, Python's or numpy's, and not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _finite(value) -> bool:
    return isinstance(value, numbers.Integral) or math.isfinite(value)


def check_number(value, name: str, minimum: float, integer: bool = False):
    """``value`` where it is a finite number (an integer with ``integer``) >= ``minimum``."""
    if (not is_number(value) or not _finite(value) or value < minimum
            or (integer and value != int(value))):
        kind = "an integer" if integer else "a number"
        raise OptionError(f"option {name}={value!r} is invalid: expected {kind} >= {minimum}")
    return value


def check_ratio(ratio) -> None:
    """``ratio``: a share of rows in (0, 1], or ``{group: share in [0, 1]}``."""
    if isinstance(ratio, Mapping):
        for group, value in ratio.items():
            if not is_number(value) or not 0 <= value <= 1:
                raise OptionError(f"ratio for group {group!r} is {value!r}: expected a share in [0, 1]")
    elif not is_number(ratio) or not 0 < ratio <= 1:
        what = "is out of range" if is_number(ratio) else "is not a number"
        raise OptionError(f"ratio={ratio!r} {what}: expected a share of rows in (0, 1], e.g. 0.1")


def check_budget_tokens(budget) -> None:
    """``budget_tokens``: a whole number of tokens >= 1, or ``{group: tokens >= 0}``."""
    def whole(value) -> bool:
        return is_number(value) and _finite(value) and value == int(value)

    if isinstance(budget, Mapping):
        for group, value in budget.items():
            if not whole(value) or value < 0:
                raise OptionError(f"budget_tokens for group {group!r} is {value!r}: expected a whole "
                                  "number of tokens >= 0")
    elif budget is not None and (not whole(budget) or budget < 1):
        raise OptionError(f"budget_tokens={budget!r} is invalid: expected a whole number of tokens >= 1")


def quality_weights(value) -> tuple:
    """``quality_column`` as ``((column, weight), ...)``, the weights summing to 1."""
    if isinstance(value, str):
        return ((value, 1.0),)
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, list | tuple) and value and all(isinstance(v, str) for v in value):
        items = [(v, 1.0) for v in value]
    else:
        raise OptionError(f"option quality_column={value!r} must be a column name, a list of names or "
                          "{name: weight}")
    if not items or any(not is_number(w) or not (w > 0 and math.isfinite(w)) for _, w in items):
        raise OptionError(f"option quality_column={value!r}: weights must be finite numbers > 0")
    total = float(sum(w for _, w in items))
    return tuple((str(name), float(w) / total) for name, w in items)


def check_device(device) -> None:
    """``device``: ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"``."""
    text = str(device)
    if text not in ("auto", "cpu", "cuda") and not (text.startswith("cuda:") and text[5:].isdigit()):
        raise OptionError(f"option device={device!r} is invalid: expected 'auto', 'cpu', 'cuda' or 'cuda:N'")


def parse_budget(value) -> int | None:
    """Bytes of a ``memory_budget`` option: a number of bytes, or text such as ``"2GiB"``.

    ``None`` and ``"auto"`` mean the default (see :func:`datamask_dask.plan.memory.resolve_budget`);
    ``"off"`` means no bound, returned as ``0``.
    """
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return None
    if isinstance(value, str) and value.strip().lower() in ("off", "none", "unbounded"):
        return 0
    from dask.utils import parse_bytes  # only for text: the command line checks its flags before Dask loads

    try:
        budget = parse_bytes(value) if isinstance(value, str) else value
        valid = not isinstance(budget, bool) and float(budget) == int(budget) and budget >= MIN_BUDGET
    except (TypeError, ValueError, OverflowError):
        valid = False
    if not valid:
        raise OptionError(f"option memory_budget={value!r} is invalid: expected bytes >= {MIN_BUDGET} "
                          "(e.g. 4_000_000_000 or '4GiB'), 'auto' or 'off'")
    return int(budget)


def chunk_rows(max_rows: int | None, max_values: int | None, dim: int | None) -> int:
    """The most rows a chunk holds: ``max_rows``, and no more than ``max_values`` embedding values allow
    at dimension ``dim`` (None: no cap of that kind; ``dim`` None: nothing read yet)."""
    caps = [max_rows] if max_rows is not None else []
    caps += [max(2, max_values // max(1, dim or 1))] if max_values is not None else []
    if not caps:  # SelectOptions refuses this; a spec built by hand may not
        raise OptionError("max_chunk_rows and max_chunk_values are both None: set one of them")
    return min(caps)


def _chunk_size(name: str):
    return lambda value: value is None or check_number(value, name, 2, integer=True)


@dataclass(frozen=True)
class SelectOptions:
    """Every setting of one selection, resolved (:func:`datamask_dask.config.resolve_options`) and
    checked: the operator's below and the learner's in ``learner``; ``profile`` names the profile or
    config used and ``given`` the options the caller gave as keywords."""

    ratio: float | dict = option(
        0.1, "share of rows to select (with --by: group=ratio,...)", rule=check_ratio, alias="select_ratio",
        flags=("--select_ratio", "--select-ratio", "--ratio"), type="per_group_float",
        doc="Share of rows to select, in (0, 1]: exactly ``round(ratio * N)`` rows (Python rounding) are "
        "selected. With ``by``, a float applies to every group and a mapping ``{group: ratio}`` (ratios in "
        "[0, 1]) gives each group its own; groups it does not name get none, and a group it names that no "
        "row holds gets nothing (a run logs it). A key is a group's value or its text, as on the command "
        "line.")
    budget_tokens: int | dict | None = option(
        None, "select by token budget instead of ratio (with --by: group=tokens,...)",
        rule=check_budget_tokens, type="per_group_int",
        doc="Select by tokens instead of rows: the selected rows' ``token_column`` values sum to at most "
        "this (``{group: tokens}`` with ``by``, its groups named as for ``ratio``). Guarantee: never above "
        "the budget; in each partition (and group) no unselected eligible row would still fit in what its "
        "share of the budget has left, so the total falls short by less than about one row's tokens "
        "per partition.")
    token_column: str = option("n_tokens", "column of each row's tokens, with budget_tokens")  # noqa: S105
    by: str | None = option(
        None, "group column: quotas per group",
        doc="Group column: quotas are planned per group (each group like a table of its own).")
    id_column: str = option(
        "chunk_id", "unique id of each row", alias="id",
        doc="Ids must be unique across the table (checked unless ``check_ids=False``).")
    quality_column: str | list | dict = option(
        "quality_score", "a column, or weighted columns: a=0.7,b=0.3", rule=quality_weights, alias="quality",
        type="weights", doc="One column, several (equal weights) or ``{column: weight}``; the weighted sum "
        "is the quality (put the columns on comparable scales first).")
    embedding_column: str = option("feature_arr", "column of the embeddings", alias="embedding")
    selected_column: str = option("selected", "name of the added boolean column")
    score_column: str | None = option(
        None, "also write the learned scores under this name",
        doc="Also output the learned logits (float32) under this name: NaN where no learning ran (quota 0, "
        "or every eligible row taken), ``-inf`` for rows made ineligible.")
    device: str = option(
        "auto", "auto (the GPU for cuDF partitions), cpu or cuda", rule=check_device,
        choices=("auto", "cpu", "cuda"), doc='``"auto"`` learns on the GPU when the partition is cuDF; '
        '``"cuda:N"`` names a GPU.')
    max_chunk_rows: int | None = option(
        50_000, "rows are learned in chunks of at most this many, which select apart (in table scope, "
        "consecutive partitions that fit in one are learned together)", rule=_chunk_size("max_chunk_rows"),
        doc="Partitions with more eligible rows are learned in chunks of at most this many rows (10_000 for "
        "DiSF, 100_000 for Facility: ``config.METRIC_DEFAULTS``) and at most ``max_chunk_values`` embedding "
        "values; in table scope, consecutive partitions whose eligible rows fit in one chunk together are "
        "learned as one. Chunks select apart, so the chunk size is part of what a selection means.")
    max_chunk_values: int | None = option(
        None, "a chunk also holds at most this many embedding values (rows x dimension)",
        rule=_chunk_size("max_chunk_values"),
        doc="A chunk also holds at most this many embedding values (rows x dimension), whichever of the two "
        "allows fewer rows: Facility's default is 76_800_000, 100_000 rows at d = 768 and fewer above it, "
        "since its cost per row grows about with the dimension. None: rows alone size the chunks.")
    oversample: float = option(
        2.0, "size of the table-wide quality pool that sets partition quotas, as a multiple of the quota",
        rule=lambda value: check_number(value, "oversample", 1.0),
        doc="Size of the table-wide quality pool that sets partition quotas, as a multiple of the quota (see "
        ":mod:`datamask_dask.plan.quotas`); >= 1.")
    check_ids: bool = option(
        True, "skip the duplicate-id check (it holds every distinct id in one task)",
        doc="Fail on duplicate or null ids. The check is a tree reduction whose last task holds every "
        "distinct id: turn it off for tables whose ids do not fit in one worker.")
    validate: str = option(
        "light", "full: check every embedding before learning; light: small columns first, embeddings chunk "
        "by chunk", choices=("full", "light"), rule=(lambda v: v in ("full", "light"), "one of ('full', "
        "'light') ('full' checks every embedding before learning, 'light' only the small columns)"),
        doc='``"full"``: the plan pass also reads every embedding and checks it (null, ragged, dimension, '
        'NaN or infinite, all-zero, norm), so bad rows fail before any learning. ``"light"``: the plan pass '
        "reads only the small columns (one read of the embeddings less); embeddings are then checked chunk "
        'by chunk just before they are learned. With ``diversity_scope="table"`` the plan pass reads (and '
        "checks) the embeddings anyway.")
    memory_budget: int | str | None = option(
        None, "working memory per selection task, e.g. 2GiB: sizes the chunks (default: none; the workers' "
        "memory is checked, and a chunk that does not fit fails before learning)", rule=parse_budget,
        type=str, doc="Working memory of one selection task beyond its partition, in bytes or as text "
        '(``"2GiB"``): chunks and the learner\'s batches are sized to fit (see '
        ':mod:`datamask_dask.plan.memory`), '
        "which changes the selection as ``max_chunk_rows`` does. Default: no budget; the chunks are the "
        "options' and a task whose chunk does not fit in half the per-thread memory limit of the current "
        "distributed cluster's workers (most of a GPU's free memory when learning on one) fails before "
        'learning, naming the ``max_chunk_rows`` that would fit. ``"off"``: no budget and no check.')
    diversity_scope: str = option(
        "table", "table: near-duplicates across the whole table are set aside before learning; partition: "
        "each partition on its own (cheaper)", choices=("table", "partition"),
        rule=(lambda v: v in ("table", "partition"), "one of ('table', 'partition') ('table' shadows "
              "near-duplicates across the whole table before learning, 'partition' learns each partition "
              "on its own)"),
        doc='``"table"``: near-duplicates (cosine >= ``duplicate_cosine``, estimated from 256-bit SimHash '
        "signatures) are found across the whole table in the plan pass, and only the best-quality member of "
        'each group stays eligible, so the selection is diverse across partitions. ``"partition"``: each '
        "partition is learned on its own (cheaper: no embedding read in the plan pass with "
        '``validate="light"``; right for tables already partitioned by topic).')
    duplicate_cosine: float = option(
        0.95, "near-duplicate threshold of the table scope",
        rule=(lambda v: is_number(v) and 0 < v < 1, "a cosine in (0, 1), e.g. 0.95"))
    pieces: str = option(
        "auto", "regions: a table larger than a chunk is learned in regions of the embedding space, quotas "
        "following the objective (Facility, Pair_simi); context: in pieces dealt from the whole table, in "
        "two rounds, the share of pieces that serves the table best learned again against what the rest "
        "picked in the first (DiSF); partitions: by partition, quotas by quality mass; auto: regions for "
        "Facility and Pair_simi, context for DiSF (table scope, a ratio, no by), else partitions",
        choices=("auto", "regions", "context", "partitions"),
        rule=(lambda v: v in ("auto", "regions", "context", "partitions"),
              "one of ('auto', 'regions', 'context', 'partitions')"),
        doc='How a table larger than one chunk is cut into the pieces the learner runs on. ``"partitions"``: '
        "each partition, small consecutive ones packed together, with quotas by quality mass. "
        '``"regions"``: spherical k-means of a sample of the table cuts it into regions of the embedding '
        "space and their areas, the quota is shared between the areas by the objective (Facility: their "
        "marginal gains; Pair_simi: the shares that cancel the picks' sum, quality weighed in), and every "
        "eligible row is learned with its area's neighbours whatever its partition "
        "(:mod:`datamask_dask.plan.regions`); a Pair_simi piece learns against the other pieces' "
        "planned picks. A random split of the table then no longer costs Facility its coverage, nor "
        "partitions by topic Pair_simi its spread. For Facility or Pair_simi alone. "
        '``"context"``: the table\'s eligible rows are dealt round DiSF\'s pieces, partition after '
        "partition, so that every piece holds every partition's topics as the table does (past 128 "
        "pieces, a strip of every n-th partition's), and the quota "
        "is shared by the pieces' rows; every piece standardises its features by the table's mean and std "
        "(read in the plan pass) and is learned in two rounds: first apart, then against the second moment "
        "of what the rest of the table picked in the first. A piece then decorrelates the table's "
        "features, not only its own, and a table partitioned by topic is learned as one split at random "
        "(:mod:`datamask_dask.plan.context`). Every piece moves at once, so "
        "the plan keeps the share of pieces in context whose expected union scores best, from both "
        "rounds' sums, and the others keep their first picks. Two more learning passes. For "
        'DiSF alone. Both need table scope, a ratio and no ``by``. ``"auto"`` (the default): '
        '``"regions"`` for Facility and Pair_simi and ``"context"`` for DiSF wherever they apply, else '
        '``"partitions"``, the cheapest (regions cost another read of the embeddings and routing every '
        "row twice; context, two more learning passes, every row routed to its piece in each). A table "
        "that fits one chunk is learned whole either way.")
    explain: bool = option(
        False, "also write each row's reason (selected, near-duplicate, quality-pruned...) and, for a "
        "near-duplicate, the id of the row it stands behind (duplicate_of)",
        rule=(lambda v: isinstance(v, bool) or type(v).__name__ == "bool_",
              "True or False (True adds the reason, duplicate_of and similarity columns)"),
        doc="Also output why each row was selected or not: ``reason`` (``selected``, ``near-duplicate``, "
        "``quality-pruned``, ``quota-exhausted``, ``not-chosen``, ``budget-exhausted``; the user guide's "
        "output page says what each means), ``duplicate_of`` (the id of the row a near-duplicate stands "
        "behind, null otherwise) and ``similarity`` (its estimated cosine to that row). The selection is "
        "the same either way.")
    learner: DataMaskOptions = field(default_factory=DataMaskOptions)
    profile: str | None = None  # the profile's name, the config file's path, or "mapping"
    given: frozenset = frozenset()  # the options the caller gave as keywords

    def __post_init__(self) -> None:
        for spec in options_of(self):
            check_value(spec, getattr(self, spec.name))
        for name in ("ratio", "budget_tokens"):
            if isinstance(getattr(self, name), Mapping) and self.by is None:
                kind = "ratio" if name == "ratio" else "tokens"
                raise OptionError(f"{name} given as {{group: {kind}}} needs by= (the group column)")
        if self.budget_tokens is not None:
            if self.by is not None and not isinstance(self.budget_tokens, Mapping):
                raise OptionError("with by=, give budget_tokens as {group: tokens} (on the command line "
                                  "en=3000,de=2000): a single budget would not say how to share it between "
                                  "groups")
            if self.ratio_given:
                raise OptionError("give either ratio (a share of rows) or budget_tokens (a token budget), "
                                  "not both")
        refused = self.pieces_refused(self.pieces) if self.pieces in ("regions", "context") else []
        if refused:
            raise OptionError(f'pieces="{self.pieces}" does not work with {", ".join(refused)}: use '
                              'pieces="partitions" there')
        if self.max_chunk_rows is None and self.max_chunk_values is None:
            raise OptionError("options max_chunk_rows and max_chunk_values are both None: set max_chunk_rows "
                              "(the rows a chunk holds at most, e.g. 50000) or max_chunk_values (rows x "
                              "dimension)")

    def pieces_refused(self, pieces: str) -> list[str]:
        """The settings that rule out ``pieces`` (``"regions"`` or ``"context"``; none: it applies)."""
        if pieces == "regions":
            metric = (self.learner.metric not in ("facility", "pair_simi"),
                      f"algorithm={self.learner.algorithm!r} (regions serve Facility or Pair_simi alone)")
        else:
            metric = (self.learner.metric != "disf",
                      f"algorithm={self.learner.algorithm!r} (context serves DiSF alone)")
        refused = [metric, (self.diversity_scope != "table", 'diversity_scope="partition"'),
                   (self.by is not None, "by="), (self.budget_tokens is not None, "budget_tokens")]
        return [what for bad, what in refused if bad]

    @property
    def learned_pieces(self) -> str:
        """How a table larger than a chunk is learned (``pieces``, ``"auto"`` resolved: regions for
        Facility and Pair_simi, context for DiSF, where they apply)."""
        if self.pieces != "auto":
            return self.pieces
        if self.learner.metric in ("facility", "pair_simi") and not self.pieces_refused("regions"):
            return "regions"
        context = self.learner.metric == "disf" and not self.pieces_refused("context")
        return "context" if context else "partitions"

    @property
    def quality(self) -> tuple:
        """``quality_column`` resolved: ``((column, weight), ...)``, the weights summing to 1."""
        return quality_weights(self.quality_column)

    @property
    def ratio_given(self) -> bool:
        """Whether the caller named a ratio (the default ratio gives way to a token budget)."""
        return "ratio" in self.given

    @classmethod
    def from_settings(cls, settings: Mapping, *, profile: str | None = None,
                      given=frozenset()) -> SelectOptions:
        """The options from a flat mapping of every setting (learner's and operator's), checked."""
        learner = DataMaskOptions.from_mapping({key: settings[key] for key in LEARNER_KEYS
                                                if key in settings})
        return cls(**{key: settings[key] for key in OPERATOR_KEYS if key in settings}, learner=learner,
                   profile=profile, given=frozenset(given))

    def to_dict(self) -> dict:
        """Every setting as one flat mapping, as config files name them, with ``"profile"`` (the run
        record's ``settings``)."""
        return {**self.learner.as_dict(), **{key: getattr(self, key) for key in OPERATOR_KEYS},
                "profile": self.profile}

    def replace(self, **changes) -> SelectOptions:
        """A copy with some settings (learner's or operator's) changed, checked again."""
        return SelectOptions.from_settings({**self.to_dict(), **changes}, profile=self.profile,
                                           given=self.given)


#: The options: the operator's, then the learner's.
OPERATOR_KEYS = tuple(spec.name for spec in options_of(SelectOptions))
LEARNER_KEYS = tuple(spec.name for spec in options_of(DataMaskOptions))
FIELDS = {spec.name: spec for spec in (*options_of(SelectOptions), *options_of(DataMaskOptions))}
#: Other spellings accepted for a key (the reference tool's and the issue's).
ALIASES = {spec.metadata["alias"]: name for name, spec in FIELDS.items() if spec.metadata.get("alias")}


def check_given(options: Mapping) -> None:
    """Apply each option's rule to the settings given as ``options`` (keyword arguments, which win over every
    other layer), so they are refused before a config or any data is read."""
    for name, value in options.items():
        if value is not None:
            check_value(FIELDS[name], value)


def default_settings() -> dict:
    """The built-in defaults, the learner's then the operator's, read from the fields (no instance: that
    would resolve the metrics, which loads torch, and ``--help`` shows these)."""
    return {name: FIELDS[name].default for name in (*LEARNER_KEYS, *OPERATOR_KEYS)}

