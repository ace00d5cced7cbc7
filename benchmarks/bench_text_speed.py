"""``datamask embed`` on a one-file, one-row-group corpus: a checkout of main (the input is one task)
beside this tree (tasks of ``--rows-per-task`` rows, torch threads per task), side by side in one run.

    python benchmarks/bench_text_speed.py --docs 2000 --json benchmarks/results/text-speed.json

Data: ``--docs`` paragraphs of this machine's documentation and docstrings
(``examples/text_pipeline.py``'s corpus), written as one parquet file of one row group. Each tree
runs the ``datamask embed`` command in its own process with the packaged all-MiniLM-L6-v2, on the
same file and cores, from the command's start to the written output (start-up and the model's load
included: what a user waits for); main's tree is ``git archive`` of ``--main-ref``. The script
checks that both write the same embeddings (up to float rounding: batches differ).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
import record  # noqa: E402
from text_pipeline import build_corpus  # noqa: E402


def checkout(ref: str, into: Path) -> Path:
    """The tree of ``ref`` (this repository's), unpacked into ``into``."""
    archive = into / "tree.tar"
    subprocess.run(["git", "archive", "--format=tar", "-o", str(archive), ref], cwd=ROOT, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / "tree", filter="data")
    return into / "tree"


def embed(tree: Path, source: Path, target: Path, flags: list[str]) -> tuple[float, str]:
    """Seconds of ``datamask embed`` run from ``tree``, and its stdout."""
    environ = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{tree / 'integrations'}"}
    started = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "datamask_dask.cli", "embed", "--input", str(source),
                          "--output", str(target), *flags],
                         env=environ, capture_output=True, text=True, cwd=tree)
    seconds = time.perf_counter() - started
    if run.returncode:
        raise SystemExit(f"datamask embed from {tree} failed:\n{run.stderr[-3000:]}")
    return seconds, run.stdout


def vectors(target: Path) -> np.ndarray:
    column = pq.read_table(target, columns=["feature_arr"]).column(0).combine_chunks()
    return np.asarray(column.flatten(), dtype=np.float32).reshape(len(column), -1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=2000, help="paragraphs in the corpus")
    parser.add_argument("--main-ref", default="main",
                        help="the git ref whose embed runs the input as one task")
    parser.add_argument("--json", help="append the results to this JSON file (results/text-speed.json)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        corpus = build_corpus(args.docs)
        source = scratch / "corpus.parquet"
        pq.write_table(pa.Table.from_pandas(corpus, preserve_index=False), source, row_group_size=len(corpus))
        chars = corpus["text"].str.len()
        print(f"{len(corpus)} documents, {int(chars.median())} characters (median), one file of one row "
              f"group; {os.cpu_count()} cores", flush=True)
        main_tree = checkout(args.main_ref, scratch)
        results = {}
        for name, tree, flags in (("main (one task)", main_tree, ["--verbose"]),
                                  ("this tree (split)", ROOT, ["--verbose", "--no-progress"])):
            seconds, stdout = embed(tree, source, scratch / name.split()[0], flags)
            tasks = re.search(r"(\d+) tasks", stdout)
            results[name] = {"seconds": seconds, "tasks": int(tasks.group(1)) if tasks else 1}
            print(f"{name}: {seconds:.1f} s, {len(corpus) / seconds:.1f} docs/s", flush=True)
        drift = float(np.abs(vectors(scratch / "main") - vectors(scratch / "this")).max())
        if drift > 1e-3:
            raise SystemExit(f"the two trees' embeddings differ by up to {drift}")

    base = results["main (one task)"]["seconds"]
    lines = ["# datamask embed on one file of one row group: one task (main) and split into tasks", "",
             f"Command: `{record.command('bench_text_speed.py', argv)}`", "",
             f"{args.docs} paragraphs of this machine's documentation, one file of one row group; "
             f"the command's wall time, start-up and model load included:", "",
             "| embed | tasks | seconds | docs/s | speed-up |", "|---|---:|---:|---:|---:|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['tasks']} | {r['seconds']:.1f} | {args.docs / r['seconds']:.1f} | "
                     f"{base / r['seconds']:.2f}x |")
    lines += ["", f"Largest difference between the two trees' embedding values: {drift:.1e}."]
    markdown = "\n".join(lines)
    print("\n" + markdown)
    if args.json:
        record.append(args.json, command=record.command("bench_text_speed.py", argv),
                      data={"corpus": {"docs": args.docs, "median_chars": int(chars.median())}},
                      markdown=markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
