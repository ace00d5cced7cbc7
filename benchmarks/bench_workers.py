"""Threads or worker processes: ``datamask select`` as a user runs it, with Dask's threads (the
default) and with ``--n-workers N`` (a local cluster of N one-thread processes), on tables of two sizes.

Each run is a fresh ``python -m datamask_dask.cli select`` process; its wall time is what the user waits
for, the cluster's start included. The job's own seconds (the CLI's summary line: plan, select, write and
commit) are shown beside it. The settings are interleaved, so load from other work falls on both alike.

    python benchmarks/bench_workers.py --repeats 3 --json benchmarks/results/workers.json

Tables: the README's sample (``datamask sample --rows 4000 --partitions 4``) and the pipeline benchmark's
table of ``--rows`` rows at d = 768 in files of 100,000 rows (``bench_pipeline.ensure_dataset``).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import record
from tables import ensure_dataset

HERE = Path(__file__).resolve().parent


def select_once(source: Path, target: Path, workers: int | None) -> tuple[float, float]:
    """Wall seconds of one ``datamask select`` process and the job seconds it reports."""
    command = [sys.executable, "-m", "datamask_dask.cli", "select", "--input", str(source), "--output",
               str(target), "--overwrite", *(["--n-workers", str(workers)] if workers else [])]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{shlex.join(command)} failed:\n{done.stderr[-2000:]}")
    job = re.search(r" in ([0-9.]+) s", done.stdout)
    return wall, float(job.group(1)) if job else float("nan")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="worker processes of the cluster setting")
    parser.add_argument("--rows", type=int, default=200_000, help="rows of the larger table (d = 768)")
    parser.add_argument("--cache", default=str(HERE.parent / ".benchmark-cache"))
    parser.add_argument("--json", help="append the results to this JSON file (record.py)")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as scratch:
        sample = Path(scratch) / "sample"
        subprocess.run([sys.executable, "-m", "datamask_dask.cli", "sample", "--output", str(sample),
                        "--rows", "4000", "--partitions", "4"], check=True, capture_output=True)
        large = ensure_dataset(Path(args.cache), args.rows, 768, 100_000, 2000)
        tables = {"README sample (4,000 rows, 4 files)": sample, f"{args.rows:,} rows, d = 768": large}
        settings = {"threads (default)": None, f"--n-workers {args.workers}": args.workers}
        seconds = {(t, s): [] for t in tables for s in settings}
        for _ in range(args.repeats):
            for table, source in tables.items():
                for setting, workers in settings.items():
                    seconds[table, setting].append(select_once(source, Path(scratch) / "out", workers))
    given = shlex.join(sys.argv[1:] if argv is None else argv)
    lines = ["# Threads or worker processes", "", f"Command: `python benchmarks/bench_workers.py {given}`",
             "", f"Machine: {record.machine()}, shared with other work; load at start {load:.2f}.", "",
             f"Median of {args.repeats} fresh `datamask select` processes, the settings interleaved "
             "(wall: what the user waits for, the cluster's start included; job: the command's own report):",
             "", "| table | setting | wall s | job s | wall / threads' wall |", "|---|---|---:|---:|---:|"]
    for table in tables:
        base = statistics.median(w for w, _ in seconds[table, "threads (default)"])
        for setting in settings:
            wall = statistics.median(w for w, _ in seconds[table, setting])
            job = statistics.median(j for _, j in seconds[table, setting])
            lines.append(f"| {table} | {setting} | {wall:.1f} | {job:.1f} | {wall / base:.2f}x |")
    text = "\n".join(lines)
    print(text)
    if args.json:
        record.append(args.json, command=record.command("bench_workers.py", argv), markdown=text,
                      data="the README's sample and the pipeline benchmark's table (bench_pipeline.py)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
