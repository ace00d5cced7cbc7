"""A selection task's memory beside the model that checks it: the peak resident memory of ``datamask select``
on one partition of one chunk, and what ``plan.memory`` models for that chunk.

Each case is a fresh process: a parquet file of ``ROWS`` clustered rows of ``DIM`` dimensions
(``sample_data.make_embeddings``, written once under ``--data``), the libraries warmed on a small
table, then ``datamask select`` with the CLI's defaults for the metric on Dask's synchronous
scheduler, so that the plan, the task and the write all run in the measured process. The peak is
its resident memory above the process's before the job (Linux's VmHWM, reset through
/proc/self/clear_refs): the partition read and the driver's work included. The model is the
check's (``plan.memory.task_bytes``: the partition's rows a worker holds, and the chunk learned).
"fits 4 GiB thread" says whether the check passes on a worker thread of 4 GiB (Dask's share of a
16-core, 64 GiB machine: 4 workers of 4 threads).

    python benchmarks/bench_task_memory.py --cases Facility:100000:768 Facility:300000:256 \\
        Facility:778605:32 Pair_simi:50000:768 DiSF:10000:768 --json benchmarks/results/task-memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import record

SCRIPT = r"""
import json, os, sys, tempfile, time
import numpy as np, pyarrow as pa, pyarrow.parquet as pq

metric, rows, dim, folder = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
os.environ["DASK_SCHEDULER"] = "synchronous"
from datamask_dask import cli
from datamask_dask.config import resolve_options
from datamask_dask.options import chunk_rows
from datamask_dask.plan.memory import WORKER_SHARE, task_bytes
from datamask_dask.sample_data import make_embeddings

def table(n, name):
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        quality, emb = make_embeddings(n, dim, seed=0)
        vectors = pa.FixedSizeListArray.from_arrays(pa.array(emb.astype(np.float32).ravel()), dim)
        pq.write_table(pa.table({"chunk_id": np.arange(n), "quality_score": quality, "feature_arr": vectors}),
                       path + ".tmp")
        os.replace(path + ".tmp", path)
    return path

def select(path):
    cli.main(["select", "--input", path, "--output", tempfile.mkdtemp() + "/out", "--algorithm", metric,
              "--no-progress"])

def status(key):
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(key))

big = table(rows, f"{rows}-{dim}.parquet")
select(table(2000, f"2000-{dim}.parquet"))  # libraries loaded, kernels compiled
options = resolve_options(algorithm=metric)
chunk = min(rows, chunk_rows(options.max_chunk_rows, options.max_chunk_values, dim))
model = task_bytes(rows, dim, options.learner, chunk)
with open("/proc/self/clear_refs", "w") as handle:
    handle.write("5")
base, started = status("VmRSS"), time.perf_counter()
select(big)
print(json.dumps({"chunk": chunk, "model": model, "peak": status("VmHWM") - base,
                  "seconds": time.perf_counter() - started, "embeddings": rows * dim * 4,
                  "fits": model <= WORKER_SHARE * 4 * 2**30}))
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=["Facility:100000:768", "Facility:300000:256",
                                                       "Facility:778605:32", "Pair_simi:50000:768",
                                                       "DiSF:10000:768"],
                        help="METRIC:ROWS:DIM of each case")
    parser.add_argument("--data", default="/tmp/datamask-task-memory", help="where the tables are written")
    parser.add_argument("--json", help="append the results to this file (benchmarks/results/...)")
    args = parser.parse_args(argv)
    Path(args.data).mkdir(parents=True, exist_ok=True)
    lines = ["#### A selection task's memory beside its model", "",
             "One partition of one chunk, `datamask select` with the CLI's defaults on the synchronous "
             "scheduler; peak resident memory above the process's before the job, beside the check's "
             "model of the task (the partition's rows held, and the chunk learned):", "",
             "| metric | rows | dim | chunk rows | embeddings MiB | model MiB | peak MiB | model / peak "
             "| fits 4 GiB thread | job s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(record.ROOT), str(record.ROOT / "integrations")])}
    for case in args.cases:
        metric, rows, dim = case.split(":")
        out = subprocess.run([sys.executable, "-c", SCRIPT, metric, rows, dim, args.data],
                             capture_output=True, text=True, check=True, env=env, cwd=record.ROOT)
        run = json.loads(out.stdout.strip().splitlines()[-1])
        mib = {key: run[key] / 2**20 for key in ("embeddings", "model", "peak")}
        lines.append(f"| {metric} | {int(rows):,} | {dim} | {run['chunk']:,} | {mib['embeddings']:.0f} | "
                     f"{mib['model']:.0f} | {mib['peak']:.0f} | {run['model'] / run['peak']:.2f} | "
                     f"{'yes' if run['fits'] else 'no'} | {run['seconds']:.1f} |")
        print(lines[-1], flush=True)
    text = "\n".join(lines)
    print(text)
    if args.json:
        record.append(args.json, command=record.command("bench_task_memory.py", argv),
                      data="clustered synthetic rows (sample_data.make_embeddings, seed 0), one parquet "
                           f"file a case (metric:rows:dim): {', '.join(args.cases)}", markdown=text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
