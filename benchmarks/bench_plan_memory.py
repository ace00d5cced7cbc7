"""Peak resident memory of the plan pass in table scope (the near-duplicate search with its exact
check) on the threaded scheduler, as the table grows past one vector block of partitions.

Each run is a fresh process: the table is built in memory (a pandas frame, Arrow embeddings, a
share of near-copies so the exact check has candidates to read), the libraries warmed on a small
table, then the peak resident memory of ``compute_plan`` above the process's memory once loaded
(Linux's VmHWM, reset through /proc/self/clear_refs) is recorded with the table's embedding bytes.
Run it from the checkout to measure (``--label`` names the commit measured); results go to
benchmarks/results/plan-memory.json (keyed by label) and are rendered by render.py.

    PYTHONPATH=.:integrations python benchmarks/bench_plan_memory.py --label precise-dups
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "plan-memory.json"

SCRIPT = r"""
import json, sys
import dask, dask.dataframe as dd, numpy as np, pandas as pd, pyarrow as pa
from datamask_dask.dask_engine.operator import compute_plan, plan_selection
from datamask_dask.sample_data import make_embeddings

n_parts, rows, dim = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])

def table(n_parts, rows):
    quality, emb = make_embeddings(n_parts * rows, dim, duplicate_share=0.2, seed=0)
    vectors = pa.FixedSizeListArray.from_arrays(pa.array(emb.ravel()), dim)
    frame = pd.DataFrame({"chunk_id": np.arange(len(quality)), "quality_score": quality.astype(np.float64),
                          "feature_arr": pd.arrays.ArrowExtensionArray(vectors)})
    return dd.from_pandas(frame, npartitions=n_parts, sort=False), emb.nbytes

def plan(ddf):
    spec, _ = plan_selection(ddf, ratio=0.1, diversity_scope="table")
    return compute_plan(ddf, spec, scheduler="threads", progress=False)

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", required=True, help="the commit or branch measured")
    parser.add_argument("--rows", type=int, default=4000, help="rows per partition")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--partitions", type=int, nargs="+", default=[4, 16, 32])
    args = parser.parse_args()
    runs = []
    for n_parts in args.partitions:
        out = subprocess.run([sys.executable, "-c", SCRIPT, str(n_parts), str(args.rows), str(args.dim)],
                             capture_output=True, text=True, check=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(runs[-1], flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results[args.label] = {"commit": commit, "scheduler": "threads", "runs": runs}
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
