"""``explain=True``: every row's reason agrees with the selection, on every output (real components)."""

from __future__ import annotations

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from conftest import FAST, unlisted

import datamask_dask
from datamask_dask import datamask_select
from datamask_dask.dedup.simhash import SIGNATURE_BITS
from datamask_dask.dedup.stages import candidate_limit
from datamask_dask.errors import OptionError
from datamask_dask.partition.explain import REASONS

PRUNE = 0.3


def check_reasons(out: pd.DataFrame, *, cosine: float = 0.95, by: str | None = None,
                  part: np.ndarray | None = None) -> pd.Series:
    """Assert that each row's reason agrees with the selection; returns the counts per reason."""
    reason = out["reason"].astype(str)
    assert set(reason) <= set(REASONS) and reason.notna().all()
    counts = reason.value_counts()
    assert counts.sum() == len(out)  # one reason a row
    assert ((reason == "selected") == out["selected"]).all()
    near = (reason == "near-duplicate").to_numpy()
    assert out["duplicate_of"].notna().to_numpy().tolist() == near.tolist()  # named exactly for those
    assert out["similarity"].notna().to_numpy().tolist() == near.tolist()
    quality = out.set_index("chunk_id")["quality_score"]
    rows = out[near]
    if len(rows):
        better = quality.loc[rows["duplicate_of"].astype(np.int64).to_numpy()].to_numpy()
        assert (better >= rows["quality_score"].to_numpy()).all()  # stands behind a row at least as good
        # the signatures' estimate (what explain shows) of a pair the search tried: the exact
        # cosine confirmed it, so the estimate may fall below the threshold, down to the candidates'
        floor = np.cos(np.pi * candidate_limit(cosine, True) / SIGNATURE_BITS)
        assert (rows["similarity"].to_numpy() >= floor - 1e-6).all()
        assert (rows["duplicate_of"] != rows["chunk_id"]).all()
        if by is not None:
            groups = out.set_index("chunk_id")[by]
            assert (groups.loc[rows["duplicate_of"].astype(np.int64)].to_numpy() == rows[by].to_numpy()).all()
    # quality-pruned rows are below every eligible row of their partition and group: the plan's threshold
    part = np.zeros(len(out), dtype=np.int64) if part is None else part
    keys = [part] + ([out[by].to_numpy()] if by else [])
    frame = out.assign(_part=keys[0], _group=keys[1] if by else 0)
    for _, cell in frame.groupby(["_part", "_group"]):
        cell_reason = cell["reason"].astype(str)
        pruned = cell.loc[cell_reason == "quality-pruned", "quality_score"]
        eligible = cell.loc[~cell_reason.isin(["quality-pruned", "near-duplicate"]), "quality_score"]
        if len(pruned) and len(eligible):
            assert pruned.max() <= eligible.min()
    return counts


def _parts(ddf) -> np.ndarray:
    return np.concatenate([np.full(n, i) for i, n in enumerate(ddf.map_partitions(len).compute())])


def test_reasons_agree_with_the_selection_and_leave_it_unchanged(corpus):
    ddf = dd.from_pandas(corpus, npartitions=4, sort=False)
    with dask.config.set(scheduler="sync"):
        plain = datamask_select(ddf, ratio=0.1, prune=PRUNE, **FAST).compute()
        out = datamask_select(ddf, ratio=0.1, prune=PRUNE, explain=True, **FAST).compute()
    assert list(out.columns) == list(plain.columns) + ["reason", "duplicate_of", "similarity"]
    assert list(plain.columns) == list(corpus.columns) + ["selected"]  # nothing changes without explain
    assert np.array_equal(out["selected"].to_numpy(), plain["selected"].to_numpy())
    counts = check_reasons(out, part=_parts(ddf))
    assert counts["selected"] == 160
    assert {"near-duplicate", "quality-pruned", "not-chosen"} <= set(counts.index)
    assert out["duplicate_of"].dtype == pd.ArrowDtype(pa.int64())


def test_groups_token_budgets_and_exhausted_quotas(corpus):
    """Per-group quotas where one group gets nothing (quota-exhausted) and a token budget that runs out."""
    rng = np.random.default_rng(0)
    table = corpus.assign(lang=rng.choice(["en", "fr"], len(corpus)),
                          n_tokens=rng.integers(50, 500, len(corpus)))
    ddf = dd.from_pandas(table, npartitions=4, sort=False)
    with dask.config.set(scheduler="sync"):
        out = datamask_select(ddf, by="lang", ratio={"en": 0.2, "fr": 0.0}, explain=True, **FAST).compute()
        budget = datamask_select(ddf, budget_tokens=40_000, explain=True, max_chunk_rows=100,
                                 **FAST).compute()
    counts = check_reasons(out, by="lang", part=_parts(ddf))
    assert (out.loc[out["lang"] == "fr", "reason"].astype(str).isin(["quota-exhausted", "near-duplicate",
                                                                     "quality-pruned"])).all()
    assert counts["quota-exhausted"] > 0
    check_reasons(budget, part=_parts(ddf))
    assert budget.loc[budget["selected"], "n_tokens"].sum() <= 40_000
    assert set(budget["reason"].astype(str)) >= {"selected", "not-chosen"}


def test_string_ids_and_a_taken_column_name(corpus):
    table = corpus.assign(chunk_id=corpus["chunk_id"].map("doc-{}".format))
    ddf = dd.from_pandas(table, npartitions=2, sort=False)
    out = datamask_select(ddf, ratio=0.1, explain=True, **FAST).compute(scheduler="sync")
    near = out[out["reason"] == "near-duplicate"]
    assert len(near) and near["duplicate_of"].isin(out["chunk_id"]).all()
    assert out["duplicate_of"].dtype == pd.ArrowDtype(pa.string())
    with pytest.raises(OptionError, match="'reason'"):
        datamask_select(ddf.assign(reason="x"), ratio=0.1, explain=True)
    with pytest.raises(OptionError, match="explain='yes'"):
        datamask_select(ddf, ratio=0.1, explain="yes")


def test_partition_scope_has_no_near_duplicates(corpus):
    ddf = dd.from_pandas(corpus, npartitions=4, sort=False)
    out = datamask_select(ddf, ratio=0.1, diversity_scope="partition", explain=True, **FAST).compute(
        scheduler="sync")
    counts = check_reasons(out, part=_parts(ddf))
    assert "near-duplicate" not in counts.index and out["duplicate_of"].isna().all()


def test_the_sharded_search_names_the_same_rows(corpus, monkeypatch):
    """Above ONE_TASK_PARTITIONS the sharded stages link each near-duplicate to the same row."""
    from datamask_dask.dedup import dask_graph, search

    ddf = unlisted(dd.from_pandas(corpus, npartitions=4, sort=False))  # wired by its partitions
    with dask.config.set(scheduler="sync"):
        one = datamask_select(ddf, ratio=0.1, explain=True, **FAST).compute()
        monkeypatch.setattr(search, "ONE_TASK_PARTITIONS", 0)
        monkeypatch.setattr(dask_graph, "LOCAL_ONE_TASK", False)  # the graph a cluster runs
        sharded = datamask_select(ddf, ratio=0.1, explain=True, **FAST).compute()
    pd.testing.assert_frame_equal(one.drop(columns="feature_arr"), sharded.drop(columns="feature_arr"))


def test_parquet_selection_only_and_table_outputs(corpus, parquet_dir, tmp_path):
    ddf = datamask_dask.read_parquet(parquet_dir)
    report = datamask_dask.write_selection(ddf, tmp_path / "out", ratio=0.1, explain=True, **FAST)
    out = pd.read_parquet(tmp_path / "out")
    check_reasons(out)
    assert report.selected == 160 and out["reason"].eq("selected").sum() == 160
    pytest.importorskip("deltalake", reason="Delta needs the lakehouse extra")
    from datamask_dask.run.tables import select_table

    select_table(str(parquet_dir), f"delta://{tmp_path / 'sel'}", 0.1, output_columns="selection",
                 explain=True, **FAST)
    import deltalake

    table = deltalake.DeltaTable(tmp_path / "sel").to_pyarrow_table()
    assert table.column_names == ["chunk_id", "selected", "reason", "duplicate_of", "similarity", "run_id"]
    got = table.to_pandas().set_index("chunk_id").sort_index()
    want = out.set_index("chunk_id").sort_index()
    assert got["reason"].tolist() == want["reason"].astype(str).tolist()


def test_explain_command_tells_a_rows_story(parquet_dir, tmp_path, capsys):
    from datamask_dask.cli import main
    from datamask_dask.report.audit import row_story

    out = tmp_path / "out"
    datamask_dask.write_selection(datamask_dask.read_parquet(parquet_dir), out, ratio=0.1, prune=PRUNE,
                                  explain=True, **FAST)
    frame = pd.read_parquet(out, dtype_backend="pyarrow")
    near = frame[frame["reason"] == "near-duplicate"].iloc[0]
    story = row_story(out, str(near["chunk_id"]))
    assert story["row"]["reason"] == "near-duplicate" and story["row"]["duplicate_of"] == near["duplicate_of"]
    group = story["group"]
    assert group["kept"]["reason"] != "near-duplicate"
    assert all(m["quality"] <= group["kept"]["quality"] for m in group["members"])
    assert story["row"]["text"] == f"document {near['chunk_id']}"
    assert story["partition"]["rows"] == 400 and story["partition"]["quality_rank"] >= 1
    nearest = story["nearest_selected"]
    assert len(nearest) == 3 and [n["cosine"] for n in nearest] == sorted((n["cosine"] for n in nearest),
                                                                          reverse=True)
    assert set(n["id"] for n in nearest) <= set(frame.loc[frame["selected"], "chunk_id"].tolist())
    assert main(["explain", str(out), "--id", str(near["chunk_id"])]) == 0
    printed = capsys.readouterr().out
    assert "near-duplicate" in printed and f"set aside behind row {near['duplicate_of']}" in printed
    assert main(["explain", str(out), "--id", "no-such-row"]) == 1
    assert "--id 'no-such-row'" in capsys.readouterr().err
    plain = tmp_path / "plain"
    datamask_dask.write_selection(datamask_dask.read_parquet(parquet_dir), plain, ratio=0.1, **FAST)
    assert main(["explain", str(plain), "--id", "1"]) == 1
    assert "written without explain" in capsys.readouterr().err


@pytest.mark.parametrize(("pieces", "told"), [
    ("regions", "the learner chose other rows of the pack of its area (pieces=regions"),
    ("partitions", "the learner chose other rows of its chunk")])
def test_a_row_not_chosen_is_told_where_the_learner_met_it(tmp_path, pieces, told):
    """In regions a row is learned with its neighbours from every partition, not in a chunk of its
    partition: its story says so, from the run record's pieces."""
    from datamask_dask.report.audit import format_story, row_story
    from datamask_dask.sample_data import make_corpus

    out = tmp_path / "out"
    frame = dd.from_pandas(make_corpus(6000, 16, seed=2), npartitions=3, sort=False)
    report = datamask_dask.write_selection(frame, out, ratio=0.1, algorithm="Facility", max_chunk_rows=2000,
                                           pieces=pieces, explain=True, scheduler="threads", **FAST)
    assert report.record["pieces"]["cut"] == pieces
    written = pd.read_parquet(out, columns=["chunk_id", "reason"])
    row = written.loc[written["reason"] == "not-chosen", "chunk_id"].iloc[0]
    assert told in format_story(row_story(out, str(row), neighbours=0))


def test_a_selection_only_output_whose_input_is_gone_says_where_it_looked(parquet_dir, tmp_path, capsys):
    import shutil

    from datamask_dask.report.audit import row_story
    from datamask_dask.report.cli import report_command

    shutil.copytree(parquet_dir, tmp_path / "input")
    datamask_dask.select_table(str(tmp_path / "input"), tmp_path / "out", ratio=0.1,
                               output_columns="selection", explain=True, **FAST)
    shutil.rmtree(tmp_path / "input")  # moved or removed since the run
    told = ("is a selection-only output, whose other columns (quality_score, text) are read from its "
            f"input: {tmp_path / 'input'} does not exist (restore the input there, or select with "
            "--output-columns all")
    with pytest.raises(FileNotFoundError) as caught:
        row_story(tmp_path / "out", "7")
    assert told in str(caught.value), caught.value
    assert report_command([str(tmp_path / "out"), "--out", str(tmp_path / "report")]) == 1
    assert told in capsys.readouterr().err


def test_a_selection_only_output_is_explained_and_reported_from_its_input(parquet_dir, tmp_path):
    """A selection-only output holds the id, selected and the reasons: the quality, the text and the
    embeddings are joined back from the input it was selected from, so a row's story is the one an
    output of every column tells, and the report is built."""
    from datamask_dask.report.audit import row_story
    from datamask_dask.report.cli import report_command

    stories = {}
    for columns in ("all", "selection"):
        out = tmp_path / columns
        datamask_dask.select_table(str(parquet_dir), out, ratio=0.1, output_columns=columns, prune=PRUNE,
                                   explain=True, **FAST)
        frame = pd.read_parquet(out, dtype_backend="pyarrow")
        near = frame[frame["reason"] == "near-duplicate"].iloc[0]["chunk_id"]
        stories[columns] = row_story(out, str(near)), row_story(out, "7")
    assert "quality_score" not in pd.read_parquet(tmp_path / "selection").columns
    assert stories["selection"] == stories["all"]
    assert stories["selection"][0]["row"]["text"].startswith("document ")
    assert len(stories["selection"][1]["nearest_selected"]) == 3
    assert report_command([str(tmp_path / "selection"), "--out", str(tmp_path / "report")]) == 0
