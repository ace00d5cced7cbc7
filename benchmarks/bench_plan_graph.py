"""The plan graph's own cost as the partition count grows: tasks, layer entries, build and run time.

Each size is a table of ``--rows-per-partition`` rows a partition (tiny, d = 8: the data costs
next to nothing, so the times are the graph's), planned with the table scope and the sharded
near-duplicate search forced (``search.ONE_TASK_PARTITIONS = 0``), and computed on the synchronous
scheduler (``--workers N``: on a LocalCluster, where the shuffles are p2p). ``layer entries``
counts every key of every layer of the plan's HighLevelGraph: it equals ``tasks`` when no layer
repeats another's keys. ``--wiring`` picks how the search is wired
(``datamask_dask.dedup.dask_graph``): ``tasks`` (task to task), ``shuffles`` (DataFrame shuffles), or
``auto`` (by ``SHUFFLE_PARTITIONS``).

    python benchmarks/bench_plan_graph.py --partitions 60 200 --wiring tasks shuffles --workers 2
"""

from __future__ import annotations

import argparse
import sys
import time

import dask.dataframe as dd

from datamask_dask.dask_engine.operator import plan_selection
from datamask_dask.dedup import dask_graph as search
from datamask_dask.dedup import search as one
from datamask_dask.sample_data import make_corpus


def measure(n_parts: int, rows: int, scheduler="sync") -> dict:
    ddf = dd.from_pandas(make_corpus(n_parts * rows, 8, seed=1), npartitions=n_parts, sort=False)
    started = time.perf_counter()
    plan = plan_selection(ddf, 0.1)[1]
    built = time.perf_counter() - started
    graph = plan.__dask_graph__()
    layers = [set(layer.keys()) for layer in graph.layers.values()]
    started = time.perf_counter()
    plan.compute(scheduler=scheduler)
    return {"partitions": n_parts, "tasks": len(set().union(*layers)),
            "entries": sum(len(keys) for keys in layers), "build": built,
            "compute": time.perf_counter() - started}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, nargs="+", default=[60, 200])
    parser.add_argument("--rows-per-partition", type=int, default=200)
    parser.add_argument("--wiring", nargs="+", choices=["auto", "tasks", "shuffles"], default=["auto"])
    parser.add_argument("--skip", nargs="*", default=[], metavar="WIRING:PARTITIONS",
                        help="sizes not to run for a wiring, e.g. tasks:1000")
    parser.add_argument("--workers", type=int, default=0,
                        help="compute on a LocalCluster of this many worker processes (p2p shuffles) "
                             "instead of the synchronous scheduler")
    args = parser.parse_args(argv)
    if args.workers:
        from distributed import Client, LocalCluster

        client = Client(LocalCluster(n_workers=args.workers, threads_per_worker=1))
    where = f"LocalCluster, {args.workers} workers" if args.workers else "sync scheduler"
    one.ONE_TASK_PARTITIONS = 0  # the sharded search at any size
    given = " ".join(sys.argv[1:] if argv is None else argv)
    print(f"Command: `python benchmarks/bench_plan_graph.py {given}`\n")
    print(f"| wiring | partitions | tasks | layer entries | build s | compute s ({where}) |")
    print("|---|---:|---:|---:|---:|---:|")
    limits = {"auto": search.SHUFFLE_PARTITIONS, "tasks": 10**9, "shuffles": 0}
    for n_parts in args.partitions:
        for wiring in args.wiring:
            if f"{wiring}:{n_parts}" in args.skip:
                continue
            search.SHUFFLE_PARTITIONS = limits[wiring]
            r = measure(n_parts, args.rows_per_partition, client if args.workers else "sync")
            print(f"| {wiring} | {n_parts} | {r['tasks']:,} | {r['entries']:,} | {r['build']:.2f} | "
                  f"{r['compute']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
