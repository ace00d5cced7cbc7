"""One meaning at real size: the same table, options and seed run every way a user can run them.

One command prints a markdown table (and appends it to ``--json``, see ``record.py``)::

    python benchmarks/bench_conformance.py --rows 120000 --dim 256 --algorithms Facility \
        --json benchmarks/results/conformance.json

What runs, for every algorithm:

- **Data**: :func:`datamask_dask.sample_data.make_corpus` (clustered, 20% near-copies, skewed
  quality; ``--data-seed``) in ``--files`` parquet files, generated once into ``--cache``.
- **Ways**: ``datamask_select(...).compute(scheduler="threads")``; ``write_selection`` on a
  ``get_client`` cluster of 2 workers of 1 thread and of 1 worker of 2 threads; ``datamask
  select`` (the CLI, threads); Spark's operator (one partition per file) and the Spark file job
  on ``local[2]``. Each way runs in its own process (``--before TREE`` adds the threads and
  the 2 x 1 cluster ways of another checkout, to show what changed).
- **Digest**: the first 12 hex characters of sha256 over the sorted selected ids; equal
  digests, equal selections. ``seconds``: the way's wall time, cluster start-up included.
- **Small workers** (``--small-workers``): 2 workers of that memory limit; the seconds from the
  cluster's start until the job fails, and its error's first words.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

import record  # noqa: E402

WAYS = ("threads", "2 workers x 1 thread", "1 worker x 2 threads", "CLI", "Spark", "Spark file job")


def digest(ids) -> str:
    return hashlib.sha256(",".join(map(str, sorted(int(i) for i in ids))).encode()).hexdigest()[:12]


def picked(frame, start: float) -> dict:
    """A way's result: the digest of the rows ``frame`` selects, and the seconds since ``start``."""
    seconds = time.perf_counter() - start
    return {"digest": digest(frame.loc[frame["selected"], "chunk_id"]), "seconds": seconds}


def ensure_table(cache: Path, rows: int, dim: int, files: int, seed: int) -> Path:
    path = cache / f"conformance-{rows}-{dim}-{files}-s{seed}"
    if not (path / "_datamask_run.json").exists():
        import dask.dataframe as dd

        from datamask_dask.io.sinks import write_parquet
        from datamask_dask.sample_data import make_corpus

        write_parquet(dd.from_pandas(make_corpus(rows, dim, seed=seed), npartitions=files, sort=False), path,
                      overwrite=True)
    return path


def run_way(way: str, table: str, algorithm: str, scratch: str, memory: str) -> dict:
    """One way, in this process: its digest (or its error) and seconds."""
    import pyarrow.parquet as pq

    from datamask_dask import datamask_select, get_client, read_parquet
    from datamask_dask.run.selection import write_selection

    options = {"ratio": 0.1, "algorithm": algorithm}
    out = Path(scratch) / way.replace(" ", "-")
    start = time.perf_counter()
    if way == "threads":
        frame = datamask_select(read_parquet(table), **options).compute(scheduler="threads")
        return picked(frame, start)
    if way == "CLI":
        from datamask_dask.cli import main

        assert main(["select", "--input", table, "--output", str(out), "--ratio", "0.1", "--algorithm",
                     algorithm]) == 0
    elif way.startswith("Spark"):
        sys.path.insert(0, str(HERE.parent / "tests"))
        from conftest import read_files, spark_worker_environment
        from datamask_spark import datamask_select as spark_select
        from datamask_spark.files import write_file_selection
        from datamask_spark.job import SETTINGS
        from pyspark.sql import SparkSession

        spark_worker_environment()
        # one Spark partition per file, the layout datamask_dask.read_parquet reads (integrations/README.md)
        spark = (SparkSession.builder.master("local[2]").config(map=SETTINGS)
                 .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                 .config("spark.sql.files.maxPartitionBytes", str(2**40))
                 .config("spark.sql.files.openCostInBytes", str(2**40)).getOrCreate())
        if way == "Spark":
            frame = read_files(spark, table).transform(spark_select, **options).select("chunk_id", "selected")
            return picked(frame.toPandas(), start)
        write_file_selection(spark, table, out, **options)
    else:
        workers, threads = (2, 1) if way.startswith("2 workers") else (1, 2)
        if way == "small workers":
            workers, threads = 2, 1
        client = get_client("cpu", n_workers=workers, threads_per_worker=threads, dashboard_address=":0",
                            memory_limit=memory if way == "small workers" else f"{8 * threads}GiB")
        started = time.perf_counter()
        try:
            write_selection(read_parquet(table), out, scheduler=client, **options)
        except Exception as exc:  # the small workers' answer: its first words, and how soon it came
            seconds = time.perf_counter() - started
            return {"error": f"{type(exc).__name__}: {str(exc)[:90]}", "seconds": seconds}
        finally:
            client.shutdown()
    return picked(pq.read_table(out, columns=["chunk_id", "selected"]).to_pandas(), start)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=120_000)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--files", type=int, default=2)
    parser.add_argument("--data-seed", type=int, default=2)
    parser.add_argument("--algorithms", nargs="+", default=["Facility"])
    parser.add_argument("--ways", nargs="+", default=list(WAYS), choices=WAYS)
    parser.add_argument("--before", help="another checkout of the package: its threads and 2 x 1 ways too")
    parser.add_argument("--small-workers", help="memory limit of 2 workers expected to fail fast (700MiB)")
    parser.add_argument("--cache", default=str(HERE.parent / ".benchmark-cache"))
    parser.add_argument("--json", help="append the results to this JSON file (results/conformance.json)")
    parser.add_argument("--way", help=argparse.SUPPRESS)  # run one way here: the child process
    parser.add_argument("--table", help=argparse.SUPPRESS)
    parser.add_argument("--scratch", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.way:
        print(json.dumps(run_way(args.way, args.table, args.algorithms[0], args.scratch, args.small_workers)))
        return 0
    import tempfile

    table = ensure_table(Path(args.cache), args.rows, args.dim, args.files, args.data_seed)
    trees = {"": str(HERE.parent), **({" (before)": args.before} if args.before else {})}
    lines = [f"# One meaning at real size ({args.rows:,} rows, d = {args.dim}, {args.files} files)", "",
             f"Command: `{record.command('bench_conformance.py', argv)}`", "",
             *([f"Before: the checkout at {record.commit(Path(args.before))}.", ""] if args.before else []),
             "Each way in its own process, default options and seed, ratio 0.1:", "",
             "| algorithm | way | digest | seconds |", "|---|---|---|---:|"]
    for algorithm in args.algorithms:
        ways = [(way, "") for way in args.ways]
        ways += [(way, " (before)") for way in args.ways[:2] if args.before]
        ways += [("small workers", "")] if args.small_workers else []
        for way, tag in ways:
            with tempfile.TemporaryDirectory(prefix="bench-conformance-") as scratch:
                environment = record.tree_environment(trees[tag])
                child = [sys.executable, __file__, "--way", way, "--table", str(table), "--scratch", scratch,
                         "--algorithms", algorithm, "--small-workers", args.small_workers or "1GiB"]
                run = subprocess.run(child, capture_output=True, text=True, env=environment)
                if run.returncode:
                    raise SystemExit(f"{algorithm}, {way}{tag}: {run.stderr[-3000:]}")
                result = json.loads(run.stdout.strip().splitlines()[-1])
            name = way + (f" ({args.small_workers})" if way == "small workers" else "") + tag
            shown = result.get("digest") or result["error"].replace("|", "/")
            lines.append(f"| {algorithm} | {name} | {shown} | {result['seconds']:.1f} |")
            print(lines[-1], file=sys.stderr, flush=True)
    lines += ["", f"{os.cpu_count()} CPU cores, shared with other work."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.json:
        shape = {"rows": args.rows, "dim": args.dim, "files": args.files, "data seed": args.data_seed}
        record.append(args.json, command=record.command("bench_conformance.py", argv), data={"table": shape},
                      markdown=text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
