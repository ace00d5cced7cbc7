"""End-to-end throughput of ``datamask select`` on partitioned parquet, with a breakdown by stage.

One command prints markdown tables (and appends them to ``--json``, see ``record.py``)::

    python benchmarks/bench_pipeline.py --sizes 100000 1000000 --workers 1 2 \
        --algorithms Pair_simi Facility --config conf/cpu.yaml --json benchmarks/results/pipeline.json

What runs, for every (size, algorithm, workers):

- **Data**: a synthetic table generated once into ``--cache`` (default ``.benchmark-cache/``):
  ``rows_per_partition`` rows per parquet file (default 100,000), columns ``chunk_id`` (int64),
  ``quality_score`` (float64), ``feature_arr`` (fixed_size_list<float32>[d], d = 768 by default)
  and ``text`` (a short string, standing for the columns a selection job carries along). The
  embeddings are clustered around cluster centres shared by every partition (Zipf-like cluster
  sizes over the whole table), 20% of each partition's rows are near-duplicates of another of its
  rows, and quality is log-normal and correlated with the cluster (as in
  :func:`datamask_dask.sample_data.make_embeddings`); partition ``i`` is drawn with seed ``i``,
  so a size of N rows is the first N / rows_per_partition files (hard links into one folder).
- **Job**: exactly what ``datamask select --input IN --output OUT --config CONFIG --n-workers W``
  runs (``write_selection(read_parquet(IN), OUT, ...)``, resumable writer included), on a
  ``LocalCluster`` from :func:`datamask_dask.cluster.get_client` with W worker processes of T
  threads each (``--threads``, default 1; the ``workers`` column says ``W x T``). ``rows/s`` =
  input rows / wall time of that call (plan pass, select pass and write, cluster start-up excluded).
- **Wall account** (the first table): every second of that wall time, once. From Dask's task
  stream (``distributed.get_task_stream``), an instant when tasks run is shared equally among the
  task prefixes running then (``datamask-select-write``, ``read_parquet``...), transfers
  (``transfer``) and spills (``spill to disk``); an instant when nothing runs is the driver's, named
  by the phase it falls in (``SelectionReport.phases``): ``driver: plan`` (the first ``plan``
  seconds), ``driver: summary`` and ``driver: commit`` (the last seconds), and ``driver: between
  passes / scheduling`` (the rest: the driver's bookkeeping and the gaps between tasks). The rows add
  up to the wall time (:func:`wall_account`).
- **Peak memory per worker**: the largest resident set size (psutil, sampled every 50 ms) of any
  worker process during the job, next to the target ``2 x (one partition's embedding bytes) +
  1 GiB``.
- **Stages**: worker-seconds spent in each stage, summed over the workers, as the package
  reports them (``SelectionReport.stages``, see :mod:`datamask_dask.telemetry`):
  ``read`` (parquet -> Arrow-backed pandas, both passes), ``plan`` (per-partition checks,
  sketches and the quota plan), ``extract`` (Arrow list column -> float32 matrix),
  ``learn`` (:func:`~datamask_dask.learn.engine.learn_mask`), ``select other`` (the rest of the select
  task: eligibility, chunking, quotas, adding the column) and ``write`` (Arrow conversion,
  parquet encoding, fsync and markers). ``idle/other`` = W x T x wall - the sum: scheduling,
  serialisation, the driver's commit, and waiting (the wall account says which).
- **Objective** (``--objective``, on by default): on partition 0 of the smallest size (its first
  ``rows_per_partition`` rows), the rows the job selected there (k rows) are scored with
  :func:`~datamask_dask.learn.metrics.evaluate_selection` on the whole partition (Facility's
  reference set is every row of the partition; quality normalised by the whole table's range, as
  the job does), next to ``random``, ``quality top-k`` and ``stochastic greedy`` (eps = 0.1, the
  same joint objective) with the same k on the same rows. Stochastic greedy runs when the
  partition has at most ``--greedy-max-n`` rows (Facility: with a reference set of
  ``--greedy-reference`` rows, scored on every row like the others).

The selected column of the runs with 1 and with 2 workers is compared: the selection must not
depend on the number of workers.
"""

from __future__ import annotations

import argparse
import ast
import itertools
import os
import platform
import shutil
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record  # noqa: E402

GIB = 2**30
ROOT = Path(__file__).resolve().parent.parent
STAGES = ("read", "plan", "extract", "learn", "select other", "write")


# --------------------------------------------------------------------------- data


def _cluster_model(d: int, n_clusters: int, seed: int = 12345):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_clusters, d), dtype=np.float32)
    sizes = 1.0 / np.arange(1, n_clusters + 1) ** 0.8
    spread = rng.uniform(0.5, 1.2, n_clusters).astype(np.float32)
    bias = rng.standard_normal(n_clusters).astype(np.float32)
    return centres, sizes / sizes.sum(), spread, bias


def make_partition(number: int, rows: int, d: int, model, duplicate_share: float = 0.2):
    """Quality and unit embeddings of partition ``number`` (seeded by it; shared cluster centres)."""
    centres, probabilities, spread, bias = model
    rng = np.random.default_rng(number)
    cluster = rng.choice(len(centres), size=rows, p=probabilities)
    emb = rng.standard_normal((rows, d), dtype=np.float32)
    emb *= spread[cluster, None]
    emb += centres[cluster]
    n_dup = int(duplicate_share * rows)
    if n_dup:
        dup, src = rng.choice(rows, n_dup, replace=False), rng.integers(0, rows, n_dup)
        emb[dup] = emb[src] + 0.05 * rng.standard_normal((n_dup, d), dtype=np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    quality = np.exp(0.6 * bias[cluster] + 0.5 * rng.standard_normal(rows).astype(np.float32))
    return quality.astype(np.float64), emb


def write_partition(path: Path, number: int, quality: np.ndarray, emb: np.ndarray) -> None:
    """Write partition ``number`` (ids from ``number * rows``) to ``path`` atomically."""
    rows, d = emb.shape
    ids = np.arange(number * rows, (number + 1) * rows, dtype=np.int64)
    table = pa.table(
        {
            "chunk_id": ids,
            "quality_score": quality,
            "feature_arr": pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), d),
            "text": pa.array([f"document {j} of the benchmark corpus" for j in ids.tolist()]),
        }
    )
    temporary = path.with_suffix(".tmp")
    pq.write_table(table, temporary, row_group_size=25_000)
    os.replace(temporary, path)


def _draw_file(job: tuple[Path, int, int, int, int]) -> str:
    """Generate partition file ``number`` of a table; a line saying so."""
    path, number, rows, d, n_clusters = job
    started = time.perf_counter()
    quality, emb = make_partition(number, rows, d, _cluster_model(d, n_clusters))
    write_partition(path, number, quality, emb)
    return f"  generated {path.name} ({rows} rows) in {time.perf_counter() - started:.1f} s"


def ensure_dataset(cache: Path, n_rows: int, d: int, rows_per_partition: int, n_clusters: int,
                   processes: int = 1) -> Path:
    """The folder of an ``n_rows`` table (generated once, missing files in ``processes`` processes;
    partitions shared between sizes)."""
    if n_rows % rows_per_partition:
        raise SystemExit(f"--sizes: {n_rows} is not a multiple of --rows-per-partition {rows_per_partition}")
    base = cache / f"pipeline-d{d}-p{rows_per_partition}-c{n_clusters}"
    parts = base / "parts"
    parts.mkdir(parents=True, exist_ok=True)
    n_parts = n_rows // rows_per_partition
    missing = [(parts / f"part.{i:05d}.parquet", i, rows_per_partition, d, n_clusters) for i in range(n_parts)
               if not (parts / f"part.{i:05d}.parquet").exists()]
    if processes > 1 and len(missing) > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(min(processes, len(missing))) as pool:
            lines = pool.map(_draw_file, missing)
            for line in lines:
                print(line, file=sys.stderr, flush=True)
    else:
        for job in missing:
            print(_draw_file(job), file=sys.stderr, flush=True)
    folder = base / f"n{n_rows}"
    if not folder.exists() or len(list(folder.glob("*.parquet"))) != n_parts:
        shutil.rmtree(folder, ignore_errors=True)
        staging = base / f".n{n_rows}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        for i in range(n_parts):
            os.link(parts / f"part.{i:05d}.parquet", staging / f"part.{i:05d}.parquet")
        os.replace(staging, folder)
    return folder


# --------------------------------------------------------------------------- memory


class MemorySampler:
    """Peak RSS of a set of processes, sampled in a background thread."""

    def __init__(self, pids, interval: float = 0.05):
        import psutil

        self.processes = {pid: psutil.Process(pid) for pid in pids}
        self.peaks = dict.fromkeys(pids, 0)
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            for pid, process in self.processes.items():
                try:
                    self.peaks[pid] = max(self.peaks[pid], process.memory_info().rss)
                except Exception:  # a worker restarted: keep what was seen
                    pass
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


# --------------------------------------------------------------------------- wall account

# Task-stream actions other than a task's compute, as the account names them.
ACTIVITIES = {"transfer": "transfer", "disk-read": "spill to disk", "disk-write": "spill to disk"}


def wall_account(tasks, started: float, stopped: float, phases: dict) -> dict[str, float]:
    """Where each second of a job's wall time ``[started, stopped]`` (``time.time()``) went.

    ``tasks`` are Dask's task-stream records (``distributed.get_task_stream``): an instant when tasks
    run is shared equally among the activities running then (a compute is named by its task prefix,
    ``key_split``; transfers and spills by their action). An instant when none runs is the driver's,
    named by its phase (``phases``, the report's wall seconds): ``plan`` from the start, ``summary``
    and ``commit`` at the end, and between them the driver's scheduling and bookkeeping. The values
    add up to ``stopped - started``.
    """
    from distributed.utils import key_split

    wall = stopped - started
    events = []  # (offset from started, +1 starts / -1 stops, activity)
    for task in tasks:
        for span in task["startstops"]:
            action = span["action"]
            activity = key_split(task["key"]) if action == "compute" else ACTIVITIES.get(action, action)
            start, stop = max(span["start"] - started, 0.0), min(span["stop"] - started, wall)
            if start < stop:
                events += [(start, 1, activity), (stop, -1, activity)]
    plan_end = min(max(phases.get("plan", 0.0), 0.0), wall)
    commit_start = max(plan_end, wall - phases.get("commit", 0.0))
    summary_start = max(plan_end, commit_start - phases.get("summary", 0.0))
    windows = [(plan_end, "driver: plan"), (summary_start, "driver: between passes / scheduling"),
               (commit_start, "driver: summary"), (wall, "driver: commit")]  # each window's end
    events.sort(key=lambda event: event[0])
    cuts = sorted({0.0, wall, *(event[0] for event in events), *(end for end, _ in windows)})
    account: dict[str, float] = {}
    running: dict[str, int] = {}
    next_event = 0
    for start, stop in itertools.pairwise(cuts):
        while next_event < len(events) and events[next_event][0] <= start:
            _, step, activity = events[next_event]
            running[activity] = running.get(activity, 0) + step
            next_event += 1
        active = [activity for activity, count in running.items() if count > 0]
        if active:
            for activity in active:
                account[activity] = account.get(activity, 0.0) + (stop - start) / len(active)
        else:
            driver = next(label for end, label in windows if start < end)
            account[driver] = account.get(driver, 0.0) + stop - start
    return account


def wall_account_lines(jobs: list[tuple[dict, dict, float]], least_share: float = 0.005) -> list[str]:
    """The account table (markdown lines): for each job (its columns, its :func:`wall_account`, its
    wall seconds), the account's rows biggest first, those under ``least_share`` of the wall as one
    row, and a total row of the wall."""
    if not jobs:
        return []
    columns = list(jobs[0][0])
    lines = [
        "Where the wall time went (each instant shared equally among the task prefixes, transfers and "
        "spills running then, from Dask's task stream; an instant with none running is the driver's, "
        "by its phase):",
        "",
        "| " + " | ".join(columns) + " | activity | s | share of wall |",
        "|" + "---|" * len(columns) + "---|---:|---:|",
    ]
    for cells, account, wall in jobs:
        job = "| " + " | ".join(str(cells[column]) for column in columns) + " | "
        rows = sorted(account.items(), key=lambda item: -item[1])
        small = [seconds for _, seconds in rows if seconds < least_share * wall]
        rows = [row for row in rows if row[1] >= least_share * wall]
        if small:  # many small prefixes: one row keeps the table readable and the total whole
            rows.append((f"{len(small)} others, each under {least_share:.1%}", sum(small)))
        for activity, seconds in rows:
            lines.append(job + f"{activity} | {seconds:.2f} | {seconds / wall:.1%} |")
        lines.append(job + f"total (wall) | {wall:.2f} | 100% |")
    return lines + [""]


# --------------------------------------------------------------------------- one job


def run_job(source: Path, target: Path, n_workers: int, config: str, overrides: dict,
            threads: int = 1) -> dict:
    """``datamask select`` on ``source`` with ``n_workers`` workers of ``threads`` threads; timings
    (with the :func:`wall_account` of the job, from Dask's task stream) and memory."""
    from distributed import get_task_stream

    from datamask_dask import get_client, read_parquet, write_selection
    from datamask_dask.io.storage import input_fingerprint

    client = get_client("cpu", n_workers=n_workers, threads_per_worker=threads, dashboard_address=":0")
    try:
        pids = list(client.run(os.getpid).values())
        shutil.rmtree(target, ignore_errors=True)  # not timed: replacing a previous run's output
        import dask.dataframe  # noqa: F401  (not timed: a one-off import, ~2 s on a cold process)

        with MemorySampler(pids) as sampler, get_task_stream(client) as stream:
            started = time.time()  # the task stream's clock
            report = write_selection(
                read_parquet(source),
                target,
                config=config,
                overwrite=True,
                resume=False,
                input_fingerprint=input_fingerprint(source),
                **overrides,
            )
            stopped = time.time()
    finally:
        client.shutdown()
    return {
        "wall": stopped - started,
        "rows": report.rows,
        "selected": report.selected,
        "workers": n_workers,
        "threads": threads,
        "stages": stage_columns(report.stages),
        "account": wall_account(stream.data, started, stopped, report.phases),
        "peak_rss": max(sampler.peaks.values()),
    }


def stage_columns(seconds: dict) -> dict:
    """The report's worker seconds per stage, in the table's columns (``plan`` = its read and checks)."""
    out = {"read": seconds.get("read", 0.0),
           "plan": seconds.get("plan read", 0.0) + seconds.get("plan check", 0.0),
           "extract": seconds.get("extract", 0.0), "learn": seconds.get("learn", 0.0),
           "write": seconds.get("write", 0.0)}
    out["select other"] = max(0.0, seconds.get("select", 0.0) - out["learn"] - out["extract"])
    return out


# --------------------------------------------------------------------------- objective


def objective_block(
    source: Path,
    output: Path,
    algorithm: str,
    lamb: float,
    greedy_max_n: int,
    greedy_reference: int,
    seed: int = 0,
) -> list[dict]:
    """Scores of the job's selection on partition 0 and of the baselines with the same k there."""
    from datamask_dask import (
        embedding_matrix,
        evaluate_selection,
        quality_topk,
        random_selection,
        read_parquet,
        stochastic_greedy,
    )

    quality_all = read_parquet(source, columns=["quality_score"]).compute()["quality_score"]
    quality_range = (float(quality_all.min()), float(quality_all.max()))
    first_input = sorted(source.glob("*.parquet"))[0]
    frame = pq.read_table(first_input, columns=["quality_score", "feature_arr"]).to_pandas(
        types_mapper=__import__("pandas").ArrowDtype
    )
    quality = frame["quality_score"].to_numpy(dtype=np.float64)
    emb = embedding_matrix(frame["feature_arr"])
    out_file = output / "part.0.parquet"
    selected = pq.read_table(out_file, columns=["selected"]).column(0).to_numpy(zero_copy_only=False)
    k = int(selected.sum())
    rows = []

    def score(method, pick, seconds):
        result = evaluate_selection(
            quality, emb, pick, algorithm=algorithm, lamb=lamb, quality_range=quality_range
        )
        rows.append({"method": method, "k": k, "n": len(quality), "seconds": seconds, **result})

    score("datamask (the job)", selected, None)
    common = dict(algorithm=algorithm, lamb=lamb, quality_range=quality_range)
    for draw in range(3):  # random: the mean of 3 seeds is what the share is measured from
        started = time.perf_counter()
        score(f"random (seed {draw})", random_selection(quality, emb, k, seed=draw, **common),
              time.perf_counter() - started)
    started = time.perf_counter()
    score("quality top-k", quality_topk(quality, emb, k, **common), time.perf_counter() - started)
    common["seed"] = seed
    if len(quality) <= greedy_max_n:
        extra = {"reference_size": greedy_reference} if algorithm.lower() == "facility" else {}
        started = time.perf_counter()
        pick = stochastic_greedy(quality, emb, k, eps=0.1, **common, **extra)
        label = "stochastic greedy" + (f" (ref {greedy_reference})" if extra else "")
        score(label, pick, time.perf_counter() - started)
    drawn = np.mean([r["objective"] for r in rows if r["method"].startswith("random")])
    best = max(r["objective"] for r in rows if r["method"].startswith(("quality top-k", "stochastic greedy")))
    for r in rows:  # the yardstick: the share of the best baseline's gain over random
        r["share"] = (r["objective"] - drawn) / (best - drawn) if best != drawn else float("nan")
    return rows


def same_selection(a: Path, b: Path) -> bool:
    def column(path):
        return pq.read_table(path, columns=["selected"]).column(0).to_numpy(zero_copy_only=False)

    return all(np.array_equal(column(a / f.name), column(b / f.name)) for f in sorted(a.glob("*.parquet")))


# --------------------------------------------------------------------------- report


def _fmt_seconds(stages: dict, name: str, total: float) -> str:
    seconds = stages.get(name, 0.0)
    return f"{seconds:.1f} ({seconds / total:.0%})" if total > 0 else f"{seconds:.1f}"


def objective_lines(args, cache: Path, out_root: Path, overrides: dict) -> list[str]:
    """The objective table (markdown lines): the job's selection on partition 0 against the baselines."""
    from datamask_dask.config import load_config

    size, workers = min(args.sizes), max(args.workers)
    lines = [
        f"## Objective on partition 0 ({args.rows_per_partition:,} rows of the {size:,}-row run)",
        "",
        "Every selection is scored with `evaluate_selection` on all rows of partition 0 "
        "(quality normalised by the table's range); the baselines select the same k there.",
        "",
        "| algorithm | lamb | method | k | share of the best baseline's gain over random | objective "
        "| quality | diversity | selection s |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for algorithm in args.algorithms:
        settings = load_config(args.config, algorithm=algorithm, **overrides)
        source = ensure_dataset(cache, size, args.dim, args.rows_per_partition, args.clusters)
        for r in objective_block(source, out_root / f"n{size}-{algorithm}-w{workers}", algorithm,
                                 float(settings["lamb"]), args.greedy_max_n, args.greedy_reference):
            seconds = "" if r["seconds"] is None else f"{r['seconds']:.1f}"
            lines.append(f"| {algorithm} | {settings['lamb']} | {r['method']} | {r['k']:,} "
                         f"| {r['share']:.1%} | {r['objective']:.4f} | {r['quality']:.4f} "
                         f"| {r['diversity']:.4f} | {seconds} |")
            print(lines[-1], file=sys.stderr, flush=True)
    return lines + [""]


def finish_report(args, lines: list[str], cache: Path, out_root: Path, overrides: dict) -> int:
    """Add the objective table (unless ``--no-objective``), remove the outputs, print and save the report."""
    if args.objective:
        lines = lines + objective_lines(args, cache, out_root, overrides)
    if not args.keep_output:
        shutil.rmtree(out_root, ignore_errors=True)
    text = "\n".join(lines)
    print(text)
    if args.json:
        shape = {"rows": max(args.sizes), "dim": args.dim, "rows a file": args.rows_per_partition}
        record.append(args.json, command=record.command(Path(sys.argv[0]).name), data={"tables": shape},
                      markdown=text)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--threads", type=int, default=1, help="threads per worker")
    parser.add_argument("--algorithms", nargs="+", default=["Pair_simi", "Facility"])
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--rows-per-partition", type=int, default=100_000)
    parser.add_argument("--clusters", type=int, default=2000, help="cluster centres shared by all partitions")
    parser.add_argument("--config", default=str(ROOT / "conf" / "cpu.yaml"))
    parser.add_argument(
        "--opt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra option for the job (repeatable), e.g. --opt refine_epochs=20",
    )
    parser.add_argument("--cache", default=str(ROOT / ".benchmark-cache"))
    parser.add_argument("--no-objective", dest="objective", action="store_false")
    parser.add_argument("--greedy-max-n", type=int, default=100_000)
    parser.add_argument("--greedy-reference", type=int, default=8192)
    parser.add_argument("--keep-output", action="store_true", help="keep the selection outputs")
    parser.add_argument("--json", help="append the results to this JSON file (results/pipeline.json)")
    args = parser.parse_args(argv)

    overrides = {}
    for item in args.opt:
        key, _, value = item.partition("=")
        try:
            overrides[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            overrides[key] = value
    cache = Path(args.cache)
    out_root = cache / "pipeline-out"
    part_bytes = args.rows_per_partition * args.dim * 4
    memory_target = 2 * part_bytes + GIB
    head = [
        f"# datamask select, end to end (d = {args.dim}, {args.rows_per_partition:,} rows per partition)",
        "",
        "Command: `python benchmarks/bench_pipeline.py "
        f"{' '.join(argv if argv is not None else sys.argv[1:])}`",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, "
        f"Python {platform.python_version()}; config {args.config}"
        + (f" + {overrides}" if overrides else ""),
        "",
    ]
    lines = [
        "Throughput, memory and worker-seconds by stage:",
        "",
        "| rows | algorithm | workers | wall s | rows/s | peak RSS / worker (target) | "
        + " | ".join(STAGES)
        + " | idle/other |",
        "|---:|---|---:|---:|---:|---:|" + "---:|" * (len(STAGES) + 1),
    ]
    results, accounts = {}, []
    for size in args.sizes:
        source = ensure_dataset(cache, size, args.dim, args.rows_per_partition, args.clusters)
        for algorithm in args.algorithms:
            for workers in args.workers:
                target = out_root / f"n{size}-{algorithm}-w{workers}"
                print(
                    f"running {size} rows, {algorithm}, {workers} worker(s)...", file=sys.stderr, flush=True
                )
                result = run_job(source, target, workers, args.config, {"algorithm": algorithm, **overrides},
                                 args.threads)
                results[size, algorithm, workers] = result
                stages, wall = result["stages"], result["wall"]
                busy = workers * args.threads * wall
                idle = max(0.0, busy - sum(stages.get(s, 0.0) for s in STAGES))
                team = f"{workers} x {args.threads}"
                accounts.append(({"rows": f"{size:,}", "algorithm": algorithm, "workers": team},
                                 result["account"], wall))
                row = (
                    f"| {size:,} | {algorithm} | {team} | {wall:.1f} | {size / wall:,.0f} | "
                    f"{result['peak_rss'] / GIB:.2f} GiB ({memory_target / GIB:.2f}) | "
                    + " | ".join(_fmt_seconds(stages, s, busy) for s in STAGES)
                    + f" | {idle:.1f} ({idle / busy:.0%}) |"
                )
                lines.append(row)
                print(row, file=sys.stderr, flush=True)
    lines = head + wall_account_lines(accounts) + lines
    lines += ["", "Workers: worker processes x threads each. Stage columns: worker-seconds summed over the "
              "threads (share of workers x threads x wall).", ""]

    # Checks against the targets.
    lines += ["## Targets", ""]
    for algorithm in args.algorithms:
        floor = 50_000 if algorithm.lower() == "pair_simi" else 20_000
        for (size, alg, workers), result in sorted(results.items()):
            if alg == algorithm and workers == max(args.workers):
                rate = size / result["wall"]
                lines.append(
                    f"- {algorithm}, {size:,} rows, {workers} workers: {rate:,.0f} rows/s "
                    f"(target >= {floor:,}: {'met' if rate >= floor else 'NOT met'})"
                )
        sizes = sorted({s for s, a, _ in results if a == algorithm})
        for workers in args.workers:
            for size in sizes[1:]:
                if (sizes[0], algorithm, workers) not in results or (size, algorithm, workers) not in results:
                    continue
                small, large = results[sizes[0], algorithm, workers], results[size, algorithm, workers]
                ratio = large["wall"] / small["wall"]
                allowed = 1.1 * size / sizes[0]
                lines.append(
                    f"- {algorithm}, {workers} worker(s): {size:,} rows take {ratio:.1f}x the time "
                    f"of {sizes[0]:,} (target <= {allowed:.0f}x: {'met' if ratio <= allowed else 'NOT met'})"
                )
        if len(args.workers) > 1:
            one, many = min(args.workers), max(args.workers)
            for size in sizes:
                if (size, algorithm, one) in results and (size, algorithm, many) in results:
                    speedup = results[size, algorithm, one]["wall"] / results[size, algorithm, many]["wall"]
                    same = same_selection(
                        out_root / f"n{size}-{algorithm}-w{one}", out_root / f"n{size}-{algorithm}-w{many}"
                    )
                    lines.append(
                        f"- {algorithm}, {size:,} rows: {many} workers {speedup:.2f}x faster than {one} "
                        f"(target >= 1.7x at 1M rows: {'met' if speedup >= 1.7 else 'NOT met'}); "
                        f"same selection: {same}"
                    )
        peak = max(r["peak_rss"] for (s, a, w), r in results.items() if a == algorithm)
        lines.append(
            f"- {algorithm}: peak RSS per worker {peak / GIB:.2f} GiB (target <= "
            f"{memory_target / GIB:.2f} GiB: {'met' if peak <= memory_target else 'NOT met'})"
        )
    lines.append("")

    return finish_report(args, lines, cache, out_root, overrides)


if __name__ == "__main__":
    sys.exit(main())
