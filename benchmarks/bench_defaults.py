"""What a user gets out of the box: ``datamask select`` without ``--config`` against the built-in
engine defaults (what it ran before the device profiles became the default, with the per-partition
scope it had then) and the published loop.

The same parquet data as ``bench_pipeline.py`` (d = 768, 50,000 rows per file), the same command
line, side by side in one run; each job is a fresh ``datamask select`` process (start-up included
in "wall s with start-up", excluded from rows/s, which uses the job's own reported time).

    python benchmarks/bench_defaults.py --rows 200000 --out benchmarks/results-defaults.md
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_pipeline as pipeline  # noqa: E402  (data generation)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--rows-per-partition", type=int, default=50_000)
    parser.add_argument("--algorithm", default="Pair_simi")
    parser.add_argument("--cache", default=str(HERE.parent / ".benchmark-cache"))
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    source = pipeline.ensure_dataset(Path(args.cache), args.rows, args.dim, args.rows_per_partition, 2000)
    scratch = Path(tempfile.mkdtemp(prefix="bench-defaults-"))
    empty = scratch / "builtin-defaults.yaml"
    empty.write_text("{}\n")  # a config file with no keys: the built-in defaults, no profile
    jobs = {"no --config (device profile)": [],
            "no --config, --diversity-scope partition": ["--diversity-scope", "partition"],
            "built-in defaults (before)": ["--config", str(empty), "--diversity-scope", "partition"],
            "--config reference, --n_epochs 500": ["--config", "reference", "--n_epochs", "500"]}
    given = " ".join(sys.argv[1:] if argv is None else argv)
    lines = [f"# `datamask select` out of the box ({args.rows:,} rows, d = {args.dim}, {args.algorithm})", "",
             f"Command: `python benchmarks/bench_defaults.py {given}`",
             "", "| job | profile | job s | wall s with start-up | rows/s |", "|---|---|---:|---:|---:|"]
    try:
        for name, extra in jobs.items():
            target = scratch / "out"
            shutil.rmtree(target, ignore_errors=True)
            command = [sys.executable, "-m", "datamask_dask.cli", "select", "--input", str(source),
                       "--output", str(target), "--algorithm", args.algorithm, *extra]
            started = time.perf_counter()
            run = subprocess.run(command, capture_output=True, text=True)
            wall = time.perf_counter() - started
            if run.returncode:
                raise SystemExit(f"{name}: {run.stderr}")
            seconds = float(re.search(r"in ([\d.]+) s \(", run.stdout).group(1))
            profile = re.search(r"profile (\S+) ->", run.stdout).group(1)
            rate = args.rows / seconds
            lines.append(f"| {name} | {Path(profile).name} | {seconds:.1f} | {wall:.1f} | {rate:,.0f} |")
            print(lines[-1], file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
