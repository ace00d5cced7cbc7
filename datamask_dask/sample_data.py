"""A synthetic corpus shaped like real curation data: clusters, near-duplicates, skewed quality.

Used by the default demo job, the examples, the tests and the benchmarks, so every figure in the
README comes from data anyone can regenerate with one call.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa


def make_embeddings(n: int, d: int = 768, *, n_clusters: int | None = None, duplicate_share: float = 0.2,
                    seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Quality scores and unit embeddings of a clustered synthetic corpus.

    Clusters have Zipf-like sizes (a few topics dominate, as in web crawls); a share of rows are
    near-duplicates of another row; quality is skewed (log-normal) and correlated with the cluster,
    so quality top-k over-samples a few clusters and is not diverse.

    Returns ``(quality, embeddings)``: float32 arrays of shapes (n,) and (n, d), rows L2-normalised.
    """
    rng = np.random.default_rng(seed)
    n_clusters = n_clusters or max(2, int(np.sqrt(n)))
    centres = rng.standard_normal((n_clusters, d), dtype=np.float32)
    sizes = 1.0 / np.arange(1, n_clusters + 1) ** 0.8
    cluster = rng.choice(n_clusters, size=n, p=sizes / sizes.sum())
    spread = rng.uniform(0.5, 1.2, n_clusters).astype(np.float32)
    emb = centres[cluster] + spread[cluster, None] * rng.standard_normal((n, d), dtype=np.float32)
    n_dup = int(duplicate_share * n)
    if n_dup:
        dup, src = rng.choice(n, n_dup, replace=False), rng.integers(0, n, n_dup)
        emb[dup] = emb[src] + 0.05 * rng.standard_normal((n_dup, d), dtype=np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    cluster_bias = rng.standard_normal(n_clusters).astype(np.float32)
    quality = np.exp(0.6 * cluster_bias[cluster] + 0.5 * rng.standard_normal(n).astype(np.float32))
    return quality.astype(np.float32), emb.astype(np.float32)


def make_corpus(n: int = 2000, d: int = 64, *, seed: int = 0, **kwargs) -> pd.DataFrame:
    """A pandas frame in the reference format: ``chunk_id``, ``quality_score``, ``feature_arr``, ``text``.

    ``feature_arr`` is an Arrow-backed fixed-size-list column (what parquet readers give back).
    """
    quality, emb = make_embeddings(n, d, seed=seed, **kwargs)
    features = pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), d)
    return pd.DataFrame({
        "chunk_id": np.arange(n, dtype=np.int64),
        "quality_score": quality.astype(np.float64),
        "feature_arr": pd.Series(pd.arrays.ArrowExtensionArray(features)),
        "text": [f"document {i}" for i in range(n)],
    })
