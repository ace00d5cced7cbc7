"""The plan graph's own cost as the partition count grows: tasks, layer entries, build and run time.

Each size is a table of ``--rows-per-partition`` rows a partition (tiny, d = 8: the data costs
next to nothing, so the times are the graph's), planned with the table scope and the sharded
near-duplicate search forced (``shards.ONE_TASK_ROWS = 0``), and computed on the synchronous
scheduler. ``layer entries`` counts every key of every layer of the plan's HighLevelGraph: it
equals ``tasks`` when no layer repeats another's keys.

    python benchmarks/bench_plan_graph.py --partitions 60 200
"""

from __future__ import annotations

import argparse
import sys
import time

import dask.dataframe as dd

from datamask_dask.ops.operator import plan_selection
from datamask_dask.plan import shards
from datamask_dask.sample_data import make_corpus


def measure(n_parts: int, rows: int) -> dict:
    ddf = dd.from_pandas(make_corpus(n_parts * rows, 8, seed=1), npartitions=n_parts, sort=False)
    started = time.perf_counter()
    plan = plan_selection(ddf, 0.1)[1]
    built = time.perf_counter() - started
    graph = plan.__dask_graph__()
    layers = [set(layer.keys()) for layer in graph.layers.values()]
    started = time.perf_counter()
    plan.compute(scheduler="sync")
    return {"partitions": n_parts, "tasks": len(set().union(*layers)),
            "entries": sum(len(keys) for keys in layers), "build": built,
            "compute": time.perf_counter() - started}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, nargs="+", default=[60, 200])
    parser.add_argument("--rows-per-partition", type=int, default=200)
    args = parser.parse_args(argv)
    shards.ONE_TASK_ROWS = 0  # the sharded search at any size
    given = " ".join(sys.argv[1:] if argv is None else argv)
    print(f"Command: `python benchmarks/bench_plan_graph.py {given}`\n")
    print("| partitions | tasks | layer entries | build s | compute s (sync scheduler) |")
    print("|---:|---:|---:|---:|---:|")
    for n_parts in args.partitions:
        r = measure(n_parts, args.rows_per_partition)
        print(f"| {n_parts} | {r['tasks']:,} | {r['entries']:,} | {r['build']:.2f} | {r['compute']:.2f} |",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
