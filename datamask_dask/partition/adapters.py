"""Partition adapters: the only place that knows pandas from cuDF.

Backends accepted
-----------------
- **pandas** partitions: numeric columns of any numpy, nullable or Arrow dtype; embeddings as an
  Arrow ``list`` / ``large_list`` / ``fixed_size_list`` column (what parquet readers give back),
  converted to an ``(n, d)`` float32 array through the Arrow buffers (``flatten`` + reshape, no
  Python loop per row), or, as a fallback, an object column holding one array per row
  (``np.stack``).
- **cuDF** partitions: embeddings as a cuDF list column, handed to torch on the GPU through
  DLPack (cupy), without a copy to the host. cuDF and cupy are imported only when a cuDF
  partition arrives, so the package imports on machines that have neither.

Everything else in the package sees numpy arrays (quality, ids, groups, tokens: small, on the
host) and, for embeddings, a numpy array or a torch tensor.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

import numpy as np
import pandas as pd
import pyarrow as pa

from ..errors import InputDataError, OptionError

if TYPE_CHECKING:
    import torch

SHOW = 5  # rows or values quoted in an error message


class EmbeddingRows(Protocol):
    """Checked embedding rows: float32, a numpy array (pandas) or a torch tensor on the GPU (cuDF)."""

    dim: int

    def rows(self, positions: np.ndarray) -> np.ndarray | torch.Tensor:
        """The rows at sorted ``positions`` as an ``(m, dim)`` matrix."""
        ...


class EmbeddingSource(EmbeddingRows, Protocol):
    """One partition's embedding column (:func:`embedding_source`)."""

    def span(self, start: int, stop: int) -> np.ndarray | torch.Tensor:
        """Rows ``start:stop`` for reading only."""
        ...


def host_rows(rows) -> np.ndarray:
    """Embedding rows as a host array: a numpy array as it is, a (GPU) torch tensor copied as float32."""
    return rows if isinstance(rows, np.ndarray) else rows.float().cpu().numpy()


def is_cudf(obj) -> bool:
    """Whether ``obj`` is a cuDF object (checked by module name, so cuDF is never imported)."""
    return type(obj).__module__.split(".", 1)[0] == "cudf"


def learner_device(device: str, frame, where: str) -> str:
    """The torch device a partition is learned on: ``device`` (the option), where ``"auto"`` is the
    GPU for cuDF partitions on a worker that has one."""
    import torch

    if device == "auto":
        return "cuda" if is_cudf(frame) and torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise OptionError(f"{where}: device={device!r} but torch on this worker sees no CUDA device; use "
                          "device='auto' or 'cpu'")
    return device


def is_numeric_dtype(dtype) -> bool:
    """pandas' test, safe on cuDF's own dtypes (lists, structs), which pandas' tests raise on."""
    return not is_cudf(dtype) and pd.api.types.is_numeric_dtype(dtype)


def backend(frame) -> str:
    """``"cudf"`` or ``"pandas"``: the library behind a partition (or a Dask dataframe's meta)."""
    return "cudf" if is_cudf(frame) else "pandas"


def missing_columns(frame, names, where: str | None) -> list[tuple[str, str]]:
    """``(name, message)`` for each of ``names`` that ``frame`` lacks: the index's own, and the absent
    ones sharing one message that names them all and lists the frame's columns once. ``where``: the
    partition the messages name, or None for the whole table (whose caller names it)."""
    available = [str(c) for c in frame.columns]
    indexed = set(getattr(frame.index, "names", None) or ()) - {None}
    absent = [name for name in dict.fromkeys(names) if name not in frame.columns]
    unknown = [name for name in absent if name not in indexed]
    named = (f"is no column {unknown[0]!r}" if len(unknown) == 1 else
             f"are no columns {', '.join(map(repr, unknown[:-1]))} and {unknown[-1]!r}" if unknown else "")
    return [(name, f"{at(where)}{name!r} is the index, not a column: move it back with ddf.reset_index()"
             if name in indexed else
             f"{at(where)}there {named}; available columns are {available}. Name yours with id_column=, "
             "quality_column=, embedding_column=, token_column= or by=")
            for name in absent]


def at(where: str | None) -> str:
    """The start of a message about ``where`` (a partition), or nothing for the whole table."""
    return f"{where}: " if where else ""


def require_columns(frame, names, where: str | None) -> None:
    """Raise :class:`InputDataError` naming the first missing column and listing the others."""
    for _, message in missing_columns(frame, names, where)[:1]:
        raise InputDataError(message)


def numeric_values(frame, name: str, where: str) -> np.ndarray:
    """A numeric column as a float64 numpy array on the host (nulls become NaN)."""
    series = frame[name]
    if not is_numeric_dtype(series.dtype):
        raise InputDataError(f"{where}: column {name!r} must be numeric, got dtype {series.dtype}")
    if is_cudf(series):
        return series.astype("float64").to_numpy(na_value=np.nan)
    return series.to_numpy(dtype=np.float64, na_value=np.nan)


def host_values(frame, name: str) -> pd.Series:
    """A column as a pandas Series (ids and group labels: small, compared on the host)."""
    series = frame[name]
    return series.to_pandas() if is_cudf(series) else series


def group_codes(frame, name: str, where: str) -> tuple[np.ndarray, list]:
    """Integer code of each row's group and the group labels, in order of first appearance."""
    codes, labels = pd.factorize(host_values(frame, name), use_na_sentinel=True)
    if (codes < 0).any():
        bad = np.flatnonzero(codes < 0)
        raise InputDataError(f"{where}: group column {name!r} has {bad.size} null value(s) at rows "
                             f"{bad[:SHOW].tolist()}: fill them (e.g. 'unknown') or drop those rows")
    return codes.astype(np.int64), [plain(v) for v in labels]


def plain(value):
    """numpy scalars to Python ones, so labels compare and print the same in every process."""
    return value.item() if isinstance(value, np.generic) else value


def fixed_dimension(dtype) -> int | None:
    """The embedding dimension a column's dtype promises (Arrow fixed-size lists), else None."""
    pa_type = getattr(dtype, "pyarrow_dtype", None)
    if pa_type is not None and pa.types.is_fixed_size_list(pa_type):
        return int(pa_type.list_size)
    return None


def probe_dimension(columns: Iterable) -> int | None:
    """The embedding dimension of the first of ``columns`` (one series a partition, in partition order,
    read as they are asked for) that has rows, checked as :func:`embedding_source` checks a column;
    None where none has. For ``validate="light"``: the select tasks check every row."""
    for number, series in enumerate(columns):
        if len(series):
            return embedding_source(series, f"partition {number}").dim
    return None


def embedding_source(series, where: str, expected_dim: int | None = None) -> EmbeddingSource:
    """Check an embedding column's structure and return an object that converts rows of it.

    Checks: no null rows, one length for every row (not ragged), at least 2 dimensions, and
    ``expected_dim`` when given (the dimension seen elsewhere in the table).

    Returns
    -------
    EmbeddingSource: ``dim`` (int) and ``rows(positions) -> (m, d)`` float32 numpy array (pandas)
    or torch tensor on the GPU (cuDF) of the rows at sorted ``positions``, a new one the caller
    may modify; ``span(start, stop)``
    gives rows ``start:stop`` for reading only (a view of the column's memory where possible).
    """
    check_embedding_type(series.dtype, series.name, where)
    source: EmbeddingSource
    if is_cudf(series):
        source = _CudfEmbeddings(series, where)
    elif series.dtype == object:
        source = _ObjectEmbeddings(series, where)
    else:  # an Arrow list column: check_embedding_type allows nothing else
        source = _ArrowEmbeddings(series, where)
    if len(series) and source.dim < 2:
        raise InputDataError(f"{where}: embedding column {series.name!r} has {source.dim} "
                             "dimension(s); at least 2 are needed")
    if len(series) and expected_dim is not None and source.dim != expected_dim:
        raise InputDataError(
            f"{where}: embedding column {series.name!r} has {source.dim} dimensions but {expected_dim} "
            "elsewhere in the table; every row must come from the same embedding model (mixed "
            "dimensions across partitions)")
    return source


def embedding_matrix(series):
    """Every row of an embedding column as one ``(n, d)`` float32 matrix (checked as below).

    A numpy array for pandas columns, a torch tensor on the GPU for cuDF ones.
    """
    return embedding_source(series, f"column {series.name!r}").rows(np.arange(len(series)))


def check_embedding_type(dtype, name, where: str | None) -> None:
    """Reject embedding dtypes that cannot hold numeric vectors (text, lists of text...)."""
    pa_type = getattr(dtype, "pyarrow_dtype", None)
    # Dask turns object columns of arrays into their text: say so, since the fix is Dask's option
    if isinstance(dtype, pd.StringDtype) or (
            pa_type is not None and (pa.types.is_string(pa_type) or pa.types.is_large_string(pa_type))):
        raise InputDataError(
            f"{at(where)}embedding column {name!r} has dtype {dtype}, i.e. text. If it held arrays, Dask "
            "converted them to strings (dataframe.convert-string): store embeddings as an Arrow list "
            "column (pd.ArrowDtype, or parquet read with dtype_backend='pyarrow'), or build the Dask "
            "frame inside dask.config.set({'dataframe.convert-string': False})")
    if pa_type is None:
        # cuDF first: pandas' dtype tests raise on cuDF's list dtype ("issubclass() arg 1 must be a class")
        if not (is_cudf(dtype) or pd.api.types.is_object_dtype(dtype)):
            raise InputDataError(f"{at(where)}embedding column {name!r} has dtype {dtype}; expected a list "
                                 "or fixed-size list of floats (Arrow), or an object column of 1-d arrays")
        return
    if pa.types.is_null(pa_type):
        raise InputDataError(f"{at(where)}embedding column {name!r} has Arrow type null: it holds no vector, "
                             "as pandas writes an empty or all-None column of objects. Write the table with "
                             "the column typed (e.g. pyarrow.list_(pyarrow.float32()) in its schema)")
    if not (pa.types.is_list(pa_type) or pa.types.is_large_list(pa_type)
            or pa.types.is_fixed_size_list(pa_type)):
        blob = pa.types.is_binary(pa_type) or pa.types.is_large_binary(pa_type)
        packed = ": bytes of packed floats decode into one with numpy.frombuffer(value, numpy.float32), " \
            "a row at a time" if blob else ""
        raise InputDataError(f"{at(where)}embedding column {name!r} has Arrow type {pa_type}; expected a "
                             f"list or fixed-size list of floats{packed}")
    value = pa_type.value_type
    if not (pa.types.is_floating(value) or pa.types.is_integer(value) or pa.types.is_decimal(value)):
        raise InputDataError(f"{at(where)}embedding column {name!r} holds lists of {value}, not numbers: "
                             "store the vectors as lists of float32")


def _ragged_error(where: str, name, lengths: np.ndarray) -> InputDataError:
    values, counts = np.unique(lengths, return_counts=True)
    common = values[np.argmax(counts)]
    bad = np.flatnonzero(lengths != common)
    return InputDataError(
        f"{where}: embedding column {name!r} is ragged: rows have lengths {values[:SHOW].tolist()}; "
        f"{bad.size} row(s) differ from the usual {int(common)}, first at rows {bad[:SHOW].tolist()}. "
        "Every embedding must have the same dimension")


def _null_error(where: str, name, null_rows: np.ndarray) -> InputDataError:
    return InputDataError(f"{where}: embedding column {name!r} is null in {null_rows.size} row(s), first "
                          f"{null_rows[:SHOW].tolist()}: embed or drop those rows")


class _ArrowEmbeddings:
    """Arrow list column: structure from the offsets, values from the flat child buffer."""

    def __init__(self, series: pd.Series, where: str):
        self.name = series.name
        # Keep the chunks as they are: combining them would copy the whole column.
        self.array = series.array.__arrow_array__()
        self._views: tuple[np.ndarray, list[np.ndarray]] | None = None  # per-chunk views, made on first use
        if self.array.null_count:
            nulls = np.asarray(self.array.is_null().to_numpy())
            raise _null_error(where, self.name, np.flatnonzero(nulls))
        if pa.types.is_fixed_size_list(self.array.type):
            self.dim = int(self.array.type.list_size)
        else:
            lengths = np.concatenate([np.diff(np.asarray(chunk.offsets)) for chunk in self.array.chunks]
                                     or [np.zeros(0, dtype=np.int64)])
            if lengths.size and (lengths != lengths[0]).any():
                raise _ragged_error(where, self.name, lengths)
            self.dim = int(lengths[0]) if lengths.size else 0

    def rows(self, positions: np.ndarray) -> np.ndarray:
        """The rows at sorted ``positions`` as a new float32 matrix: one copy, straight from Arrow memory."""
        positions = np.asarray(positions, dtype=np.int64)
        out = np.empty((positions.size, self.dim), dtype=np.float32)
        starts, matrices = self._matrices()
        # each chunk's rows are one segment of the sorted positions
        bounds = np.searchsorted(positions, [*starts, starts[-1] + len(matrices[-1])] if matrices else [0])
        for start, matrix, lo, hi in zip(starts, matrices, bounds[:-1], bounds[1:], strict=True):
            if hi > lo:
                out[lo:hi] = matrix[positions[lo:hi] - start]
        return out

    def span(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` as float32, read-only: a view of Arrow memory when they lie in one chunk."""
        starts, matrices = self._matrices()
        chunk = int(np.searchsorted(starts, start, side="right")) - 1
        if matrices and stop - starts[chunk] <= len(matrices[chunk]) and matrices[chunk].dtype == np.float32:
            return matrices[chunk][start - starts[chunk]:stop - starts[chunk]]
        return self.rows(np.arange(start, stop))

    def _matrices(self) -> tuple[np.ndarray, list[np.ndarray]]:
        """Each Arrow chunk as an (rows, dim) numpy view of its values (a copy only if they hold nulls)."""
        if self._views is None:
            starts, matrices, start = [], [], 0
            for chunk in self.array.chunks:
                values = chunk.flatten()  # the chunk's own slice of the child values, zero-copy
                flat = values.to_numpy(zero_copy_only=values.null_count == 0 and not pa.types.is_boolean(
                    values.type))  # nulls inside a vector become NaN (and are reported as such)
                starts.append(start)
                matrices.append(flat.reshape(len(chunk), self.dim))
                start += len(chunk)
            self._views = (np.asarray(starts, dtype=np.int64), matrices)
        return self._views


class _ObjectEmbeddings:
    """Fallback: an object column of arrays or lists, stacked once per partition."""

    def __init__(self, series: pd.Series, where: str):
        self.name = series.name
        values = series.to_numpy()
        nulls = np.flatnonzero(pd.isna(values))
        if nulls.size:
            raise _null_error(where, self.name, nulls)
        if values.size == 0:
            self.matrix, self.dim = np.zeros((0, 0), dtype=np.float32), 0
            return
        try:
            self.matrix = np.stack(values).astype(np.float32, copy=False)
        except (ValueError, TypeError) as exc:
            lengths = np.array([np.size(v) for v in values])  # error path only
            if (lengths != lengths[0]).any():
                raise _ragged_error(where, self.name, lengths) from exc
            raise InputDataError(f"{where}: embedding column {self.name!r} holds values that are not "
                                 f"numeric vectors ({exc})") from exc
        if self.matrix.ndim != 2:
            raise InputDataError(f"{where}: embedding column {self.name!r} must hold 1-d vectors, got "
                                 f"shape {self.matrix.shape[1:]} per row")
        self.dim = int(self.matrix.shape[1])

    def rows(self, positions: np.ndarray) -> np.ndarray:
        return self.matrix[positions]

    def span(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` (a view: read-only use)."""
        return self.matrix[start:stop]


class _CudfEmbeddings:
    """cuDF list column: lengths and leaves on the GPU, handed to torch through DLPack."""

    def __init__(self, series, where: str):
        import cupy as cp  # noqa: F401  (lazy: only GPU partitions get here)

        self.name = series.name
        self.series = series
        if series.null_count:
            raise _null_error(where, self.name, np.flatnonzero(series.isna().to_numpy()))
        lengths = series.list.len()
        if len(series) and int(lengths.min()) != int(lengths.max()):
            raise _ragged_error(where, self.name, lengths.to_numpy())
        self.dim = int(lengths.iloc[0]) if len(series) else 0

    def rows(self, positions: np.ndarray):
        import cupy as cp
        import torch

        taken = self.series.take(cp.asarray(positions))
        flat = taken.list.leaves.astype("float32").to_cupy(na_value=np.nan)
        return torch.from_dlpack(flat.reshape(len(positions), self.dim))

    def span(self, start: int, stop: int):
        """Rows ``start:stop`` (read-only use)."""
        return self.rows(np.arange(start, stop))


def embedding_rows(part, number: int) -> EmbeddingSource:
    """A partition's embedding column as read (a series, or a frame of that one column) as the source
    the near-duplicate check reads its candidate rows from."""
    return embedding_source(part.iloc[:, 0] if hasattr(part, "columns") else part, f"partition {number}")
