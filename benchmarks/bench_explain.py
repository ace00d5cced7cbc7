"""What ``--explain`` costs: the default ``datamask select`` job with and without it, side by side.

The CLI's sample corpus (``datamask sample``: d = 64, near-duplicates and skewed quality), the
CLI's defaults; each job a fresh process, the two jobs interleaved ``--repeats`` times so that load
from other work falls on both alike. Reported per job: its own seconds (start-up excluded, as the
CLI prints them) and the load average when it started; then the median of each and the ratio of
each pair (with / without), and whether both jobs selected the same rows (a digest of the selected
ids). Written as JSON: the command, the data, the machine, the commit and every run.

    python benchmarks/bench_explain.py --rows 200000 --partitions 4 --repeats 5 \
        --out benchmarks/results/explain-200k.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
import record  # noqa: E402

_SECONDS = re.compile(r"selected \([\d.]+%\) in ([\d.]+) s")


def run_job(data: Path, out: Path, explain: bool, extra: list[str]) -> dict:
    """One ``datamask select`` job in a fresh process: its seconds and the digest of its selection."""
    command = [sys.executable, "-m", "datamask_dask.cli", "select", "--input", str(data), "--output",
               str(out), "--overwrite", *extra] + (["--explain"] if explain else [])
    load = os.getloadavg()[0]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    seconds = float(_SECONDS.search(done.stdout).group(1))
    table = pq.read_table(out, columns=["chunk_id", "selected"])
    ids = table.filter(table.column("selected")).column("chunk_id").to_numpy()
    ids.sort()
    return {"explain": explain, "seconds": seconds, "load": round(load, 2),
            "digest": hashlib.blake2b(ids.tobytes(), digest_size=8).hexdigest()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--data", type=Path, help="where the sample corpus is written (default: a temp dir)")
    parser.add_argument("--out", type=Path, help="JSON results file (default: stdout only)")
    parser.add_argument("job", nargs=argparse.REMAINDER, help="extra `datamask select` flags, after --")
    args = parser.parse_args(argv)
    extra = [a for a in args.job if a != "--"]
    with tempfile.TemporaryDirectory() as scratch:
        data = args.data or Path(scratch) / "corpus"
        if not data.exists():
            subprocess.run([sys.executable, "-m", "datamask_dask.cli", "sample", "--output", str(data),
                            "--rows", str(args.rows), "--partitions", str(args.partitions)], check=True)
        runs = []
        for repeat in range(args.repeats):
            order = (False, True) if repeat % 2 == 0 else (True, False)  # alternate which goes first
            for explain in order:
                run = run_job(data, Path(scratch) / f"out-{int(explain)}", explain, extra)
                runs.append({"repeat": repeat, **run})
                print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    plain = [r["seconds"] for r in runs if not r["explain"]]
    explained = [r["seconds"] for r in runs if r["explain"]]
    ratios = [next(r["seconds"] for r in runs if r["repeat"] == i and r["explain"])
              / next(r["seconds"] for r in runs if r["repeat"] == i and not r["explain"])
              for i in range(args.repeats)]
    result = {"command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
              "data": f"datamask sample --rows {args.rows} --partitions {args.partitions} (d = 64)",
              "job": "datamask select --input DATA --output OUT --overwrite " + " ".join(extra),
              "machine": record.machine(), "commit": record.commit(), "runs": runs,
              "median_seconds": {"without": statistics.median(plain),
                                 "with_explain": statistics.median(explained)},
              "ratio_per_repeat": ratios, "median_ratio": statistics.median(ratios),
              "same_selection": len({r["digest"] for r in runs}) == 1}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
