"""The pipeline benchmark on GPUs: LocalCUDACluster, cuDF partitions, learning on ``device="cuda"``.

Same data, job and table as ``bench_pipeline.py`` (see its docstring), except:

- the cluster is :func:`datamask_dask.cluster.get_client` ``("cuda")`` (dask-cuda's
  ``LocalCUDACluster``, one worker per visible GPU, rmm pool when rmm is installed), with
  ``--threads`` threads per worker (default 1; the ``workers`` column says ``workers x threads``);
- the input is read with ``datamask_dask.read_parquet(..., backend="cudf")`` (cuDF's own
  parquet reader, one partition per file; the embedding column arrives as a cuDF list column
  and reaches torch through DLPack without a host copy), written by cuDF's parquet writer;
- the learner runs with ``device="cuda"`` and the ``gpu`` profile by default;
- ``read`` is not timed on its own (dask-cudf's reader is not the package's): it falls in
  ``idle/other``; ``extract`` times the cuDF list column -> CUDA tensor step (asynchronous
  GPU work lands in ``learn``, which ends on the host);
- one cluster runs every job; its first job, on one file, takes a fresh worker's first CUDA, cuDF
  and torch calls and is reported on its own row;
- the first table is the wall account of each job, as in ``bench_pipeline.py``
  (:func:`jobs.wall_account`: every second of the wall time once, among the task prefixes
  running then or the driver's phase); after the stage table, a table gives each job's
  worker-seconds per task prefix, from the same task stream: what the stage clocks leave in
  ``idle/other``;
- ``--label`` names the code that ran (free text, in the ``algorithm`` column), so that the rows of
  two runs of different code can be told apart in one summary;
- memory: peak host RSS per worker process (psutil) and peak GPU memory per worker, from RMM's
  statistics when RMM is the allocator, else ``torch.cuda.max_memory_allocated``.

    python benchmarks/bench_gpu.py --sizes 1000000 4000000 --algorithms Pair_simi Facility

Every GPU library is imported lazily; on a machine without a CUDA GPU, torch with CUDA, cuDF,
dask-cudf or dask-cuda, the script says which is missing and exits with status 2.
``scripts/gpu-acceptance.sh`` runs it on a GPU machine beside the CPU job and the cuDF I/O ceiling.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import inspect
import os
import sys
import time
from pathlib import Path

from jobs import (
    GIB,
    MemorySampler,
    finish_report,
    fmt_seconds,
    stage_columns,
    wall_account,
    wall_account_lines,
)
from tables import ensure_dataset

HERE = Path(__file__).resolve().parent

STAGES = ("plan", "extract", "learn", "select other", "write")


def gpu_problem() -> str | None:
    """Why this machine cannot run the GPU benchmark, or None."""
    for module, package in (
        ("cudf", "cudf-cu12"),
        ("dask_cudf", "dask-cudf-cu12"),
        ("dask_cuda", "dask-cuda"),
        ("cupy", "cupy-cuda12x"),
    ):
        if importlib.util.find_spec(module) is None:
            return (f"{module} is not installed (pip install 'datamask-dask[gpu-cu12]' or [gpu-cu13], "
                    f"or {package})")
    import torch

    if not torch.cuda.is_available():
        return (
            f"torch {torch.__version__} sees no CUDA device (CPU-only build, no driver, or "
            "CUDA_VISIBLE_DEVICES is empty)"
        )
    return None


def gpu_peak_and_reset() -> int:
    """Peak GPU bytes allocated on this worker since the last call.

    From RMM's statistics when RMM is the allocator (dask-cuda's pool: torch's own counters are
    unavailable then, "CUDAPluggableAllocator does not yet support getDeviceStats"), else torch's.
    """
    try:
        import rmm.statistics

        if rmm.statistics.get_statistics() is not None:
            peak = int(rmm.statistics.pop_statistics().peak_bytes)  # the counters since the last push
            rmm.statistics.push_statistics()
            return peak
    except ImportError:
        pass
    import torch

    peak = int(torch.cuda.max_memory_allocated())
    torch.cuda.reset_peak_memory_stats()
    return peak


def enable_rmm_statistics() -> None:
    """Count allocations through RMM on this worker (a no-op without RMM)."""
    try:
        import rmm.statistics

        rmm.statistics.enable_statistics()
        rmm.statistics.push_statistics()  # the first counters cannot be popped: pop the pushed ones
    except ImportError:
        pass


def run_job(client, source: Path, target: Path, config: str, overrides: dict,
            output_columns: str = "all") -> dict:
    """One job on ``client``'s GPU workers: every column written from cuDF partitions
    (``write_selection``), or the selection table only (``select_table``, partitions read by cuDF).
    With its worker-seconds per task prefix and its
    :func:`~jobs.wall_account`, from Dask's task stream."""
    import shutil

    from distributed import get_task_stream
    from distributed.utils import key_split

    from datamask_dask import read_parquet, select_table, write_selection
    from datamask_dask.io.storage import input_fingerprint

    client.run(gpu_peak_and_reset)
    pids = list(client.run(os.getpid).values())
    with MemorySampler(pids) as sampler, get_task_stream(client) as stream:
        shutil.rmtree(target, ignore_errors=True)  # not timed: a previous run's output
        started = time.time()  # the task stream's clock
        if output_columns == "selection":
            # cuDF's reader where select_table has one (a bench of older code runs without it)
            gpu_read = {"backend": "cudf"} if "backend" in inspect.signature(select_table).parameters else {}
            report = select_table(str(source), str(target), output_columns="selection", config=config,
                                  scheduler=client, resume=False, **gpu_read,
                                  **{"device": "cuda", **overrides})
            stages, phases = report.record["stages"], report.record["phases"]
        else:
            # cuDF's reader, one partition per file in file order: output part i is input file i
            report = write_selection(read_parquet(source, backend="cudf"), target, config=config,
                                     overwrite=True, resume=False,
                                     input_fingerprint=input_fingerprint(source),
                                     **{"device": "cuda", **overrides})
            stages, phases = report.stages, report.phases
        stopped = time.time()
    tasks: dict[str, list] = {}
    for task in stream.data:
        seconds = sum(s["stop"] - s["start"] for s in task["startstops"] if s["action"] == "compute")
        count_seconds = tasks.setdefault(key_split(task["key"]), [0, 0.0])
        count_seconds[0] += 1
        count_seconds[1] += seconds
    return {
        "wall": stopped - started,
        "rows": report.rows,
        "workers": len(pids),
        "threads": max(client.nthreads().values()),
        "stages": stage_columns(stages),
        "raw stages": stages,
        "tasks": tasks,
        "account": wall_account(stream.data, started, stopped, phases),
        "peak_rss": max(sampler.peaks.values()),
        "gpu_peak": max(client.run(gpu_peak_and_reset).values()),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000])
    parser.add_argument(
        "--workers", type=int, nargs="+", default=[0], help="GPU workers per run (0: one per visible GPU)"
    )
    parser.add_argument("--threads", type=int, default=1, help="threads per GPU worker")
    parser.add_argument("--algorithms", nargs="+", default=["Pair_simi", "Facility"])
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--rows-per-partition", type=int, default=100_000)
    parser.add_argument("--clusters", type=int, default=2000)
    parser.add_argument("--config", default=None, help="a profile or YAML file (default: the gpu profile)")
    parser.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--cache", default=str(HERE.parent / ".benchmark-cache"))
    parser.add_argument("--no-objective", dest="objective", action="store_false")
    parser.add_argument("--greedy-max-n", type=int, default=100_000)
    parser.add_argument("--greedy-reference", type=int, default=8192)
    parser.add_argument("--output-columns", choices=("all", "selection"), default="all",
                        help="every column (cuDF partitions) or the selection table only")
    parser.add_argument("--label", help="what code ran (free text), shown in the algorithm column")
    parser.add_argument("--keep-output", action="store_true")
    parser.add_argument("--json", help="append the results to this JSON file (results/gpu.json)")
    args = parser.parse_args(argv)

    problem = gpu_problem()
    if problem:
        print(
            f"bench_gpu: cannot run here: {problem}. Run benchmarks/bench_pipeline.py for the CPU figures.",
            file=sys.stderr,
        )
        return 2

    import torch

    import datamask_dask

    overrides = {}
    for item in args.opt:
        key, _, value = item.partition("=")
        try:
            overrides[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            overrides[key] = value
    cache = Path(args.cache)
    out_root = cache / "pipeline-gpu-out"
    memory_target = 2 * args.rows_per_partition * args.dim * 4 + GIB
    head = [
        f"# datamask select on GPU, end to end (d = {args.dim}, "
        f"{args.rows_per_partition:,} rows per partition)",
        "",
        f"Command: `python benchmarks/bench_gpu.py {' '.join(argv if argv is not None else sys.argv[1:])}`",
        f"GPU: {torch.cuda.get_device_name(0)} x {torch.cuda.device_count()}; config {args.config}"
        + (f" + {overrides}" if overrides else "") + f"; code: {Path(datamask_dask.__file__).parent}",
        "",
    ]
    lines = [
        "Throughput, memory and worker-seconds by stage:",
        "",
        "| rows | algorithm | workers | wall s | rows/s | peak host RSS / worker (target) | peak torch GPU "
        "memory | " + " | ".join(STAGES) + " | read + idle/other |",
        "|---:|---|---:|---:|---:|---:|---:|" + "---:|" * (len(STAGES) + 1),
    ]
    from datamask_dask import get_client

    task_lines = ["| rows | algorithm | workers | task | tasks | worker s |", "|---:|---|---:|---|---:|---:|"]
    accounts = []

    def report(size, label, r):
        label += f", {args.label}" if args.label else ""
        team = f"{r['workers']} x {r['threads']}"
        busy = r["workers"] * r["threads"] * r["wall"]
        idle = max(0.0, busy - sum(r["stages"].get(s, 0.0) for s in STAGES))
        accounts.append(({"rows": f"{size:,}", "algorithm": label, "workers": team}, r["account"], r["wall"]))
        lines.append(
            f"| {size:,} | {label} | {team} | {r['wall']:.1f} | "
            f"{size / r['wall']:,.0f} | {r['peak_rss'] / GIB:.2f} GiB ({memory_target / GIB:.2f}) | "
            f"{r['gpu_peak'] / GIB:.2f} GiB | "
            + " | ".join(fmt_seconds(r["stages"], s, busy) for s in STAGES)
            + f" | {idle:.1f} ({idle / busy:.0%}) |"
        )
        print(lines[-1], file=sys.stderr, flush=True)
        for task, (count, seconds) in sorted(r["tasks"].items(), key=lambda item: -item[1][1]):
            if seconds >= 0.05:
                task_lines.append(f"| {size:,} | {label} | {team} | {task} | {count} | "
                                  f"{seconds:.2f} |")

    tag = f"-{args.label}" if args.label else f"-t{args.threads}"  # each variant keeps its output
    for workers in args.workers:
        client = get_client("cuda", n_workers=workers or None, threads_per_worker=args.threads,
                            dashboard_address=":0")
        try:
            client.run(enable_rmm_statistics)
            # a fresh worker's first CUDA, cuDF and torch calls, on one file: reported apart
            first = ensure_dataset(cache, args.rows_per_partition, args.dim, args.rows_per_partition,
                                            args.clusters)
            warm = {"algorithm": args.algorithms[0], **overrides}
            report(args.rows_per_partition, f"{args.algorithms[0]}, a fresh worker's first job",
                   run_job(client, first, out_root / "warm-up", args.config, warm, args.output_columns))
            for size in args.sizes:
                source = ensure_dataset(cache, size, args.dim, args.rows_per_partition,
                                                 args.clusters)
                for algorithm in args.algorithms:
                    print(f"running {size} rows, {algorithm}, {workers or 'all'} GPU worker(s)...",
                          file=sys.stderr, flush=True)
                    target = out_root / f"n{size}-{algorithm}-w{workers}{tag}"
                    r = run_job(client, source, target, args.config, {"algorithm": algorithm, **overrides},
                                args.output_columns)
                    print(f"stages (worker-seconds): {r['raw stages']}", file=sys.stderr, flush=True)
                    report(size, algorithm, r)
        finally:
            client.shutdown()
    lines = head + wall_account_lines(accounts) + lines
    lines += ["", "Workers: GPU workers x threads each. Stage columns: worker-seconds summed over the "
              "threads (share of workers x threads x wall).", "",
              "Worker-seconds by task (Dask's task stream; tasks of at least 0.05 s):", "", *task_lines, ""]
    return finish_report(args, lines, cache, out_root, overrides)


if __name__ == "__main__":
    sys.exit(main())
