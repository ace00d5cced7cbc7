"""The Dask operator: ``datamask_select(ddf, ratio=0.1)`` adds a boolean ``selected`` column.

Backends accepted: Dask DataFrames with pandas or cuDF partitions (see :mod:`.adapters`).

The result is lazy. Its graph has two passes over the input:

1. **Plan** (small): the id, quality, group and token columns only. Each partition sends a
   quality sketch (:mod:`.quotas`); a tree reduction checks that ids are unique; the first
   non-empty partitions give the embedding dimension when the dtype does not say it. One task
   then turns the sketches into integer quotas (or token budgets) per partition and group, so
   the selected total is exact, and fixes the table-wide quality range.
2. **Select**: ``map_partitions`` with an explicit ``meta``. Each partition keeps its eligible
   rows (its best by quality, as many as the plan says), splits them into chunks of at most
   ``max_chunk_rows`` rows, and runs the learner (:func:`~datamask_dask.engine.learn_mask`) on
   each chunk with a seed derived from (seed, partition, group, chunk). Every input row and
   column comes back unchanged and in order, plus ``selected``.

Same input, partitioning and seed give the same ``selected`` on any scheduler and any number of
workers: nothing depends on where or when a task runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import dask
import numpy as np
import pandas as pd

from . import adapters
from .config import learner_options, load_config
from .engine import learn_mask
from .errors import InputDataError, OptionError
from .options import DataMaskOptions
from .quotas import fit_budget, make_sketch, plan_rows, plan_tokens, split_budget, split_quota

_PROBE_PARTITIONS = 4  # partitions read to learn the embedding dimension when the dtype does not say
_SPLIT_EVERY = 8  # fan-in of the duplicate-id tree reduction
_SHOW = 5
_DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class SelectSpec:
    """Resolved, validated settings of one ``datamask_select`` call (travels inside the plan)."""

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
    max_chunk_rows: int
    device: str
    check_ids: bool
    options: DataMaskOptions  # the learner's, with prune=0: pruning is table-wide, done here

    @property
    def plan_columns(self) -> list[str]:
        names = ([self.id_column] if self.check_ids else []) + [c for c, _ in self.quality]
        names += [self.by] if self.by else []
        names += [self.token_column] if self.budget is not None else []
        return list(dict.fromkeys(names))

    @property
    def select_columns(self) -> list[str]:
        names = [c for c, _ in self.quality] + [self.embedding_column]
        names += [self.by] if self.by else []
        names += [self.token_column] if self.budget is not None else []
        return list(dict.fromkeys(names))


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
    settings = load_config(config, ratio=ratio, **options)
    ratio_given = ratio is not None or "select_ratio" in options
    spec = make_spec(ddf, settings, ratio_given=ratio_given)
    plan = _plan_graph(ddf, spec)
    out_columns = {spec.selected_column: np.zeros(0, dtype=bool)}
    if spec.score_column:
        out_columns[spec.score_column] = np.zeros(0, dtype=np.float32)
    meta = adapters.with_columns(ddf._meta, out_columns)
    return ddf.map_partitions(select_partition, plan, meta=meta)


# --------------------------------------------------------------------------- call-time checks


def make_spec(ddf, settings: Mapping, *, ratio_given: bool = True) -> SelectSpec:
    """Validate resolved settings against ``ddf``'s schema (no data is read)."""
    import dask.dataframe as dd

    if not isinstance(ddf, dd.DataFrame):
        raise TypeError(f"datamask_select needs a dask DataFrame, got {type(ddf).__name__}; wrap a pandas "
                        "frame with dask.dataframe.from_pandas(df, npartitions=...)")
    meta = ddf._meta
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
    spec = SelectSpec(
        id_column=str(settings["id_column"]), quality=quality,
        embedding_column=str(settings["embedding_column"]),
        selected_column=str(settings["selected_column"]),
        score_column=None if settings["score_column"] is None else str(settings["score_column"]),
        by=None if by is None else str(by), ratio=ratio, budget=budget,
        token_column=str(settings["token_column"]) if budget is not None else None,
        prune=options.prune, oversample=_check_number(settings["oversample"], "oversample", 1.0),
        max_chunk_rows=int(_check_number(settings["max_chunk_rows"], "max_chunk_rows", 2, integer=True)),
        device=_check_device(settings["device"]), check_ids=bool(settings["check_ids"]),
        options=options.replace(prune=0.0))
    adapters.require_columns(meta, list(dict.fromkeys(spec.plan_columns + spec.select_columns)),
                             "the dataframe")
    adapters.check_embedding_dtype(meta[spec.embedding_column].dtype, spec.embedding_column, "the dataframe")
    for name, _ in quality:
        if not pd.api.types.is_numeric_dtype(meta[name].dtype):
            raise InputDataError(f"quality column {name!r} must be numeric, got dtype {meta[name].dtype}")
    for name in filter(None, (spec.selected_column, spec.score_column)):
        if name in meta.columns:
            raise OptionError(f"the dataframe already has a column {name!r}: pick another output name "
                              "with selected_column= / score_column= (the input is never overwritten)")
    if spec.score_column == spec.selected_column:
        raise OptionError("score_column and selected_column must differ")
    return spec


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
    if not items or any(not isinstance(w, int | float) or isinstance(w, bool) or not w > 0 for _, w in items):
        raise OptionError(f"option quality_column={value!r}: weights must be numbers > 0")
    total = float(sum(w for _, w in items))
    return tuple((str(name), float(w) / total) for name, w in items)


def _is_number(value) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool)


def _check_ratio(ratio, by):
    if isinstance(ratio, Mapping):
        if by is None:
            raise OptionError("ratio given as {group: ratio} needs by= (the group column)")
        for group, value in ratio.items():
            if not _is_number(value) or not 0 <= value <= 1:
                raise OptionError(f"ratio for group {group!r} is {value!r}: expected a share in [0, 1]")
        return {adapters._plain(k): float(v) for k, v in ratio.items()}
    if not _is_number(ratio) or not 0 < ratio <= 1:
        raise OptionError(f"ratio={ratio!r} is out of range: expected a share of rows in (0, 1], e.g. 0.1")
    return float(ratio)


def _check_budget(budget, by):
    if isinstance(budget, Mapping):
        if by is None:
            raise OptionError("budget_tokens given as {group: tokens} needs by= (the group column)")
        for group, value in budget.items():
            if not _is_number(value) or value < 0 or value != int(value):
                raise OptionError(f"budget_tokens for group {group!r} is {value!r}: expected a whole "
                                  "number of tokens >= 0")
        return {adapters._plain(k): int(v) for k, v in budget.items()}
    if by is not None:
        raise OptionError("with by=, give budget_tokens as {group: tokens} (a single budget would not say "
                          "how to share it between groups)")
    if not _is_number(budget) or budget < 1 or budget != int(budget):
        raise OptionError(f"budget_tokens={budget!r} is invalid: expected a whole number of tokens >= 1")
    return int(budget)


def _check_number(value, name: str, minimum: float, integer: bool = False):
    if not _is_number(value) or value < minimum or (integer and value != int(value)):
        kind = "an integer" if integer else "a number"
        raise OptionError(f"option {name}={value!r} is invalid: expected {kind} >= {minimum}")
    return value


def _check_device(device) -> str:
    device = str(device)
    if device not in _DEVICES and not (device.startswith("cuda:") and device[5:].isdigit()):
        raise OptionError(f"option device={device!r} is invalid: expected 'auto', 'cpu', 'cuda' or 'cuda:N'")
    return device


# --------------------------------------------------------------------------- plan pass


def _plan_graph(ddf, spec: SelectSpec):
    """The lazy plan: per-partition sketches, id check and dimension probe, reduced to one task."""
    parts = _plan_input(ddf, spec.plan_columns).to_delayed()
    summaries = [dask.delayed(summarise_partition, pure=True)(part, i, spec) for i, part in enumerate(parts)]
    ids = None
    if spec.check_ids:
        level = [dask.delayed(_partition_ids, pure=True)(part, i, spec.id_column)
                 for i, part in enumerate(parts)]
        while len(level) > 1:
            level = [dask.delayed(_merge_ids, pure=True)(level[i:i + _SPLIT_EVERY])
                     for i in range(0, len(level), _SPLIT_EVERY)]
        ids = dask.delayed(_id_report, pure=True)(level[0])
    dim = adapters.fixed_dimension(ddf._meta[spec.embedding_column].dtype)
    if dim is None:
        n_probe = min(_PROBE_PARTITIONS, ddf.npartitions)
        probes = ddf[spec.embedding_column].partitions[list(range(n_probe))].to_delayed()
        dim = dask.delayed(_probe_dimension, pure=True)(probes)
    return dask.delayed(make_plan, pure=True)(summaries, ids, dim, spec)


def _plan_input(ddf, columns: list[str]):
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


def combined_quality(frame, spec: SelectSpec, where: str) -> np.ndarray:
    """The (weighted) quality of each row; NaN or infinite values raise, naming the column."""
    total = np.zeros(len(frame), dtype=np.float64)
    for name, weight in spec.quality:
        values = adapters.numeric_values(frame, name, where)
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            raise InputDataError(f"{where}: quality column {name!r} has {bad.size} NaN or infinite value(s) "
                                 f"at rows {bad[:_SHOW].tolist()}{_ids_of(frame, spec, bad)}: fill or drop "
                                 "them before selecting")
        total += weight * values
    return total


def _token_values(frame, spec: SelectSpec, where: str) -> np.ndarray:
    values = adapters.numeric_values(frame, spec.token_column, where)
    bad = np.flatnonzero(~np.isfinite(values) | (values < 0))
    if bad.size:
        raise InputDataError(f"{where}: token column {spec.token_column!r} has {bad.size} missing or "
                             f"negative value(s) at rows {bad[:_SHOW].tolist()}{_ids_of(frame, spec, bad)}")
    return values


def _ids_of(frame, spec: SelectSpec, rows: np.ndarray) -> str:
    if spec.id_column not in frame.columns:
        return ""
    return f" (ids {adapters.host_values(frame, spec.id_column).iloc[rows[:_SHOW]].tolist()})"


def _groups(frame, spec: SelectSpec, where: str) -> tuple[np.ndarray, list]:
    if spec.by is None:
        return np.zeros(len(frame), dtype=np.int64), ([None] if len(frame) else [])
    return adapters.group_codes(frame, spec.by, where)


def summarise_partition(frame, number: int, spec: SelectSpec) -> dict:
    """One partition's contribution to the plan: row count and, per group, a quality sketch."""
    where = f"partition {number}"
    adapters.require_columns(frame, spec.plan_columns, where)
    quality = combined_quality(frame, spec, where)
    tokens = _token_values(frame, spec, where) if spec.budget is not None else None
    codes, labels = _groups(frame, spec, where)
    cells = {}
    for code, label in enumerate(labels):
        rows = codes == code
        q = quality[rows]
        cells[label] = {"sketch": make_sketch(q, None if tokens is None else tokens[rows]),
                        "min": float(q.min()), "max": float(q.max())}
    return {"n": len(frame), "cells": cells}


def _partition_ids(frame, number: int, id_column: str):
    ids = adapters.host_values(frame, id_column)
    nulls = np.flatnonzero(ids.isna().to_numpy())
    if nulls.size:
        raise InputDataError(f"partition {number}: id column {id_column!r} has {nulls.size} null value(s) at "
                             f"rows {nulls[:_SHOW].tolist()}: every row needs an id")
    first = pd.Series(number, index=pd.Index(ids.to_numpy()), dtype=np.int64)
    return _dedupe(first, 0, [])


def _dedupe(series: pd.Series, n_dup: int, examples: list):
    dup = series.index.duplicated(keep="first")
    if dup.any():
        n_dup += int(dup.sum())
        for value in series.index[dup].unique()[:max(0, _SHOW - len(examples))]:
            examples.append((adapters._plain(value), sorted({int(p) for p in series.loc[[value]]})))
        series = series[~dup]
    return series, n_dup, examples


def _merge_ids(results: list):
    series = pd.concat([r[0] for r in results])
    examples = [e for r in results for e in r[2]][:_SHOW]
    return _dedupe(series, sum(r[1] for r in results), examples)


def _id_report(result) -> tuple[int, list]:
    return result[1], result[2]


def _probe_dimension(parts: list) -> int | None:
    for number, series in enumerate(parts):
        if len(series):
            return adapters.embedding_source(series, f"partition {number}").dim
    return None


def _group_sort_key(label):
    return (type(label).__name__, label)


def make_plan(summaries: list[dict], ids, dim, spec: SelectSpec) -> dict:
    """Integer quotas (or token budgets) per partition and group, and the table-wide quality range."""
    if ids is not None and ids[0]:
        shown = ", ".join(f"{value!r} (partitions {parts})" for value, parts in ids[1])
        raise InputDataError(
            f"id column {spec.id_column!r} has {ids[0]} duplicate value(s), e.g. {shown}; ids must be "
            f"unique across the table: deduplicate first (e.g. ddf.drop_duplicates(subset=["
            f"{spec.id_column!r}])) or pass check_ids=False")
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
    return {"spec": spec, "cells": cells, "rows": [s["n"] for s in summaries], "dim": dim, "ranges": ranges}


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
        quality = combined_quality(frame, spec, where)
        tokens = _token_values(frame, spec, where) if spec.budget is not None else None
        codes, labels = _groups(frame, spec, where)
        device = _resolve_device(spec.device, frame, where)
        code_of = {label: code for code, label in enumerate(labels)}
        for label, index, eligible, quota, budget in cells:
            rows = np.flatnonzero(codes == code_of[label])
            context = where if spec.by is None else f"{where}, group {label!r}"
            _select_cell(rows, eligible, quota, budget, index, quality, tokens, source, frame, spec, plan,
                         number, device, context, selected, scores)
    columns = {spec.selected_column: selected}
    if spec.score_column:
        columns[spec.score_column] = scores
    return adapters.with_columns(frame, columns)


def _select_cell(rows, n_eligible, quota, budget, group_index, quality, tokens, source, frame, spec, plan,
                 number, device, context, selected, scores) -> None:
    """Select inside one group of one partition: eligible rows, chunks, learner, budget."""
    order = np.argsort(-quality[rows], kind="stable")
    eligible = np.sort(rows[order[:n_eligible]])
    if scores is not None:
        scores[rows] = -np.inf
        scores[eligible] = np.nan
    if eligible.size == 0 or (quota == 0 if budget is None else budget == 0):
        return
    n_chunks = math.ceil(eligible.size / spec.max_chunk_rows)
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
                            device, where)
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


def _learn(source, chunk, k, quality, frame, spec, plan, number, group_index, chunk_number, device, where):
    embeddings = source.rows(chunk)
    _check_vectors(embeddings, chunk, frame, spec, where)
    try:
        return learn_mask(quality[chunk], embeddings, k, spec.options, device=device,
                          quality_range=plan["ranges"][group_index],
                          seed=derive_seed(spec.options.seed, number, group_index, chunk_number))
    except InputDataError as exc:
        raise InputDataError(f"{where}: {exc}") from exc


def _check_vectors(embeddings, chunk, frame, spec: SelectSpec, where: str) -> None:
    """NaN, infinite or all-zero embeddings, reported with partition row numbers and ids."""
    if isinstance(embeddings, np.ndarray):
        norms = np.linalg.norm(embeddings.astype(np.float64, copy=False), axis=1)
    else:  # a torch tensor (cuDF partitions): reduce on the device, bring back n floats
        norms = embeddings.double().norm(dim=1).cpu().numpy()
    bad = np.flatnonzero(~np.isfinite(norms) | (norms == 0))
    if bad.size:
        rows = chunk[bad]
        raise InputDataError(
            f"{where}: embedding column {spec.embedding_column!r} has NaN, infinite or all-zero vectors in "
            f"{bad.size} row(s), first at rows {rows[:_SHOW].tolist()}{_ids_of(frame, spec, rows)}: re-embed "
            "or drop those rows")


def _resolve_device(device: str, frame, where: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if adapters.is_cudf(frame) and torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise OptionError(f"{where}: device={device!r} but torch on this worker sees no CUDA device; use "
                          "device='auto' or 'cpu'")
    return device
