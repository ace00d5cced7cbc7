"""Where the plan pass's time goes: its tasks on a local cluster, from the distributed task stream.

Runs only the plan pass (:func:`datamask_dask.dask_engine.operator.plan_selection`, computed as
``write_selection`` computes it) of ``datamask select`` with the CLI's defaults (cpu profile)
on a parquet directory, on a local cluster of ``--n-workers`` worker processes
(:func:`datamask_dask.cluster.get_client`, as ``datamask select --n-workers``), and reports from
``client.get_task_stream``: per task prefix the tasks, their compute seconds (sum, longest) and
the seconds spent moving their inputs between workers or to and from disk (spilling); per worker
its busy share of the plan's wall time; and the stage clocks the plan summaries carry
(:mod:`datamask_dask.telemetry`). ``--scope`` picks the diversity scope; ``--before PATH`` profiles
another checkout of the package too (in a fresh process each), for before/after tables.

    python benchmarks/profile_plan.py --data /work/data-1m --out benchmarks/results-plan-profile.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def profile(data: str, scope: str, n_workers: int, algorithm: str) -> dict:
    """One plan pass on a fresh local cluster: wall seconds, the task stream, stage clocks, memory."""
    from distributed import get_task_stream

    from datamask_dask.cluster import get_client
    from datamask_dask.dask_engine.operator import plan_selection
    from datamask_dask.io.parquet import read_parquet

    client = get_client("cpu", n_workers=n_workers, threads_per_worker=1, dashboard_address=":0")
    try:
        ddf = read_parquet(data)
        started = time.perf_counter()
        with get_task_stream(client) as stream:
            spec, plan = plan_selection(ddf, algorithm=algorithm, diversity_scope=scope)
            plan = client.compute(plan).result()
        wall = time.perf_counter() - started
        memory = {address: info["metrics"].get("spilled_bytes", {})
                  for address, info in client.scheduler_info()["workers"].items()}
        shadowed = sum(len(v) for v in plan.shadowed.values())
        return {"wall": wall, "t0": time.time() - wall, "tasks": _tasks(stream.data),
                "stages": plan.stages, "spilled": memory, "rows": plan.rows,
                "shadowed": shadowed, "digest": _digest(plan)}
    finally:
        client.shutdown()


def _digest(plan) -> str:
    """A hash of the plan's quotas and shadowed rows: equal plans, equal digests."""
    import hashlib

    identity = repr([getattr(plan, k) for k in ("rows", "cells", "ranges", "dim", "digests")])
    digest = hashlib.blake2b(identity.encode(), digest_size=8)
    for partition, rows in sorted(plan.shadowed.items()):
        digest.update(repr(partition).encode() + rows.astype("int64").tobytes())
    return digest.hexdigest()


def _tasks(records: list) -> list:
    out = []
    for task in records:
        key = task["key"]
        name = key[0] if isinstance(key, tuple) else str(key)
        prefix = name.rsplit("-", 1)[0] if "-" in name else name
        spans = {}
        for span in task["startstops"]:
            spans.setdefault(span["action"], []).append((span["start"], span["stop"]))
        out.append({"prefix": prefix, "worker": task["worker"], "spans": spans,
                    "nbytes": task.get("nbytes")})
    return out


def table(result: dict) -> list[str]:
    """Markdown rows: per task prefix, and per worker."""
    wall, t0 = result["wall"], result["t0"]
    rows = {}
    workers: dict[str, float] = {}
    for task in result["tasks"]:
        entry = rows.setdefault(task["prefix"], {"n": 0, "compute": 0.0, "longest": 0.0, "transfer": 0.0,
                                                 "spill": 0.0, "first": 1e18, "last": 0.0})
        entry["n"] += 1
        for action, spans in task["spans"].items():
            seconds = sum(stop - start for start, stop in spans)
            if action == "compute":
                entry["compute"] += seconds
                entry["longest"] = max(entry["longest"], max(stop - start for start, stop in spans))
                entry["first"] = min(entry["first"], min(start for start, _ in spans))
                entry["last"] = max(entry["last"], max(stop for _, stop in spans))
                workers[task["worker"]] = workers.get(task["worker"], 0.0) + seconds
            elif action == "transfer":
                entry["transfer"] += seconds
            elif action in ("disk-read", "disk-write"):
                entry["spill"] += seconds
    lines = ["| task prefix | tasks | compute s (sum) | longest s | transfer s | spill s | from s | to s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for prefix, e in sorted(rows.items(), key=lambda item: item[1]["first"]):
        lines.append(f"| {prefix} | {e['n']} | {e['compute']:.2f} | {e['longest']:.2f} | "
                     f"{e['transfer']:.2f} | {e['spill']:.2f} | {e['first'] - t0:.1f} | "
                     f"{e['last'] - t0:.1f} |")
    lines += ["", "| worker | busy s | busy share of the plan's wall |", "|---|---:|---:|"]
    for worker, busy in sorted(workers.items()):
        lines.append(f"| {worker} | {busy:.1f} | {busy / wall:.0%} |")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--scope", default="table")
    parser.add_argument("--algorithm", default="Pair_simi")
    parser.add_argument("--n-workers", type=int, default=2)
    parser.add_argument("--before", help="another checkout of the package, profiled too")
    parser.add_argument("--json", help=argparse.SUPPRESS)  # internal: one profile, as JSON, to this path
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    if args.json:
        result = profile(args.data, args.scope, args.n_workers, args.algorithm)
        Path(args.json).write_text(json.dumps(result, default=str))
        return 0
    trees = {"this checkout": str(HERE.parent)}
    if args.before:
        trees = {"before": args.before, **trees}
    given = " ".join(sys.argv[1:] if argv is None else argv)
    lines = [f"# The plan pass, task by task ({args.scope} scope, {args.algorithm}, "
             f"{args.n_workers} workers)", "", f"Command: `python benchmarks/profile_plan.py {given}`", ""]
    for name, tree in trees.items():
        out = Path(f"/tmp/profile-plan-{os.getpid()}.json")
        path = os.pathsep.join([tree, os.path.join(tree, "integrations")])
        environment = {**os.environ, "PYTHONPATH": path}
        load = os.getloadavg()[0]
        command = [sys.executable, __file__, "--data", args.data, "--scope", args.scope, "--algorithm",
                   args.algorithm, "--n-workers", str(args.n_workers), "--json", str(out)]
        subprocess.run(command, check=True, env=environment)
        result = json.loads(out.read_text())
        out.unlink()
        lines += [f"## {name} ({tree}): plan {result['wall']:.1f} s wall, load {load:.1f} at start", "",
                  f"Plan digest {result['digest']} (quotas, ranges, shadowed rows, content digests); "
                  f"{result['shadowed']:,} shadowed rows", ""]
        lines += table(result)
        stage = result.get("stages") or {}
        lines += ["", "Stage clocks (worker seconds, summed): "
                  + ", ".join(f"{k} {v:.1f}" for k, v in sorted(stage.items())), ""]
        lines += [f"Spilled bytes per worker: {result['spilled']}", ""]
        print("\n".join(lines[-30:]), file=sys.stderr, flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
