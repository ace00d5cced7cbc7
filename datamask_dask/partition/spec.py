"""The resolved options of one selection (:class:`SelectSpec`), checked against the table's schema.

Engine-agnostic: :func:`make_spec` takes the schema as an empty pandas (or cuDF) frame, the
``meta`` of a Dask dataframe or the schema of a Spark one converted to pandas, and no data is read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..config import (
    check_budget_tokens,
    check_duplicate_cosine,
    check_number,
    check_ratio,
    is_number,
    learner_options,
)
from ..errors import InputDataError, OptionError, Problem, problems_error
from ..learn.options import DataMaskOptions
from ..plan.memory import parse_budget, resolve_budget
from . import adapters

VALIDATE_MODES = ("full", "light")
SCOPES = ("table", "partition")
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class SelectSpec:
    """Resolved, validated settings of one selection (travels inside the plan)."""

    id_column: str
    quality: tuple  # ((column, weight), ...), weights summing to 1
    embedding_column: str
    selected_column: str
    score_column: str | None
    by: str | None
    ratio: float | dict | None
    budget: int | dict | None
    token_column: str | None
    prune: float
    oversample: float
    max_chunk_rows: int | None  # None: chunks are sized by max_chunk_values
    max_chunk_values: int | None
    device: str
    check_ids: bool
    options: DataMaskOptions  # the learner's, with prune=0: pruning is table-wide, done by the plan
    validate: str = "full"  # "full": the plan pass also reads and checks every embedding
    memory_budget: int | None = None  # the user's bytes of working memory per task: sizes chunks
    memory_limit: int | None = None  # what the workers' memory leaves a task: checked, never sizes chunks
    diversity_scope: str = "table"  # "table": near-duplicates across partitions are shadowed first
    duplicate_cosine: float = 0.95  # rows at least this similar are near-duplicates (table scope)
    explain: bool = False  # also output each row's reason, and the row a near-duplicate stands behind

    @property
    def plan_columns(self) -> list[str]:
        """Columns the plan pass reads."""
        # explain: the plan names the rows near-duplicates stand behind by id
        names = ([self.id_column] if self.check_ids or self.explain else []) + [c for c, _ in self.quality]
        names += [self.by] if self.by else []
        names += [self.token_column] if self.budget is not None else []
        names += [self.embedding_column] if self.validate == "full" or self.diversity_scope == "table" else []
        return list(dict.fromkeys(names))

    def chunk_rows(self, dim: int | None) -> int:
        """The most rows a chunk (or a pack) holds: ``max_chunk_rows``, or where that is None, as many
        as ``max_chunk_values`` embedding values allow at dimension ``dim`` (None: nothing read yet)."""
        if self.max_chunk_rows is not None:
            return self.max_chunk_rows
        return max(2, self.max_chunk_values // max(1, dim or 1))

    @property
    def select_columns(self) -> list[str]:
        """Columns the select pass reads."""
        names = [c for c, _ in self.quality] + [self.embedding_column]
        names += [self.by] if self.by else []
        names += [self.token_column] if self.budget is not None else []
        names += [self.id_column] if self.explain else []  # duplicate_of takes the id column's type
        return list(dict.fromkeys(names))


def spec_from_meta(meta, settings: Mapping, *, ratio_given: bool = True, scheduler=None) -> SelectSpec:
    """Validate resolved settings (:func:`datamask_dask.config.load_config`) against a table's
    schema, given as an empty pandas or cuDF frame (``meta``).

    ``ratio_given``: whether the caller named a ratio (a ratio and a token budget together are
    refused); ``scheduler``: the Dask scheduler the job will run on (it gives the default
    ``memory_budget``). Raises :class:`OptionError` for the first bad option, or
    :class:`InputDataError` for the columns the schema lacks or types wrongly.
    """
    spec = _spec_from_settings(settings, ratio_given, meta, scheduler)
    for name in filter(None, (spec.selected_column, spec.score_column)):
        if name in meta.columns:
            raise OptionError(f"the dataframe already has a column {name!r}: pick another output name "
                              "with selected_column= / score_column= (the input is never overwritten)")
    if spec.score_column == spec.selected_column:
        raise OptionError("score_column and selected_column must differ")
    if spec.explain:
        from .explain import check_free

        check_free([*meta.columns, spec.selected_column, spec.score_column])
    problems = schema_problems(meta, spec)
    if problems:
        raise problems_error(problems)
    return spec


def _spec_from_settings(settings: Mapping, ratio_given: bool, meta, scheduler) -> SelectSpec:
    options = learner_options(settings)
    quality = _quality_weights(settings["quality_column"])
    by = settings["by"]
    budget, ratio = settings["budget_tokens"], settings["ratio"]
    if budget is not None:
        if ratio_given:
            raise OptionError("give either ratio (a share of rows) or budget_tokens (a token budget), "
                              "not both")
        ratio = None
        budget = _check_budget(budget, by)
    else:
        ratio = _check_ratio(ratio, by)
    validate = settings.get("validate", "full")
    if validate not in VALIDATE_MODES:
        raise OptionError(f"option validate={validate!r} is invalid: expected one of {VALIDATE_MODES} "
                          "('full' checks every embedding before learning, 'light' only the small columns)")
    device = _check_device(settings["device"])
    scope = settings.get("diversity_scope", "table")
    if scope not in SCOPES:
        raise OptionError(f"option diversity_scope={scope!r} is invalid: expected one of {SCOPES} ('table' "
                          "shadows near-duplicates across the whole table before learning, 'partition' "
                          "learns each partition on its own)")
    cosine = settings.get("duplicate_cosine", 0.95)
    check_duplicate_cosine(cosine)
    explain = settings.get("explain", False)
    if not isinstance(explain, bool | np.bool_):
        raise OptionError(f"option explain={explain!r} is invalid: expected True or False (True adds the "
                          "reason, duplicate_of and similarity columns)")
    rows, values = settings["max_chunk_rows"], settings.get("max_chunk_values")
    if rows is None and values is None:
        raise OptionError("options max_chunk_rows and max_chunk_values are both None: set "
                          "max_chunk_rows (the rows a chunk holds at most, e.g. 50000) or max_chunk_values "
                          "(rows x dimension)")
    rows = None if rows is None else int(check_number(rows, "max_chunk_rows", 2, integer=True))
    values = None if values is None else int(check_number(values, "max_chunk_values", 2, integer=True))
    memory = resolve_budget(settings.get("memory_budget"), device=device, meta=meta, scheduler=scheduler)
    given = parse_budget(settings.get("memory_budget")) is not None
    return SelectSpec(
        id_column=str(settings["id_column"]), quality=quality,
        embedding_column=str(settings["embedding_column"]),
        selected_column=str(settings["selected_column"]),
        score_column=None if settings["score_column"] is None else str(settings["score_column"]),
        by=None if by is None else str(by), ratio=ratio, budget=budget,
        token_column=str(settings["token_column"]) if budget is not None else None,
        prune=options.prune, oversample=check_number(settings["oversample"], "oversample", 1.0),
        max_chunk_rows=rows, max_chunk_values=values,
        device=device, check_ids=bool(settings["check_ids"]),
        options=options.replace(prune=0.0), validate=validate,
        memory_budget=memory if given else None, memory_limit=None if given else memory,
        diversity_scope=scope, duplicate_cosine=float(cosine), explain=bool(explain))


def schema_problems(meta, spec: SelectSpec) -> list[Problem]:
    """What the dataframe's declared schema (``meta``) lacks or types wrongly for ``spec``."""
    columns = spec.plan_columns + spec.select_columns + ([spec.id_column] if spec.check_ids else [])
    missing = adapters.missing_columns(meta, columns, "the dataframe")
    if missing:
        return [Problem(message, name) for name, message in missing]
    problems = []
    try:
        adapters.check_embedding_type(meta[spec.embedding_column].dtype, spec.embedding_column,
                                      "the dataframe")
    except InputDataError as exc:
        problems.append(Problem(str(exc), spec.embedding_column))
    numeric = [(name, "quality") for name, _ in spec.quality]
    numeric += [(spec.token_column, "token")] if spec.budget is not None else []
    for name, kind in numeric:
        dtype = meta[name].dtype
        if not adapters.is_numeric_dtype(dtype):
            problems.append(Problem(f"{kind} column {name!r} must be numeric, got dtype {dtype}: cast it "
                                    "(e.g. ddf[col].astype('float64')) or pick another column", name))
    return problems


def _quality_weights(value) -> tuple:
    if isinstance(value, str):
        return ((value, 1.0),)
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, list | tuple) and value and all(isinstance(v, str) for v in value):
        items = [(v, 1.0) for v in value]
    else:
        raise OptionError(f"option quality_column={value!r} must be a column name, a list of names or "
                          "{name: weight}")
    if not items or any(not is_number(w) or not (w > 0 and np.isfinite(w)) for _, w in items):
        raise OptionError(f"option quality_column={value!r}: weights must be finite numbers > 0")
    total = float(sum(w for _, w in items))
    return tuple((str(name), float(w) / total) for name, w in items)


def _check_ratio(ratio, by):
    check_ratio(ratio, by)
    if isinstance(ratio, Mapping):
        return {adapters.plain(k): float(v) for k, v in ratio.items()}
    return float(ratio)


def _check_budget(budget, by):
    check_budget_tokens(budget, by)
    if isinstance(budget, Mapping):
        return {adapters.plain(k): int(v) for k, v in budget.items()}
    return int(budget)


def _check_device(device) -> str:
    device = str(device)
    if device not in DEVICES and not (device.startswith("cuda:") and device[5:].isdigit()):
        raise OptionError(f"option device={device!r} is invalid: expected 'auto', 'cpu', 'cuda' or 'cuda:N'")
    return device
