"""Validation of a selection job: options, schema and every partition's rows, before any learning.

One set of checks serves two callers:

- the operator's plan pass (:func:`datamask_dask.datamask_select`), where each partition's
  :func:`check_partition` runs before its quality sketch is made and the first bad partition
  stops the job with an :class:`~datamask_dask.errors.InputDataError`;
- :func:`validate_table` (``datamask validate``), which runs the same checks on every partition
  and collects every problem instead of stopping at the first.

What is checked
---------------
Options (ranges, types, names), the schema (columns present, numeric quality and token columns,
an embedding column of numeric lists), and per partition: NaN or infinite quality, missing or
negative token counts, null group labels, null ids, embeddings that are null, ragged, of another
dimension than the rest of the table, NaN or infinite, all-zero, or with a norm outside
``NORM_RANGE`` (float32 arithmetic loses them), and across partitions duplicate ids and mixed
embedding dimensions. Each problem names the column, the partition, the first rows (positions
inside the partition, and their ids) and what to do.

Embeddings are checked in blocks of rows, so validating a partition needs about
``block_bytes`` of memory beyond the partition itself.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

import dask
import numpy as np
import pandas as pd
import pyarrow as pa

from . import adapters
from .config import learner_options, load_config
from .errors import DataMaskError, InputDataError, OptionError
from .memory import resolve_budget
from .options import DataMaskOptions

SHOW = 5  # rows or values quoted in a message
NORM_RANGE = (1e-12, 1e12)  # usable embedding norms: float32 squares stay normal numbers inside it
VALIDATE_MODES = ("full", "light")
DEVICES = ("auto", "cpu", "cuda")
_SPLIT_EVERY = 8  # fan-in of the duplicate-id tree reduction
_BLOCK_BYTES = 64 * 2**20  # embedding bytes checked at once (less when the memory budget is smaller)


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the input or the options.

    Attributes
    ----------
    message : str
        One line saying what is wrong, where (column, partition, first rows) and what to do.
    column : str, optional
    partition : int, optional
    rows : tuple of int
        First few row positions inside the partition (empty when not row-specific).
    """

    message: str
    column: str | None = None
    partition: int | None = None
    rows: tuple = ()

    def __str__(self) -> str:
        return self.message


@dataclass
class ValidationReport:
    """Outcome of :func:`validate_table`.

    Attributes
    ----------
    rows : int
        Rows checked (0 when the checks could not start).
    partitions : int
    dim : int or None
        Embedding dimension (None when no row has one).
    columns : dict
        Column name -> dtype, as the dataframe declares them.
    problems : list of Problem
    """

    rows: int = 0
    partitions: int = 0
    dim: int | None = None
    columns: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether no problem was found."""
        return not self.problems

    def summary(self) -> str:
        """A short, human-readable outcome: the OK line or the numbered problems."""
        if self.ok:
            dim = "no embeddings" if self.dim is None else f"{self.dim}-d embeddings"
            return (f"OK: {self.rows} rows in {self.partitions} partition(s), {dim}, "
                    f"{len(self.columns)} columns")
        lines = [f"{len(self.problems)} problem(s) found:"]
        lines += [f"  {i}. {p.message}" for i, p in enumerate(self.problems, 1)]
        return "\n".join(lines)

    def raise_if_failed(self) -> None:
        """Raise :class:`InputDataError` (or :class:`OptionError`) listing the problems, if any."""
        if self.problems:
            raise problems_error(self.problems)


def problems_error(problems: list[Problem], kind: type[DataMaskError] = InputDataError) -> DataMaskError:
    """One exception for a list of problems: the first on the first line, the others after it."""
    error = kind("\n".join(p.message for p in problems))
    error.problems = list(problems)
    return error


# --------------------------------------------------------------------------- options and schema


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
    max_chunk_rows: int
    device: str
    check_ids: bool
    options: DataMaskOptions  # the learner's, with prune=0: pruning is table-wide, done by the plan
    validate: str = "full"  # "full": the plan pass also reads and checks every embedding
    memory_budget: int | None = None  # bytes of working memory per task (None: no bound)

    @property
    def plan_columns(self) -> list[str]:
        """Columns the plan pass reads."""
        names = ([self.id_column] if self.check_ids else []) + [c for c, _ in self.quality]
        names += [self.by] if self.by else []
        names += [self.token_column] if self.budget is not None else []
        names += [self.embedding_column] if self.validate == "full" else []
        return list(dict.fromkeys(names))

    @property
    def select_columns(self) -> list[str]:
        """Columns the select pass reads."""
        names = [c for c, _ in self.quality] + [self.embedding_column]
        names += [self.by] if self.by else []
        names += [self.token_column] if self.budget is not None else []
        return list(dict.fromkeys(names))


def make_spec(ddf, settings: Mapping, *, ratio_given: bool = True, scheduler=None) -> SelectSpec:
    """Validate resolved settings against ``ddf``'s schema (no data is read).

    Raises
    ------
    TypeError
        If ``ddf`` is not a Dask DataFrame.
    OptionError, InputDataError
        For the first bad option, or the columns the schema lacks or types wrongly.
    """
    import dask.dataframe as dd

    if not isinstance(ddf, dd.DataFrame):
        raise TypeError(f"datamask_select needs a dask DataFrame, got {type(ddf).__name__}; wrap a pandas "
                        "frame with dask.dataframe.from_pandas(df, npartitions=...)")
    spec = _spec_from_settings(settings, ratio_given, ddf._meta, scheduler)
    for name in filter(None, (spec.selected_column, spec.score_column)):
        if name in ddf._meta.columns:
            raise OptionError(f"the dataframe already has a column {name!r}: pick another output name "
                              "with selected_column= / score_column= (the input is never overwritten)")
    if spec.score_column == spec.selected_column:
        raise OptionError("score_column and selected_column must differ")
    problems = schema_problems(ddf._meta, spec)
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
    return SelectSpec(
        id_column=str(settings["id_column"]), quality=quality,
        embedding_column=str(settings["embedding_column"]),
        selected_column=str(settings["selected_column"]),
        score_column=None if settings["score_column"] is None else str(settings["score_column"]),
        by=None if by is None else str(by), ratio=ratio, budget=budget,
        token_column=str(settings["token_column"]) if budget is not None else None,
        prune=options.prune, oversample=_check_number(settings["oversample"], "oversample", 1.0),
        max_chunk_rows=int(_check_number(settings["max_chunk_rows"], "max_chunk_rows", 2, integer=True)),
        device=device, check_ids=bool(settings["check_ids"]),
        options=options.replace(prune=0.0), validate=validate,
        memory_budget=resolve_budget(settings.get("memory_budget"), device=device, meta=meta,
                                     scheduler=scheduler))


def schema_problems(meta, spec: SelectSpec) -> list[Problem]:
    """What the dataframe's declared schema (``meta``) lacks or types wrongly for ``spec``."""
    problems: list[Problem] = []
    available = [str(c) for c in meta.columns]
    for name in dict.fromkeys(spec.plan_columns + spec.select_columns + ([spec.id_column] if spec.check_ids
                                                                         else [])):
        if name not in meta.columns:
            problems.append(Problem(
                f"the dataframe: there is no column {name!r}; available columns are {available}. Name "
                "yours with id_column=, quality_column=, embedding_column=, token_column= or by=", name))
    if problems:
        return problems
    try:
        check_embedding_type(meta[spec.embedding_column].dtype, spec.embedding_column, "the dataframe")
    except InputDataError as exc:
        problems.append(Problem(str(exc), spec.embedding_column))
    numeric = [(name, "quality") for name, _ in spec.quality]
    numeric += [(spec.token_column, "token")] if spec.budget is not None else []
    for name, kind in numeric:
        dtype = meta[name].dtype
        if not pd.api.types.is_numeric_dtype(dtype):
            problems.append(Problem(f"{kind} column {name!r} must be numeric, got dtype {dtype}: cast it "
                                    "(e.g. ddf[col].astype('float64')) or pick another column", name))
    return problems


def check_embedding_type(dtype, name, where: str) -> None:
    """Reject embedding dtypes that cannot hold numeric vectors (text, lists of text...)."""
    adapters.check_embedding_dtype(dtype, name, where)
    pa_type = getattr(dtype, "pyarrow_dtype", None)
    if pa_type is None:
        if not (pd.api.types.is_object_dtype(dtype) or adapters.is_cudf(dtype)):
            raise InputDataError(f"{where}: embedding column {name!r} has dtype {dtype}; expected a list "
                                 "or fixed-size list of floats (Arrow), or an object column of 1-d arrays")
        return
    if not adapters._is_list_type(pa_type):
        raise InputDataError(f"{where}: embedding column {name!r} has Arrow type {pa_type}; expected a list "
                             "or fixed-size list of floats")
    value = pa_type.value_type
    if not (pa.types.is_floating(value) or pa.types.is_integer(value) or pa.types.is_decimal(value)):
        raise InputDataError(f"{where}: embedding column {name!r} holds lists of {value}, not numbers: "
                             "store the vectors as lists of float32")


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
    if not items or any(not _is_number(w) or not (w > 0 and np.isfinite(w)) for _, w in items):
        raise OptionError(f"option quality_column={value!r}: weights must be finite numbers > 0")
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
            if not _is_number(value) or not np.isfinite(value) or value < 0 or value != int(value):
                raise OptionError(f"budget_tokens for group {group!r} is {value!r}: expected a whole "
                                  "number of tokens >= 0")
        return {adapters._plain(k): int(v) for k, v in budget.items()}
    if by is not None:
        raise OptionError("with by=, give budget_tokens as {group: tokens} (a single budget would not say "
                          "how to share it between groups)")
    if not _is_number(budget) or not np.isfinite(budget) or budget < 1 or budget != int(budget):
        raise OptionError(f"budget_tokens={budget!r} is invalid: expected a whole number of tokens >= 1")
    return int(budget)


def _check_number(value, name: str, minimum: float, integer: bool = False):
    if (not _is_number(value) or not np.isfinite(value) or value < minimum
            or (integer and value != int(value))):
        kind = "an integer" if integer else "a number"
        raise OptionError(f"option {name}={value!r} is invalid: expected {kind} >= {minimum}")
    return value


def _check_device(device) -> str:
    device = str(device)
    if device not in DEVICES and not (device.startswith("cuda:") and device[5:].isdigit()):
        raise OptionError(f"option device={device!r} is invalid: expected 'auto', 'cpu', 'cuda' or 'cuda:N'")
    return device


# --------------------------------------------------------------------------- one partition


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

    def raise_if_failed(self) -> None:
        """Raise :class:`InputDataError` listing this partition's problems, if any."""
        if self.problems:
            raise problems_error(self.problems)


def check_partition(frame, number: int, spec: SelectSpec, *, embeddings: bool | None = None,
                    expected_dim: int | None = None) -> PartitionCheck:
    """Run every per-partition check on ``frame`` (partition ``number``); never raises for bad data.

    Parameters
    ----------
    frame : pandas or cuDF DataFrame
    number : int
        The partition's number, used in messages.
    spec : SelectSpec
    embeddings : bool, optional
        Also check the embedding column (default: when ``spec.validate == "full"``).
    expected_dim : int, optional
        Embedding dimension the rest of the table has.

    Returns
    -------
    PartitionCheck
    """
    where = f"partition {number}"
    embeddings = spec.validate == "full" if embeddings is None else embeddings
    columns = spec.plan_columns + ([spec.embedding_column] if embeddings else [])
    check = PartitionCheck(rows=len(frame), problems=[])
    available = [str(c) for c in frame.columns]
    missing = [c for c in dict.fromkeys(columns) if c not in frame.columns]
    if missing:
        check.problems = [Problem(
            f"{where}: there is no column {name!r}; available columns are {available}. Name yours with "
            "id_column=, quality_column=, embedding_column=, token_column= or by=", name, number)
            for name in missing]
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
        check.dim, found, vectors = embedding_problems(frame, number, spec, expected_dim)
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


def quality_values(frame, spec: SelectSpec, where: str) -> np.ndarray:
    """The (weighted) quality of each row, float64; NaN, infinite or overflowing values raise."""
    total = np.zeros(len(frame), dtype=np.float64)
    for name, weight in spec.quality:
        values = adapters.numeric_values(frame, name, where)
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            raise _error(f"{where}: quality column {name!r} has {bad.size} NaN or infinite value(s) at rows "
                         f"{bad[:SHOW].tolist()}{ids_of(frame, spec, bad)}: fill or drop them before "
                         "selecting", name, bad)
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
    values = adapters.numeric_values(frame, spec.token_column, where)
    bad = np.flatnonzero(~np.isfinite(values) | (values < 0))
    if bad.size:
        raise _error(f"{where}: token column {spec.token_column!r} has {bad.size} missing, infinite or "
                     f"negative value(s) at rows {bad[:SHOW].tolist()}{ids_of(frame, spec, bad)}: fill them "
                     "with the documents' token counts or drop those rows", spec.token_column, bad)
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
                       block_bytes: int | None = None) -> tuple[int | None, list[Problem], np.ndarray | None]:
    """Structure and values of one partition's embeddings.

    Returns
    -------
    dim : int or None
        The partition's embedding dimension (None when it has no rows or a structural problem).
    problems : list of Problem
    summary : float64 array (n, 2) or None
        Each row's norm and projection on a fixed random direction (a cheap content summary).
    """
    where = f"partition {number}"
    name = spec.embedding_column
    series = frame[name]
    try:
        check_embedding_type(series.dtype, name, where)
        source = adapters.embedding_source(series, where, expected_dim)
    except InputDataError as exc:
        return None, [Problem(str(exc), name, number)], None
    n = len(series)
    if n == 0:
        return None, [], None
    block_bytes = block_bytes or min(_BLOCK_BYTES, (spec.memory_budget or _BLOCK_BYTES) // 4)
    # A block lives as gathered float32 rows, their writable copy and a float64 copy: 5 x 4 bytes.
    step = max(1, block_bytes // (20 * source.dim))
    direction = np.random.default_rng(0).standard_normal(source.dim)
    summary = np.empty((n, 2), dtype=np.float64)
    for start in range(0, n, step):
        positions = np.arange(start, min(n, start + step))
        summary[positions] = _vector_summary(source.rows(positions), direction)
    return source.dim, vector_problems(summary[:, 0], np.arange(n), frame, spec, where, number), summary


def _vector_summary(block, direction: np.ndarray) -> np.ndarray:
    """Norm (float64) and projection of each row of a block (numpy array or torch tensor)."""
    if isinstance(block, np.ndarray):
        wide = block.astype(np.float64)
        return np.stack([np.sqrt(np.einsum("ij,ij->i", wide, wide)), wide @ direction], axis=1)
    import torch

    wide = block.double()
    along = torch.as_tensor(direction, dtype=torch.float64, device=wide.device)
    return torch.stack([wide.norm(dim=1), wide @ along], dim=1).cpu().numpy()


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
    if isinstance(embeddings, np.ndarray):
        norms = np.sqrt(np.einsum("ij,ij->i", embeddings, embeddings))  # float32, no (n, d) temporary
    else:
        norms = embeddings.norm(dim=1).cpu().numpy()
    low, high = NORM_RANGE
    suspect = np.flatnonzero(~((norms >= low) & (norms <= high)))
    if suspect.size:  # error path: classify these rows from exact float64 norms
        exact = norms.astype(np.float64)
        exact[suspect] = _vector_summary(embeddings[suspect], np.zeros(embeddings.shape[1]))[:, 0]
        problems = vector_problems(exact, positions, frame, spec, where)
        if problems:
            raise problems_error(problems)
    return norms


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


# --------------------------------------------------------------------------- across partitions


def partition_ids(frame, number: int, id_column: str):
    """A partition's distinct non-null ids, for the duplicate-id tree reduction."""
    ids = adapters.host_values(frame, id_column)
    ids = ids[~ids.isna().to_numpy()]
    first = pd.Series(number, index=pd.Index(ids.to_numpy()), dtype=np.int64)
    return _dedupe(first, 0, [])


def _dedupe(series: pd.Series, n_dup: int, examples: list):
    dup = series.index.duplicated(keep="first")
    if dup.any():
        n_dup += int(dup.sum())
        for value in series.index[dup].unique()[:max(0, SHOW - len(examples))]:
            examples.append((adapters._plain(value), sorted({int(p) for p in series.loc[[value]]})))
        series = series[~dup]
    return series, n_dup, examples


def merge_ids(results: list):
    """Merge partial results of the duplicate-id reduction."""
    series = pd.concat([r[0] for r in results])
    examples = [e for r in results for e in r[2]][:SHOW]
    return _dedupe(series, sum(r[1] for r in results), examples)


def id_report(result) -> tuple[int, list]:
    """Number of duplicate ids and a few examples ``(id, [partitions])``."""
    return result[1], result[2]


def id_graph(parts: list, id_column: str):
    """Lazy duplicate-id report over the partitions ``parts`` (a tree reduction)."""
    level = [dask.delayed(partition_ids, pure=True)(part, i, id_column) for i, part in enumerate(parts)]
    while len(level) > 1:
        level = [dask.delayed(merge_ids, pure=True)(level[i:i + _SPLIT_EVERY])
                 for i in range(0, len(level), _SPLIT_EVERY)]
    return dask.delayed(id_report, pure=True)(level[0])


def duplicate_problems(ids, id_column: str) -> list[Problem]:
    """The duplicate ids found by :func:`id_graph`, as one problem (or none)."""
    if ids is None or not ids[0]:
        return []
    shown = ", ".join(f"{value!r} (partitions {parts})" for value, parts in ids[1])
    return [Problem(f"id column {id_column!r} has {ids[0]} duplicate value(s), e.g. {shown}; ids must be "
                    f"unique across the table: deduplicate first (e.g. ddf.drop_duplicates(subset=["
                    f"{id_column!r}])) or pass check_ids=False", id_column)]


def dimension_problems(dims: list, column: str) -> list[Problem]:
    """Partitions whose embedding dimension differs from the first non-empty partition's."""
    seen = [(p, d) for p, d in enumerate(dims) if d is not None]
    if not seen:
        return []
    reference = seen[0][1]
    return [Problem(f"partition {p}: embedding column {column!r} has {d} dimensions but {reference} "
                    "elsewhere in the table; every row must come from the same embedding model (mixed "
                    "dimensions across partitions)", column, p) for p, d in seen if d != reference][:SHOW]


# --------------------------------------------------------------------------- the whole table


def _validate_partition(frame, number: int, spec: SelectSpec) -> dict:
    from .dask_select import summarise_check

    check = check_partition(frame, number, spec, embeddings=True)
    summary = summarise_check(check) if not check.problems else None
    return {"rows": check.rows, "dim": check.dim, "problems": check.problems, "summary": summary}


def validate_table(ddf, ratio=None, *, config=None, scheduler=None, **options) -> ValidationReport:
    """Check a table and the options of a selection on it, without selecting anything.

    Runs the operator's checks (the same functions as the plan pass of
    :func:`~datamask_dask.datamask_select`) on every partition, reading the columns the selection
    would read, and collects every problem instead of stopping at the first. When the data pass,
    the quota plan is also made, so a ratio or token budget the data cannot meet is reported too.

    Parameters
    ----------
    ddf : dask.dataframe.DataFrame
    ratio, config, **options
        As for :func:`~datamask_dask.datamask_select`.
    scheduler : optional
        Passed to ``dask.compute`` (e.g. a distributed Client, ``"threads"``).

    Returns
    -------
    ValidationReport
        ``report.ok``, ``report.summary()``, ``report.raise_if_failed()``.

    Examples
    --------
    >>> report = validate_table(ddf, id_column="doc_id")   # doctest: +SKIP
    >>> print(report.summary())                            # doctest: +SKIP
    """
    from .dask_select import make_plan, plan_input

    report = ValidationReport(partitions=ddf.npartitions,
                              columns={str(c): str(t) for c, t in ddf._meta.dtypes.items()})
    try:
        settings = load_config(config, ratio=ratio, **options)
        spec = make_spec(ddf, settings, ratio_given=ratio is not None or "select_ratio" in options,
                         scheduler=scheduler)
    except DataMaskError as exc:
        report.problems = list(getattr(exc, "problems", None) or [Problem(str(exc))])
        return report
    spec = _replace(spec, validate="full")
    parts = plan_input(ddf, spec.plan_columns).to_delayed()
    checks = [dask.delayed(_validate_partition, pure=True)(part, i, spec) for i, part in enumerate(parts)]
    ids = id_graph(parts, spec.id_column) if spec.check_ids else None
    checks, ids = dask.compute(checks, ids, scheduler=scheduler)
    report.rows = sum(c["rows"] for c in checks)
    dims = [c["dim"] for c in checks]
    report.dim = next((d for d in dims if d is not None), None)
    report.problems = [p for c in checks for p in c["problems"]]
    report.problems += dimension_problems(dims, spec.embedding_column)
    report.problems += duplicate_problems(ids, spec.id_column)
    if report.ok:  # the data are fine: can the quotas be met?
        try:
            make_plan([c["summary"] for c in checks], None, report.dim, spec)
        except DataMaskError as exc:
            report.problems.append(Problem(str(exc)))
    return report


def _replace(spec: SelectSpec, **changes) -> SelectSpec:
    import dataclasses

    return dataclasses.replace(spec, **changes)
