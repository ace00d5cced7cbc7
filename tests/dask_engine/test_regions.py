"""``pieces="regions"``: a table spread at random over its partitions, learned in regions of the embedding
space, keeps Facility's coverage; one whose partitions each hold a few topics keeps Pair_simi's spread.
``pieces="context"``: DiSF's pieces, learned against the rest of the table, decorrelate the table's
features. The count stays exact and the rows the same on every scheduler."""

from __future__ import annotations

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from conftest import FAST

from datamask_dask import datamask_select
from datamask_dask.dask_engine.operator import plan_selection
from datamask_dask.errors import OptionError
from datamask_dask.io.sinks import write_parquet
from datamask_dask.learn.yardstick import measure_all
from datamask_dask.plan import context

ROWS, DIM, PARTS, CLUSTERS = 3200, 16, 8, 40
OPTIONS = {"ratio": 0.1, "algorithm": "Facility", "lamb": 0.0, "max_chunk_rows": 400, "seed": 0, **FAST}


@pytest.fixture(scope="module")
def spread():
    """Clusters of skewed sizes, rows spread over the partitions at random: each partition covers the
    same ground, as a random split of a table does."""
    rng = np.random.default_rng(11)
    centres = rng.standard_normal((CLUSTERS, DIM))
    sizes = rng.dirichlet(np.full(CLUSTERS, 0.7))
    emb = centres[rng.choice(CLUSTERS, ROWS, p=sizes)] + 0.45 * rng.standard_normal((ROWS, DIM))
    emb = (emb / np.linalg.norm(emb, axis=1, keepdims=True)).astype(np.float32)
    quality = rng.random(ROWS)
    features = pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), DIM)
    frame = pd.DataFrame({"chunk_id": np.arange(ROWS, dtype=np.int64), "quality_score": quality,
                          "feature_arr": pd.Series(pd.arrays.ArrowExtensionArray(features))})
    return frame, quality, emb


@pytest.fixture(scope="module")
def topics(spread):
    """The same rows sorted by topic, quality rising with the topic: each partition holds a few."""
    frame, _, emb = spread
    rng = np.random.default_rng(12)
    topic = np.argmax(emb @ rng.standard_normal((DIM, 12)), axis=1)
    order = np.argsort(topic, kind="stable")
    frame = frame.iloc[order].reset_index(drop=True).assign(chunk_id=np.arange(ROWS, dtype=np.int64))
    frame["quality_score"] = rng.random(ROWS) * (0.5 + topic[order] / 12)
    return frame, frame["quality_score"].to_numpy(), emb[order]


def _ddf(frame):
    return dd.from_pandas(frame, npartitions=PARTS, sort=False)


def _scores(table, ways, **options) -> list:
    """The yardstick's scores of ``table``'s selections, one a ``(pieces, max_chunk_rows)`` way, each
    checked to select exactly the quota."""
    frame, quality, emb = table
    options = {**OPTIONS, **options}
    masks = []
    for pieces, chunk in ways:
        job = _ddf(frame).pipe(datamask_select, **{**options, "pieces": pieces, "max_chunk_rows": chunk})
        masks.append(job.compute(scheduler="threads")["selected"].to_numpy())
        assert masks[-1].sum() == round(0.1 * ROWS)
    return measure_all(quality, emb, masks, algorithm=options["algorithm"], lamb=options["lamb"])


def test_regions_cover_the_table_as_learning_it_whole_does(spread):
    # auto: regions here
    partitions, regions, whole = _scores(spread, [("partitions", 400), ("auto", 400), ("partitions", ROWS)])
    assert regions.share > partitions.share + 0.1  # the random split no longer costs the coverage
    assert regions.share >= whole.share - 0.03


@pytest.mark.parametrize("layout, lamb", [("topics", 0.5), ("topics", 0.0), ("spread", 0.0)])
def test_pair_simi_s_regions_learn_against_each_other_s_picks(request, layout, lamb):
    """Partitions of a few topics each, learned apart, each take their quality's share and pile up
    their topics; in regions, each pack learns against what the others are planned to pick. At lamb 0
    the areas' means cannot cancel the picks' sum, their rows can: every pack cancels its share of it
    (one that cancelled all of it, as every other would, would overshoot)."""
    partitions, regions, whole = _scores(request.getfixturevalue(layout),  # auto: regions here
                                         [("partitions", 400), ("auto", 400), ("partitions", ROWS)],
                                         algorithm="Pair_simi", lamb=lamb)
    if layout == "topics":
        assert regions.share > partitions.share + 0.05
    assert regions.share >= whole.share - 0.03


@pytest.mark.parametrize("layout, lamb", [("topics", 0.0), ("topics", 0.5), ("spread", 0.0)])
def test_disf_s_pieces_in_context_decorrelate_the_table_s_features(request, layout, lamb):
    """Partitions of a few topics each, learned apart, each decorrelate what varies inside their topics;
    in context, the rows are dealt to pieces that each hold every topic, each piece standardises by the
    table's moments and learns again against the rest's first picks, and the table's correlations
    between topics are what it cancels: as learning the table whole does, whatever the layout."""
    partitions, in_context, whole = _scores(request.getfixturevalue(layout),
                                            [("partitions", 400), ("context", 400), ("partitions", ROWS)],
                                            algorithm="DiSF", lamb=lamb)
    # apart, the topics' pieces score below random at lamb 0
    assert in_context.share > partitions.share + (0.5 if (layout, lamb) == ("topics", 0.0) else 0.0)
    assert in_context.objective - whole.random >= 0.9 * (whole.objective - whole.random)


def test_disf_deals_a_table_of_many_partitions_in_strips(monkeypatch, topics):
    """Past STRIP_PIECES pieces, DiSF's rows are dealt in strips of every n-th partition: a partition
    sends rows to its strip's pieces alone, the count stays exact, and the strips' pieces still learn
    the table's topics better than its partitions apart."""
    monkeypatch.setattr(context, "STRIP_PIECES", 3)
    options = {**OPTIONS, "algorithm": "DiSF", "pieces": "context"}
    plan = plan_selection(_ddf(topics[0]), **options)[1].compute(scheduler="sync")
    assert {pack.partitions for pack in plan.packs} == {(0, 3, 6), (1, 4, 7), (2, 5)}
    partitions, strips = _scores(topics, [("partitions", 400), ("context", 400)], algorithm="DiSF", lamb=0.0)
    assert strips.share > partitions.share + 0.5  # apart, the topics' pieces score below random


@pytest.mark.parametrize("algorithm, pieces", [("Facility", "regions"), ("Pair_simi", "regions"),
                                               ("DiSF", "context")])
def test_same_rows_on_threads_and_on_a_cluster(client, spread, algorithm, pieces):
    frame, _, _ = spread
    lazy = _ddf(frame).pipe(datamask_select, pieces=pieces, score_column="score", explain=True,
                            **{**OPTIONS, "algorithm": algorithm})
    threads = lazy.compute(scheduler="threads")
    pd.testing.assert_frame_equal(threads, lazy.compute(scheduler=client))
    assert set(threads["reason"].astype(str)) >= {"selected", "not-chosen"}


@pytest.mark.parametrize("pieces, options, named, auto", [
    ("regions", {"algorithm": "DiSF"}, "algorithm='DiSF'", "context"),
    ("regions", {"diversity_scope": "partition"}, 'diversity_scope="partition"', "partitions"),
    ("regions", {"budget_tokens": 100, "ratio": None}, "budget_tokens", None),
    ("context", {}, "algorithm='Facility'", "regions"),
    ("context", {"algorithm": "DiSF", "diversity_scope": "partition"}, 'diversity_scope="partition"',
     "partitions"),
])
def test_options_the_pieces_cannot_serve_are_refused_by_name(spread, pieces, options, named, auto):
    with pytest.raises(OptionError, match=f'pieces="{pieces}" does not work with .*{named}'):
        datamask_select(_ddf(spread[0]), **{**OPTIONS, "pieces": pieces, **options})
    if auto is not None:  # (the table has no token column to plan with)
        spec, _ = plan_selection(_ddf(spread[0]), **{**OPTIONS, **options})
        assert spec.pieces == auto


@pytest.mark.parametrize("algorithm, cut", [("Facility", "regions"), ("DiSF", "context"),
                                            ("Pair_simi", "regions")])
def test_the_run_record_says_how_the_table_was_cut(spread, tmp_path, algorithm, cut):
    from datamask_dask import write_selection

    record = write_selection(_ddf(spread[0]), tmp_path / "out", **{**OPTIONS, "algorithm": algorithm}).record
    assert record["pieces"]["cut"] == cut
    if cut == "context":  # the pieces the rows were dealt to, and the share learned in context
        assert record["pieces"]["pieces"] >= 2
        assert 0.0 <= record["pieces"]["share in context"] <= 1.0
    if cut == "regions":
        assert record["pieces"]["regions"] >= 2


@pytest.mark.parametrize("algorithm", ["facility", "Facility", "pair_simi", "Pair_simi"])
def test_facility_and_pair_simi_spelled_any_way_are_learned_in_regions_and_by_partition_when_asked(
        spread, algorithm):
    spec, _ = plan_selection(_ddf(spread[0]), **{**OPTIONS, "algorithm": algorithm})
    assert spec.pieces == "regions"
    spec, _ = plan_selection(_ddf(spread[0]), **{**OPTIONS, "algorithm": algorithm, "pieces": "partitions"})
    assert spec.pieces == "partitions"


def test_a_table_one_chunk_holds_is_learned_whole(spread):
    _, plan = plan_selection(_ddf(spread[0]), **{**OPTIONS, "max_chunk_rows": ROWS})
    assert not plan.compute(scheduler="threads").regional
    _, plan = plan_selection(_ddf(spread[0]), **OPTIONS)
    assert plan.compute(scheduler="threads").regional


@pytest.mark.parametrize("algorithm", ["Facility", "Pair_simi"])
def test_the_select_pass_takes_the_routes_of_the_plan_pass(client, spread, tmp_path, monkeypatch, algorithm):
    """Each partition's rows are routed to their areas once, by the pass that shares the quotas: the
    select pass takes its routes, kept in this process on threads and on the workers on a cluster."""
    from datamask_dask import write_selection
    from datamask_dask.plan import regions

    routed = []
    locate = regions.locate
    monkeypatch.setattr(regions, "locate",
                        lambda rows, *args: routed.append(len(rows)) or locate(rows, *args))
    options = {**OPTIONS, "algorithm": algorithm}
    write_selection(_ddf(spread[0]), tmp_path / "threads", scheduler="threads", **options)
    assert len(routed) == PARTS  # once a partition
    write_selection(_ddf(spread[0]), tmp_path / "cluster", scheduler=client, **options)
    threads, cluster = (pd.read_parquet(tmp_path / name).sort_values("chunk_id")
                        for name in ("threads", "cluster"))
    assert threads["selected"].sum() == round(0.1 * ROWS)
    assert threads["selected"].tolist() == cluster["selected"].tolist()



def test_on_a_cluster_the_routes_stay_on_the_workers(client, spread):
    from distributed import Future

    from datamask_dask.config import resolve_options
    from datamask_dask.dask_engine.runs import DaskEngine

    engine = DaskEngine(_ddf(spread[0]), resolve_options(None, **OPTIONS), scheduler=client)
    engine.plan(progress=False)
    assert sorted(engine.routes) == list(range(PARTS))
    assert all(isinstance(routes, Future) for routes in engine.routes.values())


def test_a_table_that_fits_is_read_once_and_selects_the_same_rows(client, spread, tmp_path, monkeypatch,
                                                                   caplog):
    """A listed table that fits in memory is read once and held through the passes (Facility in regions:
    plan, near-duplicate check, curves, packs, write), which read it again otherwise: the same rows
    either way, on threads and on a cluster."""
    import logging

    from datamask_dask.dask_engine import runs
    from datamask_dask.io import parquet
    from datamask_dask.run.tables import select_table

    source = tmp_path / "in"
    write_parquet(_ddf(spread[0]), source)
    reads = []
    reader = parquet.ParquetReader.__call__
    monkeypatch.setattr(parquet.ParquetReader, "__call__",
                        lambda self, piece, columns: reads.append(piece[0]) or reader(self, piece, columns))

    def selected(name: str, **how) -> list:
        reads.clear()
        report = select_table(str(source), str(tmp_path / name), summary_rows=0, **how, **OPTIONS)
        stages = report.record["stages"]
        assert stages["plan read"] > 0 and ("read" in stages) == (name == "read")  # a held read counted once
        return pd.read_parquet(tmp_path / name).sort_values("chunk_id")["selected"].tolist()

    with caplog.at_level(logging.DEBUG, logger=runs.__name__):
        held = selected("held", scheduler="threads", progress=True)  # the held read under a bar
        assert sorted(reads) == sorted(set(reads)) and len(reads) == PARTS  # each file once
        on_cluster = selected("cluster", scheduler=client)
    assert sum("held in memory" in r.getMessage() for r in caplog.records) == 2
    monkeypatch.setattr(runs, "HOLD_SHARE", 0.0)  # nothing fits: each pass reads the table
    read = selected("read", scheduler="threads")
    assert len(reads) >= 4 * PARTS
    assert sum(held) == round(0.1 * ROWS) and held == read == on_cluster
