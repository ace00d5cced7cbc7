"""Near-duplicates across partitions: per-partition vs table-wide diversity (issue 13).

A table of ``--partitions`` x ``--rows`` rows, d = ``--dim``, clustered embeddings
(``make_embeddings(..., duplicate_share=0)``) and log-normal quality; then ``--copies`` of the rows
are replaced by near-copies (noise ``--noise`` per dimension, renormalised; cosine >= 0.95 checked)
of a row in another partition (never a copy itself). Each method selects ``--ratio`` of the table
with ``ddf.pipe(datamask_select, ratio=..., seed=s)`` on the threaded scheduler (random and quality
top-k: table-wide, in numpy). Reported per selection: near-duplicate pairs (cosine >= 0.95) among
the selected rows within and across partitions, the global objective (Pair_simi on the whole
selected set; Facility on a fixed reference sample of ``--reference`` table rows, the same for
every method) and the wall time of the job (plan and select passes, computed once). For the
table scope also: how many rows of the per-partition selection it shadows, and their mean
quality against the mean quality of the rows it selects instead (where an objective gap comes from).

``--seeds 0 1 2`` repeats everything on the table made with each seed (data and selection seed),
then summarises each case: mean and standard deviation over the seeds of the objectives and of the
table scope's gain over the per-partition one.

    python benchmarks/bench_global.py --out benchmarks/results-global.md
    python benchmarks/bench_global.py --algorithms Pair_simi --seeds 0 1 2 \\
        --out benchmarks/results-global-seeds.md
"""

from __future__ import annotations

import argparse
import ast
import os
import platform
import sys
import time

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa

from datamask_dask import datamask_select, evaluate_selection, make_embeddings
from datamask_dask.dedup.simhash import count_pairs, hyperplanes, signatures

THRESHOLD = 0.95


def make_table(parts: int, rows: int, dim: int, copies: float, noise: float, seed: int = 0):
    """Quality, embeddings and partition of each row, with planted cross-partition near-copies."""
    n = parts * rows
    quality, emb = make_embeddings(n, dim, duplicate_share=0.0, seed=seed)
    rng = np.random.default_rng(seed + 1)
    part = np.arange(n) // rows
    copy = rng.choice(n, int(copies * n), replace=False)
    is_copy = np.zeros(n, dtype=bool)
    is_copy[copy] = True
    originals = np.flatnonzero(~is_copy)
    source = np.empty(copy.size, dtype=np.int64)
    for i, row in enumerate(copy):  # a non-copy row of another partition
        while True:
            candidate = originals[rng.integers(originals.size)]
            if part[candidate] != part[row]:
                source[i] = candidate
                break
    emb[copy] = emb[source] + noise * rng.standard_normal((copy.size, dim), dtype=np.float32)
    emb[copy] /= np.linalg.norm(emb[copy], axis=1, keepdims=True)
    cosine = np.einsum("ij,ij->i", emb[copy], emb[source])
    assert cosine.min() >= THRESHOLD, cosine.min()
    return quality.astype(np.float64), emb, part


def frame(quality, emb, parts: int):
    features = pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), emb.shape[1])
    df = pd.DataFrame({"chunk_id": np.arange(len(quality), dtype=np.int64), "quality_score": quality,
                       "feature_arr": pd.Series(pd.arrays.ArrowExtensionArray(features))})
    return dd.from_pandas(df, npartitions=parts, sort=False)


def duplicate_pairs(emb, part, selected, block: int = 2048) -> tuple[int, int]:
    """Pairs (i < j) of selected rows with cosine >= THRESHOLD: (within a partition, across)."""
    rows = np.flatnonzero(selected)
    e, p = emb[rows], part[rows]
    within = across = 0
    for start in range(0, rows.size, block):
        sims = e[start:start + block] @ e.T
        i, j = np.nonzero(sims >= THRESHOLD)
        i = i + start
        keep = j > i
        i, j = i[keep], j[keep]
        same = p[i] == p[j]
        within += int(same.sum())
        across += int((~same).sum())
    return within, across


def objective(quality, emb, selected, algorithm: str, lamb: float, reference: np.ndarray) -> float:
    rows = np.flatnonzero(selected)
    q_range = (float(quality.min()), float(quality.max()))
    if algorithm == "Facility":  # coverage of a fixed reference sample of the table, as Facility.evaluate
        quality_part = evaluate_selection(quality, emb, rows, algorithm="Pair_simi", lamb=1.0,
                                          quality_range=q_range)["quality"]
        cover = np.clip((emb[reference] @ emb[rows].T).max(axis=1), 0, None).mean()
        return lamb * quality_part + (1 - lamb) * float(cover)
    return evaluate_selection(quality, emb, rows, algorithm=algorithm, lamb=lamb,
                              quality_range=q_range)["objective"]


def terms(quality, emb, selected, algorithm: str, reference: np.ndarray) -> tuple[float, float]:
    """The quality and diversity terms that :func:`objective` weighs with lamb."""
    rows = np.flatnonzero(selected)
    q_range = (float(quality.min()), float(quality.max()))
    metric = "Pair_simi" if algorithm == "Facility" else algorithm  # Facility: coverage below
    value = evaluate_selection(quality, emb, rows, algorithm=metric, lamb=0.5, quality_range=q_range)
    if algorithm == "Facility":
        return value["quality"], float(np.clip((emb[reference] @ emb[rows].T).max(axis=1), 0, None).mean())
    return value["quality"], value["diversity"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rows", type=int, default=25_000, help="rows per partition")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--copies", type=float, default=0.25)
    parser.add_argument("--noise", type=float, default=0.02)
    parser.add_argument("--ratio", type=float, default=0.1)
    parser.add_argument("--reference", type=int, default=5000, help="Facility's reference sample")
    parser.add_argument("--algorithms", nargs="+", default=["Pair_simi", "Facility"])
    parser.add_argument("--lambs", nargs="+", type=float, default=[0.0, 0.5])
    parser.add_argument("--opt", action="append", default=[], help="extra option key=value (Python literal)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0], help="data and selection seeds")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    extra = {k: ast.literal_eval(v) for k, v in (o.split("=", 1) for o in args.opt)}
    rows = []
    for seed in args.seeds:
        rows += run_seed(args, extra, seed)
    write(args, extra, rows, argv)


def run_seed(args, extra: dict, seed: int) -> list[dict]:
    """Every selection of one table (data seed ``seed``), selected with ``seed``."""
    quality, emb, part = make_table(args.partitions, args.rows, args.dim, args.copies, args.noise, seed=seed)
    n = quality.size
    k = int(round(args.ratio * n))
    ddf = frame(quality, emb, args.partitions)
    reference = np.random.default_rng(7 + seed).choice(n, min(args.reference, n), replace=False)
    rows = []

    def record(name, scope, selected, seconds, algorithm=None, lamb=None, **more):
        within, across = duplicate_pairs(emb, part, selected)
        # what the run summary reports: its estimate from the selected rows' signatures
        planes = hyperplanes(emb.shape[1])
        estimate = count_pairs([signatures(emb[selected & (part == p)], planes)
                                for p in range(args.partitions)])
        objectives = {a: {lb: objective(quality, emb, selected, a, lb, reference) for lb in args.lambs}
                      for a in args.algorithms}
        rows.append(dict(name=name, scope=scope, selected=int(selected.sum()), within=within, across=across,
                         estimate=estimate, seconds=seconds, algorithm=algorithm, lamb=lamb,
                         objectives=objectives, seed=seed, **more,
                         terms=None if algorithm is None else terms(quality, emb, selected, algorithm,
                                                                    reference)))
        print({key: value for key, value in rows[-1].items() if key != "objectives"}, flush=True)

    random = np.zeros(n, dtype=bool)
    random[np.random.default_rng(seed).choice(n, k, replace=False)] = True
    record("random 10%", "table", random, None)
    top = np.zeros(n, dtype=bool)
    top[np.argsort(-quality, kind="stable")[:k]] = True
    record("quality top-k", "table", top, None)
    for algorithm in args.algorithms:
        for lamb in args.lambs:
            picked = {}
            for scope in ("partition", "table"):
                start = time.perf_counter()
                out = ddf.pipe(datamask_select, ratio=args.ratio, seed=seed, algorithm=algorithm, lamb=lamb,
                               diversity_scope=scope, score_column="score", **extra)
                out = out.compute(scheduler="threads")
                seconds = time.perf_counter() - start
                selected = picked[scope] = out["selected"].to_numpy()
                assert selected.sum() == k and (out["chunk_id"].to_numpy() == np.arange(n)).all()
                more = {}
                if scope == "table":  # shadowed rows score -inf: which per-partition picks were set aside
                    lost = picked["partition"] & np.isneginf(out["score"].to_numpy()) & ~selected
                    gained = selected & ~picked["partition"]
                    more = {"shadowed_picks": int(lost.sum()),
                            "lost_quality": float(quality[lost].mean()) if lost.any() else None,
                            "changed": int(gained.sum()),
                            "gained_quality": float(quality[gained].mean()) if gained.any() else None}
                record(f"{algorithm}, lamb {lamb:g}", scope, selected, seconds, algorithm, lamb, **more)
    return rows


def write(args, extra: dict, rows: list[dict], argv) -> None:
    k = int(round(args.ratio * args.partitions * args.rows))
    command = " ".join(sys.argv[1:] if argv is None else argv)
    lines = ["# Near-duplicates across partitions: `diversity_scope` (issue 13)", "",
             f"Command: `python benchmarks/bench_global.py {command}`", "",
             f"{args.partitions} partitions x {args.rows:,} rows, d = {args.dim}, clustered embeddings, "
             f"{args.copies:.0%} of rows near-copies (noise {args.noise}) of a row in another partition, "
             f"log-normal quality; ratio {args.ratio} ({k:,} rows), seeds {args.seeds} (data and selection), "
             "threaded scheduler"
             f"{', options ' + str(extra) if extra else ''}. {platform.processor() or platform.machine()}, "
             f"{os.cpu_count()} CPU cores (shared with other jobs: wall times are noisy; compare the two "
             "scopes of one method, run one after the other).", "",
             "Pairs: near-duplicate pairs (cosine >= 0.95) among the selected rows. Objective: "
             "lamb * quality + (1 - lamb) * diversity of the method's own metric and lamb, on the whole "
             f"selected set (Facility: coverage of a fixed reference sample of {args.reference:,} table "
             "rows).", "",
             "Shadowed picks: rows of the per-partition selection that the table scope sets aside as "
             "near-copies of a better row; their mean quality, against that of the rows the table scope "
             "selects instead (changed).", "",
             "Summary's estimate: what the run summary reports for that selection (SimHash LSH over "
             "the selected rows, within / across).", "",
             "| seed | selection | scope | pairs within a partition | pairs across partitions | all pairs | "
             "summary's estimate | objective | quality term | diversity term | "
             "shadowed picks (mean quality) | changed (mean quality) | wall s |",
             "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        obj = "" if r["algorithm"] is None else f"{r['objectives'][r['algorithm']][r['lamb']]:.4f}"
        secs = "" if r["seconds"] is None else f"{r['seconds']:.1f}"
        lost = changed = ""
        if "shadowed_picks" in r:
            lost = f"{r['shadowed_picks']:,} ({_number(r['lost_quality'])})"
            changed = f"{r['changed']:,} ({_number(r['gained_quality'])})"
        lines.append(f"| {r['seed']} | {r['name']} | {r['scope']} | {r['within']:,} | {r['across']:,} | "
                     f"{r['within'] + r['across']:,} | {r['estimate'][0]:,} / {r['estimate'][1]:,} | {obj} | "
                     f"{_terms(r.get('terms'))} | {lost} | {changed} | {secs} |")
    lines += ["", f"Over seeds {args.seeds}: mean (standard deviation) of each case.", "",
              "| selection | partition objective | table objective | table - partition | table wins | "
              "pairs partition | pairs table | wall s partition | wall s table |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name in dict.fromkeys(r["name"] for r in rows if r["algorithm"] is not None):
        by = {scope: sorted((r for r in rows if r["name"] == name and r["scope"] == scope),
                            key=lambda r: r["seed"]) for scope in ("partition", "table")}
        value = {scope: np.array([r["objectives"][r["algorithm"]][r["lamb"]] for r in by[scope]])
                 for scope in by}
        gain = value["table"] - value["partition"]
        pairs = {scope: np.array([r["within"] + r["across"] for r in by[scope]]) for scope in by}
        wall = {scope: np.array([r["seconds"] for r in by[scope]]) for scope in by}
        lines.append(f"| {name} | {_spread(value['partition'], 4)} | {_spread(value['table'], 4)} | "
                     f"{_spread(gain, 5, sign=True)} | {int((gain >= 0).sum())} of {gain.size} | "
                     f"{_spread(pairs['partition'], 0)} | {_spread(pairs['table'], 0)} | "
                     f"{_spread(wall['partition'], 1)} | {_spread(wall['table'], 1)} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            handle.write(text)



def _spread(values: np.ndarray, digits: int, sign: bool = False) -> str:
    """``mean (sd)`` of ``values`` (the sample standard deviation; none for one value)."""
    form = f"{'+' if sign else ''}.{digits}f"
    mean = format(float(values.mean()), form)
    return mean if values.size < 2 else f"{mean} ({float(values.std(ddof=1)):.{digits}f})"


def _terms(values) -> str:
    return " | " if values is None else f"{values[0]:.4f} | {values[1]:.4f}"


def _number(value) -> str:
    return "-" if value is None else f"{value:.3f}"


if __name__ == "__main__":
    main()
