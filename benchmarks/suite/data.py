"""Data of every suite, generated here only: synthetic tables from :mod:`datamask_dask.sample_data`,
written to parquet once into ``.benchmark-cache/asv`` (git-ignored), and planted near-copies whose
true cosines are known, so recall and false merges are counted exactly."""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from datamask_dask.sample_data import make_corpus, make_embeddings

CACHE = Path(__file__).resolve().parents[2] / ".benchmark-cache" / "asv"
#: each suite's data, as the results state it
SHAPES = {
    "LearnMask": {"rows": 8_000, "dim": 64, "clusters": 80, "k": 800},
    "SelectionQuality": {"rows": 16_000, "dim": 64, "clusters": 160, "partitions": 2, "ratio": 0.1},
    "SelectionQuality in pieces": {"rows": 2_000, "dim": 64, "clusters": 16, "files": 10,
                                   "max chunk rows": 200, "ratio": 0.1},
    "NearDuplicates": {"rows": 200_000, "dim": 64, "rows a partition": 25_000, "planted copies": 0.1},
    "PlanGraph": {"rows a partition": 100, "dim": 8},
    "Pipeline": {"rows": 100_000, "dim": 64, "files": 4, "clusters": 400, "workers": 2, "ratio": 0.1},
    "Spark": {"rows": 20_000, "dim": 32, "files": 2, "clusters": 100, "ratio": 0.1},
    "LearnMaskGPU": {"rows": 100_000, "dim": 256, "clusters": 1000, "k": 10_000},
}
#: cosines of the copies planted across partitions: >= 0.98 must end in one group, <= 0.90 must not
PLANTED = (0.85, 0.90, 0.95, 0.98, 0.99, 0.999)


@functools.cache
def embeddings(rows: int, dim: int, clusters: int | None = None, seed: int = 0):
    """Quality (float32) and unit embeddings of a clustered corpus with 20% near-copies."""
    return make_embeddings(rows, dim, n_clusters=clusters, seed=seed)


def frame(rows: int, dim: int, partitions: int, clusters: int | None = None, seed: int = 1):
    """The corpus as a Dask DataFrame of ``partitions`` pandas partitions (no I/O)."""
    import dask.dataframe as dd

    corpus = make_corpus(rows, dim, seed=seed, n_clusters=clusters)
    return dd.from_pandas(corpus, npartitions=partitions, sort=False)


def parquet_table(rows: int, dim: int, files: int, clusters: int | None = None,
                  layout: str = "spread") -> Path:
    """The corpus as ``files`` parquet files (``part.N.parquet``, as the package's reader orders them), in
    one of ``LAYOUTS``."""
    suffix = "" if layout == "spread" else f"-{layout}"  # the spread tables keep their cache folders
    folder = CACHE / f"table-{rows}-d{dim}-f{files}-c{clusters}{suffix}"
    if not (folder / "_complete").exists():
        quality, emb = embeddings(rows, dim, clusters)
        write_parts(folder, quality, emb, files, layout_order(emb, layout, clusters))
    return folder


#: How rows are laid out in files: "spread", in id order (every file holds rows of every cluster, as
#: make_embeddings draws each row's cluster at random); "topics", sorted by topic (files by topic).
LAYOUTS = ("spread", "topics")


def layout_order(emb: np.ndarray, layout: str, topics: int | None) -> np.ndarray | None:
    """The rows' order in the files of ``layout`` (None: id order): for "topics", sorted by their topic
    among ``topics`` (:func:`topic_labels`), ids in order inside a topic."""
    if layout == "spread":
        return None
    if layout == "topics":
        return np.argsort(topic_labels(emb, topics), kind="stable")
    raise ValueError(f"layout {layout!r} is not one of {LAYOUTS}")


def topic_labels(emb: np.ndarray, topics: int, iterations: int = 20) -> np.ndarray:
    """Each row's topic, as a pipeline that writes files by topic finds it: spherical k-means of the
    unit rows, k-means++ seeded (fixed, so the same table gets the same labels)."""
    rng = np.random.default_rng(0)
    picks = [int(rng.integers(len(emb)))]
    distance = 2 - 2 * emb @ emb[picks[0]]
    for _ in range(topics - 1):  # each next seed drawn in proportion to its squared distance from the nearest
        weights = np.maximum(distance, 0).astype(np.float64)
        picks.append(int(rng.choice(len(emb), p=weights / weights.sum())))
        distance = np.minimum(distance, 2 - 2 * emb @ emb[picks[-1]])
    centres = emb[picks]
    for _ in range(iterations):
        labels = np.argmax(emb @ centres.T, axis=1)
        sums = np.zeros_like(centres)
        np.add.at(sums, labels, emb)
        norms = np.linalg.norm(sums, axis=1, keepdims=True)
        # an empty topic keeps its centre
        centres = np.where(norms > 0, sums / np.maximum(norms, 1e-12), centres)
    return np.argmax(emb @ centres.T, axis=1)


def write_parts(folder: Path, quality: np.ndarray, emb: np.ndarray, files: int,
                order: np.ndarray | None = None) -> None:
    """Rows as ``files`` parquet files in ``folder`` (``part.N.parquet``, as the package's reader orders
    them), in ``order`` (row numbers; None: id order), each row keeping its id: once, a folder marked
    complete is kept as it is."""
    if (folder / "_complete").exists():
        return
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    order = np.arange(len(quality)) if order is None else np.asarray(order)
    for number, part in enumerate(np.array_split(order, files)):
        table = pa.table({
            "chunk_id": pa.array(part.astype(np.int64)),
            "quality_score": pa.array(quality[part].astype(np.float64)),
            "feature_arr": pa.FixedSizeListArray.from_arrays(pa.array(emb[part].reshape(-1)), emb.shape[1]),
        })
        pq.write_table(table, folder / f"part.{number}.parquet")
    (folder / "_complete").write_text("")


def planted_parts(rows: int, rows_per_partition: int, dim: int, copies: float = 0.1):
    """The near-duplicate search's inputs, one dict a partition, and the planted pairs.

    Each partition after the first has ``copies`` of its rows replaced by copies of rows of the
    previous partition at the cosines of ``PLANTED`` (in turn). Returns ``(parts, planted)`` with
    ``planted`` = (copy rows, source rows, cosines) as global row numbers.
    """
    from datamask_dask.dedup import simhash

    planes = simhash.hyperplanes(dim)
    parts, previous, planted = [], None, []
    for number in range(rows // rows_per_partition):
        quality, emb = make_embeddings(rows_per_partition, dim, n_clusters=200, seed=number)
        if previous is not None and copies:
            rng = np.random.default_rng(10_000 + number)
            n_copy = int(copies * rows_per_partition)
            rows_, sources = rng.choice(rows_per_partition, n_copy, replace=False), rng.integers(
                0, rows_per_partition, n_copy)
            cosines = np.resize(np.array(PLANTED), n_copy)
            u = previous[sources].astype(np.float64)
            w = rng.standard_normal(u.shape)
            w -= np.einsum("ij,ij->i", w, u)[:, None] * u
            w /= np.linalg.norm(w, axis=1, keepdims=True)
            emb[rows_] = (cosines[:, None] * u + np.sqrt(1 - cosines[:, None] ** 2) * w).astype(np.float32)
            base = number * rows_per_partition
            planted.append((base + rows_, base - rows_per_partition + sources, cosines))
        previous = emb
        parts.append({"quality": quality.astype(np.float64), "codes": np.zeros(rows_per_partition, np.int64),
                      "labels": [None], "signatures": simhash.signatures(emb, planes)})
    return parts, tuple(np.concatenate([p[i] for p in planted]) for i in range(3))


def duplicate_rates(parts: list, planted: tuple, groups: list) -> dict:
    """Per planted cosine: the share of pairs in one group (``merged``) and of pairs with at most one
    row left eligible (``handled``), from the one-task search's parents and ``groups``' shadowed rows."""
    from datamask_dask.dedup import search

    parent = search.table_parents(search.stack_parts(parts))["parent"]
    root = np.where(parent < 0, np.arange(parent.size), parent)
    while not np.array_equal(root[root], root):
        root = root[root]
    offsets = np.cumsum([0] + [len(p["quality"]) for p in parts])
    shadowed = np.zeros(offsets[-1], dtype=bool)
    for start, group in zip(offsets, groups, strict=False):
        shadowed[start + group.shadowed] = True
    copies, sources, cosines = planted
    merged = root[copies] == root[sources]
    handled = shadowed[copies] | shadowed[sources]
    return {c: {"merged": float(merged[cosines == c].mean()), "handled": float(handled[cosines == c].mean())}
            for c in PLANTED}


def one_thread() -> None:
    """Torch on one thread, as in a job's worker (one thread each): its CPU seconds then count work,
    not threads spinning for a core another process holds."""
    import torch

    torch.set_num_threads(1)


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
