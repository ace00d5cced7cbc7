"""The table-wide near-duplicate search as a Dask graph on a LocalCluster: time, tasks and memory.

The search alone (``datamask_dask.dedup.dask_graph.table_groups`` with the sharded wiring forced), on
``--partitions`` partitions of ``--rows-per-partition`` rows, each a file of search inputs
(256-bit SimHash signatures of d = 32 embeddings, 10% of each partition's rows near-copies at
cosine 0.99 of rows of the previous one; quality uniform) that the workers load themselves, so the
driver sends no data. ``--workers`` worker processes of one thread.
``--wiring`` picks how the search is wired (``datamask_dask.dedup.dask_graph``): ``tasks`` (task to task),
``shuffles`` (DataFrame shuffles, with ``--shuffle``'s methods: ``default`` is p2p on the cluster),
or ``auto`` (by ``SHUFFLE_PARTITIONS``).
Reported per size: wall seconds of the compute, tasks in the graph, the largest worker's peak
RSS (psutil, every 0.2 s), and a digest of the groups (equal digests, equal groups). Run it with
another checkout's package first on ``PYTHONPATH`` to compare.

    python benchmarks/bench_search_graph.py --partitions 20 60 --wiring tasks shuffles
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import record  # noqa: E402


def make_inputs(folder: Path, n_parts: int, rows: int, dim: int = 32, copies: float = 0.1) -> list[Path]:
    """One ``.npz`` of search inputs per partition (made once per folder)."""
    from datamask_dask.dedup.simhash import hyperplanes, signatures

    planes = hyperplanes(dim)
    paths, previous = [], None
    for number in range(n_parts):
        path = folder / f"part-{number:05d}.npz"
        rng = np.random.default_rng([7, number])
        emb = rng.standard_normal((rows, dim)).astype(np.float32)
        emb /= np.linalg.norm(emb, axis=1, keepdims=True)
        if previous is not None:  # near-copies (cosine 0.99) of the previous partition's rows
            chosen = rng.choice(rows, int(copies * rows), replace=False)
            u = previous[rng.integers(0, rows, chosen.size)]
            w = rng.standard_normal(u.shape).astype(np.float32)
            w -= np.einsum("ij,ij->i", w, u)[:, None] * u
            w /= np.linalg.norm(w, axis=1, keepdims=True)
            emb[chosen] = 0.99 * u + np.sqrt(1 - 0.99**2) * w
        previous = emb
        if not path.exists():
            np.savez(path, quality=rng.random(rows), signatures=signatures(emb, planes))
        paths.append(path)
    return paths


def load(path: str) -> dict:
    data = np.load(path)
    n = len(data["quality"])
    return {"quality": data["quality"], "codes": np.zeros(n, np.int64), "labels": [None],
            "signatures": data["signatures"]}


def digest(groups) -> str:
    h = hashlib.blake2b(digest_size=6)
    for g in groups:
        for key in ("shadowed", "kept", "weights"):
            h.update(np.ascontiguousarray(getattr(g, key)).tobytes())
    return h.hexdigest()


def watch_peak(stop: threading.Event, peak: list) -> None:
    import psutil

    me = psutil.Process()
    while not stop.is_set():
        for child in me.children(recursive=True):
            try:
                peak[0] = max(peak[0], child.memory_info().rss)
            except psutil.Error:
                pass
        time.sleep(0.2)


def _listing(*items):
    return items


def measure(paths: list[Path], rows: int, workers: int, method: str | None, wiring: str) -> dict:
    import dask
    from distributed import Client, LocalCluster

    from datamask_dask.dedup import dask_graph as search
    from datamask_dask.dedup import search as one

    one.ONE_TASK_PARTITIONS = 0
    search.SHUFFLE_PARTITIONS = {"auto": search.SHUFFLE_PARTITIONS, "tasks": 10**9, "shuffles": 0}[wiring]
    config = {"dataframe.shuffle.method": method} if method else {}
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True) as cluster, \
            Client(cluster), dask.config.set(config):
        inputs = [dask.delayed(load)(str(p)) for p in paths]
        graph = search.table_groups(inputs, 0.95)
        tasks = len(dict(dask.delayed(_listing)(*graph).__dask_graph__())) - 1
        stop, peak = threading.Event(), [0]
        watcher = threading.Thread(target=watch_peak, args=(stop, peak), daemon=True)
        watcher.start()
        started = time.perf_counter()
        groups = dask.compute(*graph)
        seconds = time.perf_counter() - started
        stop.set()
        watcher.join()
    return {"seconds": seconds, "tasks": tasks, "peak": peak[0], "digest": digest(groups),
            "shadowed": sum(len(g.shadowed) for g in groups)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, nargs="+", default=[20, 60])
    parser.add_argument("--rows-per-partition", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--wiring", nargs="+", choices=["auto", "tasks", "shuffles"], default=["auto"])
    parser.add_argument("--shuffle", nargs="+", default=["default"],
                        help="dask shuffle methods of the shuffles wiring (default: dask's choice)")
    parser.add_argument("--data", help="folder for the inputs (default: a temporary one)")
    parser.add_argument("--label", default="this checkout")
    parser.add_argument("--json", help="append the results to this JSON file (results/search-graph.json)")
    args = parser.parse_args(argv)
    folder = Path(args.data or tempfile.mkdtemp(prefix="search-graph-"))
    folder.mkdir(parents=True, exist_ok=True)
    given = " ".join(sys.argv[1:] if argv is None else argv)
    print(f"Command: `python benchmarks/bench_search_graph.py {given}`\n")
    table = ["| package | wiring | shuffle | partitions | rows | seconds | tasks | largest worker peak "
             "| shadowed | groups digest |", "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    print("\n".join(table))
    paths = make_inputs(folder, max(args.partitions), args.rows_per_partition)
    for n_parts in args.partitions:
        runs = [(w, m) for w in args.wiring for m in (args.shuffle if w != "tasks" else ["-"])]
        for wiring, method in runs:
            r = measure(paths[:n_parts], args.rows_per_partition, args.workers,
                        None if method in ("default", "-") else method, wiring)
            rows = n_parts * args.rows_per_partition
            table.append(f"| {args.label} | {wiring} | {method} | {n_parts} | {rows:,} | "
                         f"{r['seconds']:.1f} | {r['tasks']:,} | {r['peak'] / 2**30:.2f} GiB | "
                         f"{r['shadowed']:,} | {r['digest']} |")
            print(table[-1], flush=True)
    if args.json:
        shape = {"partitions": max(args.partitions), "rows a partition": args.rows_per_partition,
                 "workers": args.workers}
        record.append(args.json, command=record.command("bench_search_graph.py", argv),
                      data={"table": shape}, markdown="\n".join(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
