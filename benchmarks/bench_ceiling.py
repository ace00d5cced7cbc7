"""A selection job against the I/O ceiling: what ``datamask select`` costs beyond its files' plain I/O.

The ceiling is the plain I/O of the same files: in ``--workers`` processes, each file read whole
with ``pyarrow.parquet.read_table``, a boolean column added and the table written with
``write_table`` (no dictionary, no statistics). It is taken twice a repeat: in warm processes (one
pool kept for the whole run) and in fresh ones (a new pool each repeat, as every job has: a job
starts its own cluster of worker processes). The two differ by what the machine charges a process
for memory it touches for the first time, which the run measures too (a fresh process filling
1 GiB): on a virtual machine whose host backs guest memory lazily, or takes freed pages back,
that costs ~1 s a GiB, and a fresh worker pays it on every page of its peak. The jobs are
``datamask select --n-workers W`` runs, each a fresh process; their time is the job's own ("in X s"
of its summary line: plan, select and write, run summary; cluster start-up excluded), and the
process's wall time is reported beside it ("with start-up": interpreter, imports, cluster). ``share of
ceiling`` = ceiling seconds / job seconds (1.0 would be a job as cheap as copying its files), for
the warm and the fresh ceiling. Jobs and the ceilings are interleaved ``--repeats`` times, so load
from other work falls on all alike, and each repeat starts with the next job (each job follows a
different one); medians are reported. ``best share possible`` bounds what any job doing the same
arithmetic could reach: the warm ceiling against the ceiling plus the method's own compute (the
stage clocks ``learn`` and ``plan sign`` of the last repeat, spread over the workers), as if the
job cost nothing beyond plain I/O and that compute.

Jobs: the CLI's defaults (table scope, Pair_simi), ``--diversity-scope partition``, ``--algorithm
Facility``, ``--output-columns selection`` (the selection table only), and the fixed cost: the
default job on a 4-file input of 500 rows a file. ``--before PATH`` runs the same jobs with another
checkout of the package (``git worktree add``) beside this one. Each job's selection digest (a
hash of the selected ids) shows whether two runs selected the same rows. The worker-seconds per
stage come from the run record of the last repeat.

    python benchmarks/bench_ceiling.py --rows 200000 --repeats 3 --json benchmarks/results/ceiling.json
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import record
from jobs import checkout_job
from tables import cluster_model, ensure_dataset, make_partition, write_partition

HERE = Path(__file__).resolve().parent

JOBS = {
    "default (table scope, Pair_simi)": [],
    "partition scope": ["--diversity-scope", "partition"],
    "Facility": ["--algorithm", "Facility"],
    "selection-only output": ["--output-columns", "selection"],
}
TINY_ROWS, TINY_FILES = 500, 4
METHOD_STAGES = ("learn", "plan sign")  # the method's own arithmetic: the learner, the SimHash signing


def _copy_with_column(job: tuple[str, str]) -> float:
    import pyarrow as pa
    import pyarrow.parquet as pq

    source, target = job
    started = time.perf_counter()
    table = pq.read_table(source)
    table = table.append_column("selected", pa.array(np.zeros(table.num_rows, dtype=bool)))
    pq.write_table(table, target, use_dictionary=False, write_statistics=False)
    return time.perf_counter() - started


def _warm(_):
    import pyarrow.parquet  # noqa: F401

    return os.getpid()


def _touch(gib: float) -> tuple[float, float]:
    """Seconds to fill ``gib`` GiB of new memory in this process, and again right after freeing it."""
    seconds = []
    for _ in range(2):
        started = time.perf_counter()
        block = np.ones(int(gib * 2**30) // 8)
        seconds.append(time.perf_counter() - started)
        del block
    return seconds[0], seconds[1]


def first_touch(gib: float = 1.0) -> tuple[float, float]:
    """:func:`_touch` in a fresh process (what a new worker pays for its memory)."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_touch, (gib,))


def fresh_ceiling(workers: int, files: list[Path], scratch: Path) -> float:
    """:func:`ceiling` in a new pool of processes (modules imported before the clock starts)."""
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        pool.map(_warm, range(workers), chunksize=1)
        return ceiling(pool, files, scratch)


def ceiling(pool, files: list[Path], scratch: Path) -> float:
    """Wall seconds of the plain I/O of ``files`` on the pool's warm processes."""
    out = scratch / "ceiling"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    started = time.perf_counter()
    pool.map(_copy_with_column, [(str(f), str(out / f.name)) for f in files], chunksize=1)
    return time.perf_counter() - started






def ensure_tiny(folder: Path, d: int) -> Path:
    """``TINY_FILES`` files of ``TINY_ROWS`` rows: the fixed cost of a job."""
    if len(list(folder.glob("*.parquet"))) != TINY_FILES:
        folder.mkdir(parents=True, exist_ok=True)
        model = cluster_model(d, 2000)
        for number in range(TINY_FILES):
            quality, emb = make_partition(number, TINY_ROWS, d, model)
            write_partition(folder / f"part.{number:05d}.parquet", number, quality, emb)
    return folder


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--rows-per-partition", type=int, default=50_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jobs", nargs="+", choices=[*JOBS, "fixed cost"], default=[*JOBS, "fixed cost"])
    parser.add_argument("--before", help="another checkout of the package: its jobs run beside this one's")
    parser.add_argument("--cache", default=str(HERE.parent / ".benchmark-cache"))
    parser.add_argument("--json", help="append the results to this JSON file (results/ceiling.json)")
    args = parser.parse_args(argv)
    source = ensure_dataset(Path(args.cache), args.rows, args.dim, args.rows_per_partition, 2000)
    tiny = ensure_tiny(Path(args.cache) / f"tiny-d{args.dim}", args.dim)
    files = sorted(source.glob("*.parquet"))
    trees = {"": str(HERE.parent)} if not args.before else {"before: ": args.before, "": str(HERE.parent)}
    jobs = {f"{label}{name}": (tree, tiny if name == "fixed cost" else source,
                               [] if name == "fixed cost" else JOBS[name])
            for name in args.jobs for label, tree in trees.items()}
    scratch = Path(tempfile.mkdtemp(prefix="bench-ceiling-"))
    runs: dict[str, list] = {name: [] for name in jobs}
    ceilings: dict[str, list] = {"warm": [], "fresh": []}
    touches = [first_touch()]
    try:
        with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
            pool.map(_warm, range(args.workers), chunksize=1)
            ceiling(pool, files, scratch)  # the pool's processes touch their memory once, untimed
            for repeat in range(args.repeats):
                ceilings["warm"].append(ceiling(pool, files, scratch))
                ceilings["fresh"].append(fresh_ceiling(args.workers, files, scratch))
                print(f"ceiling {ceilings['warm'][-1]:.2f} s warm, {ceilings['fresh'][-1]:.2f} s fresh",
                      file=sys.stderr, flush=True)
                # each repeat starts one job later: a job runs after a different one each time (a job
                # that frees much memory leaves the next job's fresh workers more of it to fault in)
                names = list(jobs)[repeat % len(jobs):] + list(jobs)[:repeat % len(jobs)]
                for name in names:
                    tree, data, flags = jobs[name]
                    runs[name].append(checkout_job(tree, data, scratch / "out", args.workers, flags))
                    print(name, runs[name][-1]["seconds"], file=sys.stderr, flush=True)
        touches.append(first_touch())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    text = report(args, argv, source, ceilings, runs, touches)
    print(text)
    if args.json:
        shape = {"rows": args.rows, "dim": args.dim, "rows a file": args.rows_per_partition}
        record.append(args.json, command=record.command("bench_ceiling.py", argv), data={"table": shape},
                      markdown=text)
    return 0


def report(args, argv, source: Path, ceilings: dict, runs: dict, touches: list) -> str:
    given = shlex.join(sys.argv[1:] if argv is None else argv)
    warm, fresh = (float(np.median(ceilings[kind])) for kind in ("warm", "fresh"))
    lines = [f"# A job against the I/O ceiling ({args.rows:,} rows, d = {args.dim}, "
             f"{args.rows // args.rows_per_partition} files, {args.workers} workers)", "",
             f"Command: `python benchmarks/bench_ceiling.py {given}`", "",
             f"Data: `{source.name}` of bench_pipeline (clustered, 20% near-copies within each file). "
             f"Machine: {os.cpu_count()} CPU cores shared with other work; jobs and ceiling interleaved, "
             "medians compared.",
             "", f"I/O ceiling (read_table + bool column + write_table, {args.workers} processes): warm "
             f"{', '.join(f'{c:.2f}' for c in ceilings['warm'])} s, median **{warm:.2f} s**; fresh "
             f"processes {', '.join(f'{c:.2f}' for c in ceilings['fresh'])} s, median **{fresh:.2f} s**.",
             "", "Memory a fresh process touches for the first time: 1 GiB filled in "
             f"{' and '.join(f'{t[0]:.2f} s' for t in touches)} (at the start and at the end of the run), "
             f"and again right after it was freed in {' and '.join(f'{t[1]:.2f} s' for t in touches)}.", "",
             "| job | seconds per repeat | median s | share of ceiling: warm / fresh | best share possible "
             "| with start-up, median s | largest worker peak | plan / select and write / summary s "
             "| load at start | selection digest |",
             "|---|---|---:|---:|---:|---:|---:|---|---|---|"]
    for name, values in runs.items():
        median = float(np.median([r["seconds"] for r in values]))
        phases = values[-1]["phases"]
        split = " / ".join(f"{phases.get(p, np.nan):.2f}" for p in ("plan", "select and write", "summary"))
        share = "" if name.endswith("fixed cost") else f"{warm / median:.2f} / {fresh / median:.2f}"
        compute = sum(values[-1]["stages"].get(stage, 0.0) for stage in METHOD_STAGES) / args.workers
        best = "" if name.endswith("fixed cost") else f"{warm / (warm + compute):.2f}"
        seconds = ", ".join(f"{r['seconds']:.1f}" for r in values)
        loads = ", ".join(f"{r['load']:.1f}" for r in values)
        peak = max(r["peak_rss"]["largest worker"] for r in values) / 2**30
        digest = values[-1]["digest"]
        wall = float(np.median([r["wall"] for r in values]))
        lines.append(f"| {name} | {seconds} | {median:.2f} | {share} | {best} | {wall:.2f} | {peak:.2f} GiB "
                     f"| {split} | {loads} | {digest} |")
    stage_names = sorted({s for values in runs.values() for s in values[-1]["stages"]})
    lines += ["", "Worker-seconds per stage (last repeat, summed over workers; the package's stage clocks):",
              "",
              "| job | " + " | ".join(stage_names) + " |", "|---|" + "---:|" * len(stage_names)]
    for name, values in runs.items():
        stages = values[-1]["stages"]
        cells = [f"{stages[s]:.2f}" if s in stages else "" for s in stage_names]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Fixed cost: the default job on 4 files of 500 rows. Selection digest: a hash of the "
              "selected rows' ids (last repeat); equal digests, equal selections."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
