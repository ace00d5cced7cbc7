"""What the text stages share: the text column's checks, the per-process model cache and each task's
torch threads."""

from __future__ import annotations

import threading

import pandas as pd

from ..errors import InputDataError, OptionError

#: Models loaded in this process, keyed by (kind, resolved path, device): one load per worker process.
_MODELS: dict = {}
_LOCK = threading.Lock()


def load_count() -> int:
    """Models loaded by this process so far (each (path, device) at most once)."""
    return len(_MODELS)


def cached_model(key: tuple, loader):
    """The model under ``key``, loaded by ``loader()`` the first time in this process (thread-safe)."""
    with _LOCK:
        if key not in _MODELS:
            _MODELS[key] = loader()
        return _MODELS[key]


def resolve_device(device: str | None) -> str:
    """``"auto"``/None: the GPU when this process sees one, else the CPU."""
    if device in (None, "auto"):
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    if not str(device).startswith(("cpu", "cuda", "mps")):
        raise OptionError(f"device must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps', got {device!r}")
    return str(device)


def _is_text_dtype(dtype) -> bool:
    if isinstance(dtype, pd.ArrowDtype):
        import pyarrow as pa

        return pa.types.is_string(dtype.pyarrow_dtype) or pa.types.is_large_string(dtype.pyarrow_dtype)
    return pd.api.types.is_string_dtype(dtype) or pd.api.types.is_object_dtype(dtype)


def check_text_column(ddf, text_column: str, stage: str) -> None:
    """Fail before building a graph: the column exists and holds text."""
    if text_column not in ddf.columns:
        raise InputDataError(f"{stage}: text column {text_column!r} not found; columns are "
                             f"{list(ddf.columns)}: name the documents' text column with text_column=")
    dtype = ddf._meta[text_column].dtype
    if not _is_text_dtype(dtype):
        raise InputDataError(f"{stage}: column {text_column!r} holds {dtype}, not text (strings); "
                             "pass the column with the documents' text as text_column=")


def check_text_meta(ddf, text_column: str, output_column: str, stage: str) -> None:
    """Fail before building a graph: the text column exists, holds text, differs from the output."""
    check_text_column(ddf, text_column, stage)
    if output_column == text_column:
        raise OptionError(f"{stage}: output_column={output_column!r} would overwrite the text column")


def text_values(part: pd.DataFrame, text_column: str, where: str, stage: str) -> pd.Series:
    """The partition's text as a pandas string Series, or InputDataError naming column, partition
    (``where``: :func:`partition_name`) and rows."""
    col = part[text_column]
    if hasattr(col, "to_pandas"):  # cuDF
        col = col.to_pandas()
    nulls = col.isna().to_numpy()
    if nulls.any():
        rows = [int(i) for i in nulls.nonzero()[0][:5]]
        raise InputDataError(f"{stage}: column {text_column!r}, {where}: {int(nulls.sum())} null text "
                             f"value(s), first at rows {rows}; drop or fill them first")
    if col.dtype == object and len(col):
        kinds = pd.api.types.infer_dtype(col, skipna=True)
        if kinds not in ("string", "empty"):
            bad = [i for i, v in enumerate(col.to_numpy()) if not isinstance(v, str)][:5]
            raise InputDataError(f"{stage}: column {text_column!r}, {where}: holds non-string values "
                                 f"({kinds}), first at rows {bad}; it must hold text")
    text = col.astype("string[pyarrow]") if not isinstance(col.dtype, pd.StringDtype) else col
    empty = (text.str.strip().str.len() == 0).to_numpy(dtype=bool)
    if empty.any():
        rows = [int(i) for i in empty.nonzero()[0][:5]]
        raise InputDataError(f"{stage}: column {text_column!r}, {where}: {int(empty.sum())} empty or "
                             f"whitespace-only text value(s), first at rows {rows}; drop them first")
    return text


def partition_name(partition_info) -> str:
    """``"partition N"`` from the ``partition_info`` Dask passes to a partition's function."""
    number = (partition_info or {}).get("number")
    return f"partition {number}" if number is not None else "a partition"


def task_threads(tasks: int) -> int:
    """Torch CPU threads for one of ``tasks`` tasks, so that the tasks running at once fill the cores
    without oversubscribing them: on a Dask worker, its threads shared by its tasks running at once;
    elsewhere (the threaded scheduler), the cores shared by its pool's tasks running at once."""
    try:
        from distributed import get_worker

        worker = get_worker()
        cores = slots = int(getattr(worker, "nthreads", None) or worker.state.nthreads)
    except (ImportError, ValueError, AttributeError):  # not on a distributed worker
        import dask
        from dask.system import CPU_COUNT

        cores = CPU_COUNT
        slots = int(dask.config.get("num_workers", None) or cores)
    return max(1, cores // max(1, min(slots, int(tasks))))
