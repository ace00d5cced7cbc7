"""The Dask operator: ``datamask_select(ddf, ratio=0.1)`` adds a boolean ``selected`` column.

Backends accepted: Dask DataFrames with pandas or cuDF partitions (see :mod:`.adapters`).

The result is lazy. Its graph has two passes over the input:

1. **Plan** (small): the id, quality, group and token columns, and with ``validate="full"`` (the
   default) the embeddings too. Each partition is checked first (:mod:`.validate`: NaN quality,
   null ids, ragged, NaN or zero embeddings...), so bad input fails here, before any learning,
   naming the column, partition and rows. Each partition then sends a quality sketch
   (:mod:`.quotas`); a tree reduction checks that ids are unique. One task turns the sketches
   into integer quotas (or token budgets) per partition and group, so the selected total is
   exact, and fixes the table-wide quality range and the embedding dimension.
2. **Select**: ``map_partitions`` with an explicit ``meta``. Each partition keeps its eligible
   rows (its best by quality, as many as the plan says), splits them into chunks of at most
   ``max_chunk_rows`` rows (fewer when a ``memory_budget`` asks for it, see :mod:`.memory`),
   and runs the learner (:func:`~datamask_dask.engine.learn_mask`) on each chunk with a seed
   derived from (seed, partition, group, chunk). Every input row and column comes back
   unchanged and in order, plus ``selected``.

Same input, partitioning and seed give the same ``selected`` on any scheduler and any number of
workers: nothing depends on where or when a task runs. :func:`plan_selection` and
:func:`apply_plan` expose the two passes separately (the resumable writer,
:func:`datamask_dask.write_selection`, computes the plan once and records it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import dask
import numpy as np
from dask.delayed import Delayed

from . import adapters
from .config import load_config
from .engine import learn_mask
from .errors import InputDataError, OptionError
from .memory import plan_memory
from .quotas import fit_budget, make_sketch, plan_rows, plan_tokens, split_budget, split_quota
from .validate import (
    SelectSpec,
    check_partition,
    check_vectors,
    dimension_problems,
    duplicate_problems,
    group_codes,
    id_graph,
    make_spec,
    problems_error,
    quality_values,
    token_values,
)

__all__ = ["SelectSpec", "apply_plan", "datamask_select", "make_plan", "make_spec", "plan_selection",
           "select_partition"]

_PROBE_PARTITIONS = 4  # partitions read to learn the embedding dimension when nothing else says it


def datamask_select(ddf, ratio: float | Mapping | None = None, *, config=None, **options):
    """Select a share of rows that is both high in quality and diverse (DATAMASK), lazily.

    Parameters
    ----------
    ddf : dask.dataframe.DataFrame
        pandas- or cuDF-backed; one row per document with an id, quality score(s) and an
        embedding (list or fixed-size list of floats, one dimension for the whole table).
    ratio : float or mapping, default 0.1
        Share of rows to select, in (0, 1]: exactly ``round(ratio * N)`` rows (Python rounding)
        are selected. With ``by``, a float applies to every group and a mapping
        ``{group: ratio}`` (ratios in [0, 1]) gives each group its own; groups it does not name
        get none.
    config : path or mapping, optional
        YAML config file (see :mod:`datamask_dask.config`); keyword arguments win over it, and it
        wins over ``dask.config``'s ``datamask`` namespace.
    **options
        Learner options (``n_epochs``, ``partial``, ``algorithm``, ``max_lr``, ``min_lr``,
        ``lamb``, ``n_rollout``, ``init``, ``seed``, ``update``, ``final``, ...) and:

        prune : float
            Share of the table, worst quality first, made ineligible (table-wide, not per
            partition; per group with ``by``).
        id_column : str, default ``"chunk_id"``
            Ids must be unique across the table (checked unless ``check_ids=False``).
        quality_column (alias ``quality``) : str, list or mapping, default ``"quality_score"``
            One column, several (equal weights) or ``{column: weight}``; the weighted sum is
            the quality (put the columns on comparable scales first).
        embedding_column (alias ``embedding``) : str, default ``"feature_arr"``
        by : str, optional
            Group column: quotas are planned per group (each group like a table of its own).
        budget_tokens : int or mapping, optional
            Select by tokens instead of rows: the selected rows' ``token_column`` values sum to
            at most this (``{group: tokens}`` with ``by``). Guarantee: never above the budget;
            in each partition (and group) no unselected eligible row would still fit in what its
            share of the budget has left, so the total falls short by less than about one row's
            tokens per partition.
        token_column : str, default ``"n_tokens"``
        device : {"auto", "cpu", "cuda", "cuda:N"}
            ``"auto"`` learns on the GPU when the partition is cuDF.
        max_chunk_rows : int, default 200_000
            Partitions with more eligible rows are learned in chunks of at most this many rows.
        oversample : float, default 2
            Size of the table-wide quality pool that sets partition quotas, as a multiple of
            the quota (see :mod:`datamask_dask.quotas`); >= 1.
        selected_column : str, default ``"selected"``
        score_column : str, optional
            Also output the learned logits (float32) under this name: NaN where no learning
            ran (quota 0, or every eligible row taken), ``-inf`` for rows made ineligible.
        check_ids : bool, default True
            Fail on duplicate or null ids. The check is a tree reduction whose last task holds
            every distinct id: turn it off for tables whose ids do not fit in one worker.
        validate : {"full", "light"}, default "full"
            ``"full"``: the plan pass also reads every embedding and checks it (null, ragged,
            dimension, NaN or infinite, all-zero, norm), so bad rows fail before any learning.
            ``"light"``: the plan pass reads only the small columns (one read of the embeddings
            less); embeddings are then checked chunk by chunk just before they are learned.
        memory_budget : int or str, optional
            Working memory of one selection task beyond its partition, in bytes or as text
            (``"2GiB"``): chunks and the learner's batches are sized to fit (see
            :mod:`datamask_dask.memory`). Default: half the per-thread memory limit of the
            current distributed cluster's workers, or most of a GPU's free memory when learning
            on one; no bound on the local schedulers. ``"off"``: no bound.

    Returns
    -------
    dask.dataframe.DataFrame
        ``ddf`` with the same partitions, rows, index and columns, plus the boolean
        ``selected`` column (and the score column if asked). Nothing is computed yet.

    Raises
    ------
    OptionError
        At call time for bad or unknown options; at compute time for a ratio or budget the
        data cannot meet.
    InputDataError
        At call time for columns missing from the schema; at compute time, naming the
        partition, for NaN quality, ragged or mixed-dimension embeddings, duplicate ids...

    Examples
    --------
    >>> out = ddf.pipe(datamask_select, ratio=0.1, n_epochs=200)   # doctest: +SKIP
    >>> out.to_parquet("s3://bucket/selected/")                     # doctest: +SKIP
    """
    spec, plan = plan_selection(ddf, ratio, config=config, **options)
    return apply_plan(ddf, spec, plan)


def plan_selection(ddf, ratio: float | Mapping | None = None, *, config=None, scheduler=None, **options):
    """Validate the options against ``ddf``'s schema and build the lazy plan pass.

    Parameters
    ----------
    ddf, ratio, config, **options
        As for :func:`datamask_select`.
    scheduler : optional
        The scheduler the job will run on (a distributed Client gives the default
        ``memory_budget``); by default the current default Client, if any.

    Returns
    -------
    spec : SelectSpec
    plan : dask.delayed.Delayed
        Computes to the plan dict that :func:`apply_plan` and :func:`select_partition` follow.
    """
    settings = load_config(config, ratio=ratio, **options)
    ratio_given = ratio is not None or "select_ratio" in options
    spec = make_spec(ddf, settings, ratio_given=ratio_given, scheduler=scheduler)
    return spec, plan_graph(ddf, spec)


def apply_plan(ddf, spec: SelectSpec, plan):
    """The select pass: ``ddf`` plus the ``selected`` column (lazy), following ``plan``.

    ``plan`` is the Delayed from :func:`plan_selection` or the dict it computes to.
    """
    if not isinstance(plan, Delayed):  # one graph node that every partition's task refers to
        plan = dask.delayed(plan, traverse=False)
    out_columns = {spec.selected_column: np.zeros(0, dtype=bool)}
    if spec.score_column:
        out_columns[spec.score_column] = np.zeros(0, dtype=np.float32)
    meta = adapters.with_columns(ddf._meta, out_columns)
    return ddf.map_partitions(select_partition, plan, meta=meta)


# --------------------------------------------------------------------------- plan pass


def plan_graph(ddf, spec: SelectSpec):
    """The lazy plan: per-partition checks and sketches, id check and dimension, reduced to one task."""
    parts = plan_input(ddf, spec.plan_columns).to_delayed()
    summaries = [dask.delayed(summarise_partition, pure=True)(part, i, spec) for i, part in enumerate(parts)]
    ids = id_graph(parts, spec.id_column) if spec.check_ids else None
    dim = adapters.fixed_dimension(ddf._meta[spec.embedding_column].dtype)
    if dim is None and spec.validate != "full":  # "full" gets every partition's dimension anyway
        n_probe = min(_PROBE_PARTITIONS, ddf.npartitions)
        probes = ddf[spec.embedding_column].partitions[list(range(n_probe))].to_delayed()
        dim = dask.delayed(_probe_dimension, pure=True)(probes)
    return dask.delayed(make_plan, pure=True)(summaries, ids, dim, spec)


def plan_input(ddf, columns: list[str]):
    """``ddf[columns]``, read column-pruned where the source allows it.

    Where the source cannot prune columns (the projection would run on whole partitions), a
    checked projection is used instead, so a partition that lacks a column is reported by
    number rather than as a bare KeyError; nothing more is read either way.
    """
    projected = ddf[columns]
    try:
        tree = projected.optimize(fuse=False).expr.walk()
        pushed_down = not any(type(e).__name__ == "Projection" for e in tree)
    except Exception:  # an expression dask cannot optimise here: take the checked path
        pushed_down = False
    if pushed_down:
        return projected
    return ddf.map_partitions(_take_columns, columns, meta=ddf._meta[columns])


def _take_columns(frame, columns: list[str], partition_info=None):
    number = partition_info["number"] if partition_info is not None else 0
    adapters.require_columns(frame, columns, f"partition {number}")
    return frame[columns]


def summarise_partition(frame, number: int, spec: SelectSpec) -> dict:
    """One partition's contribution to the plan, after its checks: rows, dimension, sketches."""
    check = check_partition(frame, number, spec)
    check.raise_if_failed()
    return summarise_check(check)


def summarise_check(check) -> dict:
    """The plan summary of a partition that passed :func:`~datamask_dask.validate.check_partition`."""
    codes, labels = check.codes, check.labels
    if codes is None:  # no group column: one group
        codes, labels = np.zeros(check.rows, dtype=np.int64), ([None] if check.rows else [])
    cells = {}
    for code, label in enumerate(labels):
        rows = codes == code
        q = check.quality[rows]
        cells[label] = {"sketch": make_sketch(q, None if check.tokens is None else check.tokens[rows]),
                        "min": float(q.min()), "max": float(q.max())}
    return {"n": check.rows, "cells": cells, "dim": check.dim, "digest": check.digest}


def _probe_dimension(parts: list) -> int | None:
    for number, series in enumerate(parts):
        if len(series):
            return adapters.embedding_source(series, f"partition {number}").dim
    return None


def _group_sort_key(label):
    return (type(label).__name__, label)


def make_plan(summaries: list[dict], ids, dim, spec: SelectSpec) -> dict:
    """Integer quotas (or token budgets) per partition and group, and the table-wide quality range.

    Raises
    ------
    InputDataError
        For duplicate ids or mixed embedding dimensions across partitions.
    OptionError
        For a ratio or token budget the data cannot meet.
    """
    dims = [s.get("dim") for s in summaries]
    problems = duplicate_problems(ids, spec.id_column) + dimension_problems(dims, spec.embedding_column)
    if problems:
        raise problems_error(problems)
    if dim is None:
        dim = next((d for d in dims if d is not None), None)
    labels = sorted({label for s in summaries for label in s["cells"]}, key=_group_sort_key)
    cells: dict[int, list] = {}
    ranges = {}
    for index, label in enumerate(labels):
        where = "" if spec.by is None else f" in group {label!r} of {spec.by!r}"
        members = [(p, s["cells"][label]) for p, s in enumerate(summaries) if label in s["cells"]]
        sketches = [cell["sketch"] for _, cell in members]
        n_rows = sum(sk.n_rows for sk in sketches)
        ranges[index] = (min(c["min"] for _, c in members), max(c["max"] for _, c in members))
        if spec.budget is not None:
            budget = spec.budget if spec.by is None else spec.budget.get(label, 0)
            if budget == 0:
                plan = np.zeros((3, len(members)), dtype=np.int64)
            else:
                try:
                    result = plan_tokens(sketches, budget, spec.prune, spec.oversample)
                except ValueError as exc:
                    total = sum(float(sk.tokens.sum()) for sk in sketches)
                    raise OptionError(
                        f"budget_tokens={budget} cannot be met{where}: {exc} (the rows hold {total:.0f} "
                        f"tokens in column {spec.token_column!r}; prune={spec.prune}); lower the budget"
                    ) from exc
                plan = np.stack([result.eligible, result.quota, result.budget])
        else:
            ratio = spec.ratio if not isinstance(spec.ratio, dict) else spec.ratio.get(label, 0.0)
            quota = int(round(ratio * n_rows))
            try:
                result = plan_rows(sketches, quota, spec.prune, spec.oversample)
            except ValueError as exc:
                raise OptionError(f"ratio={ratio} cannot be met{where}: {exc} after prune={spec.prune}; "
                                  "lower the ratio or the prune share") from exc
            plan = np.stack([result.eligible, result.quota, np.full(len(members), -1)])
        for (partition, _), (eligible, quota, budget) in zip(members, plan.T, strict=True):
            cells.setdefault(partition, []).append(
                (label, index, int(eligible), int(quota), None if spec.budget is None else int(budget)))
    return {"spec": spec, "cells": cells, "rows": [s["n"] for s in summaries], "dim": dim, "ranges": ranges,
            "digests": [s.get("digest", "") for s in summaries]}


# --------------------------------------------------------------------------- select pass


def select_partition(frame, plan: dict, partition_info=None):
    """Add ``selected`` (and the score column) to one partition, following the plan."""
    spec: SelectSpec = plan["spec"]
    number = partition_info["number"] if partition_info is not None else 0
    where = f"partition {number}"
    n = len(frame)
    planned = plan["rows"][number] if number < len(plan["rows"]) else 0
    if n != planned:
        raise InputDataError(
            f"{where} has {n} rows now but had {planned} when quotas were planned: the input must give "
            "the same rows each time it is computed (persist() it, or fix the non-deterministic step "
            "before datamask_select)")
    selected = np.zeros(n, dtype=bool)
    scores = np.full(n, np.nan, dtype=np.float32) if spec.score_column else None
    cells = plan["cells"].get(number, [])
    if n and cells:
        adapters.require_columns(frame, spec.select_columns, where)
        source = adapters.embedding_source(frame[spec.embedding_column], where, plan["dim"])
        quality = quality_values(frame, spec, where)
        tokens = token_values(frame, spec, where) if spec.budget is not None else None
        codes, labels = group_codes(frame, spec, where)
        device = _resolve_device(spec.device, frame, where)
        memory = plan_memory(spec.memory_budget, n, source.dim, spec.options, spec.max_chunk_rows)
        code_of = {label: code for code, label in enumerate(labels)}
        for label, index, eligible, quota, budget in cells:
            rows = np.flatnonzero(codes == code_of[label])
            context = where if spec.by is None else f"{where}, group {label!r}"
            _select_cell(rows, eligible, quota, budget, index, quality, tokens, source, frame, spec, plan,
                         number, device, context, selected, scores, memory)
    columns = {spec.selected_column: selected}
    if spec.score_column:
        columns[spec.score_column] = scores
    return adapters.with_columns(frame, columns)


def _select_cell(rows, n_eligible, quota, budget, group_index, quality, tokens, source, frame, spec, plan,
                 number, device, context, selected, scores, memory) -> None:
    """Select inside one group of one partition: eligible rows, chunks, learner, budget."""
    order = np.argsort(-quality[rows], kind="stable")
    eligible = np.sort(rows[order[:n_eligible]])
    if scores is not None:
        scores[rows] = -np.inf
        scores[eligible] = np.nan
    if eligible.size == 0 or (quota == 0 if budget is None else budget == 0):
        return
    n_chunks = math.ceil(eligible.size / memory.max_chunk_rows)
    chunk_of_row = np.arange(eligible.size) * n_chunks // eligible.size  # contiguous, near-equal
    if budget is None:
        quotas, budgets = split_quota(quality[eligible], chunk_of_row, n_chunks, quota, spec.oversample), None
    else:
        budgets, quotas = split_budget(quality[eligible], tokens[eligible], chunk_of_row, n_chunks, budget,
                                       spec.oversample)
    for chunk_number in range(n_chunks):
        chunk = eligible[chunk_of_row == chunk_number]
        k = int(quotas[chunk_number])
        mask = np.zeros(chunk.size, dtype=bool)
        preference = quality[chunk]
        where = context if n_chunks == 1 else f"{context}, chunk {chunk_number}"
        if 0 < k < chunk.size:
            result = _learn(source, chunk, k, quality, frame, spec, plan, number, group_index, chunk_number,
                            device, where, memory.options)
            mask, preference = result.mask, result.scores.astype(np.float64)
            if scores is not None:
                scores[chunk] = result.scores
        elif k >= chunk.size:
            mask[:] = True
        if budgets is not None:
            mask = fit_budget(mask, tokens[chunk], preference, budgets[chunk_number])
        selected[chunk[mask]] = True
    if budget is not None and n_chunks > 1:
        # Chunks round their budgets down separately: spend what is left on the best rows that fit.
        selected[eligible] = fit_budget(selected[eligible], tokens[eligible], quality[eligible], budget)


def derive_seed(seed: int, partition: int, group: int, chunk: int) -> int:
    """Seed of one learner run, from (seed, partition, group, chunk) only: where it runs never matters."""
    sequence = np.random.SeedSequence([int(seed) % 2**64, partition, group, chunk])
    return int(sequence.generate_state(1, dtype=np.uint32)[0])


def _learn(source, chunk, k, quality, frame, spec, plan, number, group_index, chunk_number, device, where,
           options):
    embeddings = source.rows(chunk)  # our own copy
    if spec.validate != "full":  # "full" checked every row in the plan pass
        norms = check_vectors(embeddings, chunk, frame, spec, where)
        if isinstance(embeddings, np.ndarray):
            embeddings /= norms[:, None]  # in place: the learner finds unit rows and copies nothing
    try:
        return learn_mask(quality[chunk], embeddings, k, options, device=device,
                          quality_range=plan["ranges"][group_index],
                          seed=derive_seed(options.seed, number, group_index, chunk_number))
    except InputDataError as exc:
        raise InputDataError(f"{where}: {exc}") from exc


def _resolve_device(device: str, frame, where: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if adapters.is_cudf(frame) and torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise OptionError(f"{where}: device={device!r} but torch on this worker sees no CUDA device; use "
                          "device='auto' or 'cpu'")
    return device
