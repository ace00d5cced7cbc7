"""Peak resident memory of the plan pass in table scope (the near-duplicate search with its exact
check) on the threaded scheduler, as the table grows past one vector block of partitions.

Each run is a fresh process: the table is written as parquet, one file a partition (Arrow
embeddings, a share of near-copies so the exact check has candidates to read), the libraries
warmed on a small table, then the peak resident memory of ``compute_plan`` over the files above the
process's memory before it (Linux's VmHWM, reset through /proc/self/clear_refs) is recorded with
the table's embedding bytes.
Each checkout of ``--trees`` (``name=path``, this one by default) is measured in turn with its
own package; ``--json`` appends the table to a results file that render.py writes onto
docs/benchmarks.md.

    python benchmarks/bench_plan_memory.py --trees main=/tmp/wt-main this=. --json \
        benchmarks/results/plan-memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import record  # noqa: E402

SCRIPT = r"""
import gc, json, sys, tempfile
import dask, dask.dataframe as dd, numpy as np, pandas as pd, pyarrow as pa, pyarrow.parquet as pq
from datamask_dask.dask_engine.operator import compute_plan, plan_selection
from datamask_dask.sample_data import make_embeddings

n_parts, rows, dim, share = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))

def table(n_parts, rows):
    quality, emb = make_embeddings(n_parts * rows, dim, duplicate_share=share, seed=0)
    folder = tempfile.mkdtemp()
    for p in range(n_parts):  # one file a partition: the reads are the plan pass's own
        span = slice(p * rows, (p + 1) * rows)
        vectors = pa.FixedSizeListArray.from_arrays(pa.array(emb[span].ravel()), dim)
        pq.write_table(pa.table({"chunk_id": np.arange(span.start, span.stop), "quality_score":
                                 quality[span].astype(np.float64), "feature_arr": vectors}),
                       f"{folder}/part-{p:05d}.parquet")
    nbytes = emb.nbytes
    del quality, emb
    gc.collect()
    return dd.read_parquet(folder), nbytes

def plan(ddf):
    spec, _ = plan_selection(ddf, ratio=0.1, diversity_scope="table")
    return compute_plan(ddf, spec, scheduler="threads", progress=False)[0]

with dask.config.set(num_workers=2):
    plan(table(4, 500)[0])  # libraries loaded, kernels compiled
    ddf, embedding_bytes = table(n_parts, rows)
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    base = int(status["VmRSS"].split()[0]) * 1024
    result = plan(ddf)
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    peak = int(status["VmHWM"].split()[0]) * 1024
print(json.dumps({"partitions": n_parts, "rows": n_parts * rows, "dim": dim,
                  "embedding_bytes": embedding_bytes, "peak_above_loaded_bytes": peak - base}))
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", nargs="+", default=["this=."], help="name=path of each checkout measured")
    parser.add_argument("--rows", type=int, default=4000, help="rows per partition")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--partitions", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--shares", type=float, nargs="+", default=[0.05, 0.2],
                        help="shares of rows that are copies")
    parser.add_argument("--json", help="append the results to this file (benchmarks/results/...)")
    args = parser.parse_args(argv)
    lines = ["#### Plan pass memory in table scope (threaded scheduler)", "",
             f"{args.rows} rows a partition, {args.dim} dimensions, parquet files; peak resident memory "
             "of the plan pass above the process's before it, beside the table's embeddings:", "",
             "| checkout | commit | copies | partitions | embeddings MiB | peak MiB |",
             "|---|---|---:|---:|---:|---:|"]
    for name, tree in (t.split("=", 1) for t in args.trees):
        tree = Path(tree).resolve()
        env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{tree / 'integrations'}"}
        commit = record.commit(tree)
        for share in args.shares:
            for n_parts in args.partitions:
                argv_run = [str(n_parts), str(args.rows), str(args.dim), str(share)]
                out = subprocess.run([sys.executable, "-c", SCRIPT, *argv_run], capture_output=True,
                                     text=True, check=True, env=env, cwd=tree)
                run = json.loads(out.stdout.strip().splitlines()[-1])
                peak = run["peak_above_loaded_bytes"] / 2**20
                lines.append(f"| {name} | `{commit}` | {share:.0%} | {n_parts} | "
                             f"{run['embedding_bytes'] / 2**20:.0f} | {peak:.0f} |")
                print(lines[-1], flush=True)
    text = "\n".join(lines)
    print(text)
    if args.json:
        record.append(args.json, command=record.command("bench_plan_memory.py", argv),
                      data={"table": {"rows a partition": args.rows, "dimensions": args.dim}}, markdown=text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
