"""``datamask embed`` on CPU beside sentence-transformers' own multi-process encode, on the same
documents, cores and model, interleaved; and how many of each document's nearest neighbours the
fast path keeps.

    python benchmarks/bench_embed_speed.py --docs 20000 --rounds 4 --json benchmarks/results/embed-speed.json

Data: ``--docs`` paragraphs of this machine's documentation and docstrings (``examples/text_pipeline.py``'s
corpus), cached as parquet under ``--cache``. The corpus is cut into ``--rounds`` slices; each round
runs every method on its slice, in an order that turns from round to round, so that the other work on
a shared machine weighs on every method alike. The methods, each in a fresh process:

- ``pool``: ``SentenceTransformer.start_multi_process_pool`` with one process per core and
  ``encode(texts, pool=...)``, the packaged all-MiniLM-L6-v2 in float32. Timed from the ``encode``
  call to its result, after a small warm-up encode: the pool's start and the model's load are left
  out.
- ``datamask embed --precision float32`` and ``--precision bfloat16``: the whole command, its start-up,
  the model's load, reading the parquet and writing the output included.
- ``score``: ``datamask score`` (the heuristic scorer), the whole command likewise: the cheap step a
  text pipeline runs beside the embedding.

docs/s is each method's documents over its summed seconds; the speed-up is over the pool. Recall@10:
for each document, the share of its 10 nearest neighbours (exact cosine over the whole corpus)
under the pool's float32 embeddings that a method's embeddings also rank in its 10 nearest (equal
similarities ranked by row). The corpus holds copies of the same paragraph (licences), whose order
among themselves is arbitrary: "ties counted" also takes a found neighbour as right when its
similarity under the pool's embeddings reaches the 10th nearest's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
import record  # noqa: E402

METHODS = ("pool", "float32", "bfloat16", "score")
EMBEDDINGS = METHODS[:3]  # the methods that give vectors
ENV = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'integrations'}"}

# Run in a fresh interpreter: the pool baseline as sentence-transformers' documentation shows it.
POOL = """
import sys, time
import numpy as np, pyarrow.parquet as pq
from sentence_transformers import SentenceTransformer
from datamask_dask.text.embedding import default_model_path

if __name__ == "__main__":  # the pool's processes are spawned: they import this file, run none of this
    source, target, processes, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    texts = pq.read_table(source, columns=["text"]).column(0).to_pylist()
    model = SentenceTransformer(str(default_model_path()), device="cpu", local_files_only=True)
    pool = model.start_multi_process_pool(["cpu"] * processes)
    model.encode(texts[:16 * processes], pool=pool, batch_size=batch, chunk_size=4)  # every process started
    started = time.perf_counter()
    vectors = model.encode(texts, pool=pool, batch_size=batch)
    seconds = time.perf_counter() - started
    model.stop_multi_process_pool(pool)
    np.save(target, np.asarray(vectors, dtype=np.float32))
    print(seconds)
"""


def corpus(docs: int, cache: Path) -> Path:
    """The corpus of ``docs`` paragraphs as one parquet file, built once into ``cache``."""
    path = cache / f"embed-corpus-{docs}.parquet"
    if not path.exists():
        from text_pipeline import build_corpus

        cache.mkdir(parents=True, exist_ok=True)
        table = pa.Table.from_pandas(build_corpus(docs), preserve_index=False)
        if len(table) < docs:
            raise SystemExit(f"this machine's documentation gives {len(table)} paragraphs, not {docs}")
        pq.write_table(table, path.with_suffix(".tmp"))
        os.replace(path.with_suffix(".tmp"), path)
    return path


def run_pool(source: Path, scratch: Path, processes: int, batch: int) -> tuple[float, np.ndarray]:
    script, target = scratch / "pool.py", scratch / "pool.npy"
    script.write_text(POOL)
    run = subprocess.run([sys.executable, str(script), str(source), str(target), str(processes), str(batch)],
                         env=ENV, capture_output=True, text=True, cwd=scratch)
    if run.returncode:
        raise SystemExit(f"the sentence-transformers pool failed:\n{run.stderr[-3000:]}")
    return float(run.stdout.split()[-1]), np.load(target)


def run_embed(source: Path, scratch: Path, precision: str, batch: int) -> tuple[float, np.ndarray]:
    target = scratch / f"embed-{precision}"
    started = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "datamask_dask.cli", "embed", "--input", str(source),
                          "--output", str(target), "--overwrite", "--no-progress", "--precision", precision,
                          "--batch-size", str(batch)], env=ENV, capture_output=True, text=True, cwd=ROOT)
    seconds = time.perf_counter() - started
    if run.returncode:
        raise SystemExit(f"datamask embed --precision {precision} failed:\n{run.stderr[-3000:]}")
    table = pq.read_table(target, columns=["doc_id", "feature_arr"]).sort_by("doc_id")
    column = table.column("feature_arr").combine_chunks()
    return seconds, np.asarray(column.flatten(), dtype=np.float32).reshape(len(column), -1)


def run_score(source: Path, scratch: Path) -> float:
    started = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "datamask_dask.cli", "score", "--input", str(source),
                          "--output", str(scratch / "score"), "--overwrite", "--no-progress"],
                         env=ENV, capture_output=True, text=True, cwd=ROOT)
    if run.returncode:
        raise SystemExit(f"datamask score failed:\n{run.stderr[-3000:]}")
    return time.perf_counter() - started


def neighbours(x: np.ndarray, k: int = 10, block: int = 2048) -> np.ndarray:
    """Each row's ``k`` nearest rows by cosine (exact; rows are unit length), itself left out."""
    out = np.empty((len(x), k), dtype=np.int64)
    for start in range(0, len(x), block):
        sims = x[start:start + block] @ x.T
        sims[np.arange(len(sims)), np.arange(start, start + len(sims))] = -np.inf
        # A full stable sort: equal similarities (a text's copies) rank by row, the same for every method.
        out[start:start + block] = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    return out


def recall(reference: np.ndarray, found: np.ndarray) -> float:
    return float(np.mean([len(set(a) & set(b)) / len(a) for a, b in zip(reference, found, strict=True)]))


def recall_with_ties(x: np.ndarray, reference: np.ndarray, found: np.ndarray, tolerance: float = 1e-6) \
        -> float:
    """Recall where a found row counts if its reference similarity reaches the reference's k-th (less
    ``tolerance``): among more than k equal neighbours (a text's copies) any k are right."""
    hits = 0
    for start in range(0, len(x), 2048):
        rows = x[start:start + 2048]
        kth = np.einsum("ij,ij->i", rows, x[reference[start:start + 2048, -1]])
        sims = np.einsum("ij,ikj->ik", rows, x[found[start:start + 2048]])
        hits += int((sims >= kth[:, None] - tolerance).sum())
    return hits / found.size


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=20000, help="paragraphs in the corpus")
    parser.add_argument("--rounds", type=int, default=4,
                        help="slices of the corpus, each run by every method")
    parser.add_argument("--batch-size", type=int, default=64, help="documents per model pass, every method")
    parser.add_argument("--processes", type=int, default=os.cpu_count(), help="the pool's processes")
    parser.add_argument("--cache", type=Path, default=ROOT / ".benchmark-cache")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS),
                        help="the methods to run; the pool always runs, as the yardstick")
    parser.add_argument("--json", help="append the results to this JSON file (results/embed-speed.json)")
    args = parser.parse_args(argv)
    methods = tuple(name for name in METHODS if name == "pool" or name in args.methods)

    source = corpus(args.docs, args.cache)
    table = pq.read_table(source)
    chars = pc.utf8_length(table.column("text")).to_numpy(zero_copy_only=False)
    print(f"{len(table)} documents, {int(np.median(chars))} characters (median); {os.cpu_count()} cores; "
          f"{args.rounds} rounds", flush=True)
    seconds = dict.fromkeys(methods, 0.0)
    vectors: dict = {name: [] for name in methods}
    bounds = np.linspace(0, len(table), args.rounds + 1).astype(int)
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        for r in range(args.rounds):
            piece = scratch / f"round-{r}.parquet"
            pq.write_table(table.slice(bounds[r], bounds[r + 1] - bounds[r]), piece)
            for name in methods[r % len(methods):] + methods[:r % len(methods)]:  # turns each round
                found = None
                if name == "pool":
                    took, found = run_pool(piece, scratch, args.processes, args.batch_size)
                elif name == "score":
                    took = run_score(piece, scratch)
                else:
                    took, found = run_embed(piece, scratch, name, args.batch_size)
                seconds[name] += took
                if found is not None:
                    vectors[name].append(found)
                print(f"round {r + 1}: {name}: {bounds[r + 1] - bounds[r]} docs in {took:.1f} s", flush=True)
    vectors = {name: np.concatenate(parts) for name, parts in vectors.items() if parts}
    reference = neighbours(vectors["pool"])
    labels = {"pool": f"sentence-transformers pool, {args.processes} processes, float32",
              **{name: f"datamask embed --precision {name}" for name in EMBEDDINGS[1:]},
              "score": "datamask score (heuristic)"}
    lines = ["# datamask embed on CPU beside sentence-transformers' multi-process pool", "",
             f"Command: `{record.command('bench_embed_speed.py', argv)}`", "",
             f"{len(table)} paragraphs of this machine's documentation and docstrings in {args.rounds} "
             "slices, each run by every method in turn; the pool timed from its encode call, datamask "
             "embed as the whole command; recall@10 against the pool's float32 neighbours (exact cosine):",
             "",
             "| method | seconds | docs/s | speed-up over the pool | recall@10 | recall@10, ties counted | "
             "largest unit-norm error |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name in methods:
        if name not in vectors:  # no vectors: only its speed
            lines.append(f"| {labels[name]} | {seconds[name]:.1f} | {len(table) / seconds[name]:.1f} | "
                         f"{seconds['pool'] / seconds[name]:.2f}x | | | |")
            continue
        norms = np.abs(np.linalg.norm(vectors[name].astype(np.float64), axis=1) - 1).max()
        found = reference if name == "pool" else neighbours(vectors[name])
        lines.append(f"| {labels[name]} | {seconds[name]:.1f} | {len(table) / seconds[name]:.1f} | "
                     f"{seconds['pool'] / seconds[name]:.2f}x | {recall(reference, found):.4f} | "
                     f"{recall_with_ties(vectors['pool'], reference, found):.4f} | {norms:.1e} |")
    markdown = "\n".join(lines)
    print("\n" + markdown)
    if args.json:
        record.append(args.json, command=record.command("bench_embed_speed.py", argv),
                      data={"corpus": {"docs": len(table), "median_chars": int(np.median(chars)),
                                       "rounds": args.rounds}},
                      markdown=markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
