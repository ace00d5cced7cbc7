"""The table scope as the table grows: ``datamask select`` end to end at several sizes of one corpus.

The data has issue 27's shape: d = ``--dim`` (32), ``--rows-per-partition`` rows a file (100,000),
``--copies`` (10%) of each file's rows near-copies (cosine ~0.99) of rows of the previous file
(``ensure_spread_dataset``), generated once under ``--data`` at the largest size;
each smaller size is the first files of it (a folder of links). Each size is one fresh ``datamask
select --n-workers W`` process with the CLI's defaults (table scope, Pair_simi; ``--algorithm``
names other metrics, each run at every size with its own defaults: Facility in regions, DiSF in
context). Reported: the job's own seconds (start-up excluded) and plan phase, the peak resident
memory of the job's process and of its largest worker (sampled every 0.25 s), the largest
peak memory of one task of its own (``task_peaks.py``: what the workers hold between tasks left
out, so that a table that needs more workers than this one has is judged by its tasks), the planted
cross-file copy pairs whose rows were both selected (counted exactly from the output's ``selected``
column) and the near-duplicate pairs among the selected rows (the run summary's SimHash LSH estimate
on its sample of the selection, which also counts natural neighbours), each against a random pick of
as many rows.

    python benchmarks/bench_table_scale.py --sizes 1000000 6000000 --data /work/data-e2e/n6000000 \\
        --json benchmarks/results/table-scale.json
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import record
from jobs import checkout_job, random_pairs
from tables import ensure_spread_dataset, planted_copies

HERE = Path(__file__).resolve().parent


def first_files(source: Path, n_files: int, folder: Path) -> Path:
    """A folder of links to ``source``'s first ``n_files`` parquet files."""
    folder.mkdir(parents=True, exist_ok=True)
    for path in sorted(source.glob("*.parquet"))[:n_files]:
        link = folder / path.name
        if not link.exists():
            link.symlink_to(path)
    return folder


def planted_pairs_selected(output: Path, n_files: int, rows_per_file: int, copies: float) -> dict:
    """The planted cross-file copy pairs (global row numbers, the ``chunk_id`` column) of the first
    ``n_files`` files: how many there are, how many the job selected both rows of, and how many a
    random pick of as many rows as the job selected would (seed 0)."""
    table = pq.read_table(output, columns=["chunk_id", "selected"])
    selected = np.zeros(n_files * rows_per_file, dtype=bool)
    selected[table.column("chunk_id").to_numpy()] = table.column("selected").to_numpy()
    pairs = [(number * rows_per_file + rows, (number - 1) * rows_per_file + sources)
             for number in range(1, n_files)
             for _, rows, sources in [planted_copies(number, rows_per_file, copies)]]
    copy, source = (np.concatenate(side) for side in zip(*pairs, strict=True))
    pick = np.zeros_like(selected)
    pick[np.random.default_rng(0).choice(selected.size, int(selected.sum()), replace=False)] = True
    return {"pairs": int(copy.size), "job": int((selected[copy] & selected[source]).sum()),
            "random": int((pick[copy] & pick[source]).sum())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 6_000_000])
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--rows-per-partition", type=int, default=100_000)
    parser.add_argument("--copies", type=float, default=0.1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--algorithm", nargs="+", default=["Pair_simi"],
                        help="the metrics, each a job per size")
    parser.add_argument("--data", default="/tmp/datamask-scale", help="where the largest size is generated")
    parser.add_argument("--json", help="append the results to this JSON file (results/table-scale.json)")
    args = parser.parse_args(argv)
    source = ensure_spread_dataset(Path(args.data), max(args.sizes), args.dim, args.rows_per_partition,
                                   args.copies)
    scratch = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    rows = []
    try:
        for algorithm in args.algorithm:
            for size in sorted(args.sizes):
                n_files = size // args.rows_per_partition
                folder = first_files(source, n_files, source.with_name(f"{source.name}-first{n_files}"))
                load = os.getloadavg()[0]
                job = checkout_job(str(HERE.parent), folder, scratch / "out", args.workers,
                                   ["--algorithm", algorithm], task_peaks=True)
                pairs = job["summary"].get("selected_pairs") or {}
                rand = random_pairs(folder, pairs["rows"]) if pairs.get("rows") else {}
                planted = planted_pairs_selected(scratch / "out", n_files, args.rows_per_partition,
                                                 args.copies)
                rows.append((algorithm, size, n_files, job, pairs, rand, planted, load))
                print(algorithm, size, job["seconds"], job["peak_rss"], pairs, rand, planted, file=sys.stderr,
                      flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    given = " ".join(sys.argv[1:] if argv is None else argv)
    lines = [f"# The table scope as the table grows (d = {args.dim}, {args.rows_per_partition:,} rows a "
             f"file, {args.copies:.0%} cross-file near-copies)", "",
             f"Command: `python benchmarks/bench_table_scale.py {given}`", "",
             f"`datamask select --n-workers {args.workers} --algorithm A`, CLI defaults otherwise (table "
             f"scope, each metric's pieces); {os.cpu_count()} CPU cores shared with other work; one run per "
             "size.", "",
             "| metric | rows | files | load at start | job s | plan s | time / smallest's | "
             "peak RSS, job process | peak RSS, largest worker | largest / smallest's | "
             "largest task's own peak (its kind) | task peak / smallest's | "
             "selected pairs within / across (of rows) | "
             "random pick within / across | planted copy pairs: both selected, job / random pick |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|---|---|"]
    smallest = {algorithm: job for algorithm, size, _, job, *_ in rows if size == min(args.sizes)}
    for algorithm, size, n_files, job, pairs, rand, planted, load in rows:
        peak, first = job["peak_rss"], smallest[algorithm]
        base = max(first["peak_rss"].values())
        plan = job["phases"].get("plan", 0)
        (kind, task), smallest_task = next(iter(job["task_peaks"].items())), max(first["task_peaks"].values())
        lines.append(f"| {algorithm} | {size:,} | {n_files} | {load:.1f} | {job['seconds']:.1f} | {plan:.1f} "
                     f"| {job['seconds'] / first['seconds']:.2f}x | {peak['main'] / 2**30:.2f} GiB | "
                     f"{peak['largest worker'] / 2**30:.2f} GiB | {max(peak.values()) / base:.2f}x | "
                     f"{task / 2**20:,.0f} MiB ({kind}) | {task / smallest_task:.2f}x | "
                     f"{pairs.get('within')} / {pairs.get('across')} ({pairs.get('rows', 0):,}) | "
                     f"{rand.get('within')} / {rand.get('across')} | {planted['job']:,} / "
                     f"{planted['random']:,} of {planted['pairs']:,} |")
    lines += ["", "Pairs: cosine >= the run summary's threshold, among the rows of the run summary's sample "
              "of the selection; random: the same estimate on as many rows drawn at random from the input. "
              "Planted copy pairs: every (copy, source) pair the generator planted across files, counted "
              "exactly on the job's `selected` column and on a random pick of as many rows. A task's own "
              "peak: its worker's peak resident memory while it ran above the worker's as it started "
              "(`task_peaks.py`; a worker of one thread runs one task at a time), the largest over the job's "
              "tasks, named by its task prefix."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.json:
        shape = {"rows": max(args.sizes), "dim": args.dim, "rows a file": args.rows_per_partition,
                 "cross-file copies": args.copies}
        record.append(args.json, command=record.command("bench_table_scale.py", argv), data={"table": shape},
                      markdown=text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
