"""Running a benchmark's jobs and accounting for them: a job on a local cluster with its wall account
from Dask's task stream and its workers' memory (``cluster_job``), a checkout's CLI job with its peak
memory (``checkout_job``), a CLI job's selected rows (``cli_selection``), and the reports' tables.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import record
import task_peaks as task_peaks_module
from tables import ensure_dataset

from datamask_dask.dedup import simhash as duplicates
from datamask_dask.dedup.stages import unit_vectors
from datamask_dask.run import summary as summary_module

GIB = 2**30
HERE = Path(__file__).resolve().parent


STAGES = ("read", "plan", "extract", "learn", "select other", "write")


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
    # A worker stamps its spans with its estimate of its offset from the scheduler's clock, which a
    # busy event loop skews; every task of the job ran inside its wall, so a worker whose spans
    # leave it is moved back in.
    reach: dict[str, tuple[float, float]] = {}
    for task in tasks:
        first, last = reach.get(task["worker"], (wall, 0.0))
        reach[task["worker"]] = (min([first, *(span["start"] - started for span in task["startstops"])]),
                                 max([last, *(span["stop"] - started for span in task["startstops"])]))
    shift = {worker: max(-first, 0.0) or min(wall - last, 0.0) for worker, (first, last) in reach.items()}
    events = []  # (offset from started, +1 starts / -1 stops, activity)
    for task in tasks:
        for span in task["startstops"]:
            action = span["action"]
            activity = key_split(task["key"]) if action == "compute" else ACTIVITIES.get(action, action)
            offset = shift[task["worker"]] - started
            start, stop = max(span["start"] + offset, 0.0), min(span["stop"] + offset, wall)
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


def cluster_job(source: Path, target: Path, n_workers: int, config: str, overrides: dict,
            threads: int = 1) -> dict:
    """``datamask select`` on ``source`` with ``n_workers`` workers of ``threads`` threads; timings
    (with the :func:`wall_account` of the job, from Dask's task stream) and memory."""
    from distributed import get_task_stream

    from datamask_dask import get_client, select_table

    client = get_client("cpu", n_workers=n_workers, threads_per_worker=threads, dashboard_address=":0")
    try:
        pids = list(client.run(os.getpid).values())
        shutil.rmtree(target, ignore_errors=True)  # not timed: replacing a previous run's output
        import dask.dataframe  # noqa: F401  (not timed: a one-off import, ~2 s on a cold process)

        with MemorySampler(pids) as sampler, get_task_stream(client) as stream:
            started = time.time()  # the task stream's clock
            report = select_table(str(source), str(target), config=config, mode="overwrite", resume=False,
                                  scheduler=client, **overrides)
            stopped = time.time()
    finally:
        client.shutdown()
    record = report.record
    return {
        "wall": stopped - started,
        "rows": report.rows,
        "selected": report.selected,
        "workers": n_workers,
        "threads": threads,
        "stages": stage_columns(record["stages"]),
        "account": wall_account(stream.data, started, stopped, record["phases"]),
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


def fmt_seconds(stages: dict, name: str, total: float) -> str:
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


def checkout_job(tree: str, source: Path, target: Path, workers: int, flags: list[str],
                 task_peaks: bool = False) -> dict:
    """``datamask select`` of ``tree``'s checkout in a fresh process: its seconds, phases, peak
    memory (``peak_rss``), summary and selection digest; with ``task_peaks``, also each task
    prefix's largest own peak on the workers (``task_peaks.py``), in bytes, largest first."""
    shutil.rmtree(target, ignore_errors=True)
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([tree, os.path.join(tree, "integrations")])}
    peaks_folder = tempfile.mkdtemp(prefix="task-peaks-")
    if task_peaks:
        environment["DATAMASK_TASK_PEAKS"] = peaks_folder
        environment["DASK_DISTRIBUTED__WORKER__PRELOAD"] = json.dumps([str(HERE / "task_peaks.py")])
    command = [sys.executable, "-m", "datamask_dask.cli", "select", "--input", str(source), "--output",
               str(target), "--n-workers", str(workers), *flags]
    load = os.getloadavg()[0]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        job = subprocess.Popen(command, stdout=out, stderr=err, text=True, env=environment,
                               cwd=tempfile.gettempdir())
        peak = peak_rss(job)
        wall = time.perf_counter() - started
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    peaks = task_peaks_module.collected(peaks_folder)
    shutil.rmtree(peaks_folder, ignore_errors=True)
    if job.returncode:
        raise SystemExit(f"{' '.join(command)}:\n{stderr[-3000:]}")
    seconds = float(re.search(r" in ([\d.]+) s", stdout).group(1))
    record_path = target / "_datamask_run.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    return {"seconds": seconds, "wall": wall, "load": load, "phases": record.get("phases", {}),
            "peak_rss": peak, "stages": record.get("stages", {}), "summary": record.get("summary") or {},
            "digest": selection_digest(target),
            "task_peaks": peaks}


def peak_rss(job: subprocess.Popen, every: float = 0.25) -> dict:
    """Wait for ``job``; the peak resident memory (bytes) of its own process ("main") and of the
    largest of its descendants (the cluster's workers), sampled every ``every`` seconds."""
    import psutil

    peak = {"main": 0, "largest worker": 0}
    root = psutil.Process(job.pid)
    while job.poll() is None:
        try:
            peak["main"] = max(peak["main"], root.memory_info().rss)
            for child in root.children(recursive=True):
                peak["largest worker"] = max(peak["largest worker"], child.memory_info().rss)
        except psutil.Error:  # a process ended between the listing and the reading
            pass
        time.sleep(every)
    return peak


def random_pairs(source: Path, k: int, seed: int = 0) -> dict:
    """The run summary's pair count (SimHash LSH candidates confirmed on their float16 cosine) on ``k``
    rows of the table drawn at random."""
    files = sorted(source.glob("*.parquet"))
    sizes = [pq.ParquetFile(f).metadata.num_rows for f in files]
    pick = np.sort(np.random.default_rng(seed).choice(sum(sizes), k, replace=False))
    blocks, vectors, start = [], [], 0
    for path, size in zip(files, sizes, strict=True):
        rows = pick[(pick >= start) & (pick < start + size)] - start
        column = pq.read_table(path, columns=["feature_arr"]).column(0).combine_chunks()
        emb = column.values.to_numpy().reshape(size, -1)[rows]
        blocks.append(duplicates.signatures(emb, duplicates.hyperplanes(emb.shape[1])).reshape(-1))
        vectors.append(unit_vectors(emb).astype(np.float16))
        start += size
    within, across = duplicates.count_pairs(blocks, summary_module.DUPLICATE_COSINE, vectors)
    return {"rows": k, "within": within, "across": across}


def selection_digest(target: Path) -> str:
    """A hash of the ids of the rows a job selected (its output's ``chunk_id`` where ``selected``)."""
    import hashlib

    frame = pq.read_table(target, columns=["chunk_id", "selected"]).to_pandas()
    ids = np.sort(frame["chunk_id"].to_numpy()[frame["selected"].to_numpy(dtype=bool)]).astype(np.int64)
    return hashlib.blake2b(ids.tobytes(), digest_size=6).hexdigest()


def cli_selection(source: Path, flags: list[str], checkout: Path | None = None) -> tuple[np.ndarray, dict]:
    """``datamask select`` on ``source``: the ``selected`` column in id order, and the job's seconds (its
    wall time with start-up, its own phases' and the learner's worker-seconds from its run record).
    ``checkout``: the package of that source tree runs the job (another commit, side by side)."""
    target = Path(tempfile.mkdtemp(prefix="bench-quality-")) / "out"
    command = [sys.executable, "-m", "datamask_dask.cli", "select", "--input", str(Path(source).resolve()),
               "--output", str(target), "--no-progress", *flags]
    # the checkout's package for the job and the processes it starts (``python -m`` imports from its
    # working directory first, so it runs there)
    environment = None if checkout is None else record.tree_environment(checkout)
    started = time.perf_counter()
    run = subprocess.run(command, capture_output=True, text=True, env=environment, cwd=checkout)
    seconds = time.perf_counter() - started
    if run.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{run.stderr[-3000:]}")
    table = pq.read_table(target, columns=["chunk_id", "selected"]).sort_by("chunk_id")
    run_record = json.loads((target / "_datamask_run.json").read_text())
    shutil.rmtree(target.parent, ignore_errors=True)
    times = {"wall_seconds": seconds, "job_seconds": sum(run_record["phases"].values()),
             "learn_seconds": run_record["stages"].get("learn", 0.0)}
    return table["selected"].to_numpy(), times
