"""The Dask operator on a real LocalCluster (worker processes) and on the local schedulers."""

from __future__ import annotations

import os

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch
from conftest import FAST

from datamask_dask import datamask_select, get_client, load_config
from datamask_dask.config import METRIC_DEFAULTS
from datamask_dask.errors import DataMaskWarning, InputDataError, OptionError
from datamask_dask.sample_data import make_corpus


def _from_frames(frames: list[pd.DataFrame]) -> dd.DataFrame:
    """A dask DataFrame whose partitions are exactly ``frames`` (empty ones included)."""
    with dask.config.set({"dataframe.convert-string": False}):  # keep object columns of arrays as they are
        return dd.from_map(lambda i: frames[i], range(len(frames)), meta=frames[0].iloc[:0],
                           enforce_metadata=False)


def _from_pandas(frame: pd.DataFrame, npartitions: int) -> dd.DataFrame:
    """``dd.from_pandas`` that keeps object columns of arrays (Dask would turn them into text)."""
    with dask.config.set({"dataframe.convert-string": False}):
        return dd.from_pandas(frame, npartitions=npartitions, sort=False)


def _object_embeddings(frame: pd.DataFrame) -> pd.DataFrame:
    """The same frame with embeddings as an object column of numpy arrays (the fallback format)."""
    vectors = np.asarray(frame["feature_arr"].array.__arrow_array__().combine_chunks().flatten())
    d = vectors.size // max(len(frame), 1)
    column = pd.Series(list(vectors.reshape(len(frame), d)), index=frame.index, dtype=object)
    return frame.assign(feature_arr=column)


def _selected(out, scheduler="sync") -> np.ndarray:
    return out.compute(scheduler=scheduler)["selected"].to_numpy()


# ------------------------------------------------------------------ contract: rows, columns, count


def test_exact_count_and_rows_columns_unchanged_on_cluster(client, parquet_dir):
    ddf = dd.read_parquet(parquet_dir, dtype_backend="pyarrow")
    out = datamask_select(ddf, ratio=0.1, **FAST)
    assert isinstance(out, dd.DataFrame) and out.npartitions == ddf.npartitions  # lazy, same partitions
    result = out.compute(scheduler=client)
    expected = ddf.compute(scheduler="sync")
    assert list(result.columns) == [*expected.columns, "selected"]
    assert result["selected"].dtype == bool
    pd.testing.assert_frame_equal(result.drop(columns="selected"), expected)
    assert int(result["selected"].sum()) == round(0.1 * len(expected))


def test_pipe_is_the_same_as_a_direct_call(corpus):
    ddf = dd.from_pandas(corpus, npartitions=3, sort=False)
    direct = _selected(datamask_select(ddf, ratio=0.2, **FAST), "threads")
    piped = _selected(ddf.pipe(datamask_select, ratio=0.2, **FAST), "threads")
    np.testing.assert_array_equal(direct, piped)


def test_object_column_embeddings_give_the_same_selection(corpus):
    arrow = dd.from_pandas(corpus, npartitions=3, sort=False)
    objects = _from_pandas(_object_embeddings(corpus), npartitions=3)
    assert objects["feature_arr"].dtype == object
    np.testing.assert_array_equal(_selected(datamask_select(arrow, ratio=0.1, **FAST)),
                                  _selected(datamask_select(objects, ratio=0.1, **FAST)))


def test_default_parquet_read_gives_object_embeddings_and_works(parquet_dir):
    ddf = dd.read_parquet(parquet_dir)  # no Arrow dtypes: embeddings arrive as numpy arrays
    out = datamask_select(ddf, ratio=0.05, **FAST)
    result = out.compute(scheduler="threads")
    assert int(result["selected"].sum()) == round(0.05 * len(result))
    # the embeddings come back as the arrays they were read as, not as their text
    assert out.dtypes.drop("selected").equals(ddf.dtypes) and result["feature_arr"].dtype == object
    pd.testing.assert_frame_equal(result.drop(columns="selected"), ddf.compute(scheduler="sync"))


def test_score_column_and_index_preserved(corpus):
    frame = corpus.set_index(corpus.index * 10 + 7)
    result = datamask_select(dd.from_pandas(frame, npartitions=2, sort=False), ratio=0.1,
                             score_column="datamask_score", final="topk", diversity_scope="partition",
                             **FAST).compute(scheduler="sync")
    assert result.index.equals(frame.index)
    scores = result["datamask_score"]
    assert scores.dtype == np.float32 and np.isfinite(scores).all()  # every row was learned
    # with final='topk' the mask is the top-k of the scores: the score column is aligned with the rows
    first = result.iloc[:800]
    k = int(first["selected"].sum())
    assert set(first["datamask_score"].nlargest(k).index) == set(first.index[first["selected"]])


# ------------------------------------------------------------------ quotas across partitions


def _skewed(corpus: pd.DataFrame) -> pd.DataFrame:
    frame = corpus.copy()
    frame.loc[frame.index < 800, "quality_score"] *= 0.05  # first half: uniformly poor rows
    return frame


def test_partition_of_low_quality_rows_gets_fewer(client, corpus):
    ddf = dd.from_pandas(_skewed(corpus), npartitions=2, sort=False)
    result = datamask_select(ddf, ratio=0.1, **FAST).compute(scheduler=client)
    low, high = result["selected"].iloc[:800].sum(), result["selected"].iloc[800:].sum()
    assert low + high == 160
    assert low < 0.2 * high


def test_random_partitions_get_shares_by_size(corpus):
    shuffled = corpus.sample(frac=1.0, random_state=0)
    frames = [shuffled.iloc[:400], shuffled.iloc[400:1600]]
    out = datamask_select(_from_frames(frames), ratio=0.1, oversample=4.0, **FAST)
    result = out.compute(scheduler="sync")
    first = int(result["selected"].iloc[:400].sum())
    assert result["selected"].sum() == 160
    assert 25 <= first <= 55  # about a quarter


def test_prune_is_table_wide(corpus):
    frame = _skewed(corpus)
    result = datamask_select(dd.from_pandas(frame, npartitions=2, sort=False), ratio=0.1, prune=0.5,
                             score_column="s", **FAST).compute(scheduler="sync")
    threshold = np.sort(frame["quality_score"].to_numpy())[::-1][799]  # the best 800 rows stay eligible
    chosen = result.loc[result["selected"], "quality_score"]
    assert len(chosen) == 160 and (chosen >= threshold).all()
    pruned = result["quality_score"] < threshold
    assert np.isneginf(result.loc[pruned, "s"]).all()


def test_partitions_above_the_sketch_size_still_give_an_exact_count():
    frame = make_corpus(6000, 8, seed=4)  # 3000-row partitions: the plan works from binned sketches
    frame["quality_score"] *= np.repeat([0.5, 1.0], 3000)
    out = datamask_select(dd.from_pandas(frame, npartitions=2, sort=False), ratio=0.1, prune=0.2, **FAST)
    selected = out.compute(scheduler="threads")["selected"].to_numpy()
    assert selected.sum() == 600 and selected[:3000].sum() < selected[3000:].sum()
    threshold = np.quantile(frame["quality_score"], 0.2)  # about the table-wide prune line
    assert np.quantile(frame["quality_score"].to_numpy()[selected], 0.01) > 0.9 * threshold


def test_large_partitions_are_learned_in_chunks(corpus):
    ddf = dd.from_pandas(corpus, npartitions=2, sort=False)
    result = datamask_select(ddf, ratio=0.15, max_chunk_rows=150, **FAST).compute(scheduler="threads")
    assert int(result["selected"].sum()) == 240


@pytest.mark.parametrize("options", [
    {"algorithm": "Facility"},
    {"by": "language", "algorithm": "Pair_simi"},
    {"budget_tokens": 40_000, "algorithm": "Pair_simi"},
], ids=["Facility", "by group", "token budget"])
def test_small_partitions_select_as_the_table_in_one_partition(corpus, options):
    """In table scope, partitions whose eligible rows fit in one chunk together are learned as one: the
    rows, scores and reasons are those of the same table in one partition, however it is split."""
    frame = _with_groups_and_tokens(corpus)
    chosen = {"ratio": 0.1} if "budget_tokens" not in options else {}
    outputs = [datamask_select(_from_pandas(frame, npartitions), **chosen, **options, score_column="score",
                               explain=True, **FAST).compute(scheduler="sync")
               for npartitions in (1, 5)]
    one, five = (out.reset_index(drop=True) for out in outputs)
    assert one["selected"].any()
    pd.testing.assert_frame_equal(one[["selected", "score", "reason", "duplicate_of"]],
                                  five[["selected", "score", "reason", "duplicate_of"]])
    apart = datamask_select(_from_pandas(frame, 5), **chosen, **options, max_chunk_rows=320,
                            **FAST).compute(scheduler="sync")  # 320-row partitions learned apart
    assert not np.array_equal(apart["selected"].to_numpy(), five["selected"].to_numpy())


def test_a_pack_of_partitions_with_and_without_near_duplicates():
    """Only the second partition holds near-copies (its kept row stands for two): packed, the rows
    weigh as in the table in one partition."""
    frame = make_corpus(800, 64, seed=7, duplicate_share=0.0)
    vectors = np.stack(frame["feature_arr"].to_numpy())
    vectors[700] = vectors[600] + 1e-3  # a near-copy within the second half
    frame = frame.assign(feature_arr=pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), 64))
    one, two = (datamask_select(_from_pandas(frame, n), ratio=0.1, algorithm="Facility", score_column="score",
                                **FAST).compute(scheduler="sync") for n in (1, 2))
    np.testing.assert_array_equal(one["score"].to_numpy(), two["score"].to_numpy())
    assert np.flatnonzero(np.isneginf(two["score"].to_numpy())).tolist() in ([600], [700])


def test_a_packs_seconds_and_curves_are_its_own_and_counted_once(corpus, tmp_path):
    """learn_pack returns what learning the pack measured with the pack, not with a member: a member's
    selection does not count it, and the run record counts it once however many members took it."""
    from datamask_dask.dask_engine.operator import partitions, plan_selection
    from datamask_dask.partition.select import learn_pack, pack_rows, select_partition
    from datamask_dask.run.selection import write_selection
    from datamask_dask.telemetry import Measures

    ddf = _from_pandas(corpus, 4)
    spec, plan = plan_selection(ddf, ratio=0.1, **FAST)
    plan = plan.compute(scheduler="sync")
    assert [pack.partitions for pack in plan.packs] == [(0, 1, 2, 3)]
    frames = [part.compute(scheduler="sync") for part in partitions(ddf)]
    pieces = [pack_rows(frame, plan, {"number": number}) for number, frame in enumerate(frames)]
    learned = learn_pack(pieces, plan, 0)
    assert learned.index == 0 and sorted(learned.parts) == [0, 1, 2, 3]
    assert learned.measures.stages["learn"] > 0 and learned.measures.curves
    measures = Measures()
    select_partition(frames[2], plan, {"number": 2}, [learned], measures)
    assert "learn" not in measures.stages and not measures.curves  # the pack's are not the member's
    record = write_selection(ddf, tmp_path / "out", 0.1, scheduler="threads", **FAST).record
    chunks = [curve["chunk"] for curve in record["summary"]["curves"]]
    assert chunks.count("partitions 0-3") == 1 and record["stages"]["learn"] > 0


def test_dask_counts_the_rows_waiting_for_their_pack_by_their_arrays(corpus):
    """A partition's routed rows wait in a worker's memory until their pack runs: Dask's memory manager
    sees their embeddings' bytes (and can spill them), not a dataclass of a few hundred bytes."""
    from dask.sizeof import sizeof

    from datamask_dask.dask_engine.operator import partitions, plan_selection
    from datamask_dask.partition.select import pack_rows

    ddf = _from_pandas(corpus, 4)
    plan = plan_selection(ddf, ratio=0.1, **FAST)[1].compute(scheduler="sync")
    piece = pack_rows(partitions(ddf)[1].compute(scheduler="sync"), plan, {"number": 1})
    rows = piece[0]
    assert rows.embeddings.nbytes > 10_000
    assert sizeof(rows) >= rows.embeddings.nbytes + rows.positions.nbytes
    assert sizeof(piece) >= rows.embeddings.nbytes


def test_the_readers_seconds_ride_with_the_frame_and_are_counted_where_it_is_used(tmp_path):
    """The package's reader leaves each partition's read seconds on the frame; the selection counts them
    into its stages and takes them off, so the rows it returns carry nothing of it."""
    from datamask_dask import read_parquet
    from datamask_dask.io.sinks import write_parquet
    from datamask_dask.run.selection import write_selection
    from datamask_dask.telemetry import READ

    write_parquet(dd.from_pandas(make_corpus(2000, 16, seed=1), npartitions=2, sort=False), tmp_path / "in")
    frame = read_parquet(tmp_path / "in").partitions[0].compute(scheduler="sync")
    assert frame.attrs[READ] > 0
    selection = datamask_select(read_parquet(tmp_path / "in"), ratio=0.1, **FAST)
    out = selection.partitions[0].compute(scheduler="sync")
    assert READ not in out.attrs and out["selected"].sum() > 0
    record = write_selection(read_parquet(tmp_path / "in"), tmp_path / "out", 0.1, scheduler="threads",
                             **FAST).record
    assert record["stages"]["read"] > 0 and record["stages"]["plan read"] > 0


def test_a_pack_learns_its_members_tensors_where_they_are(corpus):
    """A GPU partition's members hand their rows to the pack as torch tensors, which stay on the device
    (no copy to the host and back): the pack learns from them exactly what it learns from numpy rows."""
    import dataclasses

    import torch

    from datamask_dask.dask_engine.operator import partitions, plan_selection
    from datamask_dask.partition.select import learn_pack, pack_rows

    ddf = _from_pandas(corpus, 3)
    plan = plan_selection(ddf, ratio=0.1, score_column="score", **FAST)[1].compute(scheduler="sync")
    pieces = [pack_rows(part.compute(scheduler="sync"), plan, {"number": number})
              for number, part in enumerate(partitions(ddf))]
    tensors = [{group: dataclasses.replace(rows, embeddings=torch.from_numpy(rows.embeddings))
                for group, rows in piece.items()} for piece in pieces]
    on_host, as_tensors = learn_pack(pieces, plan, 0).parts, learn_pack(tensors, plan, 0).parts
    assert list(on_host) == list(as_tensors) == [0, 1, 2]
    for member, part in on_host.items():
        np.testing.assert_array_equal(part.picked, as_tensors[member].picked)
        np.testing.assert_array_equal(part.positions, as_tensors[member].positions)  # with a score column
        np.testing.assert_array_equal(part.scores, as_tensors[member].scores)


def test_facility_chunks_hold_a_number_of_rows_and_of_embedding_values(corpus):
    """A chunk holds no more rows than max_chunk_rows and max_chunk_values (rows x dimension) allow:
    Facility's default chunk holds fewer rows at a high dimension, and the other metrics count rows."""
    from datamask_dask.config import resolve_options
    from datamask_dask.dask_engine.operator import make_spec

    ddf = _from_pandas(corpus, 5)  # 320-row partitions of 16-d rows

    def chunk(dim, config=None, **options):
        options = resolve_options(config, ratio=0.1, algorithm="Facility", **options)
        return make_spec(ddf, options).chunk_rows(dim)

    assert (chunk(64), chunk(768), chunk(1536)) == (100_000, 100_000, 50_000)
    assert chunk(64, max_chunk_rows=500) == 500
    assert chunk(768, max_chunk_rows=200_000) == 100_000  # each cap holds
    assert chunk(768, {"max_chunk_values": None}, max_chunk_rows=200_000) == 200_000  # and None lifts one
    assert chunk(768, "gpu") == chunk(768, "reference") == 1_000_000  # as those profiles say
    assert make_spec(ddf, resolve_options(ratio=0.1)).chunk_rows(64) == load_config()["max_chunk_rows"]
    with pytest.raises(OptionError, match="max_chunk_rows and max_chunk_values are both None"):
        resolve_options({"max_chunk_values": None, "max_chunk_rows": None}, algorithm="Facility", ratio=0.1)

    def scores(frame, **chunking):
        out = datamask_select(frame, ratio=0.1, algorithm="Facility", score_column="score", **chunking,
                              **FAST)
        return out.compute(scheduler="sync")["score"].to_numpy()

    apart = scores(ddf, max_chunk_values=320 * 16)  # a chunk of 320 rows: no two partitions pack
    np.testing.assert_array_equal(apart, scores(ddf, max_chunk_rows=320))
    together = scores(ddf, max_chunk_values=1600 * 16)  # the whole table packs
    np.testing.assert_array_equal(together, scores(_from_pandas(corpus, 1), max_chunk_rows=1600))
    assert not np.array_equal(apart, together)


def test_weighted_quality_columns(corpus):
    rng = np.random.default_rng(0)
    frame = corpus.assign(a=rng.random(len(corpus)), b=rng.random(len(corpus)))
    frame = frame.assign(combined=0.7 * frame["a"] + 0.3 * frame["b"])
    ddf = dd.from_pandas(frame, npartitions=2, sort=False)
    weighted = _selected(datamask_select(ddf, ratio=0.1, quality={"a": 0.7, "b": 0.3}, **FAST))
    single = _selected(datamask_select(ddf, ratio=0.1, quality_column="combined", **FAST))
    np.testing.assert_array_equal(weighted, single)


# ------------------------------------------------------------------ groups and token budgets


def _with_groups_and_tokens(corpus: pd.DataFrame) -> pd.DataFrame:
    rng = np.random.default_rng(5)
    language = np.where(rng.random(len(corpus)) < 0.3, "de", "en")
    return corpus.assign(language=language, n_tokens=rng.integers(20, 400, len(corpus)))


def test_per_group_quotas(client, corpus):
    frame = _with_groups_and_tokens(corpus)
    ddf = dd.from_pandas(frame, npartitions=3, sort=False)
    counts = frame["language"].value_counts()
    result = datamask_select(ddf, ratio=0.1, by="language", **FAST).compute(scheduler=client)
    per_group = result.groupby("language")["selected"].sum()
    assert per_group.to_dict() == {g: round(0.1 * n) for g, n in counts.items()}
    out = datamask_select(ddf, ratio={"de": 0.3, "en": 0.05}, by="language", **FAST)
    result = out.compute(scheduler="sync")
    per_group = result.groupby("language")["selected"].sum()
    assert per_group.to_dict() == {"de": round(0.3 * counts["de"]), "en": round(0.05 * counts["en"])}
    with pytest.warns(DataMaskWarning, match=r"ratio names group\(s\) 'fr' that no row's 'language' holds"):
        absent = datamask_select(ddf, ratio={"de": 0.3, "fr": 0.2}, by="language", **FAST)  # no row is "fr"
    per_group = absent.compute(scheduler="sync").groupby("language")["selected"].sum()
    assert per_group.to_dict() == {"de": round(0.3 * counts["de"]), "en": 0}


def test_a_ratio_that_takes_no_row_is_told_at_the_call(corpus):
    """What a run logs before it selects, the frame door warns at the user's line: a by column too fine
    to take rows from, and a table too small for its ratio."""
    ddf = dd.from_pandas(corpus.iloc[:400].assign(page=np.arange(400) // 2), npartitions=2, sort=False)
    with pytest.warns(DataMaskWarning, match="by='page' cuts the table into 200 groups") as caught:
        datamask_select(ddf, ratio=0.1, by="page", **FAST)
    assert caught[0].filename == __file__
    with pytest.warns(DataMaskWarning, match="ratio 0.1 of the table's 4 eligible row"):
        out = datamask_select(ddf.partitions[0].head(4, npartitions=1, compute=False), ratio=0.1, **FAST)
    assert not out["selected"].compute(scheduler="sync").any()


def test_token_budget(client, corpus):
    frame = _with_groups_and_tokens(corpus)
    ddf = dd.from_pandas(frame, npartitions=4, sort=False)
    budget = int(0.1 * frame["n_tokens"].sum())
    result = datamask_select(ddf, budget_tokens=budget, **FAST).compute(scheduler=client)
    used = int(result.loc[result["selected"], "n_tokens"].sum())
    assert used <= budget
    assert used >= budget - 4 * frame["n_tokens"].max()  # short by less than a row per partition
    chunked = datamask_select(ddf, budget_tokens=budget, max_chunk_rows=120, **FAST).compute(scheduler="sync")
    assert budget - 4 * 400 <= chunked.loc[chunked["selected"], "n_tokens"].sum() <= budget


def test_token_budget_per_group(corpus):
    frame = _with_groups_and_tokens(corpus)
    ddf = dd.from_pandas(frame, npartitions=2, sort=False)
    budgets = {"de": 5000, "en": 20000}
    result = datamask_select(ddf, by="language", budget_tokens=budgets, **FAST).compute(scheduler="sync")
    used = result[result["selected"]].groupby("language")["n_tokens"].sum()
    for group, budget in budgets.items():
        assert budget - 2 * 400 <= used[group] <= budget


# ------------------------------------------------------------------ determinism


@pytest.mark.slow
def test_same_selection_on_every_scheduler_and_worker_count(client, corpus):
    ddf = dd.from_pandas(_with_groups_and_tokens(corpus), npartitions=4, sort=False)
    out = datamask_select(ddf, ratio=0.1, seed=11, score_column="score", **FAST)
    reference = out.compute(scheduler="sync")
    runs = {"threads": out.compute(scheduler="threads"), "2 workers": out.compute(scheduler=client)}
    # A second LocalCluster, started by the package's own helper: 1 worker with 2 threads.
    with get_client("cpu", n_workers=1, threads_per_worker=2, memory_limit="2GiB", set_as_default=False,
                    dashboard_address=":0") as one:
        threads = one.run(lambda: (torch.get_num_threads(), os.environ["OMP_NUM_THREADS"]))
        assert list(threads.values()) == [(2, "2")]  # BLAS and torch threads follow threads_per_worker
        malloc = one.run(lambda: os.environ.get("MALLOC_MMAP_THRESHOLD_"))  # see cluster.py
        assert list(malloc.values()) == [str(32 * 2**20)]
        runs["1 worker"] = out.compute(scheduler=one)
    for name, run in runs.items():
        np.testing.assert_array_equal(run["selected"].to_numpy(), reference["selected"].to_numpy(),
                                      err_msg=name)
        np.testing.assert_array_equal(run["score"].to_numpy(), reference["score"].to_numpy(), err_msg=name)
    again = datamask_select(ddf, ratio=0.1, seed=11, **FAST).compute(scheduler="threads")
    np.testing.assert_array_equal(again["selected"].to_numpy(), reference["selected"].to_numpy())
    other_seed = datamask_select(ddf, ratio=0.1, seed=12, score_column="score", **FAST)
    other_seed = other_seed.compute(scheduler="threads")
    assert other_seed["selected"].sum() == reference["selected"].sum()
    assert (other_seed["score"] != reference["score"]).any()  # another learning run, which may agree on rows


@pytest.mark.slow
def test_workers_share_the_machine_memory_evenly():
    """Fewer workers than cores get the memory the others would have had (Dask's "auto" leaves it idle)."""
    from distributed.system import MEMORY_LIMIT

    with get_client("cpu", n_workers=1, set_as_default=False, dashboard_address=":0") as one:
        (worker,) = one.scheduler_info()["workers"].values()
        assert worker["memory_limit"] == MEMORY_LIMIT


# ------------------------------------------------------------------ small and odd partitions


def test_empty_and_one_row_partitions(client, corpus):
    frames = [corpus.iloc[a:b] for a, b in ((0, 0), (0, 1), (1, 500), (500, 500), (500, 502))]
    ddf = _from_frames(frames)
    result = datamask_select(ddf, ratio=0.1, **FAST).compute(scheduler=client)
    assert result["chunk_id"].tolist() == corpus["chunk_id"].iloc[:502].tolist()
    assert int(result["selected"].sum()) == round(0.1 * 502)
    out = datamask_select(ddf, ratio=0.1, **FAST)
    parts = [out.get_partition(i).compute(scheduler="sync") for i in (0, 3)]
    assert all(len(p) == 0 and "selected" in p.columns for p in parts)
    one = dd.from_pandas(corpus.iloc[:1], npartitions=1)
    with pytest.warns(DataMaskWarning, match="is no row"):  # quota 0
        assert not datamask_select(one, ratio=0.1, **FAST).compute(scheduler="sync")["selected"].any()
    assert datamask_select(one, ratio=1.0, **FAST).compute(scheduler="sync")["selected"].all()


def test_everything_empty():
    empty = dd.from_pandas(make_corpus(10, 4).iloc[:0], npartitions=1)
    result = datamask_select(empty, ratio=0.5).compute(scheduler="sync")
    assert len(result) == 0 and list(result.columns)[-1] == "selected"


def test_string_ids(client, corpus):
    frame = corpus.assign(chunk_id=[f"doc-{i:05d}" for i in range(len(corpus))])
    result = datamask_select(dd.from_pandas(frame, npartitions=3, sort=False), ratio=0.1,
                             **FAST).compute(scheduler=client)
    assert result["chunk_id"].tolist() == frame["chunk_id"].tolist()
    assert int(result["selected"].sum()) == 160


# ------------------------------------------------------------------ bad input


def test_a_pandas_frame_is_told_to_be_wrapped_at_every_door(corpus, tmp_path):
    from datamask_dask import validate_table, write_selection

    for door, call in (("datamask_select", lambda: datamask_select(corpus, ratio=0.1)),
                       ("write_selection", lambda: write_selection(corpus, tmp_path / "out", ratio=0.1)),
                       ("validate_table", lambda: validate_table(corpus, ratio=0.1))):
        with pytest.raises(TypeError, match=f"^{door} needs a dask DataFrame, got DataFrame; wrap a pandas "
                                            r"frame with dask\.dataframe\.from_pandas"):
            call()
    assert not (tmp_path / "out").exists()


def test_missing_column_is_named_with_the_available_ones(corpus):
    ddf = dd.from_pandas(corpus.drop(columns="quality_score"), npartitions=2)
    with pytest.raises(InputDataError, match=r"no column 'quality_score'.*chunk_id"):
        datamask_select(ddf, ratio=0.1)
    with pytest.raises(InputDataError, match="'emb'"):
        datamask_select(dd.from_pandas(corpus, npartitions=2), embedding_column="emb")
    renamed = dd.from_pandas(corpus.rename(columns=str.upper), npartitions=2)  # a frame of its own names
    with pytest.raises(InputDataError) as caught:
        datamask_select(renamed, ratio=0.1)
    assert str(caught.value) == (  # one line, the frame's columns and the remedy said once
        "there are no columns 'chunk_id', 'quality_score' and 'feature_arr'; available columns are "
        f"{list(renamed.columns)}. Name yours with id_column=, quality_column=, "
        "embedding_column=, token_column= or by=")
    indexed = dd.from_pandas(corpus.set_index("chunk_id"), npartitions=2)
    with pytest.raises(InputDataError, match=r"'chunk_id' is the index, not a column: .*reset_index\(\)"):
        datamask_select(indexed, ratio=0.1)
    with pytest.raises(OptionError, match="ratio='0.1' is not a number"):
        datamask_select(dd.from_pandas(corpus, npartitions=2), ratio="0.1")


def test_a_table_of_documents_is_told_how_to_add_quality_and_embeddings(corpus):
    """A table of text alone lacks the columns the text functions add: the message names them, and
    they do it."""
    from datamask_dask import embed, score_quality

    documents = dd.from_pandas(corpus[["chunk_id", "text"]].iloc[:200], npartitions=2)
    with pytest.raises(InputDataError) as caught:
        datamask_select(documents, ratio=0.1)
    assert str(caught.value).endswith(
        "or by=, or compute the quality and embedding columns from the 'text' column with score_quality "
        "and embed (on the command line: datamask score and datamask embed, or datamask select "
        "--text-column text)")
    with pytest.raises(InputDataError) as caught:  # the id is the user's own: nothing to compute
        datamask_select(dd.from_pandas(corpus.rename(columns={"chunk_id": "doc"}), npartitions=2), ratio=0.1)
    assert str(caught.value).endswith("or by=")
    out = datamask_select(embed(score_quality(documents)), ratio=0.1, **FAST).compute()
    assert out["selected"].sum() == 20


def test_column_missing_from_one_partition(corpus):
    frames = [corpus.iloc[:400], corpus.iloc[400:800], corpus.iloc[800:].drop(columns="quality_score")]
    with pytest.raises(InputDataError, match=r"partition 2: there is no column 'quality_score'"):
        datamask_select(_from_frames(frames), ratio=0.1, **FAST).compute(scheduler="sync")


def test_nan_quality_names_partition_column_and_ids(client, corpus):
    frame = corpus.copy()
    frame.loc[[900, 905], "quality_score"] = np.nan
    ddf = dd.from_pandas(frame, npartitions=4, sort=False)
    message = r"partition 2: quality column 'quality_score' has 2 NaN.*ids \[900, 905\]"
    with pytest.raises(InputDataError, match=message):
        datamask_select(ddf, ratio=0.1, **FAST).compute(scheduler=client)


def test_ragged_embeddings(corpus):
    frame = _object_embeddings(corpus.iloc[:600])
    frame.at[450, "feature_arr"] = frame.at[450, "feature_arr"][:10]
    ddf = _from_pandas(frame, npartitions=2)
    message = r"partition 1: embedding column 'feature_arr' is ragged.*rows \[150\]"
    with pytest.raises(InputDataError, match=message):
        datamask_select(ddf, ratio=0.1, **FAST).compute(scheduler="sync")
    arrow = pa.array([[1.0, 0.0], [0.0, 1.0, 0.5], [1.0, 1.0]], pa.list_(pa.float32()))
    small = pd.DataFrame({"chunk_id": [0, 1, 2], "quality_score": [0.1, 0.5, 0.9],
                          "feature_arr": pd.arrays.ArrowExtensionArray(arrow)})
    with pytest.raises(InputDataError, match="partition 0: embedding column 'feature_arr' is ragged"):
        datamask_select(dd.from_pandas(small, npartitions=1), ratio=0.5, **FAST).compute(scheduler="sync")


def test_mixed_dimensions_across_partitions():
    frames = [_object_embeddings(make_corpus(300, 16, seed=1)),
              _object_embeddings(make_corpus(300, 8, seed=2)).assign(chunk_id=np.arange(300, 600))]
    with pytest.raises(InputDataError, match=r"partition 1: .* has 8 dimensions but 16 elsewhere"):
        datamask_select(_from_frames(frames), ratio=0.1, **FAST).compute(scheduler="sync")


def test_zero_embedding_is_reported_with_its_id(corpus):
    frame = _object_embeddings(corpus.iloc[:400])
    frame.at[123, "feature_arr"] = np.zeros(16, dtype=np.float32)
    with pytest.raises(InputDataError, match=r"partition 0: .*all-zero.*ids \[123\]"):
        datamask_select(_from_pandas(frame, npartitions=1), ratio=0.1, **FAST).compute(scheduler="sync")


def test_embeddings_turned_into_text_by_dask(corpus):
    ddf = dd.from_pandas(_object_embeddings(corpus), npartitions=2)  # convert-string is on by default
    with pytest.raises(InputDataError, match="convert-string"):
        datamask_select(ddf, ratio=0.1)


def test_embeddings_stored_as_bytes_are_told_how_to_decode(corpus, tmp_path):
    """Packed float32 bytes (how some pipelines store a vector) are not a list column: the message says
    how to decode them, and the decoded column selects as the original does."""
    import pyarrow.parquet as pq

    from datamask_dask.io.parquet import read_parquet

    table = pa.Table.from_pandas(corpus, preserve_index=False).replace_schema_metadata(None)
    vectors = np.stack(corpus["feature_arr"].to_numpy()).astype(np.float32)
    packed = table.set_column(2, "feature_arr", pa.array([row.tobytes() for row in vectors], pa.binary()))
    pq.write_table(packed, tmp_path / "packed.parquet")
    told = (r"embedding column 'feature_arr' has Arrow type binary; expected a list or fixed-size list of "
            r"floats: bytes of packed floats decode into one with numpy\.frombuffer\(value, numpy\.float32\)")
    with pytest.raises(InputDataError, match=told):
        datamask_select(read_parquet(tmp_path / "packed.parquet"), ratio=0.1, **FAST)
    decoded = [np.frombuffer(value, np.float32) for value in packed.column("feature_arr").to_pylist()]
    dim = vectors.shape[1]
    fixed = pa.FixedSizeListArray.from_arrays(pa.array(np.concatenate(decoded)), dim)
    pq.write_table(packed.set_column(2, "feature_arr", fixed), tmp_path / "decoded.parquet")
    selected = datamask_select(read_parquet(tmp_path / "decoded.parquet"), ratio=0.1, **FAST).compute()
    original = datamask_select(dd.from_pandas(corpus, npartitions=1), ratio=0.1, **FAST).compute()
    assert selected["selected"].tolist() == original["selected"].tolist()


def test_an_embedding_column_pandas_wrote_empty_is_told_as_such(tmp_path):
    from datamask_dask.io.parquet import read_parquet

    empty = pd.DataFrame({"chunk_id": pd.Series([], dtype="int64"),
                          "feature_arr": pd.Series([], dtype=object),
                          "quality_score": pd.Series([], dtype="float64")})
    empty.to_parquet(tmp_path / "empty.parquet")  # its embedding column typed null
    told = (r"^embedding column 'feature_arr' has Arrow type null: it holds no vector, as pandas writes an "
            r"empty .* pyarrow\.list_")
    with pytest.raises(InputDataError, match=told):
        datamask_select(read_parquet(tmp_path / "empty.parquet"), ratio=0.1, **FAST)


@pytest.mark.parametrize("ratio", [0, -0.1, 1.5, "0.1", True])
def test_ratio_out_of_range(corpus, ratio):
    with pytest.raises(OptionError, match="ratio"):
        datamask_select(dd.from_pandas(corpus, npartitions=2), ratio=ratio)


def test_ratio_above_eligible_share(corpus):
    """The plan pass runs when the operator is called: a ratio the data cannot meet fails there."""
    with pytest.raises(OptionError, match=r"ratio=0.8 cannot be met.*eligible"):
        datamask_select(dd.from_pandas(corpus, npartitions=2), ratio=0.8, prune=0.4, **FAST)


def test_budget_that_cannot_be_met(corpus):
    frame = _with_groups_and_tokens(corpus)
    ddf = dd.from_pandas(frame, npartitions=2)
    total = int(frame["n_tokens"].sum())
    with pytest.raises(OptionError, match=rf"budget_tokens={total + 1} cannot be met.*{total} tokens"):
        datamask_select(ddf, budget_tokens=total + 1, **FAST).compute(scheduler="sync")
    with pytest.raises(OptionError, match="not both"):
        datamask_select(ddf, ratio=0.1, budget_tokens=1000)
    with pytest.raises(OptionError, match="by="):
        datamask_select(ddf, budget_tokens=1000, by="language")
    with pytest.raises(InputDataError, match="'n_tokens'"):
        datamask_select(dd.from_pandas(corpus, npartitions=2), budget_tokens=1000)


def test_duplicate_ids_across_partitions(client, corpus):
    frame = corpus.copy()
    frame.loc[1500, "chunk_id"] = 3
    frame.loc[1501, "chunk_id"] = 7
    ddf = dd.from_pandas(frame, npartitions=4, sort=False)
    with pytest.raises(InputDataError, match=r"'chunk_id' has 2 duplicate.*3 \(partitions \[0, 3\]\).*7"):
        datamask_select(ddf, ratio=0.1, **FAST).compute(scheduler=client)
    result = datamask_select(ddf, ratio=0.1, check_ids=False, **FAST).compute(scheduler="sync")
    assert int(result["selected"].sum()) == 160
    frame = corpus.assign(chunk_id=corpus["chunk_id"].astype("Int64"))
    frame.loc[1203, "chunk_id"] = None
    with pytest.raises(InputDataError, match=r"partition 3: id column 'chunk_id' has 1 null.*rows \[3\]"):
        datamask_select(dd.from_pandas(frame, npartitions=4, sort=False), ratio=0.1).compute(scheduler="sync")


def test_bad_options(corpus):
    ddf = dd.from_pandas(corpus, npartitions=2)
    with pytest.raises(OptionError, match="unknown option 'n_epoch' in keyword arguments; did you mean "
                       "'n_epochs'"):
        datamask_select(ddf, n_epoch=3)
    with pytest.raises(OptionError, match="n_rollout"):
        datamask_select(ddf, n_rollout=1)
    with pytest.raises(OptionError, match=r"option seed=1.5 is invalid: expected a whole number"):
        datamask_select(ddf, seed=1.5)
    with pytest.raises(OptionError, match=r"option lamb=\[1\] is invalid: expected a weight in \[0, 1\]"):
        datamask_select(ddf, lamb=[1])  # as a config file's list would give it: not a TypeError
    with pytest.raises(OptionError, match="already has a column 'quality_score'"):
        datamask_select(ddf, selected_column="quality_score")
    with pytest.raises(OptionError, match="device"):
        datamask_select(ddf, device="tpu")
    with pytest.raises(OptionError, match=r"\{group: ratio\} needs by="):
        datamask_select(ddf, ratio={"en": 0.1})
    with pytest.raises(TypeError, match="dask DataFrame"):
        datamask_select(corpus)


# ------------------------------------------------------------------ configuration


def test_config_precedence(tmp_path):
    config = tmp_path / "job.yaml"
    config.write_text("n_epochs: 30\nlamb: 0.2\nselect_ratio: 0.3\n")
    with dask.config.set({"datamask.n_epochs": 50, "datamask.lamb": 0.4, "datamask.n-rollout": 16}):
        assert load_config()["n_epochs"] == 50  # dask.config > defaults
        settings = load_config(config, lamb=0.1)
    assert settings["n_epochs"] == 30  # file > dask.config
    assert settings["lamb"] == 0.1  # kwargs > file
    assert settings["n_rollout"] == 16  # dask.config, hyphens accepted
    assert settings["ratio"] == 0.3  # the reference tool's name is an alias
    assert load_config()["n_epochs"] == load_config(None)["n_epochs"] != 50


def test_config_sections_per_algorithm(tmp_path):
    config = tmp_path / "profile.yaml"
    config.write_text("algorithm: Pair_simi\nrefine_epochs: 5\nalgorithms:\n"
                      "  Facility: {refine_epochs: 40, max_chunk_rows: 123}\n  pair_simi: {n_rollout: 6}\n")
    pair = load_config(config)
    assert (pair["refine_epochs"], pair["n_rollout"], pair["max_chunk_rows"]) == (5, 6, 50_000)
    facility = load_config(config, algorithm="fl")  # any spelling of the metric picks its section
    assert (facility["refine_epochs"], facility["max_chunk_rows"], facility["n_rollout"]) == (40, 123, 2)
    # a file's own values win over the built-in defaults of the metric chosen
    disf = METRIC_DEFAULTS["DiSF"]["max_chunk_rows"]
    assert load_config(config, algorithm="DiSF")["max_chunk_rows"] == disf
    config.write_text("max_chunk_rows: 777\n")
    assert load_config(config, algorithm="DiSF")["max_chunk_rows"] == 777
    assert load_config(config, algorithm="Facility", refine_epochs=7)["refine_epochs"] == 7  # kwargs win
    typo = tmp_path / "typo.yaml"
    typo.write_text("algorithms:\n  Facilty: {refine_epochs: 40}\n")
    with pytest.raises(OptionError, match="algorithms.Facilty.*unknown"):
        load_config(typo)
    nested = tmp_path / "nested.yaml"
    nested.write_text("algorithms:\n  DiSF: {algorithm: Facility}\n")
    with pytest.raises(OptionError, match="cannot set 'algorithm'"):
        load_config(nested)


def test_config_files_in_the_repository():
    from pathlib import Path

    conf = Path(__file__).resolve().parents[2] / "conf"
    reference = load_config(conf / "reference.yaml")
    assert {k: reference[k] for k in ("n_epochs", "partial", "n_rollout", "max_lr", "min_lr", "init", "lamb",
                                      "algorithm", "update", "refine", "final")} == {
        "n_epochs": 5000, "partial": 0.1, "n_rollout": 128, "max_lr": 10.0, "min_lr": 1.0, "init": "quality",
        "lamb": 0.5, "algorithm": "DiSF", "update": "paper", "refine": 0, "final": "topk"}
    assert load_config("reference") == {**reference, "profile": "reference"}  # the name, or the file
    cpu, gpu = load_config(conf / "cpu.yaml"), load_config("gpu")
    assert cpu["refine_epochs"] < gpu["refine_epochs"] and cpu["max_chunk_rows"] < gpu["max_chunk_rows"]
    # without a config: the profile of the device the job runs on
    assert load_config()["profile"] == "cpu" and load_config(device="cuda")["profile"] == "gpu"
    assert load_config(backend="cudf")["profile"] == "gpu"
    assert load_config(backend="pandas")["profile"] == "cpu"


def test_one_set_of_defaults_and_the_docs_state_them(capsys):
    """What runs without a config is the built-in defaults (the cpu profile only names the device), and
    datamask_select's docstring (docs/api.md) and ``datamask select --help`` state those defaults."""
    import ast
    import re

    from datamask_dask.cli import main
    from datamask_dask.config import default_settings

    defaults = default_settings()
    for metric in (None, "Pair_simi", "Facility", "DiSF"):
        settings = load_config(algorithm=metric) if metric else load_config()
        expected = {**defaults, **METRIC_DEFAULTS.get(metric, {}), "device": "cpu", "profile": "cpu"}
        assert settings == {**expected, "algorithm": metric or defaults["algorithm"]}
    stated = re.findall(r"^ +(\w+)(?: \(alias \w+\))? : [^\n]*?, default ([^\s(]+)$", datamask_select.__doc__,
                        re.M)
    assert len(stated) >= 12
    for name, text in stated:
        value = text.strip('`"')
        assert (ast.literal_eval(value) if value[0].isdigit() or value in ("True", "False") else value) == \
            defaults[name], name
    with pytest.raises(SystemExit):
        main(["select", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert f"(default: {defaults['max_chunk_rows']}; Facility: 100000, DiSF: 10000)" in shown
    assert "(rows x dimension) (default: none; Facility: 76800000)" in shown
    for name in ("n_rollout", "lamb", "validate", "duplicate_cosine", "seed", "n_epochs"):
        flag = name.replace("_", "[-_]")
        assert re.search(rf"--{flag}\b[^(]*\(default: {re.escape(str(defaults[name]))}\)", shown), name


def test_bad_config_files(tmp_path):
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("n_epochs: 10\nlearning_rate: 3\n")
    with pytest.raises(OptionError, match="unknown option 'learning_rate'.*known options"):
        load_config(unknown)
    unsafe = tmp_path / "unsafe.yaml"
    unsafe.write_text("n_epochs: !!python/object/apply:os.system ['echo hi']\n")
    with pytest.raises(OptionError, match="not valid YAML"):
        load_config(unsafe)
    out_of_range = tmp_path / "range.yaml"
    out_of_range.write_text("n_epochs: 0\nalgorithms:\n  Facility:\n    lamb: 2\n")
    with pytest.raises(OptionError, match=r"option lamb=2 is invalid: expected a weight in \[0, 1\] \(set as "
                       r"lamb: in config file '.*range\.yaml', section algorithms\.Facility\)$"):
        load_config(out_of_range, algorithm="Facility", n_epochs=5)
    with pytest.raises(OptionError, match=r"n_epochs=0 is invalid.* \(set as n_epochs: in config file "):
        load_config(out_of_range)  # the section is Facility's: not this metric's
    assert load_config(out_of_range, n_epochs=5)["n_epochs"] == 5  # a keyword wins, and is what is checked
    broken = tmp_path / "broken.yaml"
    broken.write_text("n_epochs: 10\n  lamb: [\n")
    with pytest.raises(OptionError, match=r"^config file '.*broken\.yaml' is not valid YAML at line 2, "
                       r"column 7: mapping values are not allowed here$"):
        load_config(broken)
    with pytest.raises(OptionError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    nested = tmp_path / "nested.yaml"
    nested.write_text("datamask:\n  n_epochs: 7\n")
    assert load_config(nested)["n_epochs"] == 7
    with dask.config.set({"datamask.n_epochz": 5}), pytest.raises(OptionError, match="dask.config"):
        load_config()


def test_each_door_takes_the_options_resolved_once(tmp_path, corpus):
    """Settings given by keyword, config file, a config's metric section and dask.config resolve to one
    SelectOptions, which the operator's spec and the run's record are made of."""
    from datamask_dask import write_selection
    from datamask_dask.config import resolve_options
    from datamask_dask.dask_engine.operator import make_spec, plan_selection
    from datamask_dask.io.records import as_json

    config = tmp_path / "job.yaml"
    config.write_text(f"n_epochs: {FAST['n_epochs']}\nlamb: 0.6\n"
                      "algorithms:\n  Facility: {refine_epochs: 3}\n")
    ddf = dd.from_pandas(corpus, npartitions=2)
    keywords = {"ratio": 0.2, "lamb": 0.3, "algorithm": "fl", "n_rollout": FAST["n_rollout"]}
    with dask.config.set({"datamask.max_chunk_rows": 900, "datamask.seed": 5}):
        options = resolve_options(config, backend="pandas", **keywords)
        assert (options.learner.lamb, options.learner.n_epochs, options.learner.refine_epochs,
                options.max_chunk_rows, options.max_chunk_values, options.learner.seed) == (
            0.3, FAST["n_epochs"], 3, 900, METRIC_DEFAULTS["Facility"]["max_chunk_values"], 5)
        assert options.ratio_given and options.given == set(keywords)
        assert resolve_options(options) is options  # resolved options are taken as they are
        with pytest.raises(OptionError, match="already resolved"):
            resolve_options(options, lamb=0.1)
        assert plan_selection(ddf, config=config, **keywords)[0] == make_spec(ddf, options)
        report = write_selection(ddf, tmp_path / "out", config=config, **keywords)
    assert report.record["settings"] == as_json(options.to_dict())
    assert report.record["profile"] == str(config) and report.record["seed"] == 5


def test_operator_honours_the_precedence(tmp_path, corpus):
    ddf = dd.from_pandas(corpus, npartitions=2)
    bad, good = tmp_path / "bad.yaml", tmp_path / "good.yaml"
    bad.write_text("n_rollout: 1\n")  # invalid: it must reach the learner options to fail
    good.write_text("n_rollout: 8\nn_epochs: 20\n")
    with pytest.raises(OptionError, match="n_rollout"):
        datamask_select(ddf, config=bad)
    datamask_select(ddf, config=bad, n_rollout=8)  # kwargs win over the file
    with dask.config.set({"datamask.n_rollout": 1}):
        with pytest.raises(OptionError, match="n_rollout"):
            datamask_select(ddf)
        result = datamask_select(ddf, ratio=0.1, config=good).compute(scheduler="sync")  # file wins
    assert int(result["selected"].sum()) == 160


@pytest.mark.parametrize("algorithm", ["DiSF", "Pair_simi"])
def test_a_routed_pack_s_task_takes_its_own_rows_of_each_member(corpus, algorithm):
    """Every partition is a member of every routed pack (dealt pieces, regions): a pack's task takes
    only its own rows of each, not the member's rows of every pack, which would bring the whole
    routed table to each pack's worker."""
    from datamask_dask.dask_engine.operator import pack_graph, partitions, plan_selection, settle

    ddf = _from_pandas(corpus, 4)
    plan = plan_selection(ddf, ratio=0.1, algorithm=algorithm, max_chunk_rows=400, **FAST)[1].compute(
        scheduler="sync")
    assert plan.routed and len(plan.packs) >= 3
    parts = partitions(ddf)
    plan, routes = settle(ddf, plan, scheduler="sync", progress=False)  # as the select pass learns it
    assert sorted(routes) == ([] if algorithm == "DiSF" else list(range(len(parts))))
    _, tasks = pack_graph(ddf, plan, dask.delayed(plan, traverse=False), range(len(parts)), routes)
    for index, task in tasks.items():
        graph = dict(task.__dask_graph__())
        members = next(key for key in graph if str(key).startswith("datamask-pack-members"))
        given = dask.get(graph, members)
        assert len(given) == len(plan.packs[index].partitions)
        assert all(set(piece) <= {index} for piece in given), index
        assert sum(piece[index].positions.size for piece in given if piece) > 0
        # what it gives back to every member is the rows it selects alone (no score column, no explain)
        learned = dask.get(graph, task.key)
        assert all(part.positions is None for part in learned.parts.values())
        assert sum(part.picked.size for part in learned.parts.values()) == plan.packs[index].quota
