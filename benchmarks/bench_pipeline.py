"""End-to-end throughput of ``datamask select`` on partitioned parquet, with a breakdown by stage.

One command prints markdown tables (and appends them to ``--json``, see ``record.py``)::

    python benchmarks/bench_pipeline.py --sizes 100000 1000000 --workers 1 2 \
        --algorithms Pair_simi Facility --config conf/cpu.yaml --json benchmarks/results/pipeline.json

What runs, for every (size, algorithm, workers):

- **Data**: a synthetic table generated once into ``--cache`` (default ``.benchmark-cache/``):
  ``rows_per_partition`` rows per parquet file (default 100,000), columns ``chunk_id`` (int64),
  ``quality_score`` (float64), ``feature_arr`` (fixed_size_list<float32>[d], d = 768 by default)
  and ``text`` (a short string, standing for the columns a selection job carries along). The
  embeddings are clustered around cluster centres shared by every partition (Zipf-like cluster
  sizes over the whole table), 20% of each partition's rows are near-duplicates of another of its
  rows, and quality is log-normal and correlated with the cluster (as in
  :func:`datamask_dask.sample_data.make_embeddings`); partition ``i`` is drawn with seed ``i``,
  so a size of N rows is the first N / rows_per_partition files (hard links into one folder).
- **Job**: exactly what ``datamask select --input IN --output OUT --config CONFIG --n-workers W``
  runs (``select_table(IN, OUT, ...)``, resumable writer included), on a
  ``LocalCluster`` from :func:`datamask_dask.cluster.get_client` with W worker processes of T
  threads each (``--threads``, default 1; the ``workers`` column says ``W x T``). ``rows/s`` =
  input rows / wall time of that call (plan pass, select pass and write, cluster start-up excluded).
- **Wall account** (the first table): every second of that wall time, once. From Dask's task
  stream (``distributed.get_task_stream``), an instant when tasks run is shared equally among the
  task prefixes running then (``datamask-select-write``, ``read_parquet``...), transfers
  (``transfer``) and spills (``spill to disk``); an instant when nothing runs is the driver's, named
  by the phase it falls in (``SelectionReport.phases``): ``driver: plan`` (the first ``plan``
  seconds), ``driver: summary`` and ``driver: commit`` (the last seconds), and ``driver: between
  passes / scheduling`` (the rest: the driver's bookkeeping and the gaps between tasks). The rows add
  up to the wall time (:func:`wall_account`).
- **Peak memory per worker**: the largest resident set size (psutil, sampled every 50 ms) of any
  worker process during the job, next to the target ``2 x (one partition's embedding bytes) +
  1 GiB``.
- **Stages**: worker-seconds spent in each stage, summed over the workers, as the package
  reports them (``SelectionReport.stages``, see :mod:`datamask_dask.telemetry`):
  ``read`` (parquet -> Arrow-backed pandas, both passes), ``plan`` (per-partition checks,
  sketches and the quota plan), ``extract`` (Arrow list column -> float32 matrix),
  ``learn`` (:func:`~datamask_dask.learn.engine.learn_mask`), ``select other`` (the rest of the select
  task: eligibility, chunking, quotas, adding the column) and ``write`` (Arrow conversion,
  parquet encoding, fsync and markers). ``idle/other`` = W x T x wall - the sum: scheduling,
  serialisation, the driver's commit, and waiting (the wall account says which).
- **Objective** (``--objective``, on by default): on partition 0 of the smallest size (its first
  ``rows_per_partition`` rows), the rows the job selected there (k rows) are scored with
  :func:`~datamask_dask.learn.metrics.evaluate_selection` on the whole partition (Facility's
  reference set is every row of the partition; quality normalised by the whole table's range, as
  the job does), next to ``random``, ``quality top-k`` and ``stochastic greedy`` (eps = 0.1, the
  same joint objective) with the same k on the same rows. Stochastic greedy runs when the
  partition has at most ``--greedy-max-n`` rows (Facility: with a reference set of
  ``--greedy-reference`` rows, scored on every row like the others).

The selected column of the runs with 1 and with 2 workers is compared: the selection must not
depend on the number of workers.
"""

from __future__ import annotations

import argparse
import ast
import os
import platform
import sys
from pathlib import Path

from jobs import (
    GIB,
    STAGES,
    cluster_job,
    finish_report,
    fmt_seconds,
    same_selection,
    wall_account_lines,
)
from tables import ensure_dataset

ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- data












# --------------------------------------------------------------------------- memory




# --------------------------------------------------------------------------- wall account







# --------------------------------------------------------------------------- one job






# --------------------------------------------------------------------------- objective






# --------------------------------------------------------------------------- report








def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--threads", type=int, default=1, help="threads per worker")
    parser.add_argument("--algorithms", nargs="+", default=["Pair_simi", "Facility"])
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--rows-per-partition", type=int, default=100_000)
    parser.add_argument("--clusters", type=int, default=2000, help="cluster centres shared by all partitions")
    parser.add_argument("--config", default=str(ROOT / "conf" / "cpu.yaml"))
    parser.add_argument(
        "--opt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra option for the job (repeatable), e.g. --opt refine_epochs=20",
    )
    parser.add_argument("--cache", default=str(ROOT / ".benchmark-cache"))
    parser.add_argument("--no-objective", dest="objective", action="store_false")
    parser.add_argument("--greedy-max-n", type=int, default=100_000)
    parser.add_argument("--greedy-reference", type=int, default=8192)
    parser.add_argument("--keep-output", action="store_true", help="keep the selection outputs")
    parser.add_argument("--json", help="append the results to this JSON file (results/pipeline.json)")
    args = parser.parse_args(argv)

    overrides = {}
    for item in args.opt:
        key, _, value = item.partition("=")
        try:
            overrides[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            overrides[key] = value
    cache = Path(args.cache)
    out_root = cache / "pipeline-out"
    part_bytes = args.rows_per_partition * args.dim * 4
    memory_target = 2 * part_bytes + GIB
    head = [
        f"# datamask select, end to end (d = {args.dim}, {args.rows_per_partition:,} rows per partition)",
        "",
        "Command: `python benchmarks/bench_pipeline.py "
        f"{' '.join(argv if argv is not None else sys.argv[1:])}`",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, "
        f"Python {platform.python_version()}; config {args.config}"
        + (f" + {overrides}" if overrides else ""),
        "",
    ]
    lines = [
        "Throughput, memory and worker-seconds by stage:",
        "",
        "| rows | algorithm | workers | wall s | rows/s | peak RSS / worker (target) | "
        + " | ".join(STAGES)
        + " | idle/other |",
        "|---:|---|---:|---:|---:|---:|" + "---:|" * (len(STAGES) + 1),
    ]
    results, accounts = {}, []
    for size in args.sizes:
        source = ensure_dataset(cache, size, args.dim, args.rows_per_partition, args.clusters)
        for algorithm in args.algorithms:
            for workers in args.workers:
                target = out_root / f"n{size}-{algorithm}-w{workers}"
                print(
                    f"running {size} rows, {algorithm}, {workers} worker(s)...", file=sys.stderr, flush=True
                )
                result = cluster_job(source, target, workers, args.config,
                                     {"algorithm": algorithm, **overrides}, args.threads)
                results[size, algorithm, workers] = result
                stages, wall = result["stages"], result["wall"]
                busy = workers * args.threads * wall
                idle = max(0.0, busy - sum(stages.get(s, 0.0) for s in STAGES))
                team = f"{workers} x {args.threads}"
                accounts.append(({"rows": f"{size:,}", "algorithm": algorithm, "workers": team},
                                 result["account"], wall))
                row = (
                    f"| {size:,} | {algorithm} | {team} | {wall:.1f} | {size / wall:,.0f} | "
                    f"{result['peak_rss'] / GIB:.2f} GiB ({memory_target / GIB:.2f}) | "
                    + " | ".join(fmt_seconds(stages, s, busy) for s in STAGES)
                    + f" | {idle:.1f} ({idle / busy:.0%}) |"
                )
                lines.append(row)
                print(row, file=sys.stderr, flush=True)
    lines = head + wall_account_lines(accounts) + lines
    lines += ["", "Workers: worker processes x threads each. Stage columns: worker-seconds summed over the "
              "threads (share of workers x threads x wall).", ""]

    # Checks against the targets.
    lines += ["## Targets", ""]
    for algorithm in args.algorithms:
        floor = 50_000 if algorithm.lower() == "pair_simi" else 20_000
        for (size, alg, workers), result in sorted(results.items()):
            if alg == algorithm and workers == max(args.workers):
                rate = size / result["wall"]
                lines.append(
                    f"- {algorithm}, {size:,} rows, {workers} workers: {rate:,.0f} rows/s "
                    f"(target >= {floor:,}: {'met' if rate >= floor else 'NOT met'})"
                )
        sizes = sorted({s for s, a, _ in results if a == algorithm})
        for workers in args.workers:
            for size in sizes[1:]:
                if (sizes[0], algorithm, workers) not in results or (size, algorithm, workers) not in results:
                    continue
                small, large = results[sizes[0], algorithm, workers], results[size, algorithm, workers]
                ratio = large["wall"] / small["wall"]
                allowed = 1.1 * size / sizes[0]
                lines.append(
                    f"- {algorithm}, {workers} worker(s): {size:,} rows take {ratio:.1f}x the time "
                    f"of {sizes[0]:,} (target <= {allowed:.0f}x: {'met' if ratio <= allowed else 'NOT met'})"
                )
        if len(args.workers) > 1:
            one, many = min(args.workers), max(args.workers)
            for size in sizes:
                if (size, algorithm, one) in results and (size, algorithm, many) in results:
                    speedup = results[size, algorithm, one]["wall"] / results[size, algorithm, many]["wall"]
                    same = same_selection(
                        out_root / f"n{size}-{algorithm}-w{one}", out_root / f"n{size}-{algorithm}-w{many}"
                    )
                    lines.append(
                        f"- {algorithm}, {size:,} rows: {many} workers {speedup:.2f}x faster than {one} "
                        f"(target >= 1.7x at 1M rows: {'met' if speedup >= 1.7 else 'NOT met'}); "
                        f"same selection: {same}"
                    )
        peak = max(r["peak_rss"] for (s, a, w), r in results.items() if a == algorithm)
        lines.append(
            f"- {algorithm}: peak RSS per worker {peak / GIB:.2f} GiB (target <= "
            f"{memory_target / GIB:.2f} GiB: {'met' if peak <= memory_target else 'NOT met'})"
        )
    lines.append("")

    return finish_report(args, lines, cache, out_root, overrides)


if __name__ == "__main__":
    sys.exit(main())
