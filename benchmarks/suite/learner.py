"""The learner on one in-memory chunk (``learn_mask`` with the cpu profile's settings), and the
selection quality of the default job, measured with the yardstick (:mod:`datamask_dask.learn.yardstick`)."""

from __future__ import annotations

import time

from . import data

METRICS = ["Pair_simi", "Facility", "DiSF"]
LAMBS = [0.0, 0.5]
SHAPE, TABLE = data.SHAPES["LearnMask"], data.SHAPES["SelectionQuality"]
PIECES = data.SHAPES["SelectionQuality in pieces"]


class LearnMask:
    """Seconds and peak memory of ``learn_mask`` on one chunk (``data.SHAPES["LearnMask"]``)."""

    params = (METRICS,)
    param_names = ["metric"]
    timeout = 300
    timer = staticmethod(time.process_time)  # CPU seconds: other processes on a shared machine do not count

    def setup(self, metric):
        from datamask_dask.config import resolve_options

        data.one_thread()
        self.quality, self.emb = data.embeddings(SHAPE["rows"], SHAPE["dim"], SHAPE["clusters"])
        self.options = resolve_options("cpu", algorithm=metric).learner

    def time_learn_mask(self, metric):
        from datamask_dask import learn_mask

        learn_mask(self.quality, self.emb, SHAPE["k"], self.options)

    def peakmem_learn_mask(self, metric):
        from datamask_dask import learn_mask

        learn_mask(self.quality, self.emb, SHAPE["k"], self.options)


class SelectionQuality:
    """The default job (``datamask_select``, the cpu profile) on a table of a few partitions
    (``data.SHAPES["SelectionQuality"]``), on threads: its share of the best baseline's gain over
    random, in points (100: as good as the baseline), and its lead over quality top-k's share; and its
    share on a table of many files, each learned apart (``data.SHAPES["SelectionQuality in pieces"]``),
    in both of ``data.LAYOUTS``. Deterministic: the same code gives the same figures, so a drop of more
    than half a point is a regression, not noise."""

    params = (METRICS, LAMBS)
    param_names = ["metric", "lamb"]
    timeout = 900

    def setup_cache(self):
        from datamask_dask import embedding_matrix
        from datamask_dask.io.parquet import read_parquet
        from datamask_dask.learn.yardstick import measure, measure_all

        ddf = data.frame(TABLE["rows"], TABLE["dim"], TABLE["partitions"], clusters=TABLE["clusters"])
        corpus = ddf.compute()
        quality = corpus["quality_score"].to_numpy()
        emb = embedding_matrix(corpus["feature_arr"])
        out = {}
        for metric in METRICS:
            for lamb in LAMBS:
                selected = _selected(ddf, TABLE["ratio"], algorithm=metric, lamb=lamb)
                score = measure(quality, emb, selected, algorithm=metric, lamb=lamb)
                out[metric, lamb] = {"share": 100 * score.share, "topk_share": 100 * score.topk_share,
                                     "selected": int(selected.sum())}
        quality, emb = data.embeddings(PIECES["rows"], PIECES["dim"], PIECES["clusters"])
        shape = PIECES["rows"], PIECES["dim"], PIECES["files"], PIECES["clusters"]
        tables = {layout: read_parquet(data.parquet_table(*shape, layout)) for layout in data.LAYOUTS}
        for metric in METRICS:
            for lamb in LAMBS:
                selections = [_selected(table, PIECES["ratio"], algorithm=metric, lamb=lamb,
                                        max_chunk_rows=PIECES["max chunk rows"]) for table in tables.values()]
                # the layouts hold the same rows: one baseline scores both
                scores = measure_all(quality, emb, selections, algorithm=metric, lamb=lamb)
                for layout, score in zip(tables, scores, strict=True):
                    out[layout, metric, lamb] = {"share": 100 * score.share}
        return out

    def track_share(self, scores, metric, lamb):
        return scores[metric, lamb]["share"]

    track_share.unit = "points"

    def track_over_topk(self, scores, metric, lamb):
        """Points of the baseline's gain the job is above quality top-k (negative: below it)."""
        return scores[metric, lamb]["share"] - scores[metric, lamb]["topk_share"]

    track_over_topk.unit = "points"

    def track_selected_rows(self, scores, metric, lamb):
        return scores[metric, lamb]["selected"]

    track_selected_rows.unit = "rows"

    def track_share_in_pieces_spread(self, scores, metric, lamb):
        """The share on the table in pieces whose every file holds rows of every cluster."""
        return scores["spread", metric, lamb]["share"]

    track_share_in_pieces_spread.unit = "points"

    def track_share_in_pieces_topics(self, scores, metric, lamb):
        """The share on the same rows, each file holding a few clusters (files by topic)."""
        return scores["topics", metric, lamb]["share"]

    track_share_in_pieces_topics.unit = "points"


def _selected(ddf, ratio, **options):
    """The default job's ``selected`` column on threads, in id order (a table by topic is not)."""
    from datamask_dask import datamask_select

    job = datamask_select(ddf, ratio=ratio, **options)[["chunk_id", "selected"]]
    return job.compute(scheduler="threads").sort_values("chunk_id")["selected"].to_numpy()
