"""Does ``lamb`` weigh quality the same at 20k and at 1M rows? What is at stake on each side.

For each chunk size n, quality top-k and a uniform random selection of k = n / 10 rows of
``make_embeddings(n, dim, seed)`` are scored with ``evaluate_selection`` (quality min-max scaled by
the chunk's own range, as ``learn_mask`` does without ``quality_range``). The quality gap
(top-k minus random) against the diversity gap (random minus top-k) is the exchange rate that
``lamb`` sets: if it drifts with n, a fixed lamb means a different trade-off. Also reported: the
chunk's quality maximum (what min-max scaling divides by) and the mean quality *rank* (quantile)
of top-k, which does not depend on n.

    python benchmarks/bench_lamb_scale.py --sizes 20000 200000 1000000 --dim 64 \
        --out benchmarks/results-lamb-scale.md
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

from datamask_dask import evaluate_selection, make_embeddings


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[20_000, 200_000, 1_000_000])
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--algorithms", nargs="+", default=["Pair_simi", "DiSF"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(2)
    lines = ["| n | quality max (raw) | metric | top-k quality | random quality | quality gap "
             "| top-k diversity | random diversity | diversity gap | gap ratio | top-k mean quantile |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n in args.sizes:
        q, e = make_embeddings(n, args.dim, seed=args.seed)
        k = n // 10
        top = np.argsort(-q, kind="stable")[:k]
        rnd = np.random.default_rng(args.seed).choice(n, k, replace=False)
        quantile = float((np.argsort(np.argsort(q)) / (n - 1))[top].mean())
        for algorithm in args.algorithms:
            t = evaluate_selection(q, e, top, algorithm=algorithm, lamb=0.5)
            r = evaluate_selection(q, e, rnd, algorithm=algorithm, lamb=0.5)
            dq, dd = t["quality"] - r["quality"], r["diversity"] - t["diversity"]
            line = (f"| {n} | {q.max():.2f} | {algorithm} | {t['quality']:.4f} | {r['quality']:.4f} "
                    f"| {dq:.4f} | {t['diversity']:.5f} | {r['diversity']:.5f} | {dd:.5f} | {dq / dd:.1f} "
                    f"| {quantile:.3f} |")
            print(line, flush=True)
            lines.append(line)
    table = "\n".join(lines)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(f"Command: `python {' '.join(sys.argv)}`\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
