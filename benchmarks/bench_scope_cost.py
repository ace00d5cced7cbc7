"""What the table scope costs: ``datamask select`` with ``--diversity-scope table`` vs ``partition``.

The pipeline benchmark's parquet data (``bench_pipeline.ensure_dataset``: d = 768, 50,000 rows per
file), the CLI's defaults (cpu profile, threaded scheduler), ``--algorithm``; each job a fresh
process, the jobs interleaved ``--repeats`` times so that load from other work falls on all of
them alike. ``--before PATH`` adds a table-scope job run with another checkout of the package
(e.g. the previous commit, ``git worktree add`` or ``git archive``), for before/after figures.
Reported per job: the job's own seconds (start-up excluded), its plan phase, and the load
average when it started; then the median over repeats and the ratio to the per-partition job.

    python benchmarks/bench_scope_cost.py --rows 200000 --repeats 3 --out benchmarks/results-scope-cost.md
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_pipeline as pipeline  # noqa: E402  (data generation)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--rows-per-partition", type=int, default=50_000)
    parser.add_argument("--algorithm", default="Pair_simi")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before", help="another checkout of the package: its table scope is a job too")
    parser.add_argument("--cache", default=str(HERE.parent / ".benchmark-cache"))
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    source = pipeline.ensure_dataset(Path(args.cache), args.rows, args.dim, args.rows_per_partition, 2000)
    here = str(HERE.parent)
    jobs = {"table scope": (here, "table"), "partition scope": (here, "partition")}
    if args.before:
        jobs = {"table scope, before": (args.before, "table"), **jobs}
    scratch = Path(tempfile.mkdtemp(prefix="bench-scope-"))
    runs: dict[str, list] = {name: [] for name in jobs}
    try:
        for _ in range(args.repeats):
            for name, (tree, scope) in jobs.items():
                target = scratch / "out"
                shutil.rmtree(target, ignore_errors=True)
                load = os.getloadavg()[0]
                path = os.pathsep.join([tree, os.path.join(tree, "integrations")])
                environment = {**os.environ, "PYTHONPATH": path}
                command = [sys.executable, "-m", "datamask_dask.cli", "select", "--input", str(source),
                           "--output", str(target), "--algorithm", args.algorithm, "--diversity-scope", scope]
                run = subprocess.run(command, capture_output=True, text=True, env=environment)
                if run.returncode:
                    raise SystemExit(f"{name}: {run.stderr}")
                seconds = float(re.search(r"in ([\d.]+) s \(", run.stdout).group(1))
                phases = json.loads((target / "_datamask_run.json").read_text())["phases"]
                runs[name].append((seconds, phases["plan"], load))
                print(name, runs[name][-1], file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    given = " ".join(sys.argv[1:] if argv is None else argv)
    base = float(np.median([r[0] for r in runs["partition scope"]]))
    lines = [f"# The table scope's cost ({args.rows:,} rows, d = {args.dim}, {args.algorithm}, cpu profile)",
             "",
             f"Command: `python benchmarks/bench_scope_cost.py {given}`", "",
             f"{os.cpu_count()} CPU cores shared with other work: jobs interleaved, medians compared.", "",
             "| job | job s per repeat | plan s per repeat | load at start | median job s | "
             "ratio to partition |",
             "|---|---|---|---|---:|---:|"]
    for name, values in runs.items():
        median = float(np.median([r[0] for r in values]))
        cells = [", ".join(f"{r[i]:.1f}" for r in values) for i in range(3)]
        lines.append(f"| {name} | {cells[0]} | {cells[1]} | {cells[2]} | {median:.1f} | "
                     f"{median / base:.2f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
