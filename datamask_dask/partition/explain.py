"""Why each row was selected or not (``explain=True``): the reason codes and the output columns.

Engine-agnostic: :func:`~datamask_dask.partition.select.select_partition` records one reason per
row from what the plan and the select step already decided, and :func:`explain_columns` turns
them, with the plan's near-duplicate links, into the ``reason``, ``duplicate_of`` and
``similarity`` columns in the frame's own library. Nothing here reads an embedding.

Reasons, one per row, in this order of precedence:

- ``selected``: the row is in the selection.
- ``near-duplicate``: set aside before learning, because a better row (higher quality, then
  lower partition and row) is its near-duplicate; ``duplicate_of`` names that row and
  ``similarity`` is the cosine estimated from the two rows' SimHash signatures.
- ``quality-pruned``: below the table-wide quality threshold of ``prune``; never eligible.
- ``quota-exhausted``: eligible, but its group's quota (or token budget) gave its partition or
  chunk (in regions: its area; in context: its piece) nothing: the quota went to better rows elsewhere.
- ``not-chosen``: eligible in a chunk (its area's pack, its piece) with a quota, and the learner chose
  other rows.
- ``budget-exhausted``: the learner chose it, but the token budget of its partition and group
  ran out before it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from ..errors import OptionError
from . import adapters

SELECTED, NEAR_DUPLICATE, QUALITY_PRUNED, QUOTA_EXHAUSTED, NOT_CHOSEN, BUDGET_EXHAUSTED = range(6)
REASONS = ("selected", "near-duplicate", "quality-pruned", "quota-exhausted", "not-chosen",
           "budget-exhausted")
REASON_COLUMN, DUPLICATE_COLUMN, SIMILARITY_COLUMN = "reason", "duplicate_of", "similarity"
COLUMNS = (REASON_COLUMN, DUPLICATE_COLUMN, SIMILARITY_COLUMN)


def check_free(columns) -> None:
    """Refuse an input that already has one of the columns ``explain=True`` adds."""
    taken = [name for name in COLUMNS if name in columns]
    if taken:
        raise OptionError(f"explain=True adds the columns {list(COLUMNS)}, but the input already has "
                          f"{taken}: rename yours (the input is never overwritten) or leave explain off")


def duplicate_type(id_dtype) -> pa.DataType:
    """The Arrow type of ``duplicate_of``: the id column's kind (int64, float64 or string), nullable."""
    if adapters.is_numeric_dtype(id_dtype) and not pd.api.types.is_bool_dtype(id_dtype):
        return pa.int64() if pd.api.types.is_integer_dtype(id_dtype) else pa.float64()
    return pa.string()


def explain_columns(frame, id_column: str, reasons: np.ndarray, links: dict | None) -> dict:
    """The ``reason``, ``duplicate_of`` and ``similarity`` columns of one partition.

    ``reasons``: int8 codes (:data:`REASONS`); ``links``: the plan's ``explain`` entry of the
    partition (positions of its near-duplicates, the ids of the rows they stand behind, the
    estimated cosines), or None.
    """
    n = len(frame)
    kind = duplicate_type(frame[id_column].dtype)
    values = np.zeros(n, dtype=object if kind == pa.string() else kind.to_pandas_dtype())
    missing = np.ones(n, dtype=bool)
    similarity = np.full(n, np.nan, dtype=np.float32)
    if links is not None and len(links["position"]):
        shown = reasons[links["position"]] == NEAR_DUPLICATE  # a group planned on every row has none
        position = links["position"][shown]
        ids = np.asarray(links["duplicate_of"])[shown]
        values[position] = ids.astype(str) if kind == pa.string() else ids
        missing[position] = False
        similarity[position] = links["similarity"][shown]
    duplicate = pa.array(values, type=kind, mask=missing, from_pandas=True)
    # Arrow strings, not a categorical: parquet, Delta, Iceberg and Spark all take them as they are
    reason = pa.DictionaryArray.from_arrays(pa.array(reasons, pa.int8()), pa.array(REASONS)).cast(pa.string())
    if adapters.is_cudf(frame):
        import cudf

        columns = {REASON_COLUMN: cudf.Series.from_arrow(reason),
                   DUPLICATE_COLUMN: cudf.Series.from_arrow(duplicate)}
        for series in columns.values():
            series.index = frame.index  # assign aligns on the index
        return {**columns, SIMILARITY_COLUMN: similarity}
    return {REASON_COLUMN: pd.arrays.ArrowExtensionArray(reason),
            DUPLICATE_COLUMN: pd.arrays.ArrowExtensionArray(duplicate), SIMILARITY_COLUMN: similarity}


def arrow_fields(id_type: pa.DataType) -> list[pa.Field]:
    """The explain columns' Arrow fields, for an id column of Arrow type ``id_type``."""
    return [pa.field(REASON_COLUMN, pa.string()),
            pa.field(DUPLICATE_COLUMN, duplicate_type(pd.ArrowDtype(id_type))),
            pa.field(SIMILARITY_COLUMN, pa.float32())]
