"""How long the ``datamask`` command takes to answer when it only parses (``--version``, ``--help``,
``select --help`` and an option it refuses, ``--select_ratio 0``), and how soon a job's first line
comes: ``datamask select --verbose`` on a 2,000-row sample (d = 16), the seconds to its first stderr
line and to its exit.

Each command runs ``--repeats`` times as a fresh ``python -m datamask_dask.cli`` process (what the
console script runs); the wall-clock median is reported. ``--before PATH`` runs the same commands
with another checkout of the package (``git worktree add``) beside this one, interleaved, so load
from other work falls on both alike.

    python benchmarks/bench_cli_start.py --before ../main-checkout --json benchmarks/results/cli-start.json
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import record

HERE = Path(__file__).resolve().parent

COMMANDS = {
    "--version": ["--version"],
    "--help": ["--help"],
    "select --help": ["select", "--help"],
    "option error": ["select", "--input", "x", "--output", "y", "--select_ratio", "0"],
    "select job, first line": ["select", "--input", "sample.parquet", "--output", "out", "--verbose"],
    "select job, exit": ["select", "--input", "sample.parquet", "--output", "out", "--verbose"],
}
JOBS = ("select job, first line", "select job, exit")  # one process gives both
SAMPLE_ROWS, SAMPLE_DIM = 2000, 16


def write_sample(cwd: str) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((SAMPLE_ROWS, SAMPLE_DIM)).astype(np.float32)
    pq.write_table(pa.table({"chunk_id": np.arange(SAMPLE_ROWS), "quality_score": rng.random(SAMPLE_ROWS),
                             "feature_arr": list(vectors)}), os.path.join(cwd, "sample.parquet"))


def run_once(tree: str, argv: list[str], cwd: str) -> tuple[float, float, int]:
    """Wall-clock seconds to the first stderr line and to the exit, and the exit status, of one
    ``datamask`` process on the package in ``tree`` (stderr a pipe, as in a batch job)."""
    environment = record.tree_environment(tree)
    output = os.path.join(cwd, "out")  # a file output of a file input
    if os.path.isdir(output):
        shutil.rmtree(output)
    elif os.path.exists(output):
        os.remove(output)
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "datamask_dask.cli", *argv], cwd=cwd, env=environment,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    first = None
    for _ in process.stderr:
        first = first or time.perf_counter() - start
    code = process.wait(timeout=300)
    took = time.perf_counter() - start
    return (first or took), took, code


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--before", help="another checkout of the package, run beside this one")
    parser.add_argument("--json", help="append the results to this JSON file (record.py)")
    args = parser.parse_args(argv)
    trees = {"this checkout": str(HERE.parent)}
    if args.before:
        trees = {"before": str(Path(args.before).resolve()), **trees}
    seconds: dict = {(name, label): [] for name in COMMANDS for label in trees}
    status: dict = {}
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-cli-start-") as cwd:  # x and y do not exist there
        write_sample(cwd)
        for _ in range(args.repeats):
            for name, command in COMMANDS.items():
                if name == JOBS[1]:
                    continue
                for label, tree in trees.items():
                    first, took, code = run_once(tree, command, cwd)
                    seconds[name, label].append(first if name == JOBS[0] else took)
                    status[name, label] = code
                    if name == JOBS[0]:
                        seconds[JOBS[1], label].append(took)
                        status[JOBS[1], label] = code
    given = shlex.join(sys.argv[1:] if argv is None else argv)
    commits = ", ".join(f"{label} {record.commit(Path(tree))} ({tree})" for label, tree in trees.items())
    lines = ["# Start-up of the datamask command", "",
             f"Command: `python benchmarks/bench_cli_start.py {given}`", "",
             f"Machine: {record.machine()}, shared with other work; load at start {load:.2f}. "
             f"Python {sys.version.split()[0]}. Commits: {commits}.", "",
             f"Median wall-clock seconds of {args.repeats} fresh processes "
             "(`python -m datamask_dask.cli ...`), the checkouts interleaved; the job's seconds to its first "
             "stderr line and to its exit:", "",
             "| command | " + " | ".join(f"{label}, median s | {label}, exit" for label in trees) + " |",
             "|---|" + "---:|---:|" * len(trees)]
    for name, command in COMMANDS.items():
        cells = [f"{statistics.median(seconds[name, label]):.2f} | {status[name, label]}" for label in trees]
        shown = f"`datamask {shlex.join(command)}`" + (f": {name.split(', ')[1]}" if name in JOBS else "")
        lines.append(f"| {shown} | " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    print(text)
    if args.json:
        record.append(args.json, command=record.command("bench_cli_start.py", argv), markdown=text,
                      data=f"the job's input: {SAMPLE_ROWS} rows, d = {SAMPLE_DIM}, one parquet file")
    return 0


if __name__ == "__main__":
    sys.exit(main())
