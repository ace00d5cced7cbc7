"""The table scope's near-duplicate reduction alone, at scale: time, memory and LSH candidates.

Signs ``--rows`` clustered d = ``--dim`` embeddings (the pipeline benchmark's generator,
``bench_pipeline.make_partition``: 20% near-copies inside each partition) in partitions of
``--rows-per-partition``, with ``--copies`` of each partition's rows replaced by near-copies of
rows of the previous partition (duplicates spread across files), then runs
:func:`datamask_dask.plan.duplicates.find_duplicates` on every signature in one process, as the
reduction task does. Reports the seconds and the peak memory that the reduction allocates
(tracemalloc, numpy arrays included), candidate pairs per band, and the shadowed rows.

    python benchmarks/bench_duplicates.py --rows 1000000 --out benchmarks/results-duplicates-1m.md
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_pipeline as pipeline  # noqa: E402  (data generation)

from datamask_dask.plan import duplicates  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--rows-per-partition", type=int, default=50_000)
    parser.add_argument("--copies", type=float, default=0.1,
                        help="share of each partition's rows copied from the previous partition")
    parser.add_argument("--threads", type=int, nargs="+", default=[duplicates.BAND_THREADS],
                        help="find_duplicates' band threads (duplicates.BAND_THREADS), one run each")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    model = pipeline._cluster_model(args.dim, 2000)
    planes = duplicates.hyperplanes(args.dim)
    parts, previous = [], None
    started = time.perf_counter()
    for number in range(args.rows // args.rows_per_partition):
        quality, emb = pipeline.make_partition(number, args.rows_per_partition, args.dim, model)
        if previous is not None and args.copies:
            rng = np.random.default_rng(10_000 + number)
            n_copy = int(args.copies * len(emb))
            rows = rng.choice(len(emb), n_copy, replace=False)
            sources = rng.integers(0, len(previous), n_copy)
            emb[rows] = previous[sources] + 0.05 * rng.standard_normal((n_copy, args.dim), dtype=np.float32)
            emb[rows] /= np.linalg.norm(emb[rows], axis=1, keepdims=True)
        previous = emb
        parts.append({"quality": quality, "codes": np.zeros(len(quality), dtype=np.int64), "labels": [None],
                      "signatures": duplicates.signatures(emb, planes)})
    made = time.perf_counter() - started
    del previous
    table = duplicates.stack_parts(parts)
    candidates = []
    for band in range(duplicates.BANDS):
        _, counts = np.unique(duplicates.band_keys(table["signatures"], band), return_counts=True)
        candidates.append(int((counts * (counts - 1) // 2).sum()))
    load = os.getloadavg()[0]
    runs = []  # (threads, seconds, peak bytes, shadowed)
    for threads in args.threads:
        duplicates.BAND_THREADS = threads
        tracemalloc.start()
        started = time.perf_counter()
        shadowed = duplicates.find_duplicates(parts)
        runs.append((threads, time.perf_counter() - started, tracemalloc.get_traced_memory()[1], shadowed))
        tracemalloc.stop()
    if any(any(not np.array_equal(a, b) for a, b in zip(r[3], runs[0][3], strict=True)) for r in runs):
        raise AssertionError("the shadowed rows depend on the number of threads")
    n = sum(len(p["quality"]) for p in parts)
    given = " ".join(sys.argv[1:] if argv is None else argv)
    lines = [f"# Near-duplicate reduction at {n:,} rows, d = {args.dim}", "",
             f"Command: `python benchmarks/bench_duplicates.py {given}`", "",
             f"{len(parts)} partitions of {args.rows_per_partition:,} rows (bench_pipeline's clustered "
             f"generator, 20% near-copies inside each partition, {args.copies:.0%} of each partition's rows "
             f"near-copies of the previous partition's), generated and signed in {made:.0f} s; load average "
             f"{load:.1f} "
             f"on {os.cpu_count()} cores at the start of the reduction.", "",
             "| rows | signature bytes | candidate pairs per band (min / median / max) | all bands | "
             "threads | reduction s (one process) | peak memory allocated by the reduction | shadowed rows |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {n:,} | {table['signatures'].nbytes / 2**20:.0f} MiB | {min(candidates):,} / "
              f"{int(np.median(candidates)):,} / {max(candidates):,} | {sum(candidates):,} | {threads} | "
              f"{seconds:.1f} | {peak / 2**20:.0f} MiB | {sum(len(s) for s in shadowed):,} |"
              for threads, seconds, peak, shadowed in runs]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
