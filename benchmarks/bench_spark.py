"""The same parquet data through Spark ``local[2]`` and through Dask with 2 workers, side by side.

    PYSPARK_PYTHON=$(which python) python benchmarks/bench_spark.py --rows 200000 --dim 768

Data: the pipeline benchmark's synthetic table (:func:`bench_pipeline.ensure_dataset`, cached in
``--cache``), ``--rows-per-partition`` rows per parquet file. Both engines see the same partitions
in the same order (Spark: a union of one read per file, one partition each; Dask:
``datamask_dask.read_parquet``), the same config (``conf/cpu.yaml`` by default) and seed, so they
must select the same rows; the script checks it.

Timed, per engine: the selection (plan pass, select pass) and writing every row plus
``selected`` as parquet, from the ``datamask_select`` call to the written output. Not timed:
starting the Spark session (printed separately) and the Dask cluster. Spark runs 2 task slots
(``local[2]``, one torch thread per task); Dask 2 worker processes of one thread.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))


def run_spark(source: Path, target: Path, config: str, overrides: dict) -> dict:
    from datamask_spark import datamask_select, spark_errors
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    started = time.perf_counter()
    spark = (SparkSession.builder.master("local[2]").appName("datamask-bench")
             .config("spark.ui.enabled", "false").config("spark.driver.memory", "4g")
             .config("spark.sql.shuffle.partitions", "2")
             # one partition per file, whatever its size (Spark splits files above 128 MiB by default)
             .config("spark.sql.files.maxPartitionBytes", str(2**40))
             .config("spark.sql.files.openCostInBytes", str(2**40)).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    startup = time.perf_counter() - started
    try:
        files = sorted(source.glob("*.parquet"))
        sdf = None
        partitions = len(files)
        for path in files:  # one partition per file, in file order (as datamask_dask.read_parquet)
            part = spark.read.parquet(str(path))
            sdf = part if sdf is None else sdf.union(part)
        started = time.perf_counter()
        with spark_errors():
            out = datamask_select(sdf, config=config, **overrides)
            planned = time.perf_counter() - started
            out.write.parquet(str(target))
        wall = time.perf_counter() - started
        written = spark.read.parquet(str(target))
        ids = {r["chunk_id"] for r in written.where("selected").select("chunk_id").collect()}
        rows = written.count()
    finally:
        spark.stop()
    return {"wall": wall, "plan": planned, "startup": startup, "rows": rows, "ids": ids,
            "partitions": partitions}


def run_dask(source: Path, target: Path, config: str, overrides: dict) -> dict:
    import pyarrow.parquet as pq

    from datamask_dask import datamask_select, get_client, read_parquet, write_parquet

    started = time.perf_counter()
    client = get_client("cpu", n_workers=2, threads_per_worker=1, dashboard_address=":0")
    startup = time.perf_counter() - started
    try:
        import dask.dataframe  # noqa: F401  (not timed: a one-off import)

        started = time.perf_counter()
        out = datamask_select(read_parquet(source), config=config, **overrides)
        planned = time.perf_counter() - started  # lazy: building the graph only
        write_parquet(out, target, overwrite=True)
        wall = time.perf_counter() - started
    finally:
        client.shutdown()
    table = pq.read_table(target, columns=["chunk_id", "selected"]).to_pandas()
    ids = set(table.loc[table["selected"], "chunk_id"].tolist())
    return {"wall": wall, "plan": planned, "startup": startup, "rows": len(table), "ids": ids,
            "partitions": len(list(source.glob("*.parquet")))}


def main(argv=None) -> int:
    from bench_pipeline import ensure_dataset

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--rows-per-partition", type=int, default=50_000)
    parser.add_argument("--clusters", type=int, default=2000)
    parser.add_argument("--config", default=str(ROOT / "conf" / "cpu.yaml"))
    parser.add_argument("--ratio", type=float, default=0.1)
    parser.add_argument("--cache", default=str(ROOT / ".benchmark-cache"))
    parser.add_argument("--engines", nargs="+", default=["spark", "dask"], choices=["spark", "dask"])
    args = parser.parse_args(argv)

    source = ensure_dataset(Path(args.cache), args.rows, args.dim, args.rows_per_partition, args.clusters)
    overrides = {"ratio": args.ratio}
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        for engine in args.engines:
            run = run_spark if engine == "spark" else run_dask
            results[engine] = run(source, Path(scratch) / engine, args.config, overrides)
            shutil.rmtree(Path(scratch) / engine, ignore_errors=True)
            r = results[engine]
            print(f"{engine}: {r['wall']:.1f} s ({r['rows']} rows, {len(r['ids'])} selected; plan "
                  f"{r['plan']:.1f} s; {r['partitions']} files; start-up {r['startup']:.1f} s, not counted)",
                  flush=True)
    print(f"\n{args.rows:,} rows, d = {args.dim}, {args.rows // args.rows_per_partition} partitions, "
          f"config {args.config}, ratio {args.ratio}\n")
    print("| engine | wall s | rows/s | selected |")
    print("|---|---:|---:|---:|")
    for engine, r in results.items():
        print(f"| {engine} | {r['wall']:.1f} | {r['rows'] / r['wall']:,.0f} | {len(r['ids']):,} |")
    if len(results) == 2:
        spark, dask = results["spark"], results["dask"]
        print(f"\nSpark / Dask wall time: {spark['wall'] / dask['wall']:.2f}x; "
              f"same rows selected: {spark['ids'] == dask['ids']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
