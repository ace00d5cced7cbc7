"""Selection quality of ``datamask select`` with the yardstick: the share of the best baseline's gain
over random (lazy greedy up to 50k rows, stochastic greedy above), with the raw objective, random's
and quality top-k's beside it.

Each case writes one synthetic table (``datamask_dask.sample_data.make_embeddings``: Zipf-sized
clusters, 20% near-copies, quality skewed and correlated with the cluster) as parquet files and runs
the job as a user would, through ``datamask select`` with the CLI defaults (``--engine`` choices and
``--opt key=value`` add flags). The selection is then scored over every row of the table.

    python benchmarks/bench_quality.py --case 20k-d768 --json benchmarks/results/quality.json
    python benchmarks/bench_quality.py --case 20k-d768 --metrics Pair_simi --lambs 0 --opt max_chunk_rows=20000
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from datamask_dask.config import PROFILES
from datamask_dask.learn.yardstick import measure
from datamask_dask.sample_data import make_embeddings

#: name: (rows, dim, files, clusters)
CASES = {
    "20k-d768": (20_000, 768, 1, 200),
    "200k-d768": (200_000, 768, 4, 500),
    "200k-d64": (200_000, 64, 4, 500),
    "1m-d64": (1_000_000, 64, 20, 2000),
}
CACHE = Path(__file__).resolve().parent.parent / ".benchmark-cache"


def dataset(case: str) -> tuple[Path, np.ndarray, np.ndarray]:
    """The case's parquet directory (written once into the cache), its quality and embeddings."""
    rows, dim, files, clusters = CASES[case]
    quality, emb = make_embeddings(rows, dim, n_clusters=clusters, seed=0)
    folder = CACHE / f"quality-{case}"
    if not (folder / "_complete").exists():
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for number, part in enumerate(np.array_split(np.arange(rows), files)):
            table = pa.table({
                "chunk_id": pa.array(part.astype(np.int64)),
                "quality_score": pa.array(quality[part].astype(np.float64)),
                "feature_arr": pa.FixedSizeListArray.from_arrays(pa.array(emb[part].reshape(-1)), dim),
            })
            pq.write_table(table, folder / f"part-{number:03d}.parquet")
        (folder / "_complete").write_text("")
    return folder, quality, emb


def profile_with(changes: list[str]) -> Path:
    """A copy of the cpu profile with ``key=value`` changes, which win over its per-metric sections too."""
    settings = yaml.safe_load((PROFILES / "cpu.yaml").read_text())
    for item in changes:
        key, _, text = item.partition("=")
        value = yaml.safe_load(text)
        settings[key] = value
        for section in settings.get("algorithms", {}).values():
            section.pop(key, None)
    path = Path(tempfile.mkdtemp(prefix="bench-quality-")) / "profile.yaml"
    path.write_text(yaml.safe_dump(settings))
    return path


def run_job(source: Path, metric: str, lamb: float, extra: list[str]) -> tuple[np.ndarray, float]:
    """``datamask select`` on ``source``; the ``selected`` column in id order and the job's wall time."""
    target = Path(tempfile.mkdtemp(prefix="bench-quality-")) / "out"
    command = [sys.executable, "-m", "datamask_dask.cli", "select", "--input", str(source), "--output",
               str(target), "--algorithm", metric, "--lamb", str(lamb), "--no-progress", *extra]
    started = time.perf_counter()
    run = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if run.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{run.stderr[-3000:]}")
    table = pq.read_table(target, columns=["chunk_id", "selected"]).sort_by("chunk_id")
    shutil.rmtree(target.parent, ignore_errors=True)
    return table["selected"].to_numpy(), seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", choices=sorted(CASES), nargs="+", default=["20k-d768"])
    parser.add_argument("--metrics", nargs="+", default=["Pair_simi", "Facility", "DiSF"])
    parser.add_argument("--lambs", type=float, nargs="+", default=[0.0, 0.5])
    parser.add_argument("--opt", action="append", default=[], help="key=value: a cpu profile setting changed (repeatable)")
    parser.add_argument("--json", help="append the results to this JSON file")
    args = parser.parse_args(argv)
    extra = ["--config", str(profile_with(args.opt))] if args.opt else []
    results = []
    print("| case | metric | lamb | share of baseline's gain | objective | random | baseline | top-k share | s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for case in args.case:
        source, quality, emb = dataset(case)
        for metric in args.metrics:
            for lamb in args.lambs:
                selected, seconds = run_job(source, metric, lamb, extra)
                score = measure(quality, emb, selected, algorithm=metric, lamb=lamb)
                results.append({"case": case, "metric": metric, "lamb": lamb, "job_seconds": seconds,
                                "options": args.opt, **score.as_dict()})
                print(f"| {case} | {metric} | {lamb} | {score.share:.2%} | {score.objective:.5f} | "
                      f"{score.random:.5f} | {score.baseline:.5f} ({score.baseline_name}) | "
                      f"{score.topk_share:.2%} | {seconds:.1f} |", flush=True)
    if args.json:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        record = {"command": "python benchmarks/bench_quality.py " + " ".join(sys.argv[1:] if argv is None else argv),
                  "machine": f"{platform.machine()}, {platform.processor() or platform.node()}",
                  "commit": commit, "results": results}
        path = Path(args.json)
        previous = json.loads(path.read_text()) if path.exists() else []
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps([*previous, record], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
