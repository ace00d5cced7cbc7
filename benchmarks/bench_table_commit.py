"""Driver memory of a table write: does it grow with the table?

    python benchmarks/bench_table_commit.py --sizes 1000000 4000000 --dim 256 \
        --json benchmarks/results/storage.json [--code DIR ...]

For each size, a fresh driver process runs ``select_table(parquet input, "delta://OUT", 0.1)`` with
every column written (``output_columns="all"``) on a ``LocalCluster`` of 2 worker processes (one
thread each), and reports the driver's peak resident set (``ru_maxrss`` of that process only: the
workers are other processes), the wall time and the rows selected. ``--code DIR`` runs the same
job with the package imported from DIR instead (a checkout of another commit), side by side.

Data: :func:`tables.ensure_dataset` (clustered embeddings, 20% near-copies, quality
correlated with the cluster), ``--rows-per-partition`` rows per file. Learner steps are few
(``--n-epochs``): what is measured is the write, not the learning.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import record  # noqa: E402
from tables import ensure_dataset

JOB = r"""
import json, resource, sys, time
import datamask_dask
from distributed import Client, LocalCluster
from datamask_dask.run.tables import select_table

source, target, n_epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster, \
        Client(cluster) as client:
    started = time.perf_counter()
    report = select_table(source, target, 0.1, scheduler=client, n_epochs=n_epochs, n_rollout=8,
                          summary_rows=0)
    seconds = time.perf_counter() - started
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
print(json.dumps({"rows": report.rows, "selected": report.selected, "seconds": seconds, "peak": peak,
                  "package": datamask_dask.__file__}))
"""


def run(code: str | None, source: Path, n_epochs: int) -> dict:
    target = Path(tempfile.mkdtemp(prefix="bench-table-commit-")) / "out"
    env = dict(os.environ)
    if code:
        env["PYTHONPATH"] = os.pathsep.join([code, str(Path(code) / "integrations")])
    try:
        # cwd: a folder without a package in it (``python -c`` puts the working directory first)
        done = subprocess.run([sys.executable, "-c", JOB, str(source.resolve()), f"delta://{target}",
                               str(n_epochs)], env=env, capture_output=True, text=True, check=True,
                              cwd=target.parent)
    except subprocess.CalledProcessError as exc:
        raise SystemExit(exc.stderr[-3000:]) from None
    finally:
        shutil.rmtree(target.parent, ignore_errors=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 4_000_000])
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--rows-per-partition", type=int, default=250_000)
    parser.add_argument("--n-epochs", type=int, default=20)
    parser.add_argument("--code", nargs="*", default=[], help="other checkouts to run side by side")
    parser.add_argument("--cache", type=Path, default=Path(".benchmark-cache"))
    parser.add_argument("--json", help="append the results to this JSON file (results/storage.json)")
    args = parser.parse_args()
    codes = [None, *args.code]
    rows = []
    for size in args.sizes:
        source = ensure_dataset(args.cache, size, args.dim, args.rows_per_partition, 64)
        for code in codes:
            result = run(code, source, args.n_epochs)
            rows.append((size, code or "this checkout", result))
            print(f"{size} rows, {code or 'this checkout'}: {result}", file=sys.stderr, flush=True)
    lines = [f"Driver peak RSS of `select_table(parquet, delta://..., 0.1)`, all columns written, "
             f"d = {args.dim}, {args.rows_per_partition} rows per file, 2 worker processes; "
             f"{platform.node()}, {os.cpu_count()} cores.", "",
             f"    python benchmarks/bench_table_commit.py --sizes {' '.join(map(str, args.sizes))} "
             f"--dim {args.dim}" + (f" --code {' '.join(args.code)}" if args.code else ""), "",
             "| rows | code | driver peak RSS (MiB) | wall (s) | selected |", "|---:|---|---:|---:|---:|"]
    for size, code, result in rows:
        lines.append(f"| {size:,} | {code} | {result['peak'] / 2**20:,.0f} | {result['seconds']:.1f} | "
                     f"{result['selected']:,} |")
    for code in dict.fromkeys(code for _, code, _ in rows):
        peaks = [r["peak"] for _, c, r in rows if c == code]
        if len(peaks) > 1:
            lines.append(f"\n{code}: largest / smallest size's driver peak = {max(peaks) / min(peaks):.2f}x")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.json:
        shape = {"rows": max(args.sizes), "dim": args.dim, "rows a file": args.rows_per_partition}
        record.append(args.json, command=record.command("bench_table_commit.py"), data={"table": shape},
                      markdown=text)


if __name__ == "__main__":
    main()
