"""Kept rows stand for their group: the table scope's objective on every row, against lazy greedy.

One partition of ``--rows`` rows, d = ``--dim``: ``--generator sample`` (default), the sample
corpus's ``make_embeddings(rows, dim, seed=0)`` (sqrt(rows) clusters), or ``pipeline``, the pipeline
benchmark's ``make_partition`` (2000 clusters); both make 20% of rows near-copies of others (cosine
about 0.998). It is written to one parquet file and selected with ``datamask_select`` (the cpu profile,
``--ratio``) twice, ``diversity_scope="table"`` and ``"partition"``, on the synchronous scheduler.
Every selection is scored with ``evaluate_selection`` on *all* rows (near-copies included, each
counted once), against lazy greedy on all rows (same k); at lamb 0 also lazy greedy run on the
kept rows only, without and with their weights (the rows each stands for). Then, at ``--lamb-all``,
the two scopes for each of ``--algorithms``: their objectives' ratio.

    python benchmarks/bench_weights.py --out benchmarks/results-weights.md
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_pipeline as pipeline  # noqa: E402  (data generation)

from datamask_dask import evaluate_selection, lazy_greedy, make_embeddings  # noqa: E402


def select(path: Path, scope: str, algorithm: str, lamb: float, ratio: float):
    """``datamask_select`` on the file: the selected mask, the seconds it took and the plan dict."""
    import dask
    import dask.dataframe as dd

    from datamask_dask.dask_engine.operator import apply_plan, plan_selection

    ddf = dd.read_parquet(str(path))
    started = time.perf_counter()
    with dask.config.set(scheduler="synchronous"):
        spec, plan = plan_selection(ddf, ratio, config="cpu", algorithm=algorithm, lamb=lamb,
                                    diversity_scope=scope)
        plan = plan.compute()
        out = apply_plan(ddf, spec, plan)["selected"].compute().to_numpy()
    return out, time.perf_counter() - started, plan


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--ratio", type=float, default=0.1)
    parser.add_argument("--algorithms", nargs="+", default=["Facility", "Pair_simi", "DiSF"])
    parser.add_argument("--lamb-all", type=float, default=0.5)
    parser.add_argument("--generator", choices=("sample", "pipeline"), default="sample")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    if args.generator == "sample":
        quality, emb = make_embeddings(args.rows, args.dim, seed=0)
        quality = quality.astype(np.float64)
    else:
        model = pipeline._cluster_model(args.dim, 2000)
        quality, emb = pipeline.make_partition(0, args.rows, args.dim, model)
    folder = Path(tempfile.mkdtemp(prefix="bench-weights-"))
    path = folder / "part.00000.parquet"
    pipeline.write_partition(path, 0, quality, emb)
    load = os.getloadavg()[0]
    given = " ".join(sys.argv[1:] if argv is None else argv)
    lines = [f"# Kept rows stand for their group: {args.rows:,} rows, d = {args.dim}, ratio {args.ratio}", "",
             f"Command: `python benchmarks/bench_weights.py {given}`", "",
             f"One parquet file ({args.generator} generator: 20% of rows near-copies of others, "
             f"cosine ~0.998), cpu profile, synchronous scheduler; {platform.machine()}, "
             f"{os.cpu_count()} cores, load average {load:.1f} at the start. Every objective is measured on "
             "all rows (copies included, each once) with `evaluate_selection`.", ""]

    # lamb 0, Facility: the scopes against lazy greedy on all rows
    rows = []
    masks = {}
    for scope in ("table", "partition"):
        mask, seconds, plan = select(path, scope, "Facility", 0.0, args.ratio)
        masks[scope] = (mask, plan)
        rows.append((f"datamask, diversity_scope={scope}", mask, seconds))
    k = int(masks["table"][0].sum())
    started = time.perf_counter()
    pick = lazy_greedy(quality, emb, k, algorithm="Facility", lamb=0.0)
    rows.append(("lazy greedy, all rows", pick, time.perf_counter() - started))
    plan = masks["table"][1]
    shadowed = plan.shadowed.get(0, np.zeros(0, dtype=np.int64))
    kept = np.setdiff1d(np.arange(args.rows), shadowed)
    weights = np.ones(args.rows)
    if 0 in plan.weights:
        weights[plan.weights[0][0]] = plan.weights[0][1]
    for label, w in (("lazy greedy, kept rows only", None),
                     ("lazy greedy, kept rows weighted", weights[kept])):
        started = time.perf_counter()
        local = lazy_greedy(quality[kept], emb[kept], k, algorithm="Facility", lamb=0.0, weights=w)
        rows.append((label, kept[local], time.perf_counter() - started))
    scores = [(label, evaluate_selection(quality, emb, pick, algorithm="Facility", lamb=0.0)["objective"], s)
              for label, pick, s in rows]
    reference = next(v for label, v, _ in scores if label == "lazy greedy, all rows")
    draws = [np.random.default_rng(seed).choice(args.rows, k, replace=False) for seed in range(3)]
    drawn = np.mean([evaluate_selection(quality, emb, pick, algorithm="Facility", lamb=0.0)["objective"]
                     for pick in draws])
    lines += ["## Facility, lamb 0", "",
              f"k = {k:,}; {shadowed.size:,} rows shadowed, {kept.size:,} kept, of which "
              f"{int((weights[kept] > 1).sum()):,} stand for 2 or more rows (weights sum to "
              f"{weights[kept].sum():,.0f} = every row).", "",
              f"Random picks (mean of 3 seeds): {drawn:.5f}.", "",
              "| selection | objective (all rows) | share of lazy greedy's gain over random | seconds |",
              "|---|---:|---:|---:|"]
    lines += [f"| {label} | {value:.5f} | {(value - drawn) / (reference - drawn):.2%} | {s:.1f} |"
              for label, value, s in scores]
    lines.append("")
    print("\n".join(lines), flush=True)

    # every metric at lamb_all: table vs partition scope
    lines += [f"## Table vs partition scope, lamb {args.lamb_all}", "",
              "| algorithm | objective, table scope | objective, partition scope | table - partition | "
              "seconds (table, partition) |", "|---|---:|---:|---:|---:|"]
    for algorithm in args.algorithms:
        values, times = {}, {}
        for scope in ("table", "partition"):
            mask, seconds, _ = select(path, scope, algorithm, args.lamb_all, args.ratio)
            values[scope] = evaluate_selection(quality, emb, mask, algorithm=algorithm,
                                               lamb=args.lamb_all)["objective"]
            times[scope] = seconds
        lines.append(f"| {algorithm} | {values['table']:.5f} | {values['partition']:.5f} | "
                     f"{values['table'] - values['partition']:+.5f} | {times['table']:.1f}, "
                     f"{times['partition']:.1f} |")
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
