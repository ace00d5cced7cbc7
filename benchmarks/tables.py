"""The benchmarks' synthetic tables, written once into a cache as parquet files: the pipeline's tables
of clustered unit rows (``ensure_dataset``), the same with near-copies across files
(``ensure_spread_dataset``), and the quality cases of ``make_embeddings`` (``CASES``, ``dataset``).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from suite.data import layout_order, write_parts

from datamask_dask.sample_data import make_embeddings


def cluster_model(d: int, n_clusters: int, seed: int = 12345):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_clusters, d), dtype=np.float32)
    sizes = 1.0 / np.arange(1, n_clusters + 1) ** 0.8
    spread = rng.uniform(0.5, 1.2, n_clusters).astype(np.float32)
    bias = rng.standard_normal(n_clusters).astype(np.float32)
    return centres, sizes / sizes.sum(), spread, bias


def make_partition(number: int, rows: int, d: int, model, duplicate_share: float = 0.2):
    """Quality and unit embeddings of partition ``number`` (seeded by it; shared cluster centres)."""
    centres, probabilities, spread, bias = model
    rng = np.random.default_rng(number)
    cluster = rng.choice(len(centres), size=rows, p=probabilities)
    emb = rng.standard_normal((rows, d), dtype=np.float32)
    emb *= spread[cluster, None]
    emb += centres[cluster]
    n_dup = int(duplicate_share * rows)
    if n_dup:
        dup, src = rng.choice(rows, n_dup, replace=False), rng.integers(0, rows, n_dup)
        emb[dup] = emb[src] + 0.05 * rng.standard_normal((n_dup, d), dtype=np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    quality = np.exp(0.6 * bias[cluster] + 0.5 * rng.standard_normal(rows).astype(np.float32))
    return quality.astype(np.float64), emb


def write_partition(path: Path, number: int, quality: np.ndarray, emb: np.ndarray) -> None:
    """Write partition ``number`` (ids from ``number * rows``) to ``path`` atomically."""
    rows, d = emb.shape
    ids = np.arange(number * rows, (number + 1) * rows, dtype=np.int64)
    table = pa.table(
        {
            "chunk_id": ids,
            "quality_score": quality,
            "feature_arr": pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), d),
            "text": pa.array([f"document {j} of the benchmark corpus" for j in ids.tolist()]),
        }
    )
    temporary = path.with_suffix(".tmp")
    pq.write_table(table, temporary, row_group_size=25_000)
    os.replace(temporary, path)


def _draw_file(job: tuple[Path, int, int, int, int]) -> str:
    """Generate partition file ``number`` of a table; a line saying so."""
    path, number, rows, d, n_clusters = job
    started = time.perf_counter()
    quality, emb = make_partition(number, rows, d, cluster_model(d, n_clusters))
    write_partition(path, number, quality, emb)
    return f"  generated {path.name} ({rows} rows) in {time.perf_counter() - started:.1f} s"


def ensure_dataset(cache: Path, n_rows: int, d: int, rows_per_partition: int, n_clusters: int,
                   processes: int = 1) -> Path:
    """The folder of an ``n_rows`` table (generated once, missing files in ``processes`` processes;
    partitions shared between sizes)."""
    if n_rows % rows_per_partition:
        raise SystemExit(f"--sizes: {n_rows} is not a multiple of --rows-per-partition {rows_per_partition}")
    base = cache / f"pipeline-d{d}-p{rows_per_partition}-c{n_clusters}"
    parts = base / "parts"
    parts.mkdir(parents=True, exist_ok=True)
    n_parts = n_rows // rows_per_partition
    missing = [(parts / f"part.{i:05d}.parquet", i, rows_per_partition, d, n_clusters) for i in range(n_parts)
               if not (parts / f"part.{i:05d}.parquet").exists()]
    if processes > 1 and len(missing) > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(min(processes, len(missing))) as pool:
            lines = pool.map(_draw_file, missing)
            for line in lines:
                print(line, file=sys.stderr, flush=True)
    else:
        for job in missing:
            print(_draw_file(job), file=sys.stderr, flush=True)
    folder = base / f"n{n_rows}"
    if not folder.exists() or len(list(folder.glob("*.parquet"))) != n_parts:
        shutil.rmtree(folder, ignore_errors=True)
        staging = base / f".n{n_rows}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        for i in range(n_parts):
            os.link(parts / f"part.{i:05d}.parquet", staging / f"part.{i:05d}.parquet")
        os.replace(staging, folder)
    return folder


def ensure_spread_dataset(folder: Path, n_rows: int, d: int, rows_per_partition: int, copies: float) -> Path:
    """The pipeline data with ``copies`` of each file's rows near-copies of the previous file's rows."""
    folder.mkdir(parents=True, exist_ok=True)
    model, previous = cluster_model(d, 2000), None
    for number in range(n_rows // rows_per_partition):
        path = folder / f"part.{number:05d}.parquet"
        if path.exists():
            previous = None
            continue
        quality, emb = make_partition(number, rows_per_partition, d, model)
        if number and previous is None:  # resumed: the previous file's rows, regenerated the same way
            regenerated = make_partition(number - 1, rows_per_partition, d, model)[1]
            previous = _spread(number - 1, regenerated, None, copies)
        emb = _spread(number, emb, previous, copies)
        write_partition(path, number, quality, emb)
        previous = emb
        print(f"  generated {path.name}", file=sys.stderr, flush=True)
    return folder


def planted_copies(number: int, n_rows: int, copies: float) -> tuple:
    """Which rows of file ``number`` (of ``n_rows`` rows, as the previous file) ``_spread`` makes
    near-copies, and of which rows of the previous file: ``(rng, rows, sources)``, the generator
    left where ``_spread`` goes on to draw the noise."""
    rng = np.random.default_rng(10_000 + number)
    n_copy = int(copies * n_rows)
    rows = rng.choice(n_rows, n_copy, replace=False)
    return rng, rows, rng.integers(0, n_rows, n_copy)


def _spread(number: int, emb: np.ndarray, previous: np.ndarray | None, copies: float) -> np.ndarray:
    """``emb`` with ``copies`` of its rows near-copies of rows of ``previous`` (cosine ~0.99)."""
    if previous is None or not copies:
        return emb
    rng, rows, sources = planted_copies(number, len(emb), copies)
    noise = 0.15 / np.sqrt(emb.shape[1])  # cosine about 0.99 to the source row, whatever the dimension
    emb[rows] = previous[sources] + noise * rng.standard_normal((rows.size, emb.shape[1]), dtype=np.float32)
    emb[rows] /= np.linalg.norm(emb[rows], axis=1, keepdims=True)
    return emb


@dataclass(frozen=True)
class Case:
    """A table of ``make_embeddings`` (seed 0) as ``files`` parquet files, and what its jobs start from."""

    rows: int
    dim: int
    files: int
    clusters: int
    layout: str = "spread"  # suite.data.LAYOUTS: rows in id order, or files by topic
    max_chunk_rows: int | None = None  # every job of the case starts from it: the table in pieces

    def changes(self) -> list[str]:
        return [] if self.max_chunk_rows is None else [f"max_chunk_rows={self.max_chunk_rows}"]


CASES = {
    "20k-d768": Case(20_000, 768, 1, 200),
    "200k-d768": Case(200_000, 768, 4, 500),
    "200k-d64": Case(200_000, 64, 4, 500),
    "1m-d64": Case(1_000_000, 64, 20, 2000),
    # a file a piece: a pack of two files would be larger than a chunk
    "24k-d64-spread": Case(24_000, 64, 12, 48, max_chunk_rows=2000),
    "24k-d64-topics": Case(24_000, 64, 12, 48, "topics", max_chunk_rows=2000),
    # the topics in four times the files: each file holds about one
    "24k-d64-topics-48-files": Case(24_000, 64, 48, 48, "topics", max_chunk_rows=2000),
}


CACHE = Path(__file__).resolve().parent.parent / ".benchmark-cache"


def dataset(case: str) -> tuple[Path, np.ndarray, np.ndarray]:
    """The case's parquet directory (written once into the cache), its quality and embeddings."""
    shape = CASES[case]
    quality, emb = make_embeddings(shape.rows, shape.dim, n_clusters=shape.clusters, seed=0)
    folder = CACHE / f"quality-{case}"
    write_parts(folder, quality, emb, shape.files, layout_order(emb, shape.layout, shape.clusters))
    return folder, quality, emb
