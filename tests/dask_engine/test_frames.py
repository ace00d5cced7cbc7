"""Conformance: ``datamask_select`` and ``write_selection`` work on every Dask DataFrame a user builds.

Each shape below is a way a data engineer ends up with a frame (concat, repartition, set_index,
persist, from_map, read_parquet with filters...). Whatever built it, the operator must select
exactly ``round(ratio * N)`` rows and hand back every input row and column unchanged.
"""

from __future__ import annotations

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import FAST

from datamask_dask import datamask_select, write_selection
from datamask_dask.io.parquet import read_parquet
from datamask_dask.io.sinks import write_parquet
from datamask_dask.sample_data import make_corpus

RATIO = 0.1
N = 600


@pytest.fixture(scope="module")
def table():
    """N rows, 8-d Arrow fixed-size-list embeddings, a source label, ids shuffled (not sorted)."""
    frame = make_corpus(N, 8, seed=5)
    frame["source"] = np.array(["web", "books", "code"])[np.arange(N) % 3]
    frame["order"] = np.random.default_rng(0).permutation(N)  # an unsorted key
    return frame


@pytest.fixture(scope="module")
def parquet_input(tmp_path_factory, table):
    path = tmp_path_factory.mktemp("frames") / "corpus"
    write_parquet(dd.from_pandas(table, npartitions=3, sort=False), path)
    return path


def _empty_partitions(table):
    ddf = dd.from_pandas(table, npartitions=4, sort=False)
    return ddf[ddf.chunk_id % 4 != 1]  # some partitions keep no row at all...


def _filtered(table):
    ddf = dd.from_pandas(table, npartitions=4, sort=False)
    ddf = ddf.assign(good=ddf.quality_score > 0.2)
    return ddf[ddf.good]


def _from_delayed(table):
    parts = [dask.delayed(lambda f: f)(table.iloc[i:i + 200]) for i in range(0, N, 200)]
    return dd.from_delayed(parts, meta=table.iloc[:0])


def _merge(table):
    labels = pd.DataFrame({"source": ["web", "books", "code"], "licence": ["cc-by", "pd", "mit"]})
    return dd.from_pandas(table, npartitions=3, sort=False).merge(labels, on="source", how="left")


def _index_not_default(table):
    frame = table.set_axis(pd.Index([f"doc-{i}" for i in range(N)], name="doc"))
    return dd.from_pandas(frame, npartitions=3, sort=False)


#: name -> (builder(table, parquet_path, client) -> ddf, scheduler ("client" or None), extra options)
SHAPES = {
    "from_pandas-1": (lambda t, p, c: dd.from_pandas(t, npartitions=1), None, {}),
    "from_pandas-many": (lambda t, p, c: dd.from_pandas(t, npartitions=7, sort=False), None, {}),
    "concat": (lambda t, p, c: dd.concat([dd.from_pandas(t.iloc[:100], npartitions=1),
                                          dd.from_pandas(t.iloc[100:], npartitions=2)]), None, {}),
    "repartition-fewer": (lambda t, p, c: dd.from_pandas(t, npartitions=6).repartition(npartitions=2),
                          None, {}),
    "repartition-more": (lambda t, p, c: dd.from_pandas(t, npartitions=2).repartition(npartitions=5),
                         None, {}),
    "set_index-sorted": (lambda t, p, c: dd.from_pandas(t.assign(key=t.chunk_id), npartitions=3)
                         .set_index("key"), None, {}),
    "set_index-unsorted": (lambda t, p, c: dd.from_pandas(t, npartitions=3, sort=False).set_index("order"),
                           None, {}),
    "persist-threads": (lambda t, p, c: dd.from_pandas(t, npartitions=3).persist(scheduler="threads"),
                        None, {}),
    "persist-cluster": (lambda t, p, c: c.persist(dd.from_pandas(t, npartitions=3)), "client", {}),
    "from_map": (lambda t, p, c: dd.from_map(lambda i: t.iloc[i * 150:(i + 1) * 150], range(4)), None, {}),
    "from_delayed": (lambda t, p, c: _from_delayed(t), None, {}),
    "read_parquet-ours": (lambda t, p, c: read_parquet(p), None, {}),
    "read_parquet-filters": (lambda t, p, c: dd.read_parquet(p, filters=[("chunk_id", ">=", 0)],
                                                             dtype_backend="pyarrow"), None, {}),
    "read_parquet-columns": (lambda t, p, c: dd.read_parquet(
        p, columns=["chunk_id", "quality_score", "feature_arr"], dtype_backend="pyarrow"), None, {}),
    "merge": (lambda t, p, c: _merge(t), None, {}),
    "assign-filter": (lambda t, p, c: _filtered(t), None, {}),
    "empty-partitions": (lambda t, p, c: _empty_partitions(t), None, {}),
    "index-not-default": (lambda t, p, c: _index_not_default(t), None, {}),
    "by-categorical": (lambda t, p, c: dd.from_pandas(t.astype({"source": "category"}), npartitions=3),
                       None, {"by": "source"}),
    "by-arrow-string": (lambda t, p, c: dd.from_pandas(t.astype({"source": pd.ArrowDtype(pa.string())}),
                                                       npartitions=3), None, {"by": "source"}),
    "map_partitions": (lambda t, p, c: dd.from_pandas(t, npartitions=3).map_partitions(lambda f: f.copy()),
                       None, {}),
    "cluster-scheduler": (lambda t, p, c: dd.from_pandas(t, npartitions=3), "client", {}),
}


def _expected_total(frame: pd.DataFrame, options: dict) -> int:
    if "by" in options:
        return sum(round(RATIO * n) for n in frame.groupby(options["by"], observed=True).size())
    return round(RATIO * len(frame))


def _check(result: pd.DataFrame, source: pd.DataFrame, options: dict) -> None:
    """Every row and column of ``source`` comes back, in order and unchanged, plus an exact ``selected``."""
    assert list(result.columns) == [*source.columns, "selected"]
    assert len(result) == len(source)
    assert result.index.equals(source.index)
    pd.testing.assert_frame_equal(result.drop(columns="selected"), source)
    assert result["selected"].dtype == bool
    assert int(result["selected"].sum()) == _expected_total(source, options)


@pytest.mark.slow
@pytest.mark.parametrize("shape", list(SHAPES))
def test_datamask_select_on_every_shape(shape, table, parquet_input, client):
    build, where, options = SHAPES[shape]
    scheduler = client if where == "client" else "threads"
    ddf = build(table, parquet_input, client)
    source = ddf.compute(scheduler=scheduler)
    result = ddf.pipe(datamask_select, ratio=RATIO, **options, **FAST).compute(scheduler=scheduler)
    _check(result, source, options)


@pytest.mark.slow
@pytest.mark.parametrize("shape", list(SHAPES))
def test_write_selection_on_every_shape(shape, table, parquet_input, client, tmp_path):
    build, where, options = SHAPES[shape]
    scheduler = client if where == "client" else "threads"
    ddf = build(table, parquet_input, client)
    report = write_selection(ddf, tmp_path / "out", ratio=RATIO, scheduler=scheduler, summary_rows=0,
                             **options, **FAST)
    source = ddf.compute(scheduler=scheduler)
    assert report.rows == len(source)
    assert report.selected == _expected_total(source, options)
    written = read_parquet(tmp_path / "out").compute()
    assert int(written["selected"].sum()) == report.selected
    assert sorted(written["chunk_id"]) == sorted(source["chunk_id"])
    assert set(written.columns) >= {*map(str, source.columns), "selected"}


@pytest.mark.slow
def test_the_lazy_result_gives_one_selection_however_it_is_computed(table, client, tmp_path):
    ddf = dd.concat([dd.from_pandas(table.iloc[:250], npartitions=2),
                     dd.from_pandas(table.iloc[250:], npartitions=2)])
    out = ddf.pipe(datamask_select, ratio=RATIO, **FAST)
    reference = out.compute(scheduler="threads")
    chosen = set(reference.loc[reference.selected, "chunk_id"])
    assert len(chosen) == round(RATIO * N)

    persisted = out.persist(scheduler="threads").compute(scheduler="threads")
    assert set(persisted.loc[persisted.selected, "chunk_id"]) == chosen
    on_cluster = client.compute(out).result()
    assert set(on_cluster.loc[on_cluster.selected, "chunk_id"]) == chosen
    only_selected = out[out.selected].compute(scheduler="threads")
    assert set(only_selected["chunk_id"]) == chosen
    assert int(out.selected.sum().compute(scheduler="threads")) == len(chosen)
    out.to_parquet(tmp_path / "dask-out", compute_kwargs={"scheduler": "threads"})
    written = pq.read_table(tmp_path / "dask-out", columns=["chunk_id", "selected"])
    written = written.to_pandas(ignore_metadata=True)
    assert set(written.loc[written.selected, "chunk_id"]) == chosen


def test_dashboard_names_never_fail_a_job():
    """Graphs with legacy tuple tasks (as dd.concat and repartition make) keep Dask's task names."""
    from dask.delayed import Delayed
    from dask.highlevelgraph import HighLevelGraph

    from datamask_dask.graph_keys import named

    graph = {("legacy-abc", 0): (sum, [1, 2]), ("legacy-abc", 1): ("legacy-abc", 0)}
    layers = HighLevelGraph({"legacy": graph}, {"legacy": set()})
    parts = [Delayed(("legacy-abc", i), layers, layer="legacy") for i in range(2)]
    renamed = named(parts, "datamask-read")
    assert dask.compute(*renamed, scheduler="sync") == (3, 3)


def test_cudf_frames_are_selected_like_pandas_ones(table):
    cudf = pytest.importorskip("cudf", reason="cuDF is not installed (needs a CUDA GPU)")
    ddf = dd.from_pandas(cudf.from_pandas(table.drop(columns="text")), npartitions=3)
    result = ddf.pipe(datamask_select, ratio=RATIO, **FAST).compute().to_pandas()
    assert len(result) == N
    assert int(result["selected"].sum()) == round(RATIO * N)


def test_two_sets_of_parts_under_one_name_are_computed_together(tmp_path, table):
    """A pushed-down read and a projected one, both named alike: graphs merge by layer, so each
    named set keeps a layer of its own."""
    from datamask_dask import read_parquet
    from datamask_dask.dask_engine.operator import column_reads

    table.drop(columns="text").to_parquet(tmp_path / "t.parquet")
    ddf = read_parquet(tmp_path / "t.parquet")
    columns = list(ddf.columns[:2])
    pushed = column_reads(ddf, columns, "datamask-read")
    projected = column_reads(ddf, columns[::-1], "datamask-read")
    first, second = dask.compute(pushed[0], projected[0], scheduler="sync")
    assert list(first.columns) == columns and list(second.columns) == columns[::-1]
