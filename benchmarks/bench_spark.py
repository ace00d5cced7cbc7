"""The same parquet data through Spark ``local[2]`` and through Dask with 2 workers, side by side.

    PYSPARK_PYTHON=$(which python) python benchmarks/bench_spark.py --rows 200000 --dim 768

Data: the pipeline benchmark's synthetic table (:func:`tables.ensure_dataset`, cached in
``--cache``), ``--rows-per-partition`` rows per parquet file. Both engines see the same partitions
in the same order (one per file: the Dask reader's pieces; for the Spark DataFrame engines a union
of one read per file), the same config (``conf/cpu.yaml`` by default) and seed, so they must select
the same rows; the script checks it.

Engines (``--engines``):

- ``spark``: :func:`datamask_spark.files.write_file_selection`, the CLI's ``--engine spark`` path
  for local parquet: Spark schedules one task per piece and the Python workers read and write the
  parquet with pyarrow;
- ``spark-dataframe``: :func:`datamask_spark.writer.write_selection` on the DataFrame Spark read
  (any DataFrame: Spark scans the rows and hands them to the workers through ``mapInArrow``; the
  workers write parquet with pyarrow);
- ``spark-writer``: ``datamask_select(sdf)`` written by Spark's own ``df.write.parquet``;
- ``dask``: ``datamask_select`` written by ``datamask_dask.write_parquet``.

Timed, per engine: the selection (plan pass, select pass) and writing every row plus
``selected`` as parquet, from the call to the written output. Not timed (printed as start-up):
starting the Spark session and its Python workers (a 2-task job that imports the selection code,
as Dask's worker setup plugin does while the cluster starts), and starting the Dask cluster.
Spark runs 2 task slots (``local[2]``, one torch thread per task); Dask 2 worker processes of one
thread. ``--profile`` prints Spark's per-stage task time and JVM CPU (from the UI's REST API);
``--transfer`` what moving the embeddings from the JVM to Python costs, beside pyarrow's read.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
import record  # noqa: E402


def _warm(batches):
    """Start a Python worker and import the selection code in it (torch included)."""
    import datamask_spark.operator  # noqa: F401
    import pyarrow as pa

    n = sum(b.num_rows for b in batches)
    yield pa.RecordBatch.from_pydict({"n": pa.array([n], pa.int64())})


def run_spark(source: Path, target: Path, config: str, overrides: dict, engine: str = "spark",
              profile: bool = False, transfer: bool = False) -> dict:
    from datamask_spark import datamask_select, spark_errors
    from datamask_spark.files import write_file_selection
    from datamask_spark.job import SETTINGS
    from datamask_spark.writer import write_selection
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    started = time.perf_counter()
    spark = (SparkSession.builder.master("local[2]").appName("datamask-bench").config(map=SETTINGS)
             .config("spark.ui.enabled", str(profile).lower()).config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", "4g").config("spark.sql.shuffle.partitions", "2")
             # one partition per file, whatever its size (Spark splits files above 128 MiB by default)
             .config("spark.sql.files.maxPartitionBytes", str(2**40))
             .config("spark.sql.files.openCostInBytes", str(2**40)).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.range(2, numPartitions=2).mapInArrow(_warm, "n long").collect()
    startup = time.perf_counter() - started
    try:
        files = sorted(source.glob("*.parquet"))
        sdf = None
        partitions = len(files)
        for path in files:  # one partition per file, in file order (as datamask_dask.read_parquet)
            part = spark.read.parquet(str(path))
            sdf = part if sdf is None else sdf.union(part)
        first_stage = _stage_count(spark) if profile else 0
        started = time.perf_counter()
        stages = {}
        if engine == "spark-writer":
            with spark_errors():
                out = datamask_select(sdf, config=config, **overrides)
                planned = time.perf_counter() - started
                out.write.parquet(str(target))
        else:
            if engine == "spark":
                record = write_file_selection(spark, source, target, config=config, **overrides)
            else:
                record = write_selection(sdf, target, config=config, **overrides)
            planned, stages = record["phases"]["plan"], record["stages"]
        wall = time.perf_counter() - started
        if profile:
            _print_stages(spark, first_stage)
        if transfer:
            _print_transfer(sdf, files)
        written = spark.read.parquet(str(target))
        ids = {r["chunk_id"] for r in written.where("selected").select("chunk_id").collect()}
        rows = written.count()
    finally:
        spark.stop()
    return {"wall": wall, "plan": planned, "startup": startup, "rows": rows, "ids": ids,
            "partitions": partitions, "stages": stages}


def _count(batches):
    import pyarrow as pa

    n = sum(b.num_rows for b in batches)
    yield pa.RecordBatch.from_pydict({"n": pa.array([n], pa.int64())})


def _print_transfer(sdf, files: list[Path], column: str = "feature_arr") -> None:
    """What moving the embeddings to Python costs Spark, beside pyarrow reading them directly.

    The JVM alone decoding the column (a sum over its last element), a ``mapInArrow`` that only
    counts the rows it receives (decode plus the row-by-row Arrow conversion and transfer), and
    pyarrow reading the same column from the files in this process (one file at a time).
    """
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F

    dim = sdf.select(F.size(column).alias("d")).first()["d"]
    jobs = {"JVM decode only": lambda: sdf.agg(F.sum(F.element_at(column, dim))).collect(),
            "mapInArrow, rows counted in Python":
                lambda: sdf.select(column).mapInArrow(_count, "n long").collect(),
            "pyarrow read (this process)": lambda: [pq.read_table(f, columns=[column]) for f in files]}
    print(f"  moving `{column}` ({len(files)} files), seconds:", flush=True)
    for name, job in jobs.items():
        started = time.perf_counter()
        job()
        print(f"    {name}: {time.perf_counter() - started:.1f}", flush=True)


def _stage_count(spark) -> int:
    return len(_rest(spark, "stages"))


def _rest(spark, what: str):
    url = spark.sparkContext.uiWebUrl
    app = spark.sparkContext.applicationId
    with urllib.request.urlopen(f"{url}/api/v1/applications/{app}/{what}") as response:
        return json.load(response)


def _print_stages(spark, first: int) -> None:
    """Spark's own account of each stage since ``first``: tasks, task seconds, JVM CPU and GC seconds."""
    time.sleep(1)  # the listener's last events
    for stage in sorted(_rest(spark, "stages"), key=lambda s: s["stageId"]):
        if stage["stageId"] < first:
            continue
        print(f"  stage {stage['stageId']:3d} {stage['name'][:60]:60s} tasks {stage['numCompleteTasks']:3d}  "
              f"task s {stage['executorRunTime'] / 1e3:7.1f}  "
              f"JVM CPU s {stage['executorCpuTime'] / 1e9:6.1f}  "
              f"GC s {stage['jvmGcTime'] / 1e3:5.1f}  in MB {stage['inputBytes'] >> 20:5d}  "
              f"out MB {stage['outputBytes'] >> 20:5d}", flush=True)


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
    parser.add_argument("--engines", nargs="+", default=["spark", "dask"],
                        choices=["spark", "spark-dataframe", "spark-writer", "dask"])
    parser.add_argument("--repeats", type=int, default=1, help="runs of each engine, interleaved")
    parser.add_argument("--profile", action="store_true", help="print Spark's per-stage metrics")
    parser.add_argument("--transfer", action="store_true",
                        help="after Spark's job, time moving the embeddings to Python (JVM decode, "
                             "mapInArrow, pyarrow)")
    parser.add_argument("--json", help="append the results to this JSON file (results/spark.json)")
    args = parser.parse_args(argv)

    source = ensure_dataset(Path(args.cache), args.rows, args.dim, args.rows_per_partition, args.clusters)
    overrides = {"ratio": args.ratio}
    runs = {engine: [] for engine in args.engines}
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(args.repeats):  # engines interleaved: a slow spell of the machine hits both
            for engine in args.engines:
                target = Path(scratch) / engine
                if engine == "dask":
                    r = run_dask(source, target, args.config, overrides)
                else:
                    r = run_spark(source, target, args.config, overrides, engine=engine,
                                  profile=args.profile, transfer=args.transfer)
                shutil.rmtree(target, ignore_errors=True)
                runs[engine].append(r)
                print(f"{engine} (repeat {repeat + 1}): {r['wall']:.1f} s ({r['rows']} rows, "
                      f"{len(r['ids'])} selected; plan {r['plan']:.1f} s; {r['partitions']} files; start-up "
                      f"{r['startup']:.1f} s, not counted)", flush=True)
                if r.get("stages"):
                    print("  worker seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in r["stages"].items()),
                          flush=True)
    print(f"\n{args.rows:,} rows, d = {args.dim}, {args.rows // args.rows_per_partition} partitions, "
          f"config {args.config}, ratio {args.ratio}, {args.repeats} repeat(s); load average at start "
          f"{load[0]:.1f}, at end {os.getloadavg()[0]:.1f}\n")
    median = {engine: statistics.median(r["wall"] for r in rs) for engine, rs in runs.items()}
    want = runs["dask"][0]["ids"] if "dask" in runs else None
    table = ["| engine | wall s per repeat | median wall s | plan s | rows/s | selected | "
             "same rows as Dask |", "|---|---|---:|---:|---:|---:|---|"]
    for engine, rs in runs.items():
        walls = ", ".join(f"{r['wall']:.1f}" for r in rs)
        same = "" if want is None else str(all(r["ids"] == want for r in rs))
        plan = statistics.median(r["plan"] for r in rs)
        table.append(f"| {engine} | {walls} | {median[engine]:.1f} | {plan:.1f} | "
                     f"{rs[0]['rows'] / median[engine]:,.0f} | {len(rs[0]['ids']):,} | {same} |")
    print("\n".join(table))
    if "dask" in runs:
        for engine in (e for e in runs if e != "dask"):
            pairs = ", ".join(f"{r['wall'] / d['wall']:.2f}x"
                              for r, d in zip(runs[engine], runs["dask"], strict=True))
            print(f"\n{engine} / dask wall time: {median[engine] / median['dask']:.2f}x (medians; per "
                  f"repeat {pairs})")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    print(f"\nPeak RSS of this process (Spark's driver; the Dask client): {peak:.2f} GiB")
    if args.json:
        shape = {"rows": args.rows, "dim": args.dim, "rows a file": args.rows_per_partition,
                 "repeats": args.repeats}
        record.append(args.json, command=record.command("bench_spark.py", argv), data={"table": shape},
                      markdown="\n".join(table), note=f"peak RSS of the driver process {peak:.2f} GiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
