"""Spark job: select 10% of a parquet corpus with DATAMASK and write every row plus ``selected``.

Run it with spark-submit (the workers must run an interpreter that has datamask-dask[spark]):

    PYSPARK_PYTHON=$(which python) spark-submit --master "local[2]" examples/spark_job.py \\
        --output /tmp/selected-spark

Without ``--input`` it writes a small synthetic corpus to a temporary directory first; point it
at your own data (one row per document: ``chunk_id``, ``quality_score``, ``feature_arr``): a
parquet directory or a Delta / Iceberg table the executors can read, written as parquet by the
Python workers themselves (the same rows as the Dask job), or remote parquet through Spark:

    spark-submit --master "local[8]" examples/spark_job.py --input delta:///data/corpus \\
        --output /data/selected --config conf/cpu.yaml
    spark-submit --master yarn examples/spark_job.py --input s3a://bucket/corpus/ \\
        --output s3a://bucket/selected/ --config conf/cpu.yaml

The same selection on Dask is ``examples/batch_job.py``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", help="parquet path or table URI (default: a generated sample corpus)")
    parser.add_argument("--output", required=True, help="output parquet directory (must not exist)")
    parser.add_argument("--ratio", type=float, default=0.1, help="share of rows to select")
    parser.add_argument("--config", help="YAML config, e.g. conf/cpu.yaml")
    parser.add_argument("--rows", type=int, default=20_000, help="rows of the sample corpus")
    parser.add_argument("--partitions", type=int, default=4, help="files of the sample corpus")
    parser.add_argument("--n-epochs", type=int, help="override the learner's steps (e.g. for a quick try)")
    parser.add_argument("--n-rollout", type=int, help="override the learner's rollouts per step")
    return parser.parse_args(argv)


def sample_corpus(directory: Path, rows: int, partitions: int) -> str:
    """A synthetic corpus in the reference format, ``partitions`` parquet files."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from datamask_dask import make_corpus

    frame = make_corpus(rows, 64, seed=0)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    step = -(-rows // partitions)
    for i in range(partitions):
        pq.write_table(table.slice(i * step, step), directory / f"part.{i}.parquet")
    return str(directory)


def main(argv=None) -> None:
    from datamask_spark.job import get_spark, select_parquet

    args = parse_args(argv)
    spark = get_spark()  # spark-submit's master and settings
    options = {k: v for k, v in {"n_epochs": args.n_epochs, "n_rollout": args.n_rollout}.items()
               if v is not None}
    with tempfile.TemporaryDirectory() as scratch:
        source = args.input or sample_corpus(Path(scratch), args.rows, args.partitions)
        # bad input raises the package's InputDataError (naming the Spark partition), not a Py4J trace
        rows, selected, seconds = select_parquet(source, args.output, spark=spark, ratio=args.ratio,
                                                 config=args.config, **options)
    print(f"selected {selected} of {rows} rows in {seconds:.1f} s -> {args.output}")
    spark.stop()


if __name__ == "__main__":
    main()
