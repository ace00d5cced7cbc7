"""The Dask operator: ``datamask_select(ddf, ratio=0.1)`` adds a boolean ``selected`` column.

Backends accepted: Dask DataFrames with pandas or cuDF partitions (see
:mod:`datamask_dask.partition.adapters`).

Two passes over the input: the plan pass runs when the operator is called (as on Spark, and as
Dask's ``sort_values`` finds its divisions), because its small result says which partitions learn
together; the select pass is the lazy result.

1. **Plan** (small): the id, quality, group and token columns, and with ``validate="full"`` the
   embeddings too. Each partition is checked first (:mod:`datamask_dask.partition.checks`: NaN
   quality, null ids, ragged, NaN or zero embeddings...), so bad input fails here, before any
   learning, naming the column, partition and rows. Each partition then sends a quality sketch
   (:mod:`datamask_dask.plan.quotas`); a tree reduction checks that ids are unique. One task
   (:func:`datamask_dask.plan.reduce.make_plan`) turns the sketches into integer quotas (or token
   budgets) per partition and group, so the selected total is exact, and fixes the table-wide
   quality range and the embedding dimension. With ``diversity_scope="table"`` (the default) the
   plan pass reads the embeddings and finds the near-duplicate groups of the whole table
   (:mod:`datamask_dask.dedup`, the same groups at every size): a row with a verified better
   near-duplicate is *shadowed* (left out of the sketches and ineligible in the select pass, so
   no partition selects a copy of a better row that lives in another one), and a kept row stands
   for the rows it shadows (its weight, which the learner's Facility counts).
2. **Select**: one :func:`datamask_dask.partition.select.select_partition` task per partition of
   :func:`partitions` (the partitions the plan pass read), gathered with ``dd.from_delayed`` and
   an explicit ``meta``. Each partition keeps its eligible rows (its best by quality, as
   many as the plan says), splits them into chunks of at most ``max_chunk_rows`` rows and
   ``max_chunk_values`` embedding values (fewer when a ``memory_budget`` asks for it, see
   :mod:`datamask_dask.plan.memory`), and runs the
   learner (:func:`datamask_dask.learn.learn_mask`) on each chunk with a seed derived from
   (seed, partition, group, chunk). In table scope, consecutive partitions whose eligible rows
   fit in one chunk together (the plan's packs) hand them to one task that learns them as one
   partition (:func:`~datamask_dask.partition.select.learn_pack`), whose result their select
   tasks take. Every input row and column comes back unchanged and in order, plus ``selected``.

Same input, partitioning and seed give the same ``selected`` on any scheduler and any number of
workers: nothing depends on where or when a task runs. :func:`plan_selection` and
:func:`apply_plan` expose the two passes separately (the resumable writer,
:func:`datamask_dask.write_selection`, computes the plan once with :func:`compute_plan` and
records it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from operator import add

import dask
from dask.delayed import Delayed
from dask.sizeof import sizeof

from .. import progress as progress_bars
from ..config import resolve_options
from ..dedup.dask_graph import table_groups, wired_by_rows
from ..graph_keys import listed, named
from ..learn.options import parameters
from ..options import FIELDS, OPERATOR_KEYS, SelectOptions
from ..partition import adapters
from ..partition.checks import (
    duplicate_input,
    id_report,
    merge_ids,
    partition_ids,
    scan_partition,
    summarise_partition,
    summarise_scan,
)
from ..partition.select import (
    PackRows,
    Routes,
    area_sums,
    context_round,
    learn_pack,
    pack_curve,
    pack_rows,
    select_partition,
    selection_meta,
)
from ..partition.spec import SelectSpec, spec_from_meta
from ..plan.reduce import make_plan, share_regions, warn_plan
from ..plan.types import Plan

__all__ = ["apply_plan", "datamask_select", "make_spec", "plan_selection"]

_PROBE_PARTITIONS = 4  # partitions read to learn the embedding dimension when nothing else says it
_SPLIT_EVERY = 8  # fan-in of the duplicate-id tree reduction


@sizeof.register(PackRows)
def _pack_rows_bytes(rows: PackRows) -> int:
    """A partition's rows routed to a pack wait in a worker's memory until the pack runs: Dask's memory
    manager counts them (and spills them under pressure) by their arrays, not the object's own bytes."""
    arrays = (rows.positions, rows.quality, rows.embeddings, rows.tokens, rows.weights, rows.areas)
    return sum(int(getattr(array, "nbytes", 0)) for array in arrays if array is not None)


def datamask_select(ddf, ratio: float | Mapping | None = None, *, config=None, **options):
    """Select a share of rows that is both high in quality and diverse (DATAMASK), lazily.

    Parameters
    ----------
    ddf : dask.dataframe.DataFrame
        pandas- or cuDF-backed; one row per document with an id, quality score(s) and an
        embedding (list or fixed-size list of floats, one dimension for the whole table).
{ratio}
    config : str, path, mapping or SelectOptions, optional
        A profile (``"cpu"``, ``"gpu"``, ``"reference"``), a YAML config file or a mapping (see
        :mod:`datamask_dask.config`); keyword arguments win over it, and it wins over
        ``dask.config``'s ``datamask`` namespace. Options already resolved
        (:func:`datamask_dask.config.resolve_options`) are used as they are.
    **options
        Learner options (``n_epochs``, ``partial``, ``algorithm``, ``max_lr``, ``min_lr``,
        ``lamb``, ``n_rollout``, ``init``, ``prune``, ``seed``, ``update``, ``final``, ...: see
        :class:`~datamask_dask.learn.options.DataMaskOptions`, whose defaults apply, with
        ``config.METRIC_DEFAULTS`` for the metric chosen) and the operator's
        (:class:`~datamask_dask.options.SelectOptions`):

{options}

    Returns
    -------
    dask.dataframe.DataFrame
        ``ddf`` with the same partitions, rows, index and columns, plus the boolean
        ``selected`` column (and the score column if asked). The plan pass has run; the select
        pass is computed with the result.

    Raises
    ------
    OptionError
        For bad or unknown options, and a ratio or budget the data cannot meet (the plan pass).
    InputDataError
        For columns missing from the schema; naming the partition, for NaN quality, ragged or
        mixed-dimension embeddings, duplicate ids... (the plan pass, or with ``validate="light"``
        the select pass for the embeddings it alone reads).

    Warns
    -----
    DataMaskWarning
        Where the plan takes no row of most ``by`` groups, or of the table, at ``ratio``, or a
        per-group ratio or budget names a group no row holds (a run logs the same).

    Examples
    --------
    >>> out = ddf.pipe(datamask_select, ratio=0.1, n_epochs=200)   # doctest: +SKIP
    >>> out.to_parquet("s3://bucket/selected/")                     # doctest: +SKIP
    """
    require_dask(ddf)
    scheduler = options.pop("scheduler", None) or _holder(ddf)  # once: finding the holder walks the graph
    spec, plan = _plan_selection(ddf, ratio, config, scheduler, options)
    return _apply_plan(ddf, spec, plan, scheduler)


datamask_select.__doc__ = datamask_select.__doc__.replace(
    "{ratio}", parameters([FIELDS["ratio"]])).replace(
    "{options}", parameters([FIELDS[name] for name in OPERATOR_KEYS if name != "ratio"], indent=8))


def plan_selection(ddf, ratio: float | Mapping | None = None, *, config=None, scheduler=None, **options):
    """Validate the options against ``ddf``'s schema and build the lazy plan pass.

    Parameters
    ----------
    ddf, ratio, config, **options
        As for :func:`datamask_select`.
    scheduler : optional
        The scheduler the job will run on (a distributed Client's workers give the memory
        limit that is checked, see ``memory_budget``, and the near-duplicate search is wired for
        it); by default the Client holding ``ddf``'s persisted partitions, else Dask's default.

    Returns
    -------
    spec : SelectSpec
    plan : dask.delayed.Delayed
        Computes to the plan dict that :func:`apply_plan` and :func:`select_partition` follow.
    """
    require_dask(ddf)
    return _plan_selection(ddf, ratio, config, scheduler or _holder(ddf), options)


def _plan_selection(ddf, ratio, config, scheduler, options: dict):
    resolved = resolve_options(config, ratio=ratio, backend=adapters.backend(ddf._meta), **options)
    spec = make_spec(ddf, resolved, scheduler=scheduler)
    with _current(scheduler):
        return spec, plan_graph(ddf, spec)


def make_spec(ddf, options: SelectOptions, *, scheduler=None) -> SelectSpec:
    """Check resolved options against a Dask dataframe's schema (no data is read).

    Raises
    ------
    TypeError
        If ``ddf`` is not a Dask DataFrame.
    OptionError, InputDataError
        For the first bad option, or the columns the schema lacks or types wrongly.
    """
    require_dask(ddf)
    return spec_from_meta(ddf._meta, options, scheduler=scheduler)


def require_dask(ddf, caller: str = "datamask_select") -> None:
    """A TypeError naming the remedy where ``ddf`` is not a Dask DataFrame (a pandas frame, say)."""
    import dask.dataframe as dd

    if not isinstance(ddf, dd.DataFrame):
        raise TypeError(f"{caller} needs a dask DataFrame, got {type(ddf).__name__}; wrap a pandas "
                        "frame with dask.dataframe.from_pandas(df, npartitions=...)")


def apply_plan(ddf, spec: SelectSpec, plan, *, scheduler=None):
    """The select pass: ``ddf`` plus the ``selected`` column (lazy), following ``plan``.

    ``plan`` is the Delayed from :func:`plan_selection` (computed here, on ``scheduler``, by default
    the client holding ``ddf``'s persisted partitions or Dask's default: which partitions learn
    together is the plan's to say) or the plan it computes to.
    """
    return _apply_plan(ddf, spec, plan, scheduler or _holder(ddf))


def _apply_plan(ddf, spec: SelectSpec, plan, scheduler):
    import dask.dataframe as dd

    client = progress_bars.client_of(scheduler)
    if client is not None:  # the select pass is the user's to compute: the scheduler watches its stalls
        from ..stalls import watch_stalls

        watch_stalls(client)
    if isinstance(plan, Delayed):  # as every pass is computed: the local schedulers' BLAS on a thread a task
        plan = progress_bars.compute(plan, scheduler=scheduler, progress=False)[0]
    plan, routes = settle(ddf, plan, scheduler=scheduler, progress=False)
    warn_plan(plan, stacklevel=3)  # the user's call of datamask_select or apply_plan
    plan_node = dask.delayed(plan, traverse=False)  # one graph node that every partition's task refers to
    meta = selection_meta(ddf._meta, spec)
    key = _key("datamask-select", ddf, plan_node)
    parts = partitions(ddf)
    packs, _ = pack_graph(ddf, plan, plan_node, range(len(parts)), routes)
    tasks = [dask.delayed(select_partition, pure=True)(part, plan_node, {"number": i}, packs.get(i, ()),
                                                       dask_key_name=(key, i))
             for i, part in enumerate(parts)]
    divisions = ddf.divisions if ddf.known_divisions else None
    # every column keeps the input's dtype: Dask's string conversion would turn an object column of
    # arrays (how its parquet reader gives list columns) into their text, and cannot read cuDF's dtypes
    with dask.config.set({"dataframe.convert-string": False}):
        return dd.from_delayed(tasks, meta=meta, divisions=divisions, prefix="datamask-select",
                               verify_meta=False)


def _holder(ddf):
    """The distributed client holding ``ddf``'s persisted partitions, if any (None: Dask's default)."""
    from distributed import futures_of

    futures = futures_of(ddf)
    return futures[0].client if futures else None


def pack_graph(ddf, plan: Plan, plan_node, todo,
               routes: Mapping[int, object] | None = None) -> tuple[dict[int, object], dict[int, Delayed]]:
    """The tasks that learn the plan's packs holding a partition of ``todo``, from their members' rows
    of ``ddf`` and the :class:`~datamask_dask.partition.select.Routes` the share pass kept of them
    (:func:`settle`): for each such partition, one Delayed list of its packs' results, which its select
    task takes; and each pack's task, by pack index.

    The packs read the columns they learn from, apart from the select tasks' reads: a partition's
    select task waits for its packs, which wait for their members, so a read both took would hold
    every member's whole partition until then."""
    wanted, routes = set(todo), routes or {}
    packs = [(index, pack) for index, pack in enumerate(plan.packs) if wanted.intersection(pack.partitions)]
    members = sorted({p for _, pack in packs for p in pack.partitions})
    parts = column_reads(ddf, plan.spec.select_columns, "datamask-pack-read") if members else []
    rows = {p: dask.delayed(pack_rows, pure=True)(
        parts[p], plan_node, {"number": p}, routes.get(p),
        dask_key_name=_key("datamask-pack-rows", parts[p], plan_node, p)) for p in members}
    learned: dict[int, list] = {}
    tasks: dict[int, Delayed] = {}
    for index, pack in packs:
        members = [pack_part(rows[p], index) for p in pack.partitions]
        tasks[index] = dask.delayed(learn_pack, pure=True)(
            listed("datamask-pack-members", members), plan_node, index,
            dask_key_name=_key("datamask-pack", members, index))
        for p in pack.partitions:
            learned.setdefault(p, []).append(tasks[index])
    return {p: listed("datamask-pack-results", taken) for p, taken in learned.items()}, tasks


def pack_part(rows: Delayed, index: int) -> Delayed:
    """A partition's rows of pack ``index`` alone, from its :func:`pack_rows` (all of its packs' rows): a
    pack's task then takes, and its worker fetches, only its own rows of each member, and the rows of
    each pack are let go once it is learned."""
    return dask.delayed(_rows_of, pure=True)(rows, index,
                                             dask_key_name=_key("datamask-pack-part", rows, index))


def _rows_of(rows: dict, index: int) -> dict:
    return {index: rows[index]} if index in rows else {}


def settle(ddf, plan: Plan, *, scheduler=None,
           progress: bool | None = None) -> tuple[Plan, dict[int, object]]:
    """The plan the select pass follows, from a :attr:`~datamask_dask.plan.types.Plan.pending` one: its
    regions' quotas shared (:func:`share_graph`), or its context's rounds learned
    (:func:`context_round_graph`); and the :class:`~datamask_dask.partition.select.Routes` of each
    partition the share pass routed, left where they are (futures on a distributed client)."""
    routes: dict[int, object] = {}
    while plan.pending:
        if plan.context is not None:
            plan = progress_bars.compute(context_round_graph(ddf, plan), scheduler=scheduler,
                                         progress=progress)[0]
            continue
        shared, routed = share_graph(column_reads(ddf, plan.spec.select_columns, "datamask-share-read"), plan)
        plan, *kept = progress_bars.compute(shared, scheduler=scheduler, progress=progress,
                                            kept=list(routed.values()))
        routes = dict(zip(routed, kept, strict=True))
    return plan, routes


def context_round_graph(ddf, plan: Plan) -> Delayed:
    """The context's next round, lazily (``pieces="context"``): every piece learned as the round learns
    it (:func:`~datamask_dask.partition.select.context_round`), each partition's picks added to the sum
    of those before it, one task after another, and the total put in the plan
    (:meth:`~datamask_dask.plan.types.Plan.with_round`)."""
    plan_node = dask.delayed(plan, traverse=False)
    parts = column_reads(ddf, plan.spec.select_columns, "datamask-context-read")  # not the packs' reads
    packs, _ = pack_graph(ddf, plan, plan_node, range(len(parts)))
    total = None
    for i, part in enumerate(parts):
        picks = dask.delayed(context_round, pure=True)(
            part, plan_node, {"number": i}, packs.get(i, ()),
            dask_key_name=_key("datamask-context-round", part, plan_node, i))
        total = picks if total is None else dask.delayed(add, pure=True)(
            total, picks, dask_key_name=_key("datamask-context-round-sum", total, picks))
    return dask.delayed(Plan.with_round, pure=True)(plan_node, total,
                                                    dask_key_name=_key("datamask-context-round-plan", total))


def share_graph(parts: list, plan: Plan) -> tuple[Delayed, dict[int, Delayed]]:
    """The regions' quotas, lazily: what the plan pass finds of the areas, shared by
    :func:`~datamask_dask.plan.reduce.share_regions` into the plan the select pass follows. Facility:
    each region's marginal-gain curves from its members' rows
    (:func:`~datamask_dask.partition.select.pack_curve`); Pair_simi: each partition's sums by area
    (:func:`~datamask_dask.partition.select.area_sums`), which move no rows. With it, each member's
    :class:`~datamask_dask.partition.select.Routes`, by partition."""
    plan_node = dask.delayed(plan, traverse=False)
    members = sorted({p for pack in plan.packs for p in pack.partitions})
    rows = {p: dask.delayed(pack_rows, pure=True)(
        parts[p], plan_node, {"number": p},
        dask_key_name=_key("datamask-region-rows", parts[p], plan_node, p)) for p in members}
    if plan.spec.options.metric == "pair_simi":
        found = [dask.delayed(area_sums, pure=True)(
            rows[p], plan_node, dask_key_name=_key("datamask-region-sums", rows[p], plan_node))
            for p in members]
    else:
        found = [dask.delayed(pack_curve, pure=True)(
            listed("datamask-region-members", [pack_part(rows[p], index) for p in pack.partitions]),
            plan_node, index,
            dask_key_name=_key("datamask-region-curve", plan_node, index))
            for index, pack in enumerate(plan.packs)]
    routes = {p: dask.delayed(Routes.of, pure=True)(
        rows[p], dask_key_name=_key("datamask-region-routes", rows[p])) for p in members}
    shared = dask.delayed(share_regions, pure=True)(plan_node, listed("datamask-region-found", found),
                                                    dask_key_name=_key("datamask-region-quotas", plan_node))
    return shared, routes


def partitions(ddf) -> list:
    """``ddf``'s partitions as the plan pass reads them: ``ddf.to_delayed()``, one Delayed each.

    Both passes take their partitions from here, never from an expression built on top of ``ddf``:
    Dask's parquet reader merges small partitions when a blockwise step (``map_partitions``) reads
    fewer columns than the files hold, so ``ddf.map_partitions(f)`` can see fewer, larger partitions
    than ``ddf`` itself, and a quota planned per partition would land on other rows. The reads are
    named ``datamask-read`` on the dashboard.
    """
    return named(ddf.to_delayed(), "datamask-read")


def listed_rows(ddf) -> int | None:
    """``ddf``'s rows where its reader lists them without reading a partition (Dask's parquet reader,
    from the files' footers, as ``len(ddf)`` takes them), else None: a filtered or persisted frame."""
    try:
        from dask.dataframe.dask_expr._expr import Lengths, Literal

        lengths = Lengths(ddf.expr).optimize(fuse=False)
    except Exception:  # a source (or a Dask) that cannot say: not known, the partitions wire the search
        return None
    return int(sum(lengths.value)) if isinstance(lengths, Literal) else None


# --------------------------------------------------------------------------- plan pass


def plan_graph(ddf, spec: SelectSpec, known_rows: int | None = None):
    """The lazy plan: per-partition checks and sketches, id check and dimension, reduced to one task.

    Only the first tasks read the partitions: each partition's distinct ids (when they are checked)
    and its checks and sketches, or in table scope its checks and a SimHash signature per row
    (:func:`~datamask_dask.partition.checks.scan_partition`), sketched without its shadowed rows
    (and with its kept rows' weights) once the near-duplicate groups of the whole table are found
    (:func:`datamask_dask.dedup.dask_graph.table_groups`, wired for ``known_rows``, the table's rows
    where its reader listed them, by default :func:`listed_rows`). The rest works on their small
    results only.
    """
    parts = column_reads(ddf, spec.plan_columns)
    if spec.diversity_scope == "table":
        scans = [dask.delayed(scan_partition, pure=True)(
            part, i, spec, len(parts), dask_key_name=_key("datamask-plan-scan", part, i, spec, len(parts)))
            for i, part in enumerate(parts)]
        inputs = [dask.delayed(duplicate_input, pure=True)(
            scan, dask_key_name=_key("datamask-plan-signatures", scan)) for scan in scans]
        # the exact check reads the candidate rows' embeddings again, inside its own tasks: the
        # scans keep none, so the process never holds the table's embeddings
        reads = column_reads(ddf, [spec.embedding_column], name="datamask-plan-vectors")
        vectors = [dask.delayed(adapters.embedding_rows, pure=True)(
            read, i, dask_key_name=_key("datamask-plan-rows", read, i)) for i, read in enumerate(reads)]
        rows = known_rows if known_rows is not None or not wired_by_rows(len(parts)) else listed_rows(ddf)
        groups = table_groups(inputs, spec.duplicate_cosine, vectors, rows)  # of the whole table
        summaries = [dask.delayed(summarise_scan, pure=True)(
            scan, groups[i], dask_key_name=_key("datamask-plan-partition", scan, i))
            for i, scan in enumerate(scans)]
    else:
        summaries = [dask.delayed(summarise_partition, pure=True)(
            part, i, spec, dask_key_name=_key("datamask-plan-partition", part, i, spec))
            for i, part in enumerate(parts)]
    ids = id_graph(parts, spec.id_column) if spec.check_ids else None
    dim = adapters.fixed_dimension(ddf._meta[spec.embedding_column].dtype)
    if dim is None and spec.validate != "full":  # "full" gets every partition's dimension anyway
        n_probe = min(_PROBE_PARTITIONS, ddf.npartitions)
        probes = ddf[spec.embedding_column].partitions[list(range(n_probe))].to_delayed()
        dim = dask.delayed(adapters.probe_dimension, pure=True)(listed("datamask-plan-probes", probes))
    return dask.delayed(make_plan, pure=True)(listed("datamask-plan-summaries", summaries), ids, dim, spec,
                                              dask_key_name=_key("datamask-plan", summaries, ids, dim, spec))


def _key(prefix: str, *args) -> str:
    """A task key the Dask dashboard shows as ``prefix`` (its task prefix), unique per arguments."""
    from dask.base import tokenize

    return f"{prefix}-{tokenize(*args)}"


def compute_plan(ddf, spec: SelectSpec, *, scheduler=None, progress: bool | None = None,
                 known_rows: int | None = None) -> tuple[Plan, dict[int, object]]:
    """The plan of :func:`plan_graph`, computed now and settled (:func:`settle`: the writers' first
    pass), with the routes its share pass kept."""
    with _current(scheduler):
        plan = plan_graph(ddf, spec, known_rows)
    return settle(ddf, progress_bars.compute(plan, scheduler=scheduler, progress=progress)[0],
                  scheduler=scheduler, progress=progress)


def _current(scheduler):
    """``scheduler`` as the current Client while a plan graph is built, where it is one: the search
    is wired for the scheduler that runs it (sharded on a cluster even where the Client is not Dask's
    default, in one task on a local scheduler)."""
    return scheduler.as_current() if hasattr(scheduler, "as_current") else contextlib.nullcontext()


def column_reads(ddf, columns: list[str], name: str = "datamask-plan-read") -> list:
    """``ddf[columns]`` per partition (one Delayed each, named ``name`` on the dashboard), column-pruned
    where the source allows it: the plan pass's reads, and the select pass's where the output needs
    only some columns.

    The pruned read is taken only where it gives the partitions of :func:`partitions` (Dask's parquet
    reader may merge small partitions differently once columns are pruned). Otherwise, or where the
    source cannot prune columns (the projection would run on whole partitions), each partition is
    projected after it is read, checked, so a partition that lacks a column is reported by number
    rather than as a bare KeyError.
    """
    whole = partitions(ddf)
    projected = ddf[columns]
    try:
        tree = projected.optimize(fuse=False).expr.walk()
        pushed_down = not any(type(e).__name__ == "Projection" for e in tree)
    except Exception:  # an expression dask cannot optimise here: take the checked path
        pushed_down = False
    if pushed_down:
        parts = projected.to_delayed()
        if len(parts) == len(whole):
            return named(parts, name)
    return [dask.delayed(_take_columns, pure=True)(part, columns, i,
                                                   dask_key_name=_key(name, part, i, columns))
            for i, part in enumerate(whole)]


def _take_columns(frame, columns: list[str], number: int):
    adapters.require_columns(frame, columns, f"partition {number}")
    return frame[columns]


def id_graph(parts: list, id_column: str):
    """Lazy duplicate-id report over the partitions ``parts``: each one's distinct ids, merged by a tree
    reduction."""
    level = [dask.delayed(partition_ids, pure=True)(
        part, i, id_column, dask_key_name=_key("datamask-plan-ids", part, i, id_column))
        for i, part in enumerate(parts)]
    while len(level) > 1:
        level = [dask.delayed(merge_ids, pure=True)(
            listed("datamask-plan-ids", level[i:i + _SPLIT_EVERY]),
            dask_key_name=_key("datamask-plan-ids", level[i:i + _SPLIT_EVERY]))
            for i in range(0, len(level), _SPLIT_EVERY)]
    return dask.delayed(id_report, pure=True)(level[0], dask_key_name=_key("datamask-plan-ids", level[0]))
