"""What the table scope costs: ``datamask select`` with ``--diversity-scope table`` vs ``partition``.

The pipeline benchmark's parquet data (``tables.ensure_dataset``: d = 768, 50,000 rows per
file), the CLI's defaults (cpu profile, threaded scheduler), ``--algorithm``; each job a fresh
process, the jobs interleaved ``--repeats`` times so that load from other work falls on all of
them alike. ``--copies F`` replaces F of each file's rows by near-copies (cosine ~0.99) of rows of
the previous file (duplicates spread across files; the data then lives under ``--data``) and reports
the near-duplicate pairs among the selected rows (the run summary's LSH estimate) against the same
estimate on a random pick of as many rows. ``--n-workers N`` runs each job on a local cluster of
N worker processes. ``--before PATH`` adds a table-scope job run with another checkout of the package
(e.g. the previous commit, ``git worktree add`` or ``git archive``), for before/after figures.
Reported per job: the job's own seconds (start-up excluded), its plan phase, and the load
average when it started; then the median over repeats and the ratio to the per-partition job.

    python benchmarks/bench_scope_cost.py --rows 200000 --repeats 3 --json benchmarks/results/scope-cost.json
    python benchmarks/bench_scope_cost.py --rows 1000000 --repeats 1 --copies 0.2 --n-workers 2 \
        --data /work/data-1m --json benchmarks/results/scope-cost.json
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
from jobs import random_pairs, selection_digest
from tables import ensure_dataset, ensure_spread_dataset

HERE = Path(__file__).resolve().parent

from datamask_dask.run import summary as summary_module  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--rows-per-partition", type=int, default=50_000)
    parser.add_argument("--algorithm", default="Pair_simi")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--copies", type=float, default=0.0,
                        help="share of each file's rows that are near-copies of the previous file's rows")
    parser.add_argument("--data", default="/tmp/datamask-spread", help="where --copies data is generated")
    parser.add_argument("--n-workers", type=int, help="worker processes of each job's local cluster")
    parser.add_argument("--before", help="another checkout of the package: its table scope is a job too")
    parser.add_argument("--cache", default=str(HERE.parent / ".benchmark-cache"))
    parser.add_argument("--json", help="append the results to this JSON file (results/scope-cost.json)")
    args = parser.parse_args(argv)
    if args.copies:
        source = ensure_spread_dataset(Path(args.data), args.rows, args.dim, args.rows_per_partition,
                                       args.copies)
    else:
        source = ensure_dataset(Path(args.cache), args.rows, args.dim, args.rows_per_partition, 2000)
    here = str(HERE.parent)
    jobs = {"table scope": (here, "table"), "partition scope": (here, "partition")}
    if args.before:
        jobs = {"table scope, before": (args.before, "table"), **jobs}
    scratch = Path(tempfile.mkdtemp(prefix="bench-scope-"))
    runs: dict[str, list] = {name: [] for name in jobs}
    picks: dict[str, str] = {}
    summaries: dict[str, dict] = {}
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
                if args.n_workers:
                    command += ["--n-workers", str(args.n_workers)]
                run = subprocess.run(command, capture_output=True, text=True, env=environment)
                if run.returncode:
                    raise SystemExit(f"{name}: {run.stderr}")
                seconds = float(re.search(r"in ([\d.]+) s \(", run.stdout).group(1))
                record = json.loads((target / "_datamask_run.json").read_text())
                phases, summaries[name] = record["phases"], record.get("summary") or {}
                runs[name].append((seconds, phases["plan"], load, phases["select and write"]))
                picks[name] = selection_digest(target)
                print(name, runs[name][-1], file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    given = " ".join(sys.argv[1:] if argv is None else argv)
    base = float(np.median([r[0] for r in runs["partition scope"]]))
    lines = [f"# The table scope's cost ({args.rows:,} rows, d = {args.dim}, {args.algorithm}, cpu profile)",
             "",
             f"Command: `python benchmarks/bench_scope_cost.py {given}`", "",
             f"{os.cpu_count()} CPU cores shared with other work: jobs interleaved, medians compared.", "",
             "| job | job s per repeat | plan s per repeat | select and write s | load at start | "
             "median job s | ratio to partition | selection digest |",
             "|---|---|---|---|---|---:|---:|---|"]
    for name, values in runs.items():
        median = float(np.median([r[0] for r in values]))
        cells = [", ".join(f"{r[i]:.1f}" for r in values) for i in range(4)]
        lines.append(f"| {name} | {cells[0]} | {cells[1]} | {cells[3]} | {cells[2]} | {median:.1f} | "
                     f"{median / base:.2f}x | {picks[name]} |")
    lines += ["", "Selection digest: a hash of the selected rows' ids (last repeat); equal digests, equal "
              "selections."]
    if args.copies:
        lines += _pairs_lines(summaries, source, args.copies)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.json:
        shape = {"rows": args.rows, "dim": args.dim, "rows a file": args.rows_per_partition}
        record.append(args.json, command=record.command("bench_scope_cost.py", argv), data={"table": shape},
                      markdown=text)
    return 0




def _pairs_lines(summaries: dict, source: Path, copies: float) -> list[str]:
    """Near-duplicate pairs among the selected rows (last repeat) and the sample's objective."""
    lines = ["", f"{copies:.0%} of each file's rows are near-copies of rows of the previous file. "
             f"Near-duplicate pairs (cosine >= {summary_module.DUPLICATE_COSINE}) among every selected row: "
             "the run summary's (`summary['selected_pairs']`: SimHash LSH candidates confirmed on their "
             "cosine, a few % low), random's the same count on a random pick of as many rows. Objective: "
             "the run summary's, on its sample of the output.", "",
             "| selection | selected rows | pairs within a partition | pairs across partitions | "
             "objective on the sample | random's objective there |", "|---|---:|---:|---:|---:|---:|"]
    k, nan = None, float("nan")
    for name, summary in summaries.items():
        pairs = summary.get("selected_pairs") or {}
        objective = (summary.get("objective") or {})
        mine, rand = objective.get("datamask", {}), objective.get("random", {})
        k = k or pairs.get("rows")
        lines.append(f"| {name} | {pairs.get('rows', 0):,} | {pairs.get('within')} | {pairs.get('across')} | "
                     f"{mine.get('objective', nan):.4f} | {rand.get('objective', nan):.4f} |")
    if k:
        pairs = random_pairs(source, k)
        lines.append(f"| random pick | {k:,} | {pairs['within']} | {pairs['across']} | | |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
