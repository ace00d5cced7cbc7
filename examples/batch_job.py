"""Batch job: select 10% of a parquet corpus on a local Dask cluster and write the result.

Run it as is to try it on the embedded synthetic corpus (written to a temporary directory first):

    python examples/batch_job.py --output /tmp/selected

or point it at your own data, and at a GPU cluster (one worker per GPU, cuDF partitions):

    python examples/batch_job.py --input s3://bucket/corpus/ --output s3://bucket/selected/ \\
        --cluster cuda            # the gpu profile applies; --config reference for the paper's loop

The same job from the command line is ``datamask select --input ... --output ...``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import dask.dataframe as dd

from datamask_dask import (
    datamask_select,
    get_client,
    make_corpus,
    read_parquet,
    selected_counts,
    write_parquet,
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", help="parquet file or directory (default: a generated sample corpus)")
    parser.add_argument("--output", required=True, help="output parquet directory")
    parser.add_argument("--ratio", type=float, default=0.1, help="share of rows to select")
    parser.add_argument("--config",
                        help="a profile (cpu, gpu, reference) or a YAML file (default: the device's)")
    parser.add_argument("--cluster", default="cpu", help="'cpu', 'cuda' or a scheduler address")
    parser.add_argument("--n-workers", type=int, default=2)
    parser.add_argument("--rows", type=int, default=20_000, help="rows of the sample corpus")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of the sample corpus")
    parser.add_argument("--n-epochs", type=int, help="override the learner's steps (e.g. for a quick try)")
    parser.add_argument("--n-rollout", type=int, help="override the learner's rollouts per step")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    overrides = {k: v for k, v in {"n_epochs": args.n_epochs, "n_rollout": args.n_rollout}.items() if v}
    client = get_client(args.cluster, n_workers=args.n_workers, dashboard_address=":0")
    try:
        with tempfile.TemporaryDirectory() as scratch:
            source = args.input
            if source is None:  # no data given: write the sample corpus as a partitioned dataset
                source = Path(scratch) / "corpus"
                corpus = dd.from_pandas(make_corpus(args.rows, 64, seed=0), npartitions=args.partitions)
                write_parquet(corpus, source)
            start = time.perf_counter()
            ddf = read_parquet(source)
            selected = ddf.pipe(datamask_select, ratio=args.ratio, config=args.config, **overrides)
            write_parquet(selected, args.output, overwrite=True)  # runs the job; renamed in when done
            rows, chosen = selected_counts(args.output)
            elapsed = time.perf_counter() - start
            print(f"{rows} rows, {chosen} selected ({chosen / rows:.1%}) in {elapsed:.1f} s "
                  f"on {len(client.scheduler_info()['workers'])} worker(s) -> {args.output}")
    finally:
        if args.cluster in ("cpu", "cuda"):
            client.shutdown()
        else:
            client.close()


if __name__ == "__main__":
    main()
