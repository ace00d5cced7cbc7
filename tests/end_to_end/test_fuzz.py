"""Fuzzing the operator with small random tables and random bad values.

Every example ends one of two ways: a valid selection of exactly ``round(ratio * N)`` rows with
every input row and column unchanged, or the project's own error (a DataMaskError) - and which
one is decided by what was broken, so bad data can never pass and good data never fail.
"""

from __future__ import annotations

import math

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from datamask_dask import DataMaskError, datamask_select

LEARNER = {"n_epochs": 5, "n_rollout": 4, "refine_epochs": 3}
ROW_DEFECTS = ("nan_quality", "inf_quality", "huge_quality", "duplicate_id", "null_id", "zero_embedding",
               "nan_embedding", "huge_embedding", "ragged_embedding", "null_embedding")
TABLE_DEFECTS = ("missing_quality", "text_quality", "missing_embedding")
BAD_RATIOS = [0, -0.5, 1.5, math.nan, math.inf, True, "0.1"]
RATIOS = st.one_of(st.floats(0.01, 1.0), st.floats(0.01, 1.0), st.sampled_from([1.0, 1e-9, *BAD_RATIOS]))


def _valid_ratio(ratio) -> bool:
    return isinstance(ratio, float | int) and not isinstance(ratio, bool) and 0 < ratio <= 1


@st.composite
def tables(draw):
    """(list of partition frames, ratio, whether an error is due)."""
    sizes = draw(st.lists(st.integers(0, 30), min_size=1, max_size=4))
    n = sum(sizes)
    d = draw(st.sampled_from([1, 2, 3, 8]))
    layout = draw(st.sampled_from(["fixed_size_list", "list", "object"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    quality = rng.random(n)
    vectors = [row for row in rng.standard_normal((n, d)).astype(np.float32)]
    ids = pd.array(np.arange(n), dtype="Int64")
    defects = draw(st.sets(st.sampled_from(ROW_DEFECTS), max_size=2)) if n else set()
    row = draw(st.integers(0, max(n - 1, 0)))
    for defect in sorted(defects, key=ROW_DEFECTS.index):  # null_embedding last: it replaces the row
        if defect == "nan_quality":
            quality[row] = np.nan
        elif defect == "inf_quality":
            quality[row] = -np.inf
        elif defect == "huge_quality":
            quality[row] = 1e300  # beyond float32: the learner could not represent it
        elif defect == "duplicate_id" and n > 1:
            ids[row] = ids[(row + 1) % n]
        elif defect == "null_id":
            ids[row] = pd.NA
        elif defect == "zero_embedding":
            vectors[row] = np.zeros(d, dtype=np.float32)
        elif defect == "nan_embedding":
            vectors[row] = vectors[row].copy()
            vectors[row][0] = np.nan
        elif defect == "huge_embedding":
            vectors[row] = vectors[row] * np.float32(1e30)
        elif defect == "ragged_embedding" and layout != "fixed_size_list" and n > 1:
            vectors[row] = np.append(vectors[row], np.float32(1.0))
        elif defect == "null_embedding":
            vectors[row] = None
    applied = {d_ for d_ in defects if not (d_ == "duplicate_id" and n < 2)
               and not (d_ == "ragged_embedding" and (layout == "fixed_size_list" or n < 2))}
    table_defect = draw(st.sampled_from([None] * 6 + list(TABLE_DEFECTS)))
    frame = pd.DataFrame({"chunk_id": ids, "quality_score": quality,
                          "feature_arr": _embedding_column(vectors, d, layout)})
    if table_defect == "missing_quality":
        frame = frame.drop(columns="quality_score")
    elif table_defect == "text_quality":
        frame["quality_score"] = frame["quality_score"].astype(str).astype(object)
    elif table_defect == "missing_embedding":
        frame = frame.drop(columns="feature_arr")
    ratio = draw(RATIOS)
    bounds = np.cumsum([0, *sizes])
    frames = [frame.iloc[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    error_due = bool(applied or table_defect or not _valid_ratio(ratio) or (n and d < 2))
    return frames, ratio, error_due


def _embedding_column(vectors: list, d: int, layout: str):
    if layout == "object":
        return pd.Series(vectors, dtype=object)
    values = [None if v is None else v.tolist() for v in vectors]
    kind = pa.list_(pa.float32(), d) if layout == "fixed_size_list" else pa.list_(pa.float32())
    return pd.arrays.ArrowExtensionArray(pa.array(values, type=kind))


# a ratio of a small table may round to no row, which the operator warns of: the count is still exact
@pytest.mark.filterwarnings("ignore::datamask_dask.errors.DataMaskWarning")
@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(tables())
def test_operator_selects_exactly_or_raises_its_own_error(case):
    frames, ratio, error_due = case
    with dask.config.set({"dataframe.convert-string": False}):
        ddf = dd.from_map(lambda i: frames[i], range(len(frames)), meta=frames[0].iloc[:0],
                          enforce_metadata=False)
    try:
        result = datamask_select(ddf, ratio=ratio, **LEARNER).compute(scheduler="sync")
    except DataMaskError as exc:
        event(f"rejected: {type(exc).__name__}")
        assert error_due, f"good input rejected: {exc}"
        assert str(exc).strip()
        return
    event("selected")
    assert not error_due, "bad input was accepted"
    expected = pd.concat(frames)
    assert list(result.columns) == [*expected.columns, "selected"]
    assert result["chunk_id"].tolist() == expected["chunk_id"].tolist()
    np.testing.assert_array_equal(result["quality_score"].to_numpy(), expected["quality_score"].to_numpy())
    assert int(result["selected"].sum()) == round(ratio * len(expected))
