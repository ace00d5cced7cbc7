"""The table scope's near-duplicate search alone, at scale: time, memory, recall and false merges.

Signs ``--rows`` clustered d = ``--dim`` embeddings (the pipeline benchmark's generator,
``tables.make_partition``: 20% near-copies inside each partition) in partitions of
``--rows-per-partition``, with ``--copies`` of each partition's rows replaced by copies of rows of
the previous partition at exact cosines (``PLANTED``, in turn: duplicates spread across files),
then runs the one-task search (:func:`datamask_dask.dedup.search.find_groups`) on every signature
in one process, as the plan's search task does, ``--repeat`` times. Reports the seconds (the
least and the median of the runs), the peak memory the search allocates (tracemalloc, numpy arrays
included, one more run), the shadowed rows and a digest of the groups, and per planted cosine the
share of planted pairs that end in one group (false merges at <= 0.90) and of which at most one
row stays eligible (recall at >= 0.98).

    python benchmarks/bench_duplicates.py --rows 1000000 --json benchmarks/results/duplicates.json

The package is the one on ``PYTHONPATH``; one whose one-task search is the connected components
of ``plan.duplicates`` is measured the same way, so two checkouts compare side by side:

    PYTHONPATH=<checkout> python benchmarks/bench_duplicates.py --rows 200000

``--sharded --sizes 1000000 4000000 16000000`` measures the sharded step instead
(:mod:`datamask_dask.dedup.stages`, every task run in this process one after another, bands in
rounds of ``--rounds-of``, one shard per 4 partitions as the Dask operator makes them): per size,
candidate pairs per row, seconds per row, and each stage's largest task memory (its inputs' bytes
plus the peak it allocates, tracemalloc). Besides bench_pipeline's in-partition copies, ``--copies``
of each partition's rows are planted copies of rows of the previous partition at exact cosines
(``PLANTED``); reported per cosine: the share of planted pairs that end in one group (recall at
>= 0.98, false merges at <= 0.90), and for all rows set aside, the exact cosine of each to the
better row that set it aside (its parent), from the embeddings, which this mode keeps.

    python benchmarks/bench_duplicates.py --sharded --dim 64 --sizes 1000000 4000000 16000000 \
        --json benchmarks/results/duplicates.json
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np
import record
from tables import cluster_model, make_partition

import datamask_dask

HERE = Path(__file__).resolve().parent

# The package on PYTHONPATH may keep the near-duplicate code in plan/ (the other side of a
# side-by-side run). Asked on disk: an editable install would hand a missing dedup/ over from
# another checkout.
ROOMED = (Path(datamask_dask.__file__).parent / "dedup").is_dir()
if ROOMED:
    from datamask_dask.dedup import simhash as duplicates
    from datamask_dask.dedup import stages as sharding
else:
    from datamask_dask.plan import duplicates
    from datamask_dask.plan import shards as sharding

PLANTED = (0.85, 0.90, 0.95, 0.98, 0.99, 0.999)  # cosines of the planted cross-partition copies
STAGES = ("band_records", "bucket_edges", "merge_edges", "best_parents",
          "forward_weights", "deliver", "partition_groups")


def _planted_copies(emb, previous, rng, share):
    """Replace ``share`` of ``emb``'s rows by copies of ``previous``'s rows at the cosines of
    ``PLANTED`` (in turn); returns (rows, sources, cosines)."""
    n_copy = int(share * len(emb))
    rows = rng.choice(len(emb), n_copy, replace=False)
    sources = rng.integers(0, len(previous), n_copy)
    cosines = np.resize(np.array(PLANTED), n_copy)
    u = previous[sources].astype(np.float64)
    w = rng.standard_normal(u.shape)
    w -= np.einsum("ij,ij->i", w, u)[:, None] * u
    w /= np.linalg.norm(w, axis=1, keepdims=True)
    emb[rows] = (cosines[:, None] * u + np.sqrt(1 - cosines[:, None] ** 2) * w).astype(np.float32)
    return rows, sources, cosines


def _nbytes(value) -> int:
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, dict):
        return sum(_nbytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_nbytes(v) for v in value)
    return 0


def sharded(args) -> int:
    """The sharded step at each of ``args.sizes`` (see the module docstring)."""
    model = cluster_model(args.dim, 2000)
    planes = duplicates.hyperplanes(args.dim)
    given = " ".join(sys.argv[1:])
    lines = [f"# The sharded near-duplicate step, d = {args.dim}", "",
             f"Command: `python benchmarks/bench_duplicates.py {given}`", "",
             f"Partitions of {args.rows_per_partition:,} rows (bench_pipeline's clustered generator, 20% "
             f"near-copies inside each partition), {args.copies:.0%} of each partition's rows replaced by "
             f"copies of the previous partition's rows at cosines {', '.join(map(str, PLANTED))} (in turn). "
             "Every task of the sharded graph runs in this process, one after another, with tracemalloc "
             f"on; bands in rounds of {args.rounds_of}; one shard per 4 partitions. {os.cpu_count()} cores. "
             "Candidate pairs: the buckets' full and anchor pairs, before repeats across bands are dropped "
             "(the neighbour pairs of large buckets, at most 16 a row per band, are not counted).",
             "", "| rows | band bits x bands | shards | candidate pairs | per row | seconds | us per row | "
             "largest task memory (stage) | shadowed rows | unresolved | groups digest | load |",
             "|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|---:|"]
    recall_lines = ["", "Planted pairs by true cosine: share in one group (both rows stand for by the same "
                    "kept row) / share of which at most one row stays eligible:", "",
                    "| rows | " + " | ".join(f"{c}" for c in PLANTED) + " |",
                    "|---:|" + "---:|" * len(PLANTED)]
    parent_lines = ["", "Rows set aside by the exact cosine of each to its parent (the better row that "
                    "set it aside):", "", "| rows | set aside | below 0.90 | 0.90 to 0.95 | 0.95 or more |",
                    "|---:|---:|---:|---:|---:|"]
    stage_lines = ["", "Largest task memory and seconds per stage:", "",
                   "| rows | " + " | ".join(STAGES) + " |", "|---:|" + "---:|" * len(STAGES)]
    for n_rows in args.sizes:
        parts, previous, planted, embeddings = [], None, [], []
        for number in range(n_rows // args.rows_per_partition):
            quality, emb = make_partition(number, args.rows_per_partition, args.dim, model)
            if previous is not None and args.copies:
                rng = np.random.default_rng(10_000 + number)
                rows, sources, cosines = _planted_copies(emb, previous, rng, args.copies)
                base = number * args.rows_per_partition
                planted.append((base + rows, base - args.rows_per_partition + sources, cosines))
            previous = emb
            embeddings.append(emb)
            parts.append({"quality": quality, "codes": np.zeros(len(quality), dtype=np.int64),
                          "labels": [None], "signatures": duplicates.signatures(emb, planes)})
        del previous, emb
        n_shards = sharding.shard_count(len(parts), sharding.PARTITIONS_PER_SHARD)
        stages = {}

        def on_task(name, function, *task_args, stages=stages):
            inputs = _nbytes(task_args)
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            started = time.perf_counter()
            out = function(*task_args)
            seconds = time.perf_counter() - started
            memory = inputs + tracemalloc.get_traced_memory()[1] - before
            peak, total = stages.get(name, (0, 0.0))
            stages[name] = (max(peak, memory), total + seconds)
            return out

        load = os.getloadavg()[0]
        tracemalloc.start()
        started = time.perf_counter()
        spill_dir = Path(tempfile.mkdtemp(prefix="bench-duplicates-"))
        spilled = iter(range(10**9))

        def spill(pieces, folder=spill_dir, count=spilled):
            """A task's edge pieces to one memory-mapped file per column (a shuffle's spill)."""
            sizes = np.cumsum([0] + [len(piece[0]) for piece in pieces])
            columns = []
            for column in range(len(pieces[0])):
                path = folder / f"{next(count)}.npy"
                np.save(path, np.concatenate([piece[column] for piece in pieces]))
                columns.append(np.load(path, mmap_mode="r"))
            return [tuple(c[sizes[i]:sizes[i + 1]] for c in columns) for i in range(len(pieces))]

        groups, stats = sharding.find_groups_sharded(parts, shards=n_shards, rounds_of=args.rounds_of,
                                                     on_task=on_task, spill=spill)
        shutil.rmtree(spill_dir, ignore_errors=True)
        seconds = time.perf_counter() - started
        tracemalloc.stop()
        root = _roots(stats["parents"], n_rows, args.rows_per_partition)
        parent_cosine = _parent_cosines(stats["parents"], np.concatenate(embeddings), args.rows_per_partition)
        copies = np.concatenate([p[0] for p in planted])
        sources = np.concatenate([p[1] for p in planted])
        cosines = np.concatenate([p[2] for p in planted])
        same = root[copies] == root[sources]
        kept = root == np.arange(n_rows)
        handled = ~(kept[copies] & kept[sources])
        worst = max(stages.items(), key=lambda item: item[1][0])
        lines.append(f"| {n_rows:,} | {stats['bits']} x {stats['bands']} | {n_shards} | {stats['pairs']:,} | "
                     f"{stats['pairs'] / n_rows:.2f} | {seconds:.1f} | {1e6 * seconds / n_rows:.1f} | "
                     f"{worst[1][0] / 2**20:.0f} MiB ({worst[0]}) | "
                     f"{sum(len(_field(g, 'shadowed')) for g in groups):,} | {stats['unresolved']} | "
                     f"{_digest(groups)} | {load:.1f} |")
        recall_lines.append(f"| {n_rows:,} | " + " | ".join(
            f"{same[cosines == c].mean():.2%} / {handled[cosines == c].mean():.2%}" for c in PLANTED) + " |")
        below, above = np.mean(parent_cosine < 0.90), np.mean(parent_cosine >= 0.95)
        parent_lines.append(f"| {n_rows:,} | {parent_cosine.size:,} | {below:.2%} | "
                            f"{1 - below - above:.2%} | {above:.2%} |")
        cells = [f"{stages[s][0] / 2**20:.0f} MiB, {stages[s][1]:.1f} s" if s in stages else "-"
                 for s in STAGES]  # "-": a stage that an older package does not have
        stage_lines.append(f"| {n_rows:,} | " + " | ".join(cells) + " |")
        print("\n".join([lines[-1], recall_lines[-1], parent_lines[-1], stage_lines[-1]]), flush=True)
        del parts, groups, stats, root, embeddings
    text = "\n".join(lines + recall_lines + parent_lines + stage_lines) + "\n"
    print(text)
    if args.json:
        _save(args, text)
    return 0


def _save(args, text: str) -> None:
    """Append this run's tables to ``--json`` (benchmarks/record.py)."""
    shape = {"rows": max(args.sizes) if args.sharded else args.rows, "dim": args.dim,
             "rows a partition": args.rows_per_partition, "planted copies": args.copies}
    record.append(args.json, command=record.command("bench_duplicates.py"), data={"partitions": shape},
                  markdown=text)


def _field(group, key: str) -> np.ndarray:
    """A partition's groups, as DuplicateGroups or (a checkout before it, --before runs) a dict."""
    return group[key] if isinstance(group, dict) else getattr(group, key)


def _digest(groups: list) -> str:
    """A short hash of every partition's shadowed rows, kept rows and weights: equal digests, equal groups."""
    import hashlib

    digest = hashlib.sha256()
    for group in groups:
        for key in ("shadowed", "kept", "weights"):
            digest.update(np.ascontiguousarray(_field(group, key), dtype=np.int64).tobytes())
    return digest.hexdigest()[:12]


def _global_rows(refs: np.ndarray, rows_per_partition: int) -> np.ndarray:
    """Row references (``partition << 32 | position``) as global row numbers."""
    return ((refs >> np.uint64(32)).astype(np.int64) * rows_per_partition
            + (refs & np.uint64(0xFFFFFFFF)).astype(np.int64))


def _parent_cosines(parents: list, embeddings: np.ndarray, rows_per_partition: int) -> np.ndarray:
    """The exact cosine of each shadowed row to its parent (the embeddings are unit rows)."""
    child = np.concatenate([_global_rows(s["child"], rows_per_partition) for s in parents])
    parent = np.concatenate([_global_rows(s["parent"], rows_per_partition) for s in parents])
    return np.einsum("ij,ij->i", embeddings[child], embeddings[parent])


def _roots(parents: list, n_rows: int, rows_per_partition: int) -> np.ndarray:
    """Each row's group representative (global row number), following the shadowed rows' parents."""
    parent = np.arange(n_rows, dtype=np.int64)
    for shard in parents:
        child = _global_rows(shard["child"], rows_per_partition)
        parent[child] = _global_rows(shard["parent"], rows_per_partition)
    while True:
        jumped = parent[parent]
        if np.array_equal(jumped, parent):
            return parent
        parent = jumped


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--rows-per-partition", type=int, default=50_000)
    parser.add_argument("--copies", type=float, default=0.1,
                        help="share of each partition's rows copied from the previous partition")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of the one-task search")
    parser.add_argument("--json", help="append the results to this JSON file (results/duplicates.json)")
    parser.add_argument("--sharded", action="store_true", help="measure the sharded stages (dedup.stages)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000],
                        help="--sharded: table sizes, one run each")
    parser.add_argument("--rounds-of", type=int, default=sharding.ROUND_BANDS,
                        help="--sharded: bands per round")
    args = parser.parse_args(argv)
    if args.sharded:
        return sharded(args)
    model = cluster_model(args.dim, 2000)
    planes = duplicates.hyperplanes(args.dim)
    parts, previous, planted = [], None, []
    started = time.perf_counter()
    for number in range(args.rows // args.rows_per_partition):
        quality, emb = make_partition(number, args.rows_per_partition, args.dim, model)
        if previous is not None and args.copies:
            rng = np.random.default_rng(10_000 + number)
            rows, sources, cosines = _planted_copies(emb, previous, rng, args.copies)
            base = number * args.rows_per_partition
            planted.append((base + rows, base - args.rows_per_partition + sources, cosines))
        previous = emb
        # the embeddings too, as the plan pass hands them over (a package that confirms candidates
        # on exact cosine reads them; one that does not leaves them)
        parts.append({"quality": quality, "codes": np.zeros(len(quality), dtype=np.int64), "labels": [None],
                      "signatures": duplicates.signatures(emb, planes), "embeddings": emb})
    made = time.perf_counter() - started
    del previous
    n = sum(len(p["quality"]) for p in parts)
    find_groups, roots = _one_task_search()
    find_groups(parts)  # once first: imports and compiled code loaded, as in a worker's later tasks
    load = os.getloadavg()[0]
    seconds = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        groups = find_groups(parts)
        seconds.append(time.perf_counter() - started)
    tracemalloc.start()
    find_groups(parts)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    root = roots(parts)
    given = " ".join(sys.argv[1:] if argv is None else argv)
    lines = [f"# One-task near-duplicate search at {n:,} rows, d = {args.dim}", "",
             f"Command: `python benchmarks/bench_duplicates.py {given}`", "",
             f"{len(parts)} partitions of {args.rows_per_partition:,} rows (bench_pipeline's clustered "
             f"generator, 20% near-copies inside each partition, {args.copies:.0%} of each partition's rows "
             f"copies of the previous partition's at cosines {', '.join(map(str, PLANTED))}), generated and "
             f"signed in {made:.0f} s; load average {load:.1f} on {os.cpu_count()} cores at the start of the "
             f"search; {args.repeat} runs after a first one.", "",
             "| rows | search s (least / median) | peak memory allocated by the search | shadowed rows | "
             "groups digest |", "|---:|---:|---:|---:|---|",
             f"| {n:,} | {min(seconds):.2f} / {float(np.median(seconds)):.2f} | {peak / 2**20:.0f} MiB | "
             f"{sum(len(_field(g, 'shadowed')) for g in groups):,} | {_digest(groups)} |"]
    lines += _recall_lines(n, planted, root, groups, args.rows_per_partition)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.json:
        _save(args, text)
    return 0


def _one_task_search():
    """The one-task search of the package on ``PYTHONPATH`` and a function giving each row's group
    (its kept row's number): ``dedup.search`` where the package has it, else the connected
    components of ``plan.duplicates``, so that both sides of a comparison run this script."""
    if not ROOMED:
        def components(parts):
            table = duplicates.stack_parts(parts)
            left, right = duplicates.band_edges(table, range(duplicates.BANDS))
            return duplicates._components(len(table["quality"]), left, right)

        return duplicates.find_groups, components
    from datamask_dask.dedup import search

    def parents(parts):  # each row's parent from the groups, whichever rule made them
        sizes = [len(p["quality"]) for p in parts]
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        parent = np.full(int(offsets[-1]), -1, dtype=np.int64)
        for number, group in enumerate(search.find_groups(parts)):
            ref = np.asarray(group.parent, dtype=np.int64)
            parent[offsets[number] + np.asarray(group.shadowed)] = offsets[ref >> 32] + (ref & 0xFFFFFFFF)
        root = np.where(parent < 0, np.arange(parent.size), parent)
        while True:
            jumped = root[root]
            if np.array_equal(jumped, root):
                return root
            root = jumped

    return search.find_groups, parents


def _recall_lines(n: int, planted: list, root: np.ndarray, groups: list, rows_per_partition: int) -> list:
    """Per planted cosine: the share of planted pairs in one group / of which at most one row stays
    eligible."""
    if not planted:
        return []
    shadowed = np.zeros(n, dtype=bool)
    for number, group in enumerate(groups):
        shadowed[number * rows_per_partition + _field(group, "shadowed")] = True
    copies, sources, cosines = (np.concatenate([p[i] for p in planted]) for i in range(3))
    same = root[copies] == root[sources]
    handled = shadowed[copies] | shadowed[sources]
    return ["", "Planted pairs by true cosine: share in one group / share of which at most one row stays "
            "eligible:", "", "| rows | " + " | ".join(f"{c}" for c in PLANTED) + " |",
            "|---:|" + "---:|" * len(PLANTED),
            f"| {n:,} | " + " | ".join(f"{same[cosines == c].mean():.2%} / {handled[cosines == c].mean():.2%}"
                                      for c in PLANTED) + " |"]


if __name__ == "__main__":
    sys.exit(main())
