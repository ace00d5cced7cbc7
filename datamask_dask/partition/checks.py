"""The checks of one partition's rows, before any learning, and its summary for the quota plan.

One set of checks serves every caller: the plan pass of the Dask operator and of the Spark
integration (each partition's :func:`check_partition` runs before its quality sketch is made, and
the first bad partition stops the job with an :class:`~datamask_dask.errors.InputDataError`),
and ``datamask validate`` (:func:`datamask_dask.validate_table`), which collects every problem.

What is checked
---------------
Per partition: NaN, null or infinite quality, missing or negative token counts, null group labels,
null ids, embeddings that are null, ragged, of another dimension than the rest of the table, NaN
or infinite, all-zero, or with a norm outside ``NORM_RANGE`` (float32 arithmetic loses them).
Across partitions (:mod:`datamask_dask.plan.reduce`): duplicate ids and mixed embedding
dimensions. Each problem names the column, the partition, the first rows (positions inside the
partition, and their ids) and what to do. Options and schema: :mod:`.spec`.

Embeddings are checked in blocks of rows, so validating a partition needs about
``block_bytes`` of memory beyond the partition itself.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..dedup import simhash
from ..dedup.groups import DuplicateGroups
from ..errors import InputDataError, Problem, problems_error
from ..plan import context, regions
from ..plan.quotas import make_sketch
from ..plan.types import CellSummary, PartitionSummary
from ..telemetry import Measures
from . import adapters
from .adapters import SHOW
from .spec import SelectSpec

NORM_RANGE = (1e-12, 1e12)  # usable embedding norms: float32 squares stay normal numbers inside it
_BLOCK_BYTES = 64 * 2**20  # embedding bytes checked at once (less when the memory budget is smaller)


@dataclass
class PartitionCheck:
    """What :func:`check_partition` found in one partition.

    ``quality``, ``tokens``, ``codes`` and ``labels`` are the partition's combined quality, token
    counts and group codes, kept for the caller (the plan pass) so nothing is read twice; they are
    None when a problem prevented computing them.
    """

    rows: int
    problems: list
    dim: int | None = None
    quality: np.ndarray | None = None
    tokens: np.ndarray | None = None
    codes: np.ndarray | None = None
    labels: list | None = None
    digest: str = ""
    signatures: np.ndarray | None = None  # SimHash of each row (diversity_scope="table"), uint8 (n, 32)

    def raise_if_failed(self) -> None:
        """Raise :class:`InputDataError` listing this partition's problems, if any."""
        if self.problems:
            raise problems_error(self.problems)


def check_partition(frame, number: int, spec: SelectSpec, *, embeddings: bool | None = None,
                    expected_dim: int | None = None, measures: Measures | None = None) -> PartitionCheck:
    """Run every per-partition check on ``frame`` (partition ``number``); never raises for bad data.

    ``embeddings``: also check the embedding column (default: with ``validate="full"`` or table
    scope); ``expected_dim``: the embedding dimension the rest of the table has; ``measures``: where
    the signatures' seconds go.
    """
    where = f"partition {number}"
    if embeddings is None:  # table scope reads the embeddings in the plan pass anyway: check them there
        embeddings = spec.validate == "full" or spec.diversity_scope == "table"
    sign = embeddings and spec.diversity_scope == "table"
    columns = spec.plan_columns + ([spec.embedding_column] if embeddings else [])
    check = PartitionCheck(rows=len(frame), problems=[])
    missing = adapters.missing_columns(frame, columns, where)
    if missing:
        check.problems = [Problem(message, name, number) for name, message in missing]
        return check
    problems = check.problems
    check.quality = _collect(problems, quality_values, frame, spec, where, number)
    if spec.budget is not None:
        check.tokens = _collect(problems, token_values, frame, spec, where, number)
    if spec.by is not None:
        groups = _collect(problems, group_codes, frame, spec, where, number)
        if groups is not None:
            check.codes, check.labels = groups
    if spec.check_ids:
        problems.extend(id_problems(frame, number, spec.id_column))
    vectors = None
    if embeddings:
        check.dim, found, vectors, check.signatures = embedding_problems(frame, number, spec, expected_dim,
                                                                         sign=sign, measures=measures)
        problems.extend(found)
    if not problems:
        check.digest = _digest(frame, spec, check, vectors)
    return check


def _collect(problems: list, function, frame, spec, where: str, number: int):
    try:
        return function(frame, spec, where)
    except InputDataError as exc:
        problems.append(Problem(str(exc), getattr(exc, "column", None), number, getattr(exc, "rows", ())))
        return None


def _error(message: str, column: str, rows=()) -> InputDataError:
    error = InputDataError(message)
    error.column, error.rows = column, tuple(int(r) for r in rows[:SHOW])
    return error


def ids_of(frame, spec: SelectSpec, rows: np.ndarray) -> str:
    """`` (ids [...])`` for the first rows, when the frame has the id column."""
    if spec.id_column not in frame.columns or not len(rows):
        return ""
    return f" (ids {adapters.host_values(frame, spec.id_column).iloc[rows[:SHOW]].tolist()})"


def _all_null(series) -> bool:
    """Every value null, not NaN: as a column that a file of the table lacks is read (Arrow types tell
    the two apart; numpy's floats do not)."""
    return not isinstance(series.dtype, np.dtype) and bool(series.isna().all())


def quality_values(frame, spec: SelectSpec, where: str) -> np.ndarray:
    """The (weighted) quality of each row, float64; NaN, infinite or overflowing values raise."""
    total = np.zeros(len(frame), dtype=np.float64)
    for name, weight in spec.quality:
        values = adapters.numeric_values(frame, name, where)
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            lacking = bad.size == len(frame) and _all_null(adapters.host_values(frame, name))
            whole = " (every row null: does a file of the table lack the column?)" if lacking else ""
            raise _error(f"{where}: quality column {name!r} has {bad.size} NaN, null or infinite "
                         f"value(s){whole} at rows {bad[:SHOW].tolist()}{ids_of(frame, spec, bad)}: fill or "
                         "drop them before selecting", name, bad)
        total += weight * values
    # The learner works in float32: larger magnitudes would become infinite there.
    bad = np.flatnonzero(~(np.abs(total) <= np.finfo(np.float32).max))
    if bad.size:
        names = [c for c, _ in spec.quality]
        raise _error(f"{where}: quality {names} is too large for float32 in {bad.size} row(s) at rows "
                     f"{bad[:SHOW].tolist()}{ids_of(frame, spec, bad)}: rescale the scores (e.g. to [0, 1])",
                     names[0], bad)
    return total


def token_values(frame, spec: SelectSpec, where: str) -> np.ndarray:
    """Token counts as float64; missing, infinite or negative counts raise."""
    name = spec.token_column
    if name is None:  # make_spec names it with every token budget
        raise RuntimeError(f"{where}: token counts read without a token budget; please report this")
    values = adapters.numeric_values(frame, name, where)
    bad = np.flatnonzero(~np.isfinite(values) | (values < 0))
    if bad.size:
        raise _error(f"{where}: token column {name!r} has {bad.size} missing, infinite or "
                     f"negative value(s) at rows {bad[:SHOW].tolist()}{ids_of(frame, spec, bad)}: fill them "
                     "with the documents' token counts or drop those rows", name, bad)
    return values


def group_codes(frame, spec: SelectSpec, where: str) -> tuple[np.ndarray, list]:
    """Integer group code of each row and the labels (a single group without ``by``)."""
    if spec.by is None:
        return np.zeros(len(frame), dtype=np.int64), ([None] if len(frame) else [])
    try:
        return adapters.group_codes(frame, spec.by, where)
    except InputDataError as exc:
        raise _error(str(exc), spec.by) from exc


def id_problems(frame, number: int, id_column: str) -> list[Problem]:
    """Null ids in one partition (duplicates are found across partitions by :func:`id_graph`)."""
    ids = adapters.host_values(frame, id_column)
    nulls = np.flatnonzero(ids.isna().to_numpy())
    if not nulls.size:
        return []
    return [Problem(f"partition {number}: id column {id_column!r} has {nulls.size} null value(s) at rows "
                    f"{nulls[:SHOW].tolist()}: every row needs an id", id_column, number,
                    tuple(nulls[:SHOW].tolist()))]


def embedding_problems(frame, number: int, spec: SelectSpec, expected_dim: int | None = None,
                       block_bytes: int | None = None, sign: bool = False, measures: Measures | None = None):
    """Structure and values of one partition's embeddings.

    Returns
    -------
    dim : int or None
        The partition's embedding dimension (None when it has no rows or a structural problem).
    problems : list of Problem
    summary : float64 array (n, 2) or None
        Each row's norm and projection on a fixed random direction (a cheap content summary).
    signatures : uint8 array (n, 32) or None
        With ``sign``, each row's SimHash (:func:`datamask_dask.dedup.simhash.signatures`),
        computed from the same blocks (the embeddings are read once).
    """
    where = f"partition {number}"
    name = spec.embedding_column
    series = frame[name]
    try:
        source = adapters.embedding_source(series, where, expected_dim)
    except InputDataError as exc:
        return None, [Problem(str(exc), name, number)], None, None
    n = len(series)
    if n == 0:
        return None, [], None, (np.zeros((0, simhash.SIGNATURE_BYTES), dtype=np.uint8) if sign else None)
    measures = Measures() if measures is None else measures
    memory = spec.memory_budget or spec.memory_limit or _BLOCK_BYTES
    block_bytes = block_bytes or min(_BLOCK_BYTES, memory // 4)
    # A block: its float32 rows (a copy where Arrow chunks or dtypes need one; counted twice for
    # headroom) and their projections.
    step = max(1, block_bytes // (8 * source.dim + 4 * simhash.SIGNATURE_BITS))
    # The content summary (the run's fingerprint, which a resume compares) is a projection on a
    # fixed direction by einsum: its bits do not depend on BLAS threads or block sizes, which
    # differ between the run and its resume (a float32 matrix product's rounding does).
    direction = np.random.default_rng(0).standard_normal(source.dim).astype(np.float32)
    planes = simhash.hyperplanes(source.dim) if sign else None
    summary = np.empty((n, 2), dtype=np.float64)
    signed = np.empty((n, simhash.SIGNATURE_BYTES), dtype=np.uint8) if sign else None
    for start in range(0, n, step):
        stop = min(n, start + step)
        block = source.span(start, stop)
        summary[start:stop, 0] = row_norms(block)
        summary[start:stop, 1] = _projection(block, direction)
        if signed is not None:  # with sign
            with measures.timed("sign"):
                signed[start:stop] = simhash.signatures(block, planes)
    problems = vector_problems(summary[:, 0], np.arange(n), frame, spec, where, number)
    return source.dim, problems, summary, signed


def _projection(block, direction: np.ndarray) -> np.ndarray:
    """Each row's projection on ``direction``, float32 on the block's device, as a host array."""
    if isinstance(block, np.ndarray):
        return np.einsum("ij,j->i", block, direction)
    import torch

    return (block.float() @ torch.as_tensor(direction, device=block.device)).cpu().numpy()


def row_norms(block) -> np.ndarray:
    """Each row's L2 norm as float64 (host), from a float32 block (numpy array or torch tensor).

    Computed in float32 (no (n, d) float64 copy); rows whose float32 norm is not finite or outside
    ``NORM_RANGE`` (where float32 may have overflowed or underflowed) are recomputed in float64,
    so the checks classify them exactly.
    """
    if isinstance(block, np.ndarray):
        norms = np.sqrt(np.einsum("ij,ij->i", block, block)).astype(np.float64)
    else:
        norms = block.float().norm(dim=1).cpu().numpy().astype(np.float64)
    low, high = NORM_RANGE
    suspect = np.flatnonzero(~((norms >= low) & (norms <= high)))
    if suspect.size:
        norms[suspect] = _exact_norms(block[suspect])
    return norms


def _exact_norms(block) -> np.ndarray:
    """Float64 norms of a few rows (numpy array or torch tensor)."""
    if isinstance(block, np.ndarray):
        wide = block.astype(np.float64)
        return np.sqrt(np.einsum("ij,ij->i", wide, wide))
    return block.double().norm(dim=1).cpu().numpy()


def vector_problems(norms: np.ndarray, positions: np.ndarray, frame, spec: SelectSpec, where: str,
                    number: int | None = None) -> list[Problem]:
    """NaN or infinite, all-zero and out-of-range embeddings, from the rows' float64 norms."""
    name = spec.embedding_column
    low, high = NORM_RANGE
    finite = np.isfinite(norms)
    kinds = (
        (~finite, "NaN or infinite values", "re-embed or drop those rows"),
        (finite & (norms == 0), "all-zero vectors",
         "a zero vector has no direction; re-embed or drop those rows"),
        (finite & (norms != 0) & ((norms < low) | (norms > high)), f"vectors with a norm outside [{low:g}, "
         f"{high:g}]", "float32 arithmetic cannot normalise them; rescale them (e.g. L2-normalise)"),
    )
    problems = []
    for bad, what, todo in kinds:
        rows = positions[np.flatnonzero(bad)]
        if rows.size:
            problems.append(Problem(
                f"{where}: embedding column {name!r} has {what} in {rows.size} row(s), first at rows "
                f"{rows[:SHOW].tolist()}{ids_of(frame, spec, rows)}: {todo}", name, number,
                tuple(rows[:SHOW].tolist())))
    return problems


def check_vectors(embeddings, positions: np.ndarray, frame, spec: SelectSpec, where: str) -> np.ndarray:
    """Raise on NaN, infinite, all-zero or out-of-range rows of a chunk about to be learned.

    ``embeddings``: float32 numpy array, or torch tensor (GPU partitions). Returns the rows'
    norms (float32, host), so the caller can normalise without another pass.
    """
    norms = row_norms(embeddings)
    problems = vector_problems(norms, positions, frame, spec, where)
    if problems:
        raise problems_error(problems)
    return norms.astype(np.float32)


def _digest(frame, spec: SelectSpec, check: PartitionCheck, vectors: np.ndarray | None) -> str:
    """Fingerprint of what the checks saw: ids, quality, tokens, groups and embedding summaries."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(np.int64(check.rows).tobytes())
    if spec.check_ids:
        ids = adapters.host_values(frame, spec.id_column)
        digest.update(pd.util.hash_pandas_object(ids, index=False).to_numpy().tobytes())
    for values in (check.quality, check.tokens, check.codes, vectors):
        if values is not None:
            digest.update(np.ascontiguousarray(values).tobytes())
    if check.labels is not None:
        digest.update(repr(check.labels).encode())
    return digest.hexdigest()


def summarise_partition(frame, number: int, spec: SelectSpec) -> PartitionSummary:
    """One partition's contribution to the plan, after its checks: rows, dimension, sketches."""
    return summarise_scan(scan_partition(frame, number, spec))


@dataclass(frozen=True)
class Scan:
    """Round 1 of the plan pass on one partition: its checks, kept on the worker for its summary."""

    check: PartitionCheck  # quality, codes, signatures...
    stages: dict  # seconds of the read and the checks
    ids: np.ndarray | None = None  # explain: the ids, to name the rows near-duplicates stand behind
    sample: np.ndarray | None = None  # pieces="regions": evenly spaced unit rows, for the centroids
    moments: np.ndarray | None = None  # pieces="context": sums of the unit rows and their squares


def scan_partition(frame, number: int, spec: SelectSpec, partitions: int = 1) -> Scan:
    """Round 1 of the plan pass: one partition's checks (raising on bad data), kept for its summary.

    With ``diversity_scope="table"`` the check also holds each row's SimHash signature, which
    :func:`duplicate_input` sends to :func:`datamask_dask.dedup.search.find_groups`. With
    ``pieces="regions"`` it keeps evenly spaced unit rows for the regions' centroids, its share of the
    table's sample (``partitions``: the table's partition count); with ``pieces="context"``, the sums
    of its unit rows and of their squares (:func:`datamask_dask.plan.context.row_moments`).
    """
    measures = Measures()
    measures.took(frame)
    with measures.timed("check"):
        check = check_partition(frame, number, spec, measures=measures)
        check.raise_if_failed()
    if check.rows and check.dim:  # the select pass's memory check, made where the job can still stop early
        dim, where = check.dim, f"partition {number}"
        spec.memory_plan(check.rows, dim, where, adapters.learner_device(spec.device, frame, where))
    moments = None
    if spec.pieces == "context" and check.rows and check.dim:
        with measures.timed("moments"):
            source = adapters.embedding_source(frame[spec.embedding_column], f"partition {number}")
            moments = context.row_moments(
                adapters.host_rows(source.rows(np.arange(start, min(check.rows, start + context.BLOCK))))
                for start in range(0, check.rows, context.BLOCK))
    stages = {f"plan {stage}": s for stage, s in measures.stages.items()}
    named = spec.explain and spec.diversity_scope == "table"  # to name the rows near-duplicates stand behind
    sample = region_sample(frame, number, spec, partitions, check.dim) if spec.pieces == "regions" else None
    return Scan(check, stages, adapters.host_values(frame, spec.id_column).to_numpy() if named else None,
                sample, moments)


def region_sample(frame, number: int, spec: SelectSpec, partitions: int, dim: int | None) -> np.ndarray:
    """Evenly spaced rows of the partition's embeddings (:func:`~datamask_dask.plan.regions.sample_count`),
    as unit float32 rows on the host."""
    if not dim:
        return np.zeros((0, 0), dtype=np.float32)
    positions = regions.sample_positions(len(frame), regions.sample_count(partitions, dim))
    rows = adapters.embedding_source(frame[spec.embedding_column], f"partition {number}").rows(positions)
    rows = np.asarray(adapters.host_rows(rows), dtype=np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def duplicate_input(scan: Scan) -> dict:
    """What the near-duplicate search needs of one scanned partition (about 44 bytes a row): never
    the embeddings, which its exact check reads again for the candidate rows alone."""
    check = scan.check
    codes, labels = _codes(check)
    return {"quality": check.quality, "codes": codes, "labels": labels, "signatures": check.signatures}


def summarise_scan(scan: Scan, groups: DuplicateGroups | None = None) -> PartitionSummary:
    """Round 2: the partition's plan summary, its shadowed rows left out of the sketches.

    ``groups``: the partition's entry of :func:`datamask_dask.dedup.search.find_groups` (its
    shadowed rows, and its kept rows with the group sizes they stand for).
    """
    if groups is None:
        return dataclasses.replace(summarise_check(scan.check), stages=scan.stages, sample=scan.sample,
                                   moments=scan.moments)
    summary = summarise_check(scan.check, groups.shadowed, groups.kept, groups.weights)
    links = duplicate_links(scan, groups) if scan.ids is not None else None
    return dataclasses.replace(summary, stages=scan.stages, links=links, sample=scan.sample,
                               moments=scan.moments)


def duplicate_links(scan: Scan, groups: DuplicateGroups) -> dict:
    """What ``explain`` needs of a partition's near-duplicate groups (``make_plan`` joins them):
    its shadowed rows with their parents' references and their signatures, and the id and
    signature of each of its rows that is a parent. Only rows in groups, never the embeddings."""
    signatures, ids = scan.check.signatures, scan.ids
    if signatures is None or ids is None:  # a scan in table scope signs its rows; with explain it keeps ids
        raise RuntimeError("explain: a partition's signatures or ids are missing; please report this with "
                           "the run record")
    parents = np.asarray(groups.parents, dtype=np.int64)
    return {"shadowed": np.asarray(groups.shadowed, dtype=np.int64),
            "parent": np.asarray(groups.parent, dtype=np.int64),
            "signatures": signatures[groups.shadowed],
            "parents": parents, "parent_ids": ids[parents],
            "parent_signatures": signatures[parents]}


def _codes(check) -> tuple[np.ndarray, list]:
    if check.codes is None:  # no group column: one group
        return np.zeros(check.rows, dtype=np.int64), ([None] if check.rows else [])
    return check.codes, check.labels


def summarise_check(check, shadowed: np.ndarray | None = None, kept: np.ndarray | None = None,
                    weights: np.ndarray | None = None) -> PartitionSummary:
    """The plan summary of a partition that passed :func:`~datamask_dask.partition.checks.check_partition`.

    ``shadowed``: positions of the partition's rows that are near-duplicates of a better row (see
    :mod:`datamask_dask.dedup.simhash`). Each cell then has two sketches: ``sketch`` without
    them (what the quotas are planned on) and ``sketch_all`` with them (the fallback when a group
    has too few rows left for its quota), ``n`` its rows in all and ``shadowed`` their positions.
    ``kept`` and ``weights``: positions of the rows kept for a group of near-copies and the rows
    each stands for; a cell holds its own as ``kept`` and ``weights``.
    """
    codes, labels = _codes(check)
    hidden = np.zeros(check.rows, dtype=bool)
    if shadowed is not None:
        hidden[shadowed] = True
    weight = np.ones(check.rows, dtype=np.int64)
    if kept is not None:
        weight[kept] = weights
    cells = {}
    for code, label in enumerate(labels):
        rows = codes == code
        q = check.quality[rows]
        tokens = None if check.tokens is None else check.tokens[rows]
        sketch = make_sketch(q, tokens)
        cell = CellSummary(sketch=sketch, min=float(q.min()), max=float(q.max()), n=int(rows.sum()))
        if hidden[rows].any():
            remain = ~hidden[rows]
            stand_for = np.flatnonzero(rows & (weight > 1)).astype(np.int64)
            cell = dataclasses.replace(
                cell, sketch=make_sketch(q[remain], None if tokens is None else tokens[remain]),
                sketch_all=sketch, shadowed=np.flatnonzero(rows & hidden).astype(np.int64), kept=stand_for,
                weights=weight[stand_for])
        cells[label] = cell
    return PartitionSummary(n=check.rows, cells=cells, dim=check.dim, digest=check.digest)


# --------------------------------------------------------------------------- ids across partitions


def partition_ids(frame, number: int, id_column: str):
    """A partition's distinct non-null ids, for the duplicate-id tree reduction."""
    ids = adapters.host_values(frame, id_column)
    ids = ids[~ids.isna().to_numpy()]
    first = pd.Series(number, index=pd.Index(ids.to_numpy()), dtype=np.int64)
    return _dedupe(first, 0, {})


def _dedupe(series: pd.Series, n_dup: int, examples: dict):
    """Drop repeated ids, counting them; ``examples`` maps a few duplicate ids to the partitions seen
    holding them (an id repeated at several levels of the tree is one example)."""
    dup = series.index.duplicated(keep="first")
    if dup.any():
        n_dup += int(dup.sum())
        for value in series.index[dup].unique():
            key = adapters.plain(value)
            if key in examples or len(examples) < SHOW:
                examples[key] = examples.get(key, set()) | {int(p) for p in series.loc[[value]]}
        series = series[~dup]
    return series, n_dup, examples


def merge_ids(results: list):
    """Merge partial results of the duplicate-id reduction."""
    series = pd.concat([r[0] for r in results])
    examples: dict = {}
    for _, _, theirs in results:
        for key, parts in theirs.items():
            if key in examples or len(examples) < SHOW:
                examples[key] = examples.get(key, set()) | parts
    return _dedupe(series, sum(r[1] for r in results), examples)


def id_report(result) -> tuple[int, list]:
    """Number of duplicate ids and a few examples ``(id, [partitions])``."""
    return result[1], [(value, sorted(parts)) for value, parts in result[2].items()]
