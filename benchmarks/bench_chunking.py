"""Which ``max_chunk_rows`` for the CPU profile: objective of a whole partition's selection and time.

One partition of n rows (``make_embeddings(n, dim, seed)``, rows in random order) selects
k = ratio * n rows the way the operator does (``partition/select.py``): the eligible rows are cut
into ``ceil(n / max_chunk_rows)`` contiguous, near-equal chunks, each chunk's quota comes from
``split_quota`` (exact, sums to k), and each chunk learns with the profile's options for that
metric and the seed ``derive_seed(seed, 0, 0, chunk)``. The union is scored on the *whole*
partition with ``evaluate_selection`` (Facility's term on a fixed uniform sample of
``--eval-reference`` rows of the partition, the same for every chunk size, when n exceeds it).
Quality is scaled by the partition's range, as the operator passes it to every chunk.

    python benchmarks/bench_chunking.py --rows 200000 --dim 64 --chunks 25000 50000 100000 200000 \
        --algorithms Pair_simi Facility DiSF --out benchmarks/results-chunking.md

Wall time covers the learning only (embeddings already in memory), as the learn stage does.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np
import torch

from datamask_dask import learn_mask, make_embeddings
from datamask_dask.config import learner_options, load_config
from datamask_dask.learn.objectives import evaluate_selection
from datamask_dask.partition.select import derive_seed
from datamask_dask.plan.quotas import split_quota


def select_in_chunks(quality, emb, k, max_chunk_rows, options, oversample, seed):
    """The operator's chunking of one partition (no prune, one group); returns the selected rows."""
    n = quality.shape[0]
    n_chunks = math.ceil(n / max_chunk_rows)
    chunk_of_row = np.arange(n) * n_chunks // n  # contiguous, near-equal
    quotas = split_quota(quality, chunk_of_row, n_chunks, k, oversample)
    lo, hi = float(quality.min()), float(quality.max())
    chosen = []
    for number in range(n_chunks):
        rows = np.flatnonzero(chunk_of_row == number)
        mask = learn_mask(quality[rows], emb[rows], int(quotas[number]), options, quality_range=(lo, hi),
                          seed=derive_seed(seed, 0, 0, number)).mask
        chosen.append(rows[mask])
    return np.concatenate(chosen)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--ratio", type=float, default=0.1)
    p.add_argument("--chunks", type=int, nargs="+", default=[25_000, 50_000, 100_000, 200_000])
    p.add_argument("--algorithms", nargs="+", default=["Pair_simi", "Facility", "DiSF"])
    p.add_argument("--lamb", type=float, default=None, help="default: the profile's")
    p.add_argument("--profile", default="cpu")
    p.add_argument("--eval-reference", type=int, default=50_000,
                   help="Facility is evaluated on this many uniformly sampled rows of the partition")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    quality, emb = make_embeddings(args.rows, args.dim, seed=args.seed)
    k = round(args.ratio * args.rows)
    sample = None
    if args.rows > args.eval_reference:
        rng = np.random.default_rng(args.seed)
        sample = np.sort(rng.choice(args.rows, args.eval_reference, replace=False))
    lines = ["| algorithm | lamb | max_chunk_rows | chunks | objective | quality | diversity | learn s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for algorithm in args.algorithms:
        settings = load_config(args.profile, algorithm=algorithm,
                               **({"lamb": args.lamb} if args.lamb is not None else {}))
        options = learner_options(settings)
        for rows in args.chunks:
            t0 = time.perf_counter()
            sel = select_in_chunks(quality, emb, k, rows, options, settings["oversample"], options.seed)
            seconds = time.perf_counter() - t0
            assert np.unique(sel).size == k, (algorithm, rows)
            lamb = options.lamb
            ev = evaluate_selection(quality, emb, sel, algorithm=algorithm, lamb=lamb, reference=sample)
            line = (f"| {algorithm} | {lamb:g} | {rows} | {math.ceil(args.rows / rows)} "
                    f"| {ev['objective']:.5f} | {ev['quality']:.4f} | {ev['diversity']:.4f} "
                    f"| {seconds:.1f} |")
            print(line, flush=True)
            lines.append(line)
    table = "\n".join(lines)
    print("\n" + table)
    if args.out:
        note = (f"Facility's term on a fixed uniform sample of {args.eval_reference} of the {args.rows} rows "
                "(unbiased estimate; the same rows for every chunk size)." if sample is not None else "")
        with open(args.out, "w") as fh:
            fh.write(f"Profile {args.profile!r} (per-metric sections applied), n = {args.rows}, "
                     f"d = {args.dim}, k = {k}; torch {torch.__version__}, {args.threads} threads, "
                     f"{os.cpu_count()} cores.\n"
                     f"{note}\n\nCommand: `python {' '.join(sys.argv)}`\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
