"""The operator on a LocalCUDACluster with cuDF partitions (GPU machines with RAPIDS only).

The same checks as on CPU: exact count, rows and columns unchanged, quotas follow quality, groups,
token budgets, determinism, and bad input reported by partition.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from conftest import FAST

pytestmark = pytest.mark.gpu

cudf = pytest.importorskip("cudf")
dask_cudf = pytest.importorskip("dask_cudf")
pytest.importorskip("dask_cuda")
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no GPU", allow_module_level=True)

import dask.dataframe as dd  # noqa: E402

from datamask_dask import datamask_select, get_client  # noqa: E402
from datamask_dask.errors import InputDataError  # noqa: E402


@pytest.fixture(scope="module")
def cuda_client():
    client = get_client("cuda", n_workers=1, set_as_default=False, dashboard_address=":0",
                        rmm_pool_size="1GB")
    yield client
    client.shutdown()


def _to_cudf(frame):
    """A pandas corpus frame as cuDF, embeddings as a cuDF list column."""
    table = pa.Table.from_pandas(frame, preserve_index=False).replace_schema_metadata(None)
    for name in table.column_names:
        column = table.column(name)
        if pa.types.is_fixed_size_list(column.type):
            column = column.cast(pa.list_(column.type.value_type))
        elif pa.types.is_large_string(column.type):
            column = column.cast(pa.string())
        table = table.set_column(table.schema.get_field_index(name), name, column)
    return cudf.DataFrame.from_arrow(table)


def _gpu_frame(frame, npartitions):
    return dask_cudf.from_cudf(_to_cudf(frame), npartitions=npartitions, sort=False)


def test_cudf_partitions_exact_count_and_unchanged_rows(cuda_client, corpus):
    ddf = _gpu_frame(corpus, 4)
    result = datamask_select(ddf, ratio=0.1, score_column="score", diversity_scope="partition",
                             **FAST).compute(scheduler=cuda_client)
    assert isinstance(result, cudf.DataFrame)
    host = result.to_pandas()
    assert list(host.columns) == [*corpus.columns, "selected", "score"]
    assert host["chunk_id"].tolist() == corpus["chunk_id"].tolist()
    np.testing.assert_array_equal(host["quality_score"].to_numpy(), corpus["quality_score"].to_numpy())
    assert host["selected"].dtype == bool and int(host["selected"].sum()) == 160
    assert np.isfinite(host["score"].to_numpy()).all()


def test_cudf_quotas_follow_quality(cuda_client, corpus):
    frame = corpus.copy()
    frame.loc[frame.index < 800, "quality_score"] *= 0.05
    out = datamask_select(_gpu_frame(frame, 2), ratio=0.1, **FAST)
    result = out.compute(scheduler=cuda_client).to_pandas()
    low, high = result["selected"].iloc[:800].sum(), result["selected"].iloc[800:].sum()
    assert low + high == 160 and low < 0.2 * high


def test_cudf_groups_and_budget(cuda_client, corpus):
    rng = np.random.default_rng(5)
    frame = corpus.assign(language=np.where(rng.random(len(corpus)) < 0.3, "de", "en"),
                          n_tokens=rng.integers(20, 400, len(corpus)))
    ddf = _gpu_frame(frame, 3)
    counts = frame["language"].value_counts()
    result = datamask_select(ddf, ratio=0.1, by="language", **FAST).compute(scheduler=cuda_client).to_pandas()
    per_group = result.groupby("language")["selected"].sum().to_dict()
    assert per_group == {g: round(0.1 * n) for g, n in counts.items()}
    budget = int(0.1 * frame["n_tokens"].sum())
    result = datamask_select(ddf, budget_tokens=budget, **FAST).compute(scheduler=cuda_client).to_pandas()
    used = result.loc[result["selected"], "n_tokens"].sum()
    assert budget - 3 * 400 <= used <= budget


def test_cudf_determinism(cuda_client, corpus):
    ddf = _gpu_frame(corpus, 4)
    out = datamask_select(ddf, ratio=0.1, seed=3, **FAST)
    first = out.compute(scheduler=cuda_client).to_pandas()["selected"].to_numpy()
    again = out.compute(scheduler=cuda_client).to_pandas()["selected"].to_numpy()
    local = out.compute(scheduler="sync").to_pandas()["selected"].to_numpy()
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(first, local)


def test_pandas_partitions_on_the_gpu(cuda_client, corpus):
    ddf = dd.from_pandas(corpus, npartitions=2, sort=False)
    result = datamask_select(ddf, ratio=0.1, device="cuda", **FAST).compute(scheduler=cuda_client)
    assert int(result["selected"].sum()) == 160


def test_cudf_bad_input_names_the_partition(cuda_client, corpus):
    frame = corpus.copy()
    frame.loc[900, "quality_score"] = np.nan
    with pytest.raises(InputDataError, match="partition 2: quality column 'quality_score'"):
        datamask_select(_gpu_frame(frame, 4), ratio=0.1, **FAST).compute(scheduler=cuda_client)
    ragged = cudf.DataFrame({"chunk_id": [0, 1, 2], "quality_score": [0.1, 0.5, 0.9],
                             "feature_arr": [[1.0, 0.0], [0.0, 1.0, 0.5], [1.0, 1.0]]})
    with pytest.raises(InputDataError, match="partition 0: embedding column 'feature_arr' is ragged"):
        datamask_select(dask_cudf.from_cudf(ragged, npartitions=1), ratio=0.5,
                        **FAST).compute(scheduler=cuda_client)


def test_cudf_reader_takes_fixed_size_lists_and_keeps_files_in_order(cuda_client, corpus, parquet_dir):
    """dask-cudf's reader rejects fixed_size_list<float>[d]; the package's cuDF reader does not."""
    from datamask_dask import read_parquet

    ddf = read_parquet(parquet_dir, backend="cudf")
    assert ddf.npartitions == 4
    result = datamask_select(ddf, ratio=0.1, **FAST).compute(scheduler=cuda_client)
    assert isinstance(result, cudf.DataFrame)
    host = result.to_pandas()
    assert host["chunk_id"].tolist() == corpus["chunk_id"].tolist()  # partition i is file i, in order
    assert int(host["selected"].sum()) == 160


def test_cudf_write_selection_end_to_end(cuda_client, corpus, parquet_dir, tmp_path):
    """Read, select and write on the GPU (cuDF's writer), then read back on the host."""
    import pyarrow.parquet as pq

    from datamask_dask import read_parquet, write_selection

    report = write_selection(read_parquet(parquet_dir, backend="cudf"), tmp_path / "out", ratio=0.1,
                             scheduler=cuda_client, **FAST)
    table = pq.read_table(tmp_path / "out")
    assert report.rows == table.num_rows == len(corpus) and report.selected == 160
    assert sorted(table.column("chunk_id").to_pylist()) == corpus["chunk_id"].tolist()
    assert report.record["profile"] == "gpu"



def test_cudf_selection_only_table_is_read_on_the_gpu(cuda_client, corpus, parquet_dir, tmp_path):
    """The selection-only output reads a parquet input with cuDF's reader (backend="cudf"), and selects the
    rows that the job writing every column selects from the same cuDF partitions."""
    import pyarrow.parquet as pq

    from datamask_dask import read_parquet, write_selection
    from datamask_dask.io.tables import read_table
    from datamask_dask.run.tables import select_table

    assert isinstance(read_table(str(parquet_dir), backend="cudf").frame._meta, cudf.DataFrame)
    select_table(str(parquet_dir), str(tmp_path / "selection"), 0.1, output_columns="selection",
                 backend="cudf", scheduler=cuda_client, **FAST)
    write_selection(read_parquet(parquet_dir, backend="cudf"), tmp_path / "all", ratio=0.1,
                    scheduler=cuda_client, **FAST)
    tables = {name: pq.read_table(tmp_path / name) for name in ("selection", "all")}
    assert tables["selection"].column_names == ["chunk_id", "selected", "run_id"]
    chosen = {name: sorted(t.filter(t.column("selected")).column("chunk_id").to_pylist())
              for name, t in tables.items()}
    assert len(chosen["selection"]) == 160 and chosen["selection"] == chosen["all"]


def test_cudf_selection_does_not_depend_on_worker_threads(cuda_client, corpus, parquet_dir, tmp_path):
    """A GPU worker with several threads (reads and writes beside the learner) selects the same rows,
    its packs learned where their members' rows are, on the GPU."""
    import pyarrow.parquet as pq

    from datamask_dask import read_parquet, write_selection

    threaded = get_client("cuda", n_workers=1, threads_per_worker=4, set_as_default=False,
                          dashboard_address=":0", rmm_pool_size="1GB")
    try:
        selected = {}
        for name, client in (("one", cuda_client), ("four", threaded)):
            report = write_selection(read_parquet(parquet_dir, backend="cudf"), tmp_path / name, ratio=0.1,
                                     scheduler=client, **FAST)
            assert report.record["stages"].get("learn", 0) > 0
            table = pq.read_table(tmp_path / name)
            selected[name] = sorted(table.filter(table.column("selected")).column("chunk_id").to_pylist())
    finally:
        threaded.shutdown()
    assert len(selected["one"]) == 160 and selected["one"] == selected["four"]

def test_cudf_partitions_explain_every_row(cuda_client, corpus):
    """explain=True on cuDF partitions: a reason for every row, agreeing with the selection."""
    result = datamask_select(_gpu_frame(corpus, 4), ratio=0.1, prune=0.3, explain=True, **FAST).compute(
        scheduler=cuda_client)
    assert isinstance(result, cudf.DataFrame)
    got = result.to_pandas()
    assert list(got.columns)[-3:] == ["reason", "duplicate_of", "similarity"]
    reason = got["reason"].astype(str)
    assert ((reason == "selected") == got["selected"]).all() and got["selected"].sum() == 160
    near = reason == "near-duplicate"
    assert near.any() and (got["duplicate_of"].notna() == near).all()
    quality = got.set_index("chunk_id")["quality_score"]
    better = quality.loc[got.loc[near, "duplicate_of"].astype("int64").to_numpy()].to_numpy()
    assert (better >= got.loc[near, "quality_score"].to_numpy()).all()


def test_facility_learns_the_same_mask_on_every_gpu_run():
    """Facility's gains add into indexed places: with CUDA's atomics their float sums, hence the mask,
    changed from run to run; sorted sums (datamask_dask.learn.sums) give the same bits each time."""
    from datamask_dask.learn import learn_mask
    from datamask_dask.learn.sums import add_at_columns, add_at_rows

    generator = torch.Generator(device="cuda").manual_seed(0)
    target = torch.zeros(4, 1000, device="cuda")
    index = torch.randint(0, 1000, (4, 200_000), device="cuda", generator=generator)
    values = torch.rand(4, 200_000, device="cuda", generator=generator)
    sums = [add_at_columns(target.clone(), index, values) for _ in range(3)]
    assert all(torch.equal(sums[0], other) for other in sums[1:])
    torch.testing.assert_close(sums[0], target.clone().scatter_add_(1, index, values))
    rows = add_at_rows(torch.zeros(1000, 8, device="cuda"), index[0], values[:, :, None].expand(-1, -1, 8)[0])
    torch.testing.assert_close(rows, torch.zeros(1000, 8, device="cuda").index_add_(
        0, index[0], values[:, :, None].expand(-1, -1, 8)[0]))

    rng = np.random.default_rng(3)
    embeddings = rng.standard_normal((20_000, 64)).astype(np.float32)
    quality = rng.random(20_000)
    masks = [learn_mask(quality, embeddings, 2000, algorithm="Facility", n_epochs=20, seed=1,
                        device="cuda") for _ in range(2)]
    np.testing.assert_array_equal(masks[0].mask, masks[1].mask)
    np.testing.assert_array_equal(masks[0].scores, masks[1].scores)
