"""The same ``datamask select`` job on local disk and on an S3 API server on localhost, side by side.

    python benchmarks/bench_object_storage.py --rows 400000 --dim 256 --repeats 2 \
        --json benchmarks/results/storage.json

The S3 server is moto (``python -m moto.server``, the test extra), a pure-Python server on this
machine: it measures what the package's S3 path costs (listing, ranged reads through fsspec,
uploads, the commit's copies and the lock), not the throughput of a real object store. Each
repeat runs the local job and the S3 job one after the other (interleaved), in fresh processes
with the same flags; the time is the job's own (the "in X s" of its summary line, start-up
excluded), and the rows selected must be the same.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import record  # noqa: E402
from tables import ensure_dataset

FLAGS = ["--n_epochs", "100", "--select_ratio", "0.1", "--seed", "0", "--n-workers", "2"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_moto() -> tuple[subprocess.Popen, dict]:
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint, "AWS_ALLOW_HTTP": "true"}
    return server, env


def job(source: str, target: str, env: dict) -> tuple[float, str]:
    done = subprocess.run([sys.executable, "-m", "datamask_dask.cli", "select", "--input", source,
                           "--output", target, *FLAGS], env={**os.environ, **env}, capture_output=True,
                          text=True)
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    line = done.stdout.strip().splitlines()[-1]
    seconds = float(re.search(r" in ([0-9.]+) s ", line).group(1))
    selected = re.search(r"rows, (\d+) selected", line).group(1)
    return seconds, selected


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--rows-per-partition", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--cache", type=Path, default=Path(".benchmark-cache"))
    parser.add_argument("--json", help="append the results to this JSON file (results/storage.json)")
    args = parser.parse_args()
    source = ensure_dataset(args.cache, args.rows, args.dim, args.rows_per_partition, 64)
    server, env = start_moto()
    scratch = Path(tempfile.mkdtemp(prefix="bench-object-storage-"))
    try:
        import s3fs

        fs = s3fs.S3FileSystem(key="testing", secret="testing", endpoint_url=env["AWS_ENDPOINT_URL"])
        fs.mkdir("bench")
        fs.put([str(p) for p in sorted(source.glob("*.parquet"))], "bench/corpus/")
        times = {"local disk": [], "S3 (moto, localhost)": []}
        for repeat in range(args.repeats):
            local = job(str(source), str(scratch / f"out-{repeat}"), {})
            remote = job("s3://bench/corpus", f"s3://bench/out-{repeat}", env)
            if local[1] != remote[1]:
                raise SystemExit(f"different selections: {local[1]} vs {remote[1]} rows")
            times["local disk"].append(local[0])
            times["S3 (moto, localhost)"].append(remote[0])
            print(f"repeat {repeat}: local {local[0]:.1f} s, s3 {remote[0]:.1f} s", file=sys.stderr,
                  flush=True)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait()
        shutil.rmtree(scratch, ignore_errors=True)
    medians = {name: statistics.median(values) for name, values in times.items()}
    lines = [f"`datamask select` ({' '.join(FLAGS)}), {args.rows:,} rows, d = {args.dim}, "
             f"{args.rows_per_partition:,} rows per file; {platform.node()}, {os.cpu_count()} cores, "
             f"{args.repeats} interleaved repeats.", "",
             f"    python benchmarks/bench_object_storage.py --rows {args.rows} --dim {args.dim} "
             f"--repeats {args.repeats}", "",
             "| storage | job seconds (each repeat) | median | rows/s |", "|---|---|---:|---:|"]
    for name, values in times.items():
        lines.append(f"| {name} | {', '.join(f'{v:.1f}' for v in values)} | {medians[name]:.1f} | "
                     f"{args.rows / medians[name]:,.0f} |")
    ratio = medians["S3 (moto, localhost)"] / medians["local disk"]
    lines.append(f"\nS3 / local disk (medians): {ratio:.2f}x the time, the same rows selected.")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.json:
        shape = {"rows": args.rows, "dim": args.dim, "rows a file": args.rows_per_partition}
        record.append(args.json, command=record.command("bench_object_storage.py"), data={"table": shape},
                      markdown=text)


if __name__ == "__main__":
    main()
