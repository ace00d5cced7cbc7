"""The resolved options of one selection (:class:`SelectSpec`), checked against the table's schema.

Engine-agnostic: :func:`make_spec` takes the schema as an empty pandas (or cuDF) frame, the
``meta`` of a Dask dataframe or the schema of a Spark one converted to pandas, and no data is read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa

from ..errors import InputDataError, OptionError, Problem, problems_error
from ..learn.options import DataMaskOptions
from ..options import TEXT_COLUMN, SelectOptions, chunk_rows, parse_budget
from ..plan.memory import MemoryPlan, check_memory, plan_memory, resolve_budget
from . import adapters


@dataclass(frozen=True)
class SelectSpec:
    """The options of one selection checked against the table's schema (travels inside the plan); its
    values all come from :class:`~datamask_dask.options.SelectOptions`."""

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
    max_chunk_rows: int | None  # None: chunks are sized by max_chunk_values alone
    max_chunk_values: int | None  # None: by max_chunk_rows alone
    device: str
    check_ids: bool
    options: DataMaskOptions  # the learner's, with prune=0: pruning is table-wide, done by the plan
    validate: str  # "full": the plan pass also reads and checks every embedding
    memory_budget: int | None  # the user's bytes of working memory per task: sizes chunks
    memory_limit: int | None  # what the workers' memory leaves a task: checked, never sizes chunks
    diversity_scope: str  # "table": near-duplicates across partitions are shadowed first
    duplicate_cosine: float  # rows at least this similar are near-duplicates (table scope)
    explain: bool  # also output each row's reason, and the row a near-duplicate stands behind
    # how a table larger than a chunk is learned: "partitions", "regions" (plan.regions) or "context"
    # (plan.context)
    pieces: str = "partitions"

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
        """The most rows a chunk (or a pack) holds at embedding dimension ``dim``
        (:func:`~datamask_dask.options.chunk_rows`)."""
        return chunk_rows(self.max_chunk_rows, self.max_chunk_values, dim)

    def memory_plan(self, n_rows: int, dim: int, where: str, device: str = "cpu",
                    packed: bool = False) -> MemoryPlan:
        """The chunk and learner sizes of ``n_rows`` rows of ``dim``-d embeddings learned on ``device``
        (sized by ``memory_budget``), checked against the workers' memory (``memory_limit``): raises
        ``OptionError`` naming ``where`` and the ``max_chunk_rows`` that fits (``packed``: the rows
        are a pack's, which a smaller ``max_chunk_rows`` makes fewer)."""
        memory = plan_memory(self.memory_budget, n_rows, dim, self.options, self.chunk_rows(dim), device)
        check_memory(self.memory_limit, n_rows, dim, memory.options, min(memory.max_chunk_rows, n_rows),
                     where, device, packed)
        return memory

    @property
    def select_columns(self) -> list[str]:
        """Columns the select pass reads."""
        names = [c for c, _ in self.quality] + [self.embedding_column]
        names += [self.by] if self.by else []
        names += [self.token_column] if self.budget is not None else []
        names += [self.id_column] if self.explain else []  # duplicate_of takes the id column's type
        return list(dict.fromkeys(names))


def spec_from_meta(meta, options: SelectOptions, *, scheduler=None) -> SelectSpec:
    """Check resolved options (:func:`datamask_dask.config.resolve_options`) against a table's schema,
    given as an empty pandas or cuDF frame (``meta``).

    ``scheduler``: the Dask scheduler the job will run on (it gives the default ``memory_budget``).
    Raises :class:`OptionError` for an output column the table already has, or
    :class:`InputDataError` for the columns the schema lacks or types wrongly.
    """
    spec = _spec(options, meta, scheduler)
    for name in filter(None, (spec.selected_column, spec.score_column)):
        if name in meta.columns:
            raise OptionError(f"the input already has a column {name!r}: pick another output name "
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


def _spec(options: SelectOptions, meta, scheduler) -> SelectSpec:
    budget = options.budget_tokens
    ratio = None if budget is not None else options.ratio
    memory = resolve_budget(options.memory_budget, device=str(options.device), meta=meta, scheduler=scheduler)
    given = parse_budget(options.memory_budget) is not None
    return SelectSpec(
        id_column=str(options.id_column), quality=options.quality,
        embedding_column=str(options.embedding_column), selected_column=str(options.selected_column),
        score_column=None if options.score_column is None else str(options.score_column),
        by=None if options.by is None else str(options.by), ratio=_plain(ratio, float),
        budget=_plain(budget, int), token_column=str(options.token_column) if budget is not None else None,
        prune=options.learner.prune, oversample=options.oversample,
        max_chunk_rows=_plain(options.max_chunk_rows, int),
        max_chunk_values=_plain(options.max_chunk_values, int),
        device=str(options.device), check_ids=bool(options.check_ids),
        options=options.learner.replace(prune=0.0), validate=options.validate,
        memory_budget=memory if given else None, memory_limit=None if given else memory,
        diversity_scope=options.diversity_scope, duplicate_cosine=float(options.duplicate_cosine),
        explain=bool(options.explain), pieces=options.learned_pieces)


def _plain(value, kind):
    """A number as ``kind``, a ``{group: number}`` mapping with plain keys, or None."""
    if isinstance(value, Mapping):
        return {adapters.plain(k): kind(v) for k, v in value.items()}
    return None if value is None else kind(value)


def schema_problems(meta, spec: SelectSpec) -> list[Problem]:
    """What the dataframe's declared schema (``meta``) lacks or types wrongly for ``spec``."""
    columns = spec.plan_columns + spec.select_columns + ([spec.id_column] if spec.check_ids else [])
    missing = adapters.missing_columns(meta, columns, None)
    if missing:
        # a table of documents yet to be scored or embedded: name the steps that add the columns
        computed = {spec.embedding_column, *(name for name, _ in spec.quality)}
        hint = (f", or compute the quality and embedding columns from the {TEXT_COLUMN!r} column with "
                "score_quality and embed (on the command line: datamask score and datamask embed, or "
                f"datamask select --text-column {TEXT_COLUMN})"
                if TEXT_COLUMN in meta.columns and computed & {name for name, _ in missing} else "")
        return [Problem(message + hint, name) for name, message in missing]
    problems = []
    try:
        adapters.check_embedding_type(meta[spec.embedding_column].dtype, spec.embedding_column, None)
    except InputDataError as exc:
        problems.append(Problem(str(exc), spec.embedding_column))
    for name, kind, option in ((spec.id_column, "id", "id_column (--id-column)"), (spec.by, "group", "by")):
        nested = getattr(meta[name].dtype, "pyarrow_dtype", None) if name in meta.columns else None
        if nested is not None and pa.types.is_nested(nested):
            problems.append(Problem(f"{kind} column {name!r} holds {nested} values, not single ones "
                                    f"(integers or strings): name another column with {option}", name))
    numeric = [(name, "quality") for name, _ in spec.quality]
    numeric += [(spec.token_column, "token")] if spec.budget is not None else []
    for name, kind in numeric:
        dtype = meta[name].dtype
        if not adapters.is_numeric_dtype(dtype):
            problems.append(Problem(f"{kind} column {name!r} must be numeric, got dtype {dtype}: cast it "
                                    "to float64 (Dask: astype, Spark: cast) or pick another column", name))
    return problems
